"""A stand-in for a real chat model, built offline: Qwen2's architecture with random weights, and a byte-level BPE
tokenizer with Qwen2.5-Instruct's ChatML chat template.

    path = make_standin_chat_model("runs/standin")          # 0.1 s on a CPU, once transformers is imported
    model, tokenizer = load_model_and_tokenizer(path)       # as from_pretrained("Qwen/Qwen2.5-0.5B-Instruct") would

Nothing is downloaded: the tokenizer is trained here with `tokenizers` on ~400 built-in lines, and the model
is `Qwen2ForCausalLM(Qwen2Config(...))` drawn with a seed. What it shares with the real thing, so that code run on it
takes the real model's path:
  * the tokenizer's pipeline: NFC normalization, Qwen2's pre-tokenizer regex (every digit its own piece, so numbers
    are spelled digit by digit), byte-level BPE (any text round-trips exactly), a byte-level decoder;
  * the special tokens after the ordinary vocabulary, as in Qwen2.5: `<|endoftext|>` (padding, and what a base
    model ends text with), `<|im_start|>`, `<|im_end|>` (the end of a chat turn, the tokenizer's eos); no bos token;
  * the ChatML template, Qwen2.5-Instruct's own (`CHATML_TEMPLATE`): `<|im_start|>role\\n...<|im_end|>\\n` per
    message, a default system message when the conversation has none, `add_generation_prompt` opening the
    assistant's turn, and Qwen3's `enable_thinking=False` closing an empty `<think>` block there; with `tools=` the
    tools' JSON schemas in the system message, assistant `tool_calls` as `<tool_call>` blocks and `tool` messages as
    `<tool_response>` blocks in a user turn, exactly as Qwen2.5 writes them; `<tool_call>` and `</tool_call>` are
    single added tokens that are not special, as in Qwen2.5's tokenizer;
  * the generation config Qwen2.5-Instruct ships: both ends of text as eos, and its sampling defaults (top_k=20,
    top_p=0.8, temperature=0.7, repetition_penalty=1.05), which a GRPO sampler must not inherit (rollout.py);
  * `Qwen2ForCausalLM` with tied embeddings, grouped-query attention, biases on q/k/v, rope_theta 1e6, sdpa attention.

What it does not share: the weights are random, so completions are noise; the vocabulary is about 1,000 tokens, not
151,936 (and the embedding matrix is not padded beyond the tokenizer's length as Qwen's is). The weights are drawn
with a larger spread than a fresh model's (`initializer_range`), so that different prompts give different greedy
completions instead of one token repeated: a test comparing two samplers then compares something.
"""

from pathlib import Path

from ..loading.chat_templates import QWEN25_MESSAGES

__all__ = ["CHATML_TEMPLATE", "QWEN25_05B_SHAPE", "TOY_SHAPE", "make_standin_chat_model",
           "make_standin_process_reward_model", "PRM_SCORE_TOKEN"]

# make_standin_chat_model's arguments for Qwen2.5-0.5B's shape (its published config.json): 24 blocks, hidden 896,
# MLP 4864, 14 query and 2 key-value heads, a 151,936-row tied embedding; 494M parameters. The weights' spread is
# a trained model's (0.02 would make every logit nearly equal; 0.5 overflows float16 within a few blocks).
QWEN25_05B_SHAPE = dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                        embedding_size=151936, max_position_embeddings=32768, initializer_range=0.1)
# ... and the same code paths at a toy size, for the CPU runs of the CUDA tests and the GPU check's dry run: grouped-
# query attention, an embedding padded beyond the tokenizer, the same spread of weights.
TOY_SHAPE = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, embedding_size=2048,
                 initializer_range=0.1)

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"  # added tokens in Qwen2.5, but not special ones

# Qwen2.5's pre-tokenizer (tokenizer.json, "Split" before "ByteLevel"): contractions, words with one leading
# non-letter, single digits (\p{N}, not GPT-4's \p{N}{1,3}), punctuation runs, newlines, spaces.
QWEN2_SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                       r"|\s*[\r\n]+|\s+(?!\S)|\s+")

DEFAULT_SYSTEM_MESSAGE = "You are a helpful assistant."

# Qwen2.5-Instruct's chat template, word for word (TRL ships it as trl/chat_templates/qwen2_5.jinja), with two
# changes: the default system message is Qwen2-Instruct's plain sentence above (Qwen2.5's is "You are Qwen, created
# by Alibaba Cloud. You are a helpful assistant."), and Qwen3's enable_thinking=false closes an empty think block
# after the generation prompt. With `tools=[schema, ...]` it writes the system message's "# Tools" section with one
# JSON schema a line inside <tools></tools>; an assistant message's `tool_calls` become
# `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` blocks; and consecutive `tool` messages share one
# user turn, each in <tool_response></tool_response>.
CHATML_TEMPLATE = (r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'DEFAULT_SYSTEM_MESSAGE' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nDEFAULT_SYSTEM_MESSAGE<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
""" + QWEN25_MESSAGES + r"""{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
""").replace("DEFAULT_SYSTEM_MESSAGE", DEFAULT_SYSTEM_MESSAGE)


def _training_text() -> list[str]:
    """What the BPE merges are learned from: the shapes of text the tasks and the template produce.

    No corpus is needed for a stand-in; text it was not trained on still tokenizes, byte by byte where no merge
    applies. Deterministic, so the same seed gives the same tokenizer.
    """
    lines = [
        "A conversation between User and Assistant. The user asks a question, and the Assistant solves it.",
        "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
        "answer.",
        "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags.",
        "Respond in the following format:\n<think>\n...\n</think>\n<answer>\n...\n</answer>",
        "Using the numbers [3, 5, 7, 9], create an equation that equals 24. You can use basic arithmetic operations "
        "(+, -, *, /) and each number can only be used once.",
        "<think>\n(9 - 7) * 3 * 5 = 30, no. 9 + 7 + 5 + 3 = 24.\n</think>\n<answer>\n9 + 7 + 5 + 3\n</answer>",
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May.",
        "She sold 48 / 2 = 24 clips in May and 48 + 24 = 72 clips in total.\n#### 72",
        "What is 2 + 3? How many apples does Tom have? The answer is \\boxed{5}.",
        "Let's think step by step. First, we find the total cost: $12.50 * 4 = $50.00.",
        "system\nuser\nassistant\n" + DEFAULT_SYSTEM_MESSAGE,
        "A train leaves the station at 3 o'clock and travels at 60 miles per hour for two and a half hours.",
        "The rectangle is 12 meters long and 5 meters wide, so its area is 60 square meters and its perimeter 34.",
        "If a shirt costs $25 and is on sale for 20% off, the discount is $5 and the new price is $20.",
        "Every week the farmer collects eggs from the chickens, keeps a dozen for the family and sells the rest.",
        "The school has 3 classes with 28 students each; how many students are there in all of the classes?",
        "We know that x + y = 10 and x - y = 4. Adding the two equations gives 2x = 14, so x = 7 and y = 3.",
        "The probability of rolling a six with a fair die is 1/6, and of rolling two sixes in a row 1/36.",
        "Check the answer: substitute the value back into the original equation and see whether both sides agree.",
        "It's important to read the question carefully. We're asked for the difference, not the sum.",
        "Therefore, the final answer is 42. I'll double-check: 6 * 7 = 42, which matches.",
        "Wait, that doesn't look right. Let me recompute the remainder when 100 is divided by 7: it is 2.",
        "She walked to the library, borrowed three novels and a cookbook, and returned them the following week.",
        "Water boils at 100 degrees Celsius at sea level, which is 212 degrees Fahrenheit.",
        "The quick brown fox jumps over the lazy dog while the children watch from the garden.",
        "In the morning they planted tomatoes; in the afternoon they painted the fence white.",
        "Please write your reasoning first, then give only the number as the final answer.",
        "Hint: the greatest common divisor of 48 and 18 is 6, and their least common multiple is 144.",
        "Python, JSON and YAML files: {\"prompt\": \"What is 1 + 1?\", \"answer\": \"2\"}",
        # The shapes of a tool-calling conversation: the template's "# Tools" section, a call, a response.
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
        "function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": "
        "{\"name\": \"calculator\", \"description\": \"Evaluate an arithmetic expression.\", \"parameters\": "
        "{\"type\": \"object\", \"properties\": {\"expression\": {\"type\": \"string\", \"description\": "
        "\"The expression.\"}}, \"required\": [\"expression\"]}, \"return\": {\"type\": \"string\"}}}\n</tools>",
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
        "<args-json-object>}\n</tool_call>",
        "<tool_call>\n{\"name\": \"python\", \"arguments\": {\"code\": \"print(48 + 24)\"}}\n</tool_call>",
        "user\n<tool_response>\n72\n</tool_response>\nuser\n<tool_response>\nError: ZeroDivisionError: division "
        "by zero\n</tool_response>",
    ]
    names = ["Tom", "Anna", "James", "Maria", "Liam", "Sofia", "Noah", "Emma"]
    things = ["apples", "books", "marbles", "cookies", "dollars", "pencils", "stickers", "eggs"]
    verbs = ["buys", "sells", "gives away", "finds", "loses", "earns", "bakes", "collects"]
    for i in range(120):
        a, b, c = 3 + 7 * i % 97, 2 + 5 * i % 31, 1 + i % 9
        name, thing, verb = names[i % 8], things[i * 3 % 8], verbs[i * 5 % 8]
        lines.append(f"{name} has {a} {thing} and {verb} {b} more. How many {thing} does {name} have now?")
        lines.append(f"<think>\n{name} starts with {a}. Then {a} + {b} = {a + b}, and ({a + b}) * {c} = {(a + b) * c}."
                     f"\n</think>\n<answer>\n{a + b}\n</answer>")
        lines.append(f"Using the numbers [{a}, {b}, {c}], create an equation that equals {a * c - b}. "
                     f"<answer>{a} * {c} - {b}</answer> #### {a * c - b}")
    return lines


def _make_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE trained on `texts`, Qwen2.5's pipeline and special tokens, wrapped for transformers."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    # The decoder maps the byte alphabet's stand-in characters (Ġ for a space, Ċ for a newline) back to bytes and
    # joins pieces with nothing between them; without it "Hello world" decodes as "HelloĠworld".
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer=trainer)
    # Qwen2.5 writes a tool call between <tool_call> and </tool_call>, each one added token that is not special
    # (decoding with skip_special_tokens keeps them). Added before the special tokens so that these keep the last ids.
    bpe.add_tokens([AddedToken(TOOL_CALL_START, special=False, normalized=False),
                    AddedToken(TOOL_CALL_END, special=False, normalized=False)])
    # Added after training, so that they take the last ids, in Qwen2.5's order (151643, 151644, 151645).
    bpe.add_special_tokens([ENDOFTEXT, IM_START, IM_END])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, eos_token=IM_END, pad_token=ENDOFTEXT, additional_special_tokens=[IM_START],
        clean_up_tokenization_spaces=False, model_max_length=32768,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def make_standin_chat_model(out_dir, *, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4,
                            num_kv_heads: int = 2, vocab_size: int = 1000, max_position_embeddings: int = 2048,
                            initializer_range: float = 0.5, seed: int = 0, texts: list[str] | None = None,
                            intermediate_size: int | None = None, embedding_size: int | None = None,
                            rms_norm_eps: float = 1e-6, device: str = "cpu") -> Path:
    """Build the stand-in and save model + tokenizer to `out_dir` (save_pretrained format); returns the path.

    vocab_size: the most tokens in all, the five added ones included (two tool-call tokens, three special ones); a
    small text supports fewer merges (the built-in text fills all 1,000). texts: what the tokenizer is trained on
    (default: ~400 built-in lines shaped like the tasks' prompts, answers and tool calls). Weights are drawn from
    N(0, initializer_range) with torch seeded by `seed`; the caller's random state is left as it was. The defaults
    give 187k parameters, built and saved in ~0.1 s (plus ~1.5 s of imports the first time in a process).
    intermediate_size: the MLP's width (default 4 x hidden_size). embedding_size: rows of the (tied) embedding and
    head, when larger than the tokenizer (Qwen2.5 pads its 151,665 tokens to 151,936): the real model's shape, at
    its cost. `QWEN25_05B_SHAPE` gives Qwen2.5-0.5B's. device: where the weights are drawn (a GPU draws 0.5B in a
    second, two CPU cores in two minutes; the two draw different numbers from the same seed).
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokenizer = _make_tokenizer(texts if texts is not None else _training_text(), vocab_size - 5)
    endoftext, im_end = tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_END])
    config = Qwen2Config(
        vocab_size=max(len(tokenizer), embedding_size or 0), hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size, rms_norm_eps=rms_norm_eps,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings, tie_word_embeddings=True, rope_theta=1e6,
        initializer_range=initializer_range, bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext,
        attn_implementation="sdpa",
    )
    cuda = torch.device(device).type == "cuda"
    with torch.random.fork_rng(devices=[torch.device(device)] if cuda else []):  # leave the caller's streams alone
        torch.manual_seed(seed)
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    # Qwen2.5-Instruct's generation_config.json, word for word but for the ids.
    model.generation_config = GenerationConfig(
        bos_token_id=endoftext, pad_token_id=endoftext, eos_token_id=[im_end, endoftext],
        do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05,
    )
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


PRM_SCORE_TOKEN = "<extra_0>"  # where Qwen2.5-Math-PRM reads each step's score


def make_standin_process_reward_model(out_dir, *, hidden_size: int = 64, num_layers: int = 2, seed: int = 0) -> Path:
    """A stand-in for a hub process reward model (Qwen2.5-Math-PRM's interface), saved to `out_dir`; returns the path.

    The stand-in chat model's tokenizer and ChatML template with one more added token, `<extra_0>`, the step
    separator whose position the PRM reads a score at; the model a `Qwen2ForTokenClassification` with two labels
    (per-token logits for "wrong" and "right", as Qwen2ForProcessRewardModel returns), random weights drawn with
    `seed`. Load it with AutoModelForTokenClassification and AutoTokenizer; score with
    minigrpo.reward_models.process.ProcessRewardModel. Random weights: the scores mean nothing, the plumbing is real."""
    import torch
    from transformers import Qwen2Config, Qwen2ForTokenClassification

    tokenizer = _make_tokenizer(_training_text(), 1000 - 6)
    tokenizer.add_tokens([PRM_SCORE_TOKEN], special_tokens=True)
    endoftext, im_end = tokenizer.convert_tokens_to_ids([ENDOFTEXT, IM_END])
    config = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
        rope_theta=1e6, initializer_range=0.5, bos_token_id=endoftext, eos_token_id=im_end, pad_token_id=endoftext,
        num_labels=2, attn_implementation="sdpa",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForTokenClassification(config)
    out = Path(out_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out
