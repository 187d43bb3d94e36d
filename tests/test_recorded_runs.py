"""Refactors must not move numbers: short runs of every loss type, every advantage estimator and the options
that change control flow, against metrics recorded once, with one thread, before the code was reorganised.

The recorded figures live in tests/data/recorded_runs.json. To record them again (only when a change is *meant*
to move numbers, and say so in the commit):

    OMP_NUM_THREADS=1 python tests/test_recorded_runs.py --record [case ...]

Each run is 3 steps of the shipped think_addition model (4 prompts x G=4), so the whole file takes about a
minute. Timings are not compared; everything else a step logs is, to 1e-6 relative (bit for bit where the order
of operations did not change).
"""

import json
import math
import sys
from pathlib import Path

import pytest
import torch

RECORDED = Path(__file__).parent / "data" / "recorded_runs.json"
BASE = dict(max_steps=3, num_generations=4, generation_batch_size=16, eval_steps=0, eval_limit=8, eval_num_samples=0,
            save_model=False, learning_rate=1e-4, log_completions=False)
TWO_REWARDS = dict(reward_funcs=["correctness", "format"])
OFF_POLICY = dict(num_iterations=2, steps_per_generation=2)

# name -> Config overrides; "ppo" runs train_ppo, "sft" train_sft
CASES = {
    "loss-grpo": {},
    "loss-bnpo": dict(loss_type="bnpo", **OFF_POLICY),
    "loss-dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none"),
    "loss-dapo": dict(loss_type="dapo", epsilon_high=0.28, **OFF_POLICY),
    "loss-luspo": dict(loss_type="luspo", importance_sampling_level="sequence"),
    "loss-cispo": dict(loss_type="cispo", **OFF_POLICY),
    "loss-sapo": dict(loss_type="sapo", **OFF_POLICY),
    "loss-gmpo": dict(loss_type="gmpo", **OFF_POLICY),
    "loss-vespo": dict(loss_type="vespo", **OFF_POLICY),
    "loss-gpg": dict(loss_type="gpg"),
    "loss-clip_cov": dict(loss_type="clip_cov", clip_cov_ratio=0.2, **OFF_POLICY),
    "loss-kl_cov": dict(loss_type="kl_cov", kl_cov_ratio=0.2, **OFF_POLICY),
    "level-sequence": dict(importance_sampling_level="sequence", **OFF_POLICY),
    "level-sequence_token": dict(importance_sampling_level="sequence_token", **OFF_POLICY),
    "grpo-delta-beta": dict(delta=1.5, beta=0.04, kl_estimator="k2", **OFF_POLICY),
    "grpo-kl_in_reward": dict(beta=0.04, kl_in_reward=True, kl_estimator="k1"),
    "grpo-bias_corrected_kl": dict(beta=0.04, use_bias_correction_kl=True, **OFF_POLICY),
    "grpo-off_policy_mask": dict(off_policy_mask_threshold=1e-4, **OFF_POLICY),
    "grpo-top_entropy": dict(top_entropy_quantile=0.2),
    "grpo-entropy_coef": dict(entropy_coef=0.01),
    "adv-rloo": dict(advantage_estimator="rloo", mask_truncated_completions=True),
    "adv-reinforce_plus_plus": dict(advantage_estimator="reinforce_plus_plus"),
    "adv-reinforce_plus_plus_baseline": dict(advantage_estimator="reinforce_plus_plus_baseline"),
    "adv-opo": dict(advantage_estimator="opo"),
    "adv-grpo_passk": dict(advantage_estimator="grpo_passk"),
    "adv-pass_at_k": dict(advantage_estimator="pass_at_k", pass_k=2),
    "adv-gpg": dict(advantage_estimator="gpg", loss_type="gpg"),
    "adv-population-batch": dict(std_type="population", scale_rewards="batch", **TWO_REWARDS,
                                 reward_weights=[1.0, 0.5]),
    "adv-gdpo": dict(multi_objective_aggregation="normalize_then_sum", **TWO_REWARDS),
    "adv-optimal_token_baseline": dict(advantage_estimator="optimal_token_baseline", **OFF_POLICY),
    "gfpo": dict(num_generations=8, generation_batch_size=32, num_remains_in_group=4, gfpo_filter="token_efficiency"),
    "dynamic_sampling": dict(loss_type="dapo", dynamic_sampling=True, max_dynamic_sampling_rounds=3),
    "overlong": dict(loss_type="dapo", reward_funcs=["correctness", "overlong"], overlong_buffer_len=8,
                     max_completion_length=24),
    "grad_accum-grpo": dict(gradient_accumulation_steps=4, **OFF_POLICY),
    "grad_accum-bnpo": dict(loss_type="bnpo", gradient_accumulation_steps=2),
    "lora": dict(use_peft=True, lora_r=4, beta=0.04),
    "sync_ref_model": dict(beta=0.04, sync_ref_model=True, ref_model_sync_steps=1),
    "ppo": {},
    "sft": dict(warmup_steps=2),
}
SFT_BATCH_SIZE = 16
TIMINGS = ("step_seconds", "generate_seconds", "tokens_per_second")


def run_case(name: str, out_dir: Path) -> dict:
    """Train one case; returns {"metrics": [one dict per step, timings left out], "summary": accuracies}."""
    from minigrpo.config import Config

    cfg = Config(output_dir=str(out_dir / name), **{**BASE, **CASES[name]})
    if name == "sft":
        from minigrpo.sft import train_sft

        summary = train_sft(cfg, batch_size=SFT_BATCH_SIZE, progress=False)
    elif name == "ppo":
        from minigrpo.ppo_trainer import train_ppo

        summary = train_ppo(cfg, progress=False)
    else:
        from minigrpo.trainer import train

        summary = train(cfg, progress=False)
    lines = [json.loads(x) for x in (out_dir / name / "metrics.jsonl").read_text().splitlines()]
    metrics = [{k: v for k, v in line.items() if k not in TIMINGS} for line in lines]
    return {"metrics": metrics, "summary": {k: summary[k] for k in ("accuracy_before", "accuracy_after")}}


def assert_close(recorded, now, where: str, rel: float = 1e-6) -> None:
    """Same structure and keys; floats within rel (relative, with an absolute floor of rel for values near 0)."""
    if isinstance(recorded, dict):
        assert isinstance(now, dict) and recorded.keys() == now.keys(), f"{where}: keys {set(recorded) ^ set(now)}"
        for key in recorded:
            assert_close(recorded[key], now[key], f"{where}.{key}", rel)
    elif isinstance(recorded, list):
        assert isinstance(now, list) and len(recorded) == len(now), f"{where}: length"
        for i, (a, b) in enumerate(zip(recorded, now)):
            assert_close(a, b, f"{where}[{i}]", rel)
    elif isinstance(recorded, float) and not isinstance(now, bool):
        assert isinstance(now, (int, float)), f"{where}: {now!r}"
        assert math.isclose(recorded, now, rel_tol=rel, abs_tol=rel), f"{where}: recorded {recorded!r}, now {now!r}"
    else:
        assert recorded == now, f"{where}: recorded {recorded!r}, now {now!r}"


@pytest.fixture(scope="module")
def recorded():
    return json.loads(RECORDED.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_run_reproduces_recorded_metrics(name, recorded, tmp_path, one_thread):
    assert_close(recorded[name], run_case(name, tmp_path), name)


def test_every_case_was_recorded(recorded):
    assert set(recorded) == set(CASES)


if __name__ == "__main__" and sys.argv[1:2] == ["--record"]:  # --record [name ...]: only those cases
    import tempfile

    torch.set_num_threads(1)
    names = sys.argv[2:] or list(CASES)
    figures = json.loads(RECORDED.read_text()) if RECORDED.exists() and sys.argv[2:] else {}
    with tempfile.TemporaryDirectory() as tmp:
        figures.update({name: run_case(name, Path(tmp)) for name in names})
    RECORDED.parent.mkdir(exist_ok=True)
    RECORDED.write_text(json.dumps(figures, indent=1) + "\n")
    print(f"recorded {len(names)} runs in {RECORDED}")
