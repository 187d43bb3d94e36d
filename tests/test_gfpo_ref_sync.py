"""GFPO (keep the k best of each sampled group) and the reference-model refresh (sync_ref_model), by hand and in
the loop."""

import json
import shutil

import pytest
import torch

from minigrpo.advantages import gfpo_keep, group_advantages
from minigrpo.config import Config, ConfigError
from minigrpo.loading.models import refresh_reference
from minigrpo.trainer import train

SMALL = dict(num_generations=4, generation_batch_size=16, eval_steps=0, eval_limit=8, eval_num_samples=0,
             save_model=False, learning_rate=1e-3)


def half_right(prompts, completions, **row):
    return [float(i % 2) for i in range(len(completions))]


def test_gfpo_keeps_the_k_shortest_or_most_efficient_by_hand():
    rewards = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    lengths = torch.tensor([10, 3, 5, 5, 4, 4, 8, 2])
    # group 1 lengths 10, 3, 5, 5: the shortest two are #1 (3) and #2 (5, tied with #3: the earlier wins)
    # group 2 lengths 4, 4, 8, 2: #3 (2) and #0 (4, tied with #1)
    assert gfpo_keep(rewards, lengths, 4, 2).tolist() == [False, True, True, False, True, False, False, True]
    # reward per token: group 1 0.1, 0, 0.2, 0.2 -> #2, #3; group 2 0, 0, 0.125, 0 -> #2, then #0 (tie, earlier)
    assert gfpo_keep(rewards, lengths, 4, 2, "token_efficiency").tolist() == [False, False, True, True,
                                                                              True, False, True, False]
    nan = torch.tensor([float("nan"), 1.0, 0.0, 1.0])  # an unscorable completion ranks last
    assert gfpo_keep(nan, torch.tensor([1, 4, 4, 8]), 4, 3, "token_efficiency").tolist() == [False, True, True, True]
    with pytest.raises(ValueError, match="metric must be"):
        gfpo_keep(rewards, lengths, 4, 2, "longest")


def test_gfpo_trains_on_k_per_group_with_their_own_advantages(tmp_path, random_model_dir):
    cfg = Config(model_name_or_path=str(random_model_dir), output_dir=str(tmp_path / "run"), max_steps=2,
                 num_remains_in_group=2, log_completions_groups=4, **SMALL)
    train(cfg, reward_funcs=[half_right], progress=False)
    metrics = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    records = [json.loads(x) for x in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert all(len(m["advantages"]) == 4 * 2 for m in metrics)  # 4 prompts x the 2 kept, not x 4 sampled
    assert len(records) == 2 * 4 and all(len(r["completions"]) == 2 for r in records)
    for r in records:  # GRPO's advantage over the kept pair alone
        rewards = torch.tensor([c["reward"] for c in r["completions"]])
        expected, _ = group_advantages(rewards, 2)
        assert [c["advantage"] for c in r["completions"]] == pytest.approx(expected.tolist(), abs=1e-5)


def test_refresh_reference_moves_it_toward_the_policy_by_hand():
    policy, ref = torch.nn.Linear(2, 1, bias=False), torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        policy.weight.copy_(torch.tensor([[1.0, 2.0]]))
        ref.weight.copy_(torch.tensor([[0.0, 10.0]]))
    refresh_reference(ref, policy, alpha=0.6)
    assert ref.weight[0].tolist() == pytest.approx([0.6 * 1 + 0.4 * 0, 0.6 * 2 + 0.4 * 10])  # [0.6, 5.2]
    assert policy.weight.tolist() == [[1.0, 2.0]]


def test_sync_ref_model_survives_a_resume_exactly(tmp_path, random_model_dir):
    """The refreshed reference is saved in the checkpoint: resumed from step 2, steps 3-4 (their KL to the moving
    reference included) equal the uninterrupted run's."""
    cfg = dict(model_name_or_path=str(random_model_dir), max_steps=4, save_steps=2, beta=0.1, sync_ref_model=True,
               ref_model_sync_steps=1, ref_model_mixup_alpha=0.5, **SMALL)
    train(Config(output_dir=str(tmp_path / "whole"), **cfg), reward_funcs=[half_right], progress=False)
    shutil.copytree(tmp_path / "whole", tmp_path / "resumed")
    (tmp_path / "resumed" / "checkpoints" / "step-000004.pt").unlink()
    train(Config(output_dir=str(tmp_path / "resumed"), resume_from_checkpoint=str(tmp_path / "resumed"), **cfg),
          reward_funcs=[half_right], progress=False)
    lines = lambda run: [{k: v for k, v in json.loads(x).items() if not k.endswith("seconds") and k != "tokens_per_second"}  # noqa: E731
                         for x in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    assert lines("resumed") == lines("whole")
    assert lines("whole")[-1]["kl"] > 0


@pytest.mark.parametrize("overrides, message", [
    (dict(sync_ref_model=True), "sync_ref_model: there is no reference model to refresh with beta = 0"),
    (dict(sync_ref_model=True, beta=0.1, use_peft=True), "sync_ref_model: with use_peft the reference is the base"),
    (dict(sync_ref_model=True, beta=0.1, ref_model_mixup_alpha=0.0), "ref_model_mixup_alpha: must be in"),
    (dict(num_remains_in_group=8), "num_remains_in_group: GFPO keeps 2..num_generations-1"),
    (dict(num_generations=4, generation_batch_size=8, num_remains_in_group=3, steps_per_generation=4),
     "steps_per_generation: must divide the 6 completions GFPO keeps"),
    (dict(gfpo_filter="longest"), "gfpo_filter: 'longest' is not one of length, token_efficiency"),
])
def test_bad_gfpo_and_sync_settings_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        Config(**overrides)
