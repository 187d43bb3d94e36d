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


def test_a_function_that_fails_on_every_completion_is_called_a_signature_error():
    """TRL 1.16 passes trainer_state, log_metric and log_extra: a function that needs what minigrpo does not pass
    fails on every completion, and the error says how it is called instead of blaming completion 0."""
    def needs_a_judge(prompts, completions, judge_client, **row):
        return [1.0] * len(completions)

    with pytest.raises(RewardError, match=r"'needs_a_judge' raised on every completion tried \(the first and the "
                                          r"last\): TypeError.*judge_client.*each dataset column \(and trainer_state"):
        score_completions([needs_a_judge], ["p"] * 3, ["a", "bb", "c"], {"answer": ["1", "2", "3"]})


def test_trls_extra_arguments_reach_a_function_that_takes_them_and_no_other():
    """trainer_state, log_metric and log_extra go to a function with **kwargs (TRL's convention) or one that names
    them; a function written without **kwargs, naming only its columns, keeps working."""
    from minigrpo.reward_logs import LoggedColumnError, RewardLogs

    def strict(prompts, completions, answer, completion_ids):
        return [float(c == a) for c, a in zip(completions, answer)]

    def counting(completions, log_metric, **row):
        log_metric("rewards/long", sum(len(c) > 1 for c in completions))
        return [0.0] * len(completions)

    logs = RewardLogs()
    rows = {"answer": ["a", "b"], "completion_ids": [[1], [2]]}
    rewards, _ = score_completions([strict, counting], ["p", "p"], ["a", "bb"], rows, context=logs.kwargs())
    assert rewards[:, 0].tolist() == [1.0, 0.0] and logs.take_metrics() == {"rewards/long": 1.0}
    logs.log_metric("loss", 1.0)  # the step's own metric: refused, not overwritten
    with pytest.raises(LoggedColumnError, match="log_metric: 'loss' is one of the step's own metrics"):
        logs.take_metrics(taken={"loss": 0.5})


def test_a_reward_function_that_hangs_is_stopped_and_named():
    import signal
    import time

    from minigrpo.rewards import RewardTimeout

    def waits(prompts, completions, **row):  # an LLM judge whose server never answers
        time.sleep(60)

    def loops(prompts, completions, **row):  # or Python that never ends
        while True:
            pass

    handler = signal.getsignal(signal.SIGALRM)
    for hangs in (waits, loops):
        started = time.monotonic()
        with pytest.raises(RewardTimeout, match=rf"reward function '{hangs.__name__}' did not return within 0.2 s "
                                                r"\(reward_timeout\)"):
            score_completions([hangs], ["p", "p"], ["a", "b"], {}, timeout=0.2)
        assert time.monotonic() - started < 30  # stopped, not waited out
    assert signal.getsignal(signal.SIGALRM) is handler and signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert score_completions([lambda prompts, completions, **row: [1.0, 0.0]], ["p", "p"], ["a", "b"], {},
                             timeout=0.2)[0].tolist() == [[1.0], [0.0]]  # a quick one is untouched


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


# ---- the R1 format checks: the patterns' answers, in linear time -----------------------------------------------------
_PIECES = ["<think>", "</think>", "<answer>", "</answer>", "\n", " ", "x", "<", ">"]


def test_the_r1_checks_agree_with_their_patterns():
    import random
    import re

    from minigrpo.rewards import R1_SOFT, R1_STRICT, answer_tag, has_r1_blocks, is_r1_format

    rng = random.Random(0)
    texts = ["", "<think>\n\n</think>\n<answer>\n\n</answer>", "<think>\n</think>\n<answer>\n</answer>",
             "<think>a</think> \n <answer>b</answer>", "<answer>a</answer><answer> b </answer>"]
    texts += ["".join(rng.choice(_PIECES) for _ in range(rng.randint(1, 14))) for _ in range(20_000)]
    middles = _PIECES + ["\n</think>\n<answer>\n"]
    texts += ["<think>\n" + "".join(rng.choice(middles) for _ in range(rng.randint(0, 6))) + "\n</answer>"
              for _ in range(5_000)]  # strict's ends in place, so that its middle decides
    for text in texts:
        assert is_r1_format(text) == (R1_STRICT.fullmatch(text) is not None), repr(text)
        assert has_r1_blocks(text) == (R1_SOFT.search(text) is not None), repr(text)
        found = re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL)
        assert answer_tag(text) == (found[-1].strip() if found else None), repr(text)
    assert sum(is_r1_format(t) for t in texts) > 50 and sum(has_r1_blocks(t) for t in texts) > 500  # both ways


def test_a_completion_that_repeats_the_tags_does_not_stall_the_checks():
    # "<think></think><answer>" repeated, never closed: R1_SOFT.search took 71 s on 23 KB (cubic); the checks a task
    # and the evaluation run on every completion must not hang on model text. 2 MB here, in a process of its own so
    # that a slow check fails the test instead of hanging the suite.
    import subprocess
    import sys

    code = ("from minigrpo.rewards import answer_tag, has_r1_blocks, is_r1_format\n"
            "for text in ['<think></think><answer>' * 100_000, '<think>\\n' + '\\n</think>\\n<answer>\\n' * 100_000,"
            " '<answer>' * 250_000]:\n"
            "    assert not has_r1_blocks(text) and not is_r1_format(text) and answer_tag(text) is None\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
