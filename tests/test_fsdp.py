"""Sharded training (FSDP2, `fsdp="full_shard"`) and replicated training (DistributedDataParallel) on 2 CPU
processes over gloo, under `torchrun` and `accelerate launch`.

The lesson: sharding changes where the numbers live, not what they are. Each process holds half of the
parameters and of AdamW's moments, gathers a block's weights only while it computes with them, and still takes
the optimizer step a single process takes on the whole batch: its metrics and its final weights match the
one-process run's to float rounding, for full fine-tuning and LoRA, for a token-sum loss (dapo, normalised by the
global token count) and a sequence-mean one (grpo).
"""

import json
import math
from pathlib import Path

import pytest
import torch
from test_distributed import ACCELERATE, launch, metrics, run_one_process

from minigrpo.config import Config, ConfigError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "distributed_run.py")
LORA = ["use_peft=true", "lora_dropout=0"]  # dropout draws from each process's own RNG: off, to compare


def held(run: Path, processes: int) -> list[dict]:
    """Each process's shard-RANK.json (distributed_run.py): elements held, output-head calls."""
    return [json.loads((run / f"shard-{r}.json").read_text()) for r in range(processes)]


def trained_weights(run: Path, lora: bool) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(run / "model" / ("adapter_model.safetensors" if lora else "model.safetensors"))


@pytest.fixture(scope="module")
def one_process_runs(tmp_path_factory):
    """The one-process run of each (settings), in this process: made once, compared with several engines."""
    runs = {}

    def run(loss_type: str, settings: tuple[str, ...]) -> Path:
        key = (loss_type, settings)
        if key not in runs:
            runs[key] = tmp_path_factory.mktemp("one") / "run"
            run_one_process(runs[key], loss_type, *settings)
        return runs[key]

    return run


def assert_same_run(one: Path, two: Path, lora: bool) -> None:
    a, b = metrics(one), metrics(two)
    assert [r["step"] for r in b] == [r["step"] for r in a], "rank 0 alone writes one line per step"
    for x, y in zip(a, b):
        assert x["advantages"] == pytest.approx(y["advantages"], abs=1e-4)  # same completions, same order
        for key in ("reward", "reward_std", "completions/mean_length"):
            assert x[key] == pytest.approx(y[key], abs=1e-6), key
        for key in ("loss", "grad_norm", "entropy"):  # the global loss, the averaged gradient, a token mean
            assert x[key] == pytest.approx(y[key], rel=1e-4, abs=1e-6), key
        assert x["grad_norm"] > 0
    w1, w2 = trained_weights(one, lora), trained_weights(two, lora)
    assert w1.keys() == w2.keys()
    for name in w1:  # AdamW moves a weight by ~lr = 1e-3 a step even where its gradient is ~0 and only rounding
        torch.testing.assert_close(w2[name], w1[name], rtol=1e-4, atol=1e-4, msg=name)  # differs: 1/10 of a step


@pytest.mark.parametrize("fsdp, lora, loss_type, launcher, extra", [
    ("full_shard", False, "dapo", "torchrun", ()),
    ("full_shard", False, "grpo", "accelerate", ()),
    ("full_shard", True, "dapo", "accelerate", ()),
    ("full_shard", True, "grpo", "torchrun", ()),
    ("", False, "grpo", "torchrun", ()),  # DDP; dapo and bnpo under accelerate: test_distributed.py
    ("", True, "dapo", "torchrun", ("gradient_accumulation_steps=2",)),  # DDP's no_sync on the first micro-batch
    ("", True, "grpo", "accelerate", ("load_in_4bit=true",)),  # QLoRA: DDP only (fsdp refuses 4-bit weights)
], ids=lambda value: {"full_shard": "fsdp", "": "ddp", True: "lora", False: "full"}.get(value, None)
    if not isinstance(value, tuple) else "+".join(value) or "defaults")
def test_two_processes_match_one(tmp_path, one_thread, one_process_runs, fsdp, lora, loss_type, launcher, extra):
    if launcher == "accelerate" and ACCELERATE is None:
        pytest.skip("accelerate is not installed")
    settings = (*(LORA if lora else []), *extra)
    one = one_process_runs(loss_type, settings)
    two = tmp_path / "two"
    launch([SCRIPT, str(two), loss_type, *settings, *([f"fsdp={fsdp}"] if fsdp else [])], one_thread,
           processes=2, launcher=launcher)
    assert_same_run(one, two, lora)

    # What each process holds, counted (a sharded tensor: its local shard): half of everything, or all of it.
    whole, ranks = held(one, 1)[0], held(two, 2)
    for key in ("params", "optimizer_state"):
        if fsdp:
            assert sum(r[key] for r in ranks) == whole[key], key
            assert all(abs(r[key] - whole[key] / 2) <= 0.01 * whole[key] for r in ranks), (key, ranks)
        else:
            assert all(r[key] == whole[key] for r in ranks), key
    assert all(r["head_calls"] > 0 for r in ranks), "the output head ran in blocks (logprobs.head_logprobs)"

    # The saved model is one ordinary folder: it loads, and computes what the one-process model computes.
    from minigrpo.loading.models import load_model

    ids = torch.tensor([[1, 5, 6, 7]])
    with torch.no_grad():
        logits = [load_model(run / "model")(input_ids=ids).logits for run in (one, two)]
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-4, atol=1e-4)


def test_one_pass_log_probs_equal_the_length_grouped_ones(random_model_dir):
    """Under FSDP2 the log-probs take one decoder call for the whole micro-batch (ShardedLogprobForward): the same
    numbers and gradients as logprobs.py's length groups and shared prompts, with the head still in blocks."""
    from minigrpo.logprobs import completion_logprobs
    from minigrpo.loading.models import load_model

    model = load_model(random_model_dir)
    torch.manual_seed(0)
    prompt_ids = torch.randint(3, 17, (4, 5)).repeat_interleave(2, dim=0)  # 4 prompts, 2 completions each
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[:2, :2] = 0  # a left-padded prompt
    completion_ids = torch.randint(3, 17, (8, 6))
    completion_mask = (torch.arange(6) < torch.tensor([1, 6, 2, 5, 3, 4, 6, 2]).unsqueeze(1)).float()  # (8, 6)
    ids = (prompt_ids, prompt_mask, completion_ids, completion_mask)
    results = []
    for one_pass in (False, True):
        model.zero_grad()
        logp, entropy = completion_logprobs(model, *ids, with_entropy=True, one_pass=one_pass)
        logp.sum().backward()
        results.append((logp, entropy, [p.grad.clone() for p in model.parameters()]))
    (logp, entropy, grads), (logp1, entropy1, grads1) = results
    torch.testing.assert_close(logp1, logp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy1, entropy, rtol=1e-5, atol=1e-5)
    for g1, g in zip(grads1, grads):
        torch.testing.assert_close(g1, g, rtol=1e-4, atol=1e-5)
    assert (logp1[completion_mask == 0] == 0).all()


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_sharded_reference_accumulation_and_checkpointing(tmp_path, one_thread, one_process_runs, lora):
    """The rest of what trains under FSDP2: the KL term's reference (a sharded copy that follows the policy every
    step, sync_ref_model; with LoRA the adapter switched off), old log-probs (num_iterations 2), gradient
    accumulation and activation checkpointing, one process vs two."""
    reference = LORA if lora else ["sync_ref_model=true", "ref_model_sync_steps=1"]
    settings = (*reference, "beta=0.05", "num_iterations=2", "gradient_accumulation_steps=2")
    one = one_process_runs("bnpo", (*settings, "gradient_checkpointing=true"))
    two = tmp_path / "two"
    launch([SCRIPT, str(two), "bnpo", *settings, "fsdp=full_shard", 'fsdp_config={"activation_checkpointing": true}'],
           one_thread, processes=2, launcher="torchrun")
    assert_same_run(one, two, lora)
    assert all(row["kl"] > 0 for row in metrics(two)[1:]), "the reference took part"


def test_mixed_precision_offload_and_kept_blocks_train(tmp_path, one_thread):
    """fsdp_config's other switches and bf16 (FSDP2's MixedPrecisionPolicy: bfloat16 compute, float32 gradient
    reduction) train: finite steps, each process holding half."""
    run = tmp_path / "run"
    launch([SCRIPT, str(run), "dapo", "fsdp=full_shard", "bf16=true",
            'fsdp_config={"cpu_offload": true, "reshard_after_forward": false}'], one_thread, processes=2,
           launcher="torchrun")
    assert all(math.isfinite(row["loss"]) and row["grad_norm"] > 0 for row in metrics(run))
    ranks = held(run, 2)
    assert ranks[0]["params"] == ranks[1]["params"] > 0


def test_fp16_an_overflow_in_one_shard_skips_the_step_on_every_process(tmp_path, one_thread):
    """fp16 under FSDP2 (MixedPrecisionPolicy in float16, the loss scaled): at step 2 process 0 alone finds inf in
    its shard of the gradient. Both processes skip that step (their AdamW took 2 of 3 steps), count it and halve
    the scale: sharded weights that skipped on one process only would no longer be one model."""
    run = tmp_path / "run"
    launch([SCRIPT, str(run), "grpo", "fsdp=full_shard", "fp16=true", "plant_overflow_step=2"], one_thread,
           processes=2, launcher="torchrun")
    lines = metrics(run)
    assert [row["grad_scaler/skipped_steps"] for row in lines] == [0, 1, 0]
    assert [row["grad_scaler/scale"] for row in lines] == [2.0**16, 2.0**15, 2.0**15]
    assert [rank["optimizer_steps"] for rank in held(run, 2)] == [2, 2]
    assert lines[1]["grad_norm"] is None and all(math.isfinite(row["loss"]) for row in lines)


def test_ppo_refuses_fsdp():
    from minigrpo.ppo_trainer import train_ppo

    with pytest.raises(ConfigError, match="fsdp: not supported by train_ppo"):
        train_ppo(Config(fsdp="full_shard"), progress=False)


@pytest.mark.parametrize("settings, message", [
    (dict(fsdp="shard"), "fsdp: 'shard' is not one of"),
    (dict(fsdp="full_shard", fsdp_config={"offload": True}), "fsdp_config: 'offload' is not one of cpu_offload"),
    (dict(fsdp="full_shard", fsdp_config={"cpu_offload": "yes"}), "fsdp_config: cpu_offload must be true or false"),
    (dict(fsdp_config={"cpu_offload": True}), "fsdp_config: set fsdp full_shard too"),
    (dict(fsdp="full_shard", use_vllm=True), "fsdp: not with use_vllm"),
    (dict(fsdp="full_shard", use_peft=True, load_in_4bit=True), "fsdp: not with load_in_4bit"),
])
def test_sharding_settings_are_checked(settings, message):
    with pytest.raises(ConfigError, match=message) as error:
        Config(**settings)
    assert "\n" not in str(error.value)


# ---------------------------------------------------------------------------------------------------------
# Memory per GPU: computed (memory_sharded.sharded_floor), and measured on the CPU
# ---------------------------------------------------------------------------------------------------------
def qwen_run(**settings) -> Config:
    return Config(model_name_or_path="Qwen/Qwen2.5-0.5B-Instruct", max_completion_length=256, num_generations=8,
                  generation_batch_size=64, **settings)


def test_sharding_divides_weights_gradients_and_moments():
    from minigrpo.lab.memory import qwen_config
    from minigrpo.lab.memory_sharded import root_and_block_params, sharded_floor

    one, ddp, fsdp = (sharded_floor(qwen_run(), W, sharded) for W, sharded in ((1, False), (2, False), (2, True)))
    for key in ("weights", "gradients", "optimizer"):
        assert ddp[key] == one[key] and fsdp[key] == one[key] // 2, key  # each holds all, or half
    assert ddp["ddp_buckets"] == one["gradients"] and fsdp["ddp_buckets"] == 0
    total, root, block = root_and_block_params(qwen_config("qwen2.5-0.5b"))
    assert fsdp["gathered"] == (root + 2 * block) * 4  # the root and two blocks, float32
    assert fsdp["sampling"] == total * 4 + fsdp["weights"] + fsdp["gradients"] + fsdp["optimizer"]
    assert fsdp["activations"] < one["activations"]  # half the batch per process
    eight = sharded_floor(qwen_run(), 8, True)
    assert eight["floor"] < fsdp["floor"] < one["floor"]
    with pytest.raises(ConfigError, match="num_processes: 8 prompts per step cannot be split"):
        sharded_floor(qwen_run(), 3, True)


def test_fit_table_names_every_run():
    from minigrpo.lab.memory_sharded import FIT_RUNS, fit_table

    table = fit_table()
    assert all(name in table for name in FIT_RUNS) and "8 x 24 GB FSDP2" in table


def test_memory_measured_one_process_against_two(tmp_path, one_thread):
    """The side-by-side measurement, on the shipped tiny model: each of the 2 processes holds half the parameters
    and half of AdamW's moments, counted on its shards."""
    from minigrpo.lab.memory_sharded import measure_side_by_side

    one, *two = measure_side_by_side("tiny", 2, workdir=tmp_path, batch_size=16, num_generations=8,
                                     prompt_length=8, completion_length=8)
    assert [r["world_size"] for r in (one, *two)] == [1, 2, 2]
    for key in ("params_held", "optimizer_state_held"):
        assert sum(r[key] for r in two) == one[key] and all(r[key] <= one[key] / 2 + 1024 for r in two), key
    assert all(r["step_peak_bytes"] > 0 for r in (one, *two))


def test_memory_command_prints_each_gpus_share(capsys):
    from minigrpo.lab.memory_cli import main

    recipe = str(ROOT / "recipes" / "qwen2.5-0.5b-instruct_gsm8k_full.yaml")
    assert main(["--recipe", recipe, "--num-processes", "8", "--fsdp"]) == 0
    out = capsys.readouterr().out
    assert "on 8 process(es), FSDP2" in out and "| **per GPU** |" in out and "not measured on any GPU" in out
