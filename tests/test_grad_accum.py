"""gradient_accumulation_steps: a mini-batch run in micro-batches takes the same optimizer step as in one pass."""

import copy

import pytest
import torch

from minigrpo.config import Config, ConfigError
from minigrpo.loading.models import load_model
from minigrpo.batch import Batch
from minigrpo.logprobs import LogprobForward
from minigrpo.objectives.aggregation import micro_batch_share
from minigrpo.trainer import grpo_update

N, P, T = 8, 5, 7


def batch(vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([7, 2, 5, 7, 1, 3, 6, 4])  # ragged: token means and sequence means differ
    completion_mask = (torch.arange(T) < lengths[:, None]).float()
    return Batch.of_completions(
        torch.randint(3, vocab, (N, P), generator=g), torch.ones(N, P, dtype=torch.long),
        torch.randint(3, vocab, (N, T), generator=g), completion_mask, adv=torch.randn(N, generator=g),
        old_logp=-torch.rand(N, T, generator=g) * 3,  # off-policy: ratios differ from 1, clipping can fire
    )


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo", "gmpo", "cispo", "sapo"])
def test_micro_batches_take_the_same_step_as_one_pass(random_model_dir, loss_type):
    model = load_model(random_model_dir)
    inputs = batch(model.config.vocab_size)
    after = {}
    for ga in (1, 2, 4):
        torch.manual_seed(1)  # the same mini-batch order
        m = copy.deepcopy(model)
        m.train()
        optimizer = torch.optim.SGD(m.parameters(), lr=1.0)  # SGD: the step is the gradient, nothing hides a difference
        cfg = Config(loss_type=loss_type, num_generations=4, generation_batch_size=N, steps_per_generation=1,
                     gradient_accumulation_steps=ga, max_grad_norm=1e9)
        stats = grpo_update(LogprobForward(m), optimizer, inputs, cfg, max_completion_length=T)
        after[ga] = ([p.detach().clone() for p in m.parameters()], stats[0])
    for ga in (2, 4):
        for p1, p2 in zip(after[1][0], after[ga][0]):
            torch.testing.assert_close(p2, p1, rtol=1e-5, atol=1e-6)
        assert after[ga][1]["loss"] == pytest.approx(after[1][1]["loss"], rel=1e-5, abs=1e-7)
        assert after[ga][1]["grad_norm"] == pytest.approx(after[1][1]["grad_norm"], rel=1e-5)
        assert after[ga][1]["tokens"] == after[1][1]["tokens"]


def test_micro_batch_share_by_hand():
    mask = torch.tensor([[1.0, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]])  # 3, 1, 2, 3 tokens
    micro = mask[:2]  # rows 0 and 1 of a mini-batch of 4 rows, 9 tokens
    assert micro_batch_share("sequence_mean", micro, 4, mask.sum()) == 2 / 4  # grpo: two of four completions
    assert micro_batch_share("token_mean", micro, 4, mask.sum()).item() == pytest.approx(4 / 9)  # bnpo: 4 of 9 tokens
    assert micro_batch_share("token_sum", micro, 4, mask.sum()) == 1.0  # dapo: divided by the mini-batch's count
    # Two processes, each with 4 rows; 18 tokens over both: a micro-batch's 4 tokens count 4 * 2 / 18 of its
    # process's loss, and the engines' average over the 2 processes halves it back to 4 / 18 of the global batch's.
    assert micro_batch_share("token_mean", micro, 4, 18.0, dp_size=2).item() == pytest.approx(8 / 18)
    assert micro_batch_share("sequence_mean", micro, 4, 18.0, dp_size=2) == 2 / 4  # rows: each process's own mean


def test_gradient_accumulation_must_divide_the_mini_batch():
    with pytest.raises(ConfigError, match="gradient_accumulation_steps: must divide the mini-batch of 64 completions"):
        Config(generation_batch_size=128, steps_per_generation=2, gradient_accumulation_steps=3)
