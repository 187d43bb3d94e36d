"""Reward functions, the scorer's error messages, and the NaN policy."""

import math

import pytest
import torch

from minigrpo.rewards import RewardError, combine_rewards, overlong_penalty, score_completions, shuffled


def test_overlong_penalty_by_hand():
    f = overlong_penalty(max_completion_length=10, buffer_len=4)  # soft zone: lengths 7..10
    ids = [[0] * n for n in (3, 6, 7, 8, 10, 11)]
    assert f(None, [""] * 6, completion_ids=ids) == pytest.approx([0.0, 0.0, -0.25, -0.5, -1.0, -1.0])
    with pytest.raises(ValueError, match="buffer_len"):
        overlong_penalty(10, 0)


def test_shuffled_keeps_the_rate_and_breaks_the_relation():
    def real(prompts, completions, **row):
        return [float(c == "right") for c in completions]

    control = shuffled(real, seed=0)
    completions = ["right"] * 30 + ["wrong"] * 70
    rewards = control(None, completions)
    assert sum(rewards) == 30  # same number of 1s as the real checker gives
    assert rewards != real(None, completions)  # ... on other completions


def test_scorer_names_the_function_and_completion():
    def picky(prompts, completions, answer, **row):
        return [1.0 / len(c) for c in completions]  # ZeroDivisionError on the empty completion

    with pytest.raises(RewardError, match=r"'picky' raised on completion 2 \(''\)"):
        score_completions([picky], ["p"] * 3, ["a", "bb", ""], {"answer": ["1", "2", "3"]})


@pytest.mark.parametrize(
    "returned, match",
    [([1.0], "returned 1 values for 2"), (["high", 0.0], "non-number for completion 0")],
)
def test_scorer_rejects_wrong_shapes_and_types(returned, match):
    def bad(prompts, completions, **row):
        return returned

    with pytest.raises(RewardError, match=match):
        score_completions([bad], ["p", "p"], ["a", "b"], {})


def test_none_means_not_applicable_and_nan_means_unscorable():
    def f1(prompts, completions, **row):
        return [1.0, None, math.nan, math.inf]

    def f2(prompts, completions, **row):
        return [0.5, 0.5, 0.5, 0.5]

    per_func, unscorable = score_completions([f1, f2], ["p"] * 4, ["a"] * 4, {})
    assert unscorable.tolist() == [False, False, True, True]
    rewards = combine_rewards(per_func, unscorable, [1.0, 2.0])
    assert rewards[:2].tolist() == [2.0, 1.0]  # None skips f1 for completion 1
    assert rewards[2:].isnan().all()  # a NaN/inf anywhere makes the completion unscorable


def test_numpy_and_torch_scalars_are_numbers():
    def f(prompts, completions, **row):
        return [torch.tensor(1.0), True]

    per_func, _ = score_completions([f], ["p", "p"], ["a", "b"], {})
    assert per_func[:, 0].tolist() == [1.0, 1.0]
