"""decode_step.DecodeStep (the model's layers called directly) against HFDecodeStep (model(...) with HF's
DynamicCache): the same next-token logits to the bit, step after step, for every architecture DecodeStep claims,
with left padding, grouped-query attention, LoRA adapters and dropped rows; and what has_decode_step turns away."""

import pytest
import torch
from peft import LoraConfig, PromptTuningConfig, get_peft_model
from transformers import (
    AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, Qwen2Config,
    Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM,
)

from minigrpo.generation.decode_step import DecodeStep, HFDecodeStep, has_decode_step
from minigrpo.rollout import decode, prefill
from minigrpo.tasks import get_task

V = 40
SHAPE = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=128)


def build(cls, config_cls, **kw):
    torch.manual_seed(0)
    model = cls(config_cls(**{**SHAPE, **kw})).eval()
    model.config._attn_implementation = "sdpa"
    return model


MODELS = {
    "llama": lambda: build(LlamaForCausalLM, LlamaConfig, num_key_value_heads=4),
    "llama-gqa": lambda: build(LlamaForCausalLM, LlamaConfig, num_key_value_heads=2, head_dim=32),
    "qwen2": lambda: build(Qwen2ForCausalLM, Qwen2Config, num_key_value_heads=2),  # biases on q, k, v
    "qwen3": lambda: build(Qwen3ForCausalLM, Qwen3Config, num_key_value_heads=2, head_dim=16),  # q/k norms
}


def prompts(B=3, P=7):
    """Left-padded prompts of lengths P, P-3, 2."""
    torch.manual_seed(1)
    ids = torch.randint(3, V, (B, P))
    mask = torch.ones(B, P, dtype=torch.long)
    mask[1, :3] = 0
    mask[2, : P - 2] = 0
    return ids.masked_fill(mask == 0, 0), mask


def steps_logits(model, step_class, ids, mask, G=2, n_steps=6, drop_at=3):
    """Prefill as decode does, then feed a fixed token sequence; drop two rows at step drop_at."""
    V = model.config.vocab_size
    with torch.inference_mode():
        _, cache, mask = prefill(model, ids, mask, G)
        position = mask.sum(1, keepdim=True)
        step = step_class(model, cache, mask, n_steps)
        out, tokens = [], torch.arange(len(mask)) % (V - 3) + 3
        for t in range(n_steps):
            if t == drop_at:
                keep = torch.tensor([0, 2, 3, 5])
                step.keep(keep)
                tokens, position = tokens[keep], position[keep]
            out.append(step(tokens, position).clone())
            tokens, position = (tokens * 7 + t) % (V - 3) + 3, position + 1
    return out


@pytest.mark.parametrize("name", MODELS)
def test_decode_step_gives_hf_logits(name):
    model = MODELS[name]()
    assert has_decode_step(model)
    ids, mask = prompts()
    ours, hf = steps_logits(model, DecodeStep, ids, mask), steps_logits(model, HFDecodeStep, ids, mask)
    for a, b in zip(ours, hf):
        assert a.shape == b.shape
        assert torch.equal(a, b), (a - b).abs().max()


def test_decode_step_is_bit_exact_on_the_shipped_model():
    """Same modules, same ops, same order: with multi-head attention (no grouped keys) the logits are HF's
    to the last bit, so rollouts under a seed are the very same tokens as before."""
    task = get_task("think_addition")
    model = AutoModelForCausalLM.from_pretrained(task.model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
    enc = tokenizer([r["prompt"] for r in task.load("test")[:3]], padding=True, padding_side="left", return_tensors="pt")
    ours = steps_logits(model, DecodeStep, enc["input_ids"], enc["attention_mask"])
    hf = steps_logits(model, HFDecodeStep, enc["input_ids"], enc["attention_mask"])
    assert all(torch.equal(a, b) for a, b in zip(ours, hf))


def test_decode_step_with_lora_adapter_on_and_off():
    """The modules are called, not their weights read: a LoRA adapter (B != 0) counts, and disable_adapter()
    turns it off for both steps alike."""
    model = get_peft_model(MODELS["llama"](), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "down_proj"]))
    for module in model.modules():
        if hasattr(module, "lora_B"):
            torch.nn.init.normal_(module.lora_B["default"].weight, std=0.5)
    model.eval()
    assert has_decode_step(model)
    ids, mask = prompts()
    with_adapter = steps_logits(model, DecodeStep, ids, mask)
    assert all(torch.equal(a, b) for a, b in zip(with_adapter, steps_logits(model, HFDecodeStep, ids, mask)))
    with model.disable_adapter():
        without = steps_logits(model, DecodeStep, ids, mask)
        assert all(torch.equal(a, b) for a, b in zip(without, steps_logits(model, HFDecodeStep, ids, mask)))
    assert (with_adapter[0] - without[0]).abs().max() > 1e-2  # the adapter did change the logits


def test_decode_uses_the_step_for_known_architectures_and_hf_for_the_rest():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval()
    sliding = build(Qwen2ForCausalLM, Qwen2Config, num_key_value_heads=2, use_sliding_window=True, sliding_window=4,
                    max_window_layers=0)
    eager = MODELS["llama"]()
    eager.config._attn_implementation = "eager"  # the same math, rounded otherwise
    prompt_tuned = get_peft_model(MODELS["llama"](), PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=2))
    remote_code_class = type("LlamaForCausalLM", (LlamaForCausalLM,), {})  # a familiar name, defined elsewhere
    assert remote_code_class.__module__ == __name__
    lookalike = remote_code_class(MODELS["llama"]().config)
    for model in (gpt2, sliding, eager, prompt_tuned, lookalike):
        assert not has_decode_step(model)
    ids, mask = prompts()
    kw = dict(num_generations=2, max_new_tokens=8, temperature=1.0, top_p=1.0, do_sample=False, eos_ids=[2], pad_id=0)
    for model in (gpt2, MODELS["qwen2"]()):  # the fallback and the written-out step give greedy tokens alike
        assert torch.equal(decode(model, ids, mask, **kw), decode(model, ids, mask, decode_step="hf", **kw))
    with pytest.raises(ValueError, match="decode_step must be"):
        decode(gpt2, ids, mask, decode_step="fast", **kw)
