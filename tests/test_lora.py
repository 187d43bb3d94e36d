"""LoRA and QLoRA: real bitsandbytes 4-bit layers on the CPU, the adapter-off reference, saving round-trips."""

import json
import warnings

import pytest
import torch

from minigrpo.config import Config, ConfigError
from minigrpo.loading.models import (AdapterDisabled, add_lora, is_quantized, load_model, load_tokenizer, parameter_counts,
                             reference_policy, save_policy)
from minigrpo.run import load_policy
from minigrpo.trainer import train

bnb = pytest.importorskip("bitsandbytes")
from peft import PeftModel  # noqa: E402

SMALL = dict(max_steps=2, num_generations=4, generation_batch_size=16, eval_steps=0, eval_limit=4, max_completion_length=8,
             eval_num_samples=2, learning_rate=1e-2)


def always_half(prompts, completions, **row):
    return [float(i % 2) for i in range(len(completions))]


def some_ids(n=3, length=10):
    torch.manual_seed(1)
    return torch.randint(3, 17, (n, length))


def perturb_adapter(model):
    """LoRA starts with B = 0 (the adapter changes nothing); give B values so the adapter is visible."""
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)


def logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_qlora_grpo_trains_the_tiny_model_on_cpu(tmp_path, random_model_dir):
    cfg = Config(model_name_or_path=str(random_model_dir), output_dir=str(tmp_path / "run"), use_peft=True,
                 load_in_4bit=True, use_bnb_nested_quant=True, lora_r=4, lora_alpha=8, beta=0.04, **SMALL)
    summary = train(cfg, reward_funcs=[always_half], progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(line["loss"] == line["loss"] for line in lines)
    assert lines[0]["kl"] == 0.0  # B = 0 at the start: policy and adapter-off reference are the same model
    assert lines[1]["kl"] > 0.0  # one optimizer step later the adapter has moved the policy away from the base
    assert summary["quantized"] is True
    assert 0 < summary["trainable_params"] < summary["total_params"] / 2
    assert summary["peak_memory_bytes"] > 0
    saved = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert {"quantized", "trainable_params", "total_params", "peak_memory_bytes"} <= saved.keys()
    adapter = tmp_path / "run" / "model"
    assert (adapter / "adapter_config.json").exists() and (adapter / "adapter_model.safetensors").exists()
    from safetensors.torch import load_file

    lora_B = [t for k, t in load_file(adapter / "adapter_model.safetensors").items() if "lora_B" in k]
    assert lora_B and all(t.abs().sum() > 0 for t in lora_B)  # trained: B left zero
    assert (tmp_path / "run" / "model_merged" / "model.safetensors").exists()


def test_qlora_layers_are_real_linear4bit_and_only_the_adapter_gets_gradients(random_model_dir):
    cfg = Config(model_name_or_path=str(random_model_dir), use_peft=True, load_in_4bit=True, lora_r=4)
    model, _ = load_policy(cfg, random_model_dir, torch.device("cpu"))
    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    assert len(layers) == 7  # q, k, v, o, gate, up, down of the one block
    assert all(layer.weight.dtype == torch.uint8 and layer.weight.quant_type == "nf4" for layer in layers)
    assert is_quantized(model)
    model(input_ids=some_ids(), labels=some_ids()).loss.backward()
    grads = {name: p.grad for name, p in model.named_parameters() if p.grad is not None}
    assert grads and all("lora_" in name for name in grads)
    # At the start B = 0, so dL/dA = (alpha/r) B^T (...) = 0 and only B moves on the first step.
    assert all(g.abs().sum() == 0 for name, g in grads.items() if "lora_A" in name)
    assert all(g.abs().sum() > 0 for name, g in grads.items() if "lora_B" in name)


def test_qlora_gradients_are_the_same_after_an_eval_mode_forward(random_model_dir):
    """A rollout runs the policy in eval mode; on a CPU with AVX512-BF16, bitsandbytes then switches the 4-bit
    layers to an inference kernel with no backward, which silently dropped the gradient through the frozen base
    (models.load_model turns that switch off). Same batch, same adapter: the same gradients either way."""
    def adapter_gradients(eval_first: bool):
        torch.manual_seed(0)
        model, tokenizer = load_policy(Config(use_peft=True, load_in_4bit=True), random_model_dir, torch.device("cpu"))
        ids = tokenizer(["3471+586=<think>"], return_tensors="pt")["input_ids"]
        if eval_first:
            model.eval()
            with torch.no_grad():
                model(ids)
        model.train()
        model(ids).logits.square().mean().backward()
        return [p.grad.clone() for p in model.parameters() if p.requires_grad]

    for without, with_eval in zip(adapter_gradients(False), adapter_gradients(True), strict=True):
        torch.testing.assert_close(with_eval, without)


def test_lora_reference_is_the_base_with_the_adapter_off(random_model_dir):
    model = add_lora(load_model(random_model_dir), r=4)
    ref = reference_policy(model)
    assert isinstance(ref, AdapterDisabled) and ref.peft_model is model  # no second copy of the weights
    perturb_adapter(model)
    ids = some_ids()
    base = load_model(random_model_dir)
    assert torch.allclose(logits(ref, ids), logits(base, ids), atol=1e-6)
    assert not torch.allclose(logits(model, ids), logits(base, ids), atol=1e-3)  # the adapter is back on after


def test_full_model_reference_is_a_frozen_copy(random_model_dir):
    model = load_model(random_model_dir)
    ref = reference_policy(model)
    assert ref is not model and not any(p.requires_grad for p in ref.parameters())
    trainable, total = parameter_counts(model)
    assert trainable == total > 0 and not is_quantized(model)


def test_lora_adapter_and_merged_model_round_trip(tmp_path, random_model_dir):
    model = add_lora(load_model(random_model_dir), r=4, dropout=0.0)
    perturb_adapter(model)
    model.eval()
    written = save_policy(model, load_tokenizer(random_model_dir), tmp_path / "model", base_name_or_path=random_model_dir)
    assert written == [tmp_path / "model", tmp_path / "model_merged"]
    assert (tmp_path / "model" / "adapter_config.json").exists()
    ids = some_ids()
    expected = logits(model, ids)
    reloaded = PeftModel.from_pretrained(load_model(random_model_dir), tmp_path / "model")
    assert torch.allclose(logits(reloaded, ids), expected, atol=1e-5)
    merged = load_model(tmp_path / "model_merged")
    assert not is_quantized(merged) and not hasattr(merged, "peft_config")
    assert torch.allclose(logits(merged, ids), expected, atol=1e-4)


def test_qlora_adapter_round_trips_onto_a_4bit_base_and_merges_onto_the_float_base(tmp_path, random_model_dir):
    quant = dict(load_in_4bit=True, use_bnb_nested_quant=True)
    model = add_lora(load_model(random_model_dir, **quant), r=4, dropout=0.0)
    perturb_adapter(model)
    model.eval()
    save_policy(model, load_tokenizer(random_model_dir), tmp_path / "model", base_name_or_path=random_model_dir)
    ids = some_ids()
    reloaded = PeftModel.from_pretrained(load_model(random_model_dir, **quant), tmp_path / "model")
    assert torch.allclose(logits(reloaded, ids), logits(model, ids), atol=1e-5)  # same 4-bit base, same adapter
    # The merged model is the float base + the adapter: equal to that, and near (not equal to) the 4-bit policy.
    float_with_adapter = PeftModel.from_pretrained(load_model(random_model_dir), tmp_path / "model")
    merged = load_model(tmp_path / "model_merged")
    assert torch.allclose(logits(merged, ids), logits(float_with_adapter, ids), atol=1e-4)
    assert not torch.equal(logits(merged, ids), logits(model, ids))


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"load_in_4bit": True}, "load_in_4bit: .* add use_peft"),
        ({"use_peft": True, "lora_r": 0}, "lora_r: must be >= 1"),
        ({"use_peft": True, "lora_dropout": 1.0}, "lora_dropout: must be in"),
        ({"bnb_4bit_quant_type": "int4"}, "bnb_4bit_quant_type: 'int4' is not one of"),
        ({"dtype": "float64"}, "dtype: 'float64' is not one of"),
    ],
)
def test_bad_lora_config_names_the_field(overrides, match):
    with pytest.raises(ConfigError, match=match):
        Config(**overrides)


def test_trl_model_config_names():
    trl = pytest.importorskip("trl")
    names = {"use_peft", "lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "load_in_4bit",
             "bnb_4bit_quant_type", "use_bnb_nested_quant", "dtype"}
    import dataclasses

    assert names <= {f.name for f in dataclasses.fields(trl.ModelConfig)}
    assert names <= {f.name for f in dataclasses.fields(Config)}
    assert "use_vllm" in {f.name for f in dataclasses.fields(trl.GRPOConfig)}


def test_training_continues_from_a_saved_adapter(tmp_path, random_model_dir):
    """--model RUN/model (a LoRA adapter) with use_peft continues that adapter on its base; without use_peft it is
    refused in one line (was: transformers' "does not require grad" traceback at the first backward)."""
    first = train(Config(model_name_or_path=str(random_model_dir), output_dir=str(tmp_path / "a"), use_peft=True,
                         lora_r=4, **SMALL), reward_funcs=[always_half], progress=False)
    adapter = tmp_path / "a" / "model"
    with pytest.raises(ConfigError, match=r"model_name_or_path: .* is a LoRA adapter \(on .*\); continue training it "
                                          r"with use_peft"):
        load_policy(Config(model_name_or_path=str(adapter)), str(adapter), torch.device("cpu"))
    model, _ = load_policy(Config(use_peft=True), str(adapter), torch.device("cpu"))
    saved = PeftModel.from_pretrained(load_model(random_model_dir), str(adapter))
    assert parameter_counts(model)[0] > 0  # the adapter is trainable again
    model.eval()  # (LoRA dropout)
    assert torch.equal(logits(model, some_ids()), logits(saved, some_ids()))  # ... and it starts where it stopped
    second = train(Config(model_name_or_path=str(adapter), output_dir=str(tmp_path / "b"), use_peft=True, **SMALL),
                   reward_funcs=[always_half], progress=False)
    assert second["eval_before"]["accuracy_greedy"] == first["eval_after"]["accuracy_greedy"]
    assert (tmp_path / "b" / "model_merged" / "config.json").exists()  # merged onto the adapter's base, once


def test_wrapping_a_model_in_lora_prints_no_deprecation_note(random_model_dir):
    # peft asks transformers for a deprecated name whenever it wraps a model; a user's LoRA run must not show it
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        add_lora(load_model(random_model_dir), r=4)
    assert not [w for w in caught if issubclass(w.category, (FutureWarning, DeprecationWarning))], \
        [str(w.message) for w in caught]
