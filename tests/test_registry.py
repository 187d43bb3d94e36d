"""Loss types and advantage estimators declare themselves in one place; one registered from outside the package
validates, trains and logs like a built-in one."""

import json
from dataclasses import dataclass

import pytest
import torch

from minigrpo.advantages import ADVANTAGE_ESTIMATORS, ESTIMATOR_NEEDS, register_advantage
from minigrpo.config import Config, ConfigError
from minigrpo.objectives import LOSSES, Surrogate, SurrogateInputs, get_loss, policy_loss, register_loss
from minigrpo.objectives.aggregation import micro_batch_share
from minigrpo.trainer import train


@dataclass(frozen=True)
class ScaledOptions:
    scale: float = 1.0

    def __post_init__(self):
        if not self.scale > 0:
            raise ValueError(f"scale: must be > 0, got {self.scale}")


def scaled_reinforce(x: SurrogateInputs, opts: ScaledOptions) -> Surrogate:
    """-scale * A * log pi: REINFORCE with a knob, aggregated over tokens."""
    return Surrogate(-opts.scale * x.adv * x.logp, stats={"scaled/scale": opts.scale})


@pytest.fixture
def outside_loss():
    register_loss("scaled_reinforce", aggregation="token_sum", options=ScaledOptions)(scaled_reinforce)
    register_advantage("sign")(lambda x: torch.sign(x.rewards - x.rewards.view(-1, x.group_size).mean(1)
                                                    .repeat_interleave(x.group_size)))
    yield
    del LOSSES["scaled_reinforce"], ADVANTAGE_ESTIMATORS["sign"], ESTIMATOR_NEEDS["sign"]


def test_registered_loss_goes_through_the_pipeline(outside_loss):
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, stats = policy_loss(logp, logp.detach(), torch.tensor([1.0, -2.0]), mask, loss_type="scaled_reinforce",
                              scale=3.0)
    # -3 * (1 * (-1 - 2) + (-2) * (-0.5)) / 3 tokens = -3 * (-3 + 1) / 3 = 2
    assert loss.item() == pytest.approx(2.0)
    assert stats["scaled/scale"] == 3.0 and stats["clip_ratio/region_mean"] == 0.0  # clips nothing
    with pytest.raises(ValueError, match="no option gamma"):
        policy_loss(logp, logp.detach(), torch.tensor([1.0, -2.0]), mask, loss_type="scaled_reinforce", gamma=1.0)


def test_config_reads_the_tables(outside_loss):
    Config(loss_type="scaled_reinforce", advantage_estimator="sign", loss_options={"scale": 2.0})
    with pytest.raises(ConfigError, match="loss_type: 'nope' is not one of grpo"):
        Config(loss_type="nope")
    with pytest.raises(ConfigError, match="scale: must be > 0"):
        Config(loss_type="scaled_reinforce", loss_options={"scale": 0.0})
    with pytest.raises(ConfigError, match="has no option typo"):
        Config(loss_type="scaled_reinforce", loss_options={"typo": 1})
    with pytest.raises(ConfigError, match="importance_sampling_level: gmpo takes token"):
        Config(loss_type="gmpo", importance_sampling_level="sequence")


def test_micro_batch_share_comes_from_the_aggregation(outside_loss):
    micro = torch.ones(2, 2)  # two rows of a mini-batch of four, eight tokens
    share = lambda loss_type: micro_batch_share(get_loss(loss_type).aggregation, micro, 4, 8.0)  # noqa: E731
    assert share("scaled_reinforce") == 1.0  # token_sum: already the mini-batch's
    assert share("gmpo") == 0.5  # sequence_mean: rows


def test_registered_loss_and_estimator_train(outside_loss, tmp_path, random_model_dir):
    def half(prompts, completions, **row):
        return [float(i % 2) for i in range(len(completions))]

    cfg = Config(model_name_or_path=str(random_model_dir), output_dir=str(tmp_path / "run"), max_steps=2,
                 num_generations=4, generation_batch_size=8, eval_steps=0, eval_limit=4, eval_num_samples=0,
                 save_model=False, loss_type="scaled_reinforce", advantage_estimator="sign",
                 loss_options={"scale": 2.0})
    train(cfg, reward_funcs=[half], progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(line["scaled/scale"] == 2.0 for line in lines)
    assert all(line["grad_norm"] > 0 for line in lines)
    assert sorted(set(lines[0]["advantages"])) == [-1.0, 1.0]  # the sign estimator's values


def test_an_estimator_says_what_it_reads_beyond_the_rewards():
    # needs: what the loop must sample or compute for it (a greedy completion per prompt, the token statistics)
    with pytest.raises(ValueError, match="needs: value_head is not one of greedy_rewards, token_stats"):
        register_advantage("critic", needs=("value_head",))
    assert ESTIMATOR_NEEDS["remax"] == {"greedy_rewards"} and ESTIMATOR_NEEDS["grpo"] == frozenset()
    assert "critic" not in ADVANTAGE_ESTIMATORS
