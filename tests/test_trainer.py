"""The training loop on a very small config: every option runs, nothing is NaN, same seed -> same metrics."""

import json

import pytest

from minigrpo.config import Config
from minigrpo.rewards import RewardError
from minigrpo.trainer import train

SMALL = dict(max_steps=2, num_generations=4, generation_batch_size=16, eval_steps=1, eval_num_problems=8,
             eval_num_samples=2, eval_limit=16, save_model=False, learning_rate=1e-3)
REQUIRED_KEYS = {"step", "loss", "reward", "reward_std", "frac_reward_zero_std", "completions/mean_length",
                 "clip_ratio/region_mean", "kl", "entropy", "step_seconds"}


def run(tmp_path, model_dir, name="run", funcs=None, **overrides):
    cfg = Config(model_name_or_path=str(model_dir), output_dir=str(tmp_path / name), **{**SMALL, **overrides})
    summary = train(cfg, reward_funcs=funcs, progress=False)
    lines = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return summary, lines


def always_half(prompts, completions, **row):
    """Rewards 1 for every other completion: groups always have non-zero std, so the loss is non-trivial."""
    return [float(i % 2) for i in range(len(completions))]


@pytest.mark.run_plots  # reads plots/
@pytest.mark.parametrize(
    "overrides",
    [
        dict(loss_type="grpo"),
        dict(loss_type="bnpo"),
        dict(loss_type="dr_grpo", scale_rewards="none"),
        dict(loss_type="dapo", epsilon_high=0.28, dynamic_sampling=True),
        dict(loss_type="cispo", epsilon_high=5.0),
        dict(loss_type="sapo"),
        dict(loss_type="gmpo"),
        dict(loss_type="grpo", importance_sampling_level="sequence"),
        dict(loss_type="grpo", importance_sampling_level="sequence_token"),
        dict(loss_type="grpo", beta=0.04, num_iterations=2, steps_per_generation=2, delta=1.5),
        dict(loss_type="grpo", beta=0.04, kl_in_reward=True, kl_estimator="k1"),
        dict(loss_type="grpo", advantage_estimator="rloo", mask_truncated_completions=True),
    ],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()),
)
def test_every_option_trains_without_nan(tmp_path, random_model_dir, overrides):
    summary, lines = run(tmp_path, random_model_dir, funcs=[always_half], **overrides)
    assert len(lines) == 2
    for line in lines:
        assert REQUIRED_KEYS <= line.keys()
        for key, value in line.items():
            if isinstance(value, float):
                assert value == value, f"{key} is NaN"  # noqa: PLR0124
    assert lines[0]["frac_reward_zero_std"] == 0.0
    assert summary["steps"] == 2 and 0.0 <= summary["accuracy_after"] <= 1.0
    if overrides.get("beta") and not overrides.get("kl_in_reward"):
        assert lines[-1]["kl"] is not None
    assert (tmp_path / "run" / "plots" / "reward.png").exists()


def test_shipped_rewards_run_by_name(tmp_path, random_model_dir):
    _, lines = run(tmp_path, random_model_dir,
                   **{"reward_funcs": ["correctness", "format", "overlong", "random"], "reward_weights": [1, 0.1, 1, 0]})
    assert {"rewards/correctness_reward/mean", "rewards/overlong/mean"} <= lines[0].keys()


def test_same_seed_same_metrics(tmp_path, random_model_dir):
    timing = {"step_seconds", "generate_seconds", "tokens_per_second"}
    _, a = run(tmp_path, random_model_dir, "a", funcs=[always_half], seed=3)
    _, b = run(tmp_path, random_model_dir, "b", funcs=[always_half], seed=3)
    strip = lambda lines: [{k: v for k, v in line.items() if k not in timing} for line in lines]  # noqa: E731
    assert strip(a) == strip(b)


def test_reward_function_that_raises_is_named(tmp_path, random_model_dir):
    def picky(prompts, completions, **row):
        return [1 / 0 if i == 5 else 0.0 for i in range(len(completions))]

    with pytest.raises(RewardError, match=r"reward function 'picky' raised"):
        run(tmp_path, random_model_dir, funcs=[picky])


def test_nan_rewards_are_counted_and_harmless(tmp_path, random_model_dir):
    def sometimes_nan(prompts, completions, **row):
        return [float("nan") if i % 4 == 0 else float(i % 2) for i in range(len(completions))]

    _, lines = run(tmp_path, random_model_dir, funcs=[sometimes_nan])
    assert lines[0]["frac_reward_nan"] == pytest.approx(0.25)
    assert lines[0]["loss"] == lines[0]["loss"]  # not NaN


def test_dynamic_sampling_with_no_signal_at_all_does_not_crash(tmp_path, random_model_dir):
    def constant(prompts, completions, **row):
        return [1.0] * len(completions)  # every group has zero std, in every sampling round

    _, lines = run(tmp_path, random_model_dir, funcs=[constant], dynamic_sampling=True, max_dynamic_sampling_rounds=2)
    assert lines[0]["frac_reward_zero_std"] == 1.0 and lines[0]["sampling_rounds"] == 2
    assert lines[0]["loss"] == 0.0 and lines[0]["advantages/max"] == 0.0


def test_a_non_finite_gradient_stops_the_step_before_the_weights_change(tmp_path, random_model_dir, monkeypatch):
    # The loss stays finite; a hook turns d loss / d logp into inf, so every parameter's gradient is non-finite.
    import torch

    import minigrpo.trainer as trainer_module

    real_policy_loss = trainer_module.policy_loss

    def policy_loss_with_inf_grad(logp, *args, **kwargs):
        logp.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        return real_policy_loss(logp, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", policy_loss_with_inf_grad)
    steps_taken = []
    monkeypatch.setattr(torch.optim.AdamW, "step", lambda self, *a, **k: steps_taken.append(1))
    with pytest.raises(FloatingPointError, match="step 1: the gradient norm is (inf|nan)"):
        run(tmp_path, random_model_dir, funcs=[always_half])
    assert steps_taken == []  # optimizer.step never ran: the weights are the ones loaded
