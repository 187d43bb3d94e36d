"""`minigrpo memory`: the Qwen2.5 shapes are the real sizes, the ratio is computed right, the command runs."""

import json

import pytest
import torch

from minigrpo.cli import main
from minigrpo.lab.memory import SETUPS, format_table, grpo_ppo_ratio, measure_setup, qwen_config, shape_dir


@pytest.mark.parametrize("shape, params", [("qwen2.5-0.5b", 494_032_768), ("qwen2.5-1.5b", 1_543_714_304)])
def test_qwen_shapes_have_the_published_parameter_counts(shape, params):
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):  # shapes only, no memory
        model = AutoModelForCausalLM.from_config(qwen_config(shape))
    assert sum(p.numel() for p in model.parameters()) == params


def test_ratio_uses_memory_above_the_baseline_on_cpu_and_the_peak_on_cuda():
    mib = 2**20
    results = [
        {"setup": "grpo-full", "trainable_params": 10, "total_params": 10, "peak_bytes": 460 * mib,
         "baseline_bytes": 400 * mib, "seconds": 1.0},
        {"setup": "ppo-critic", "trainable_params": 20, "total_params": 20, "peak_bytes": 500 * mib,
         "baseline_bytes": 400 * mib, "seconds": 2.0},
    ]
    assert grpo_ppo_ratio(results, "cpu") == pytest.approx(0.6)
    assert grpo_ppo_ratio(results, "cuda") == pytest.approx(460 / 500)
    assert "GRPO/PPO memory ratio: 0.60" in format_table(results, "cpu")
    assert grpo_ppo_ratio(results[:1], "cpu") is None


TINY_STEP = dict(device="cpu", batch_size=4, num_generations=2, prompt_length=8, completion_length=8, lora_r=4)


def test_memory_command_runs_each_setup_in_its_own_process_and_prints_the_ratio(tmp_path, capsys):
    """The command end to end on the tiny model; two setups keep it quick (each process imports torch anew)."""
    out = tmp_path / "memory.json"
    args = ["memory", "--shape", "tiny", "--setups", "grpo-full,ppo-critic", "--device", "cpu", "--batch-size", "4",
            "--num-generations", "2", "--prompt-length", "8", "--completion-length", "8", "--json", str(out)]
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert SETUPS["grpo-full"] in printed and SETUPS["ppo-critic"] in printed
    assert "GRPO/PPO memory ratio: " in printed
    results = {r["setup"]: r for r in json.loads(out.read_text())["results"]}
    assert all(r["peak_bytes"] >= r["baseline_bytes"] > 0 for r in results.values())
    full, ppo = results["grpo-full"], results["ppo-critic"]
    assert full["trainable_params"] == full["total_params"]
    assert ppo["total_params"] > 1.9 * full["total_params"]  # a critic the size of the policy


@pytest.mark.parametrize("setup", ["grpo-lora", "grpo-qlora"])
def test_lora_setups_train_only_the_adapter(setup):
    model_dir = str(shape_dir("tiny", "unused"))
    full = measure_setup("grpo-full", model_dir, **TINY_STEP)
    result = measure_setup(setup, model_dir, **TINY_STEP)
    assert result["total_params"] > full["total_params"]  # base + adapter
    assert 0 < result["trainable_params"] < full["total_params"] / 5


def test_static_estimate_counts_what_peft_trains_and_what_the_step_holds():
    """The meta-device count agrees with peft and with the measured setups; the bytes follow the formula."""
    from minigrpo.lab.memory import NF4_BITS, estimate_static_bytes, shape_config
    from minigrpo.loading.models import add_lora, load_model, parameter_counts
    from minigrpo.ppo_critic import ValueModel
    from minigrpo.tasks import get_task

    estimate = estimate_static_bytes(shape_config("tiny"), lora_r=4)
    model = load_model(get_task("think_addition").model_dir)
    p = sum(t.numel() for t in model.parameters())
    critic = sum(t.numel() for t in ValueModel(model).parameters())
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not model.lm_head]
    linear = sum(m.weight.numel() for m in linears)
    lora_trainable, lora_total = parameter_counts(add_lora(model, r=4))
    lora_counts = (estimate["grpo-lora"]["trainable_params"], estimate["grpo-lora"]["total_params"])
    assert lora_counts == (lora_trainable, lora_total)
    full, lora, qlora, ppo = (estimate[s] for s in ("grpo-full", "grpo-lora", "grpo-qlora", "ppo-critic"))
    assert full["total"] == 16 * p  # float32 weights, gradients, two moments: 4 + 4 + 8 bytes a parameter
    assert ppo["trainable_params"] == p + critic and ppo["total"] == 16 * (p + critic)
    assert lora["gradients"] == 4 * lora_trainable and lora["optimizer"] == 8 * lora_trainable
    # QLoRA stores the block linears (q, k, v, o, gate, up, down; not the head) in 4.127 bits instead of 32.
    assert qlora["weights"] == pytest.approx(lora["weights"] - linear * (4 - NF4_BITS[True] / 8))
    assert NF4_BITS[True] == pytest.approx(4.127, abs=1e-3)  # the QLoRA paper's figure


def test_peft_keeps_the_adapter_and_a_4_bit_bases_other_weights_in_float32():
    """What `recipe_floor` counts in 4 bytes whatever the recipe's dtype, seen on a loaded model: LoRA's A and B
    (peft's autocast_adapter_dtype), and with a 4-bit base every weight bitsandbytes leaves unquantized (peft's
    prepare_model_for_kbit_training casts them)."""
    from minigrpo.loading.models import add_lora, load_model
    from minigrpo.tasks import get_task

    model_dir = get_task("think_addition").model_dir
    for load_in_4bit in (False, True):
        model = add_lora(load_model(model_dir, dtype="bfloat16", load_in_4bit=load_in_4bit), r=4, alpha=8)
        adapter = [p for name, p in model.named_parameters() if "lora_" in name]
        assert adapter and all(p.dtype == torch.float32 and p.requires_grad for p in adapter)
        others = {p.dtype for name, p in model.named_parameters() if "lora_" not in name}
        assert others == ({torch.uint8, torch.float32} if load_in_4bit else {torch.bfloat16}), others
