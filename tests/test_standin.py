"""The offline stand-in for a real chat model (minigrpo/lab/standin.py): that it loads as a hub model would, that its
tokenizer and chat template behave like Qwen2.5-Instruct's, and that every part of the package that touches a
prompt (encoding, both samplers, log-probs, LoRA, QLoRA, saving) runs on it with chat prompts."""

import copy

import pytest
import torch

from minigrpo.config import Config, ConfigError
from minigrpo.logprobs import completion_logprobs
from minigrpo.loading.models import add_lora, is_quantized, load_model_and_tokenizer, load_tokenizer, save_policy
from minigrpo.run import load_policy
from minigrpo.prompts import encode_prompts, left_pad
from minigrpo.rollout import sample_completions, sample_completions_hf
from minigrpo.lab.standin import make_standin_chat_model

pytestmark = pytest.mark.usefixtures("one_thread")  # a model this small runs fastest on one thread

SYSTEM = {"role": "system", "content": "Answer with a number."}
CHATS = [[SYSTEM, {"role": "user", "content": f"What is {a} + {b}?"}] for a, b in [(2, 3), (17, 25), (408, 99)]]


@pytest.fixture(scope="module")
def standin(chat_model_dir):
    return load_model_and_tokenizer(chat_model_dir)


def test_the_stand_in_loads_as_a_hub_chat_model_would(chat_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(chat_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(chat_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM" and type(tokenizer).__name__ == "Qwen2Tokenizer"
    assert model.config.tie_word_embeddings and model.config._attn_implementation == "sdpa"
    assert model.config.vocab_size == len(tokenizer)
    # Qwen2.5's special tokens come after the ordinary vocabulary, in this order; no bos token.
    V = len(tokenizer)
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [V - 3, V - 2, V - 1]
    assert (tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token) == ("<|endoftext|>", "<|im_end|>", None)
    assert model.generation_config.eos_token_id == [V - 1, V - 3] and model.generation_config.pad_token_id == V - 3
    assert model.generation_config.top_k == 20  # Qwen's sampling defaults ship with it, as on the hub


def test_the_same_seed_builds_the_same_model(tmp_path, chat_model_dir):
    again = make_standin_chat_model(tmp_path / "again")
    for name in ("model.safetensors", "tokenizer.json", "chat_template.jinja"):
        assert (again / name).read_bytes() == (chat_model_dir / name).read_bytes()
    other = make_standin_chat_model(tmp_path / "other", seed=1)
    assert (other / "model.safetensors").read_bytes() != (chat_model_dir / "model.safetensors").read_bytes()


def test_the_chat_template_writes_chatml_as_qwen_does(standin):
    _, tokenizer = standin

    def render(messages, **kwargs):
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)

    user = {"role": "user", "content": "What is 2 + 3?"}
    assert render([SYSTEM, user], add_generation_prompt=True) == (
        "<|im_start|>system\nAnswer with a number.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n"
        "<|im_start|>assistant\n")
    # No system message: Qwen2.5's template writes a default one.
    assert render([user], add_generation_prompt=True) == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n")
    # Qwen3's enable_thinking=False closes an empty think block, so the model answers at once.
    assert render([SYSTEM, user], add_generation_prompt=True, enable_thinking=False) == (
        render([SYSTEM, user], add_generation_prompt=True) + "<think>\n\n</think>\n\n")
    assert render([SYSTEM, user, {"role": "assistant", "content": "5"}]).endswith(
        "<|im_start|>assistant\n5<|im_end|>\n")


@pytest.mark.parametrize("text", [
    "Hello world", "  two  spaces,\ttab and trailing space ", "line one\n\nline three\n", "3471+586=4057",
    "(9 - 7) * 3 / 5 = 1.2", "<think>\nok\n</think>\n<answer>42</answer>", "naïve café, 日本語, 🙂, ∑ x²",
    "Tom's dog isn't here", "ünseen wörds and zxqv",
])
def test_decoding_gives_back_the_text_exactly(standin, text):
    _, tokenizer = standin
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text  # byte-level: no spaces inserted, none lost


def test_numbers_are_spelled_digit_by_digit_and_text_is_nfc_normalized_as_in_qwen(standin):
    _, tokenizer = standin
    assert tokenizer.tokenize("x=4057") == ["x", "=", "4", "0", "5", "7"]  # Qwen2's pre-tokenizer: one digit a piece
    decomposed = "cafe\u0301"  # e + combining acute accent
    assert tokenizer.decode(tokenizer(decomposed)["input_ids"]) == "caf\u00e9"  # comes back composed


def test_encode_prompts_templates_chats_and_leaves_strings_alone(standin):
    _, tokenizer = standin
    chat, plain = CHATS[0], "What is 2 + 3?"
    chat_ids, plain_ids = encode_prompts(tokenizer, [chat, plain])
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert chat_ids == tokenizer(text, add_special_tokens=False)["input_ids"]
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert chat_ids[0] == im_start and chat_ids.count(im_start) == 3  # system, user, assistant: nothing added
    assert tokenizer.decode(chat_ids) == text
    assert plain_ids == tokenizer(plain)["input_ids"] and tokenizer.decode(plain_ids) == plain


def test_a_chat_prompt_for_a_model_without_a_chat_template_is_one_line():
    from minigrpo.tasks import get_task

    tokenizer = load_tokenizer(get_task("think_addition").model_dir)
    with pytest.raises(ConfigError) as err:
        encode_prompts(tokenizer, [CHATS[0]])
    assert "chat template" in str(err.value) and "\n" not in str(err.value)


def test_sample_completions_on_chat_prompts_feeds_the_templated_ids(standin):
    model, tokenizer = standin
    torch.manual_seed(0)
    rollout = sample_completions(model, tokenizer, CHATS, num_generations=4, max_completion_length=16)
    prompt_ids, prompt_mask = left_pad(encode_prompts(tokenizer, CHATS), tokenizer.pad_token_id)
    assert torch.equal(rollout.prompt_ids, prompt_ids.repeat_interleave(4, dim=0))
    assert torch.equal(rollout.prompt_mask, prompt_mask.repeat_interleave(4, dim=0))
    assert rollout.completion_ids.shape[0] == 12 and rollout.completion_ids.shape[1] <= 16
    assert len(set(rollout.completions)) > 1  # random weights, but not one token repeated
    plain = sample_completions(model, tokenizer, ["What is 2 + 3?"], num_generations=2, max_completion_length=4)
    assert plain.prompt_ids[0].tolist() == tokenizer("What is 2 + 3?")["input_ids"]


def test_the_decode_loop_and_hf_generate_agree_on_chat_prompts(standin):
    """Greedy, so the two must pick the same tokens, although the model's generation_config carries Qwen's
    sampling defaults (top_k=20, repetition_penalty=1.05) that HF generate would otherwise apply."""
    model, tokenizer = standin
    kw = dict(num_generations=2, max_completion_length=16, do_sample=False)
    ours, hf = sample_completions(model, tokenizer, CHATS, **kw), sample_completions_hf(model, tokenizer, CHATS, **kw)
    assert torch.equal(ours.completion_ids, hf.completion_ids) and ours.completions == hf.completions
    assert torch.equal(ours.completion_mask, hf.completion_mask)
    assert len(set(ours.completions)) == len(CHATS)  # the prompts lead to different completions
    # Qwen's 1.05 changes nothing in 16 random tokens; a "penalty" of 0.1 (favouring the prompt's tokens) shows
    # that a plain generate would inherit it, and that sample_completions_hf does not.
    penalized = copy.deepcopy(model)
    penalized.generation_config.repetition_penalty = 0.1
    assert torch.equal(sample_completions_hf(penalized, tokenizer, CHATS, **kw).completion_ids, hf.completion_ids)
    ids, mask = left_pad(encode_prompts(tokenizer, CHATS), tokenizer.pad_token_id)
    inherited = penalized.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=16)
    assert not torch.equal(inherited[:, ids.shape[1]:], hf.completion_ids[::2, :inherited.shape[1] - ids.shape[1]])


def test_completion_logprobs_equal_a_plain_forward_on_each_unpadded_row(standin):
    """The model in float64, so that a difference is a wrong position or mask, not rounding: in float32 this model's
    logits (tens) leave ~1e-5 between a padded batch and an unpadded row. (completion_logprobs returns float32.)"""
    model, tokenizer = standin
    model = copy.deepcopy(model).double()
    torch.manual_seed(1)
    r = sample_completions(model, tokenizer, CHATS, num_generations=2, max_completion_length=12)
    logp, _ = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    for i in range(len(logp)):
        prompt = r.prompt_ids[i][r.prompt_mask[i].bool()]
        completion = r.completion_ids[i][r.completion_mask[i].bool()]
        with torch.no_grad():
            logits = model(torch.cat([prompt, completion])[None]).logits[0]  # (P + T, V), no padding at all
        expected = logits[len(prompt) - 1:-1].log_softmax(-1).gather(1, completion[:, None])[:, 0]
        torch.testing.assert_close(logp[i, :len(completion)], expected.float(), atol=1e-5, rtol=0)
        assert (logp[i, len(completion):] == 0).all()


@pytest.mark.parametrize("adapter", [dict(), dict(load_in_4bit=True)], ids=["lora", "qlora"])
def test_lora_and_qlora_load_the_stand_in_and_sample_chats(chat_model_dir, adapter):
    if adapter:
        pytest.importorskip("bitsandbytes")
    cfg = Config(model_name_or_path=str(chat_model_dir), use_peft=True, lora_r=4, lora_alpha=8, **adapter)
    model, tokenizer = load_policy(cfg, chat_model_dir, torch.device("cpu"))
    assert is_quantized(model) == bool(adapter)
    torch.manual_seed(0)
    r = sample_completions(model, tokenizer, CHATS[:2], num_generations=2, max_completion_length=8)
    logp, _ = completion_logprobs(model, r.prompt_ids, r.prompt_mask, r.completion_ids, r.completion_mask)
    assert r.completion_ids.shape[0] == 4 and torch.isfinite(logp).all()


def test_save_policy_round_trips_full_and_lora(tmp_path, standin, chat_model_dir):
    model, tokenizer = standin
    ids = torch.tensor([encode_prompts(tokenizer, CHATS[:1])[0]])
    with torch.no_grad():
        before = model(ids).logits
    save_policy(model, tokenizer, tmp_path / "full")
    again, again_tok = load_model_and_tokenizer(tmp_path / "full")
    with torch.no_grad():
        assert torch.equal(again(ids).logits, before)
    assert again_tok.chat_template == tokenizer.chat_template and encode_prompts(again_tok, CHATS) == encode_prompts(
        tokenizer, CHATS)
    assert again.generation_config.eos_token_id == model.generation_config.eos_token_id

    lora = add_lora(load_model_and_tokenizer(chat_model_dir)[0], r=4, alpha=8, dropout=0.0)
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)  # B = 0 at the start; make the adapter change something
        with_adapter = lora(ids).logits
    adapter_dir, merged_dir = save_policy(lora, tokenizer, tmp_path / "lora", base_name_or_path=chat_model_dir)
    merged, merged_tok = load_model_and_tokenizer(merged_dir)
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, with_adapter, atol=1e-4, rtol=1e-4)
        assert not torch.allclose(merged(ids).logits, before, atol=1e-3)
    assert merged_tok.chat_template == tokenizer.chat_template
    assert (adapter_dir / "adapter_config.json").exists()
