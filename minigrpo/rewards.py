"""Reward functions and the scorer that calls them.

A reward function is plain Python with TRL's signature:

    f(prompts: list[str], completions: list[str], **row) -> list[float | None]

`row` holds the dataset columns (e.g. `answer`), each as a list aligned with `completions`, plus
`completion_ids` (token ids of each completion). Return one float per completion; None means "does not
apply" (the function is skipped for that completion). The task's own checkers (`correctness`, `format`)
live with the task in minigrpo/tasks/; the ones here work for any task.

For process supervision a function may return, for a completion, `StepRewards(rewards, ends)` instead of a
float: each reasoning step's reward and the character offset where it ends (step_rewards.py, which also says how
step and outcome rewards mix). Its entry in rewards/<name>/mean is then its mean step reward. Plain float-returning
functions are unchanged.

Policy for bad values: a NaN or inf reward marks an unscorable completion. It is kept out of its group's
baseline and gets advantage 0 (see advantages.py), and the trainer counts it (`frac_reward_nan`).
A function that raises, returns the wrong number of values or a non-number stops training with a one-line
error naming the function and the completion.
"""

import contextlib
import inspect
import math
import random
import re
import signal
import threading
from collections.abc import Callable, Sequence

import torch

from .errors import MinigrpoError
from .prompts import completion_text  # noqa: F401 - the tasks and reward functions take it from here
from .sandbox.user_code import callable_name, load_callable
from .step_rewards import StepRewards, arithmetic_steps

__all__ = ["RewardError", "RewardTimeout", "StepRewards", "completion_text", "answer_tag", "r1_format",
           "r1_format_soft", "has_r1_blocks", "is_r1_format", "overlong_penalty", "shuffled", "load_reward_func",
           "score_completions", "combine_rewards", "reward_func_name", "math_verify_reward"]

RewardFunc = Callable[..., list]


class RewardError(MinigrpoError, RuntimeError):
    """A reward function misbehaved; the message names it and the completion."""


class RewardTimeout(RewardError):
    """A reward function did not return within reward_timeout seconds."""


# The R1 format (DeepSeek-R1's template: reasoning in <think>, answer in <answer>), in the two forms GRPO
# recipes use. Strict is open-r1's `format_reward`: the whole completion, tags on their own lines. Soft is the
# pattern of the GSM8K GRPO notebooks (willccbb's, Unsloth's): the two blocks in order, whitespace free,
# anything allowed around them. Soft is easier to learn; strict leaves nothing outside the blocks.
R1_STRICT = re.compile(r"^<think>\n.*?\n</think>\n<answer>\n.*?\n</answer>$", re.DOTALL)
R1_SOFT = re.compile(r"<think>.*?</think>\s*<answer>.*?</answer>", re.DOTALL)
# The two patterns say what the formats are; the functions below decide the same in one pass over the text. The
# patterns themselves backtrack: on a completion that repeats the tags without closing them ("<think></think><answer>"
# a thousand times) R1_SOFT.search takes minutes (cubic in the length) and R1_STRICT and <answer>(.*?)</answer>
# seconds (quadratic), and a checker must not hang on model text. tests/test_rewards.py checks that each function
# agrees with its pattern.
_THINK_THEN_ANSWER = re.compile(r"</think>\s*<answer>")


def is_r1_format(text: str) -> bool:
    """R1_STRICT.fullmatch(text) is not None, in linear time: the text opens with "<think>\\n", closes with
    "\\n</answer>", and "\\n</think>\\n<answer>\\n" stands between them without overlapping either."""
    opening, middle, closing = "<think>\n", "\n</think>\n<answer>\n", "\n</answer>"
    if not (text.startswith(opening) and text.endswith(closing)):
        return False
    at = text.find(middle, len(opening))  # the first one leaves the most room for the answer
    return at != -1 and at + len(middle) <= len(text) - len(closing)


def has_r1_blocks(text: str) -> bool:
    """R1_SOFT.search(text) is not None, in linear time: some "</think>", whitespace, "<answer>" comes after a
    "<think>" and before a "</answer>". The earliest "<think>" and the last "</answer>" leave the most room, and the
    first "</think> <answer>" after that "<think>" ends earliest."""
    think = text.find("<think>")
    if think == -1:
        return False
    found = _THINK_THEN_ANSWER.search(text, think + len("<think>"))
    return found is not None and found.end() <= text.rfind("</answer>")


def answer_tag(text: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>``, or None. The same as the last of
    re.findall(r"<answer>(.*?)</answer>", text, re.DOTALL), in linear time."""
    found, start = None, text.find("<answer>")
    while start != -1:
        end = text.find("</answer>", start + len("<answer>"))
        if end == -1:
            break
        found = text[start + len("<answer>"):end]
        start = text.find("<answer>", end + len("</answer>"))
    return None if found is None else found.strip()


def r1_format(prompts, completions, **row) -> list[float]:
    """1.0 if the completion is exactly "<think>\\n...\\n</think>\\n<answer>\\n...\\n</answer>", else 0.0."""
    return [float(is_r1_format(completion_text(c))) for c in completions]


def r1_format_soft(prompts, completions, **row) -> list[float]:
    """1.0 if "<think>...</think>" is followed by "<answer>...</answer>" anywhere in the completion, else 0.0."""
    return [float(has_r1_blocks(completion_text(c))) for c in completions]


def overlong_penalty(max_completion_length: int, buffer_len: int) -> RewardFunc:
    """DAPO's soft overlong punishment (Yu et al. 2025, eq. 13), on completion length L in tokens:

        R(L) = 0                                  if L <= L_max - L_cache
               (L_max - L_cache - L) / L_cache    if L_max - L_cache < L <= L_max   (falls linearly to -1)
               -1                                 if L > L_max
    """
    if not 0 < buffer_len <= max_completion_length:
        raise ValueError(f"overlong buffer_len must be in 1..{max_completion_length}, got {buffer_len}")
    soft_start = max_completion_length - buffer_len

    def overlong(prompts, completions, completion_ids, **row):
        rewards = []
        for ids in completion_ids:
            length = len(ids)
            if length <= soft_start:
                rewards.append(0.0)
            elif length <= max_completion_length:
                rewards.append((soft_start - length) / buffer_len)
            else:
                rewards.append(-1.0)
        return rewards

    return overlong


def shuffled(reward_func: RewardFunc, seed: int = 0) -> RewardFunc:
    """A control: the real rewards of the batch, randomly permuted across its completions.

    The batch gets exactly as many 1s as the real checker would give, but they land on random completions,
    so the reward has no relation to correctness. If training on it lifts accuracy, the lift did not come
    from the verifier.
    """
    rng = random.Random(seed)

    def random_reward(prompts, completions, **row):
        rewards = list(reward_func(prompts, completions, **row))
        rng.shuffle(rewards)
        return rewards

    random_reward.__name__ = f"random_{getattr(reward_func, '__name__', 'reward')}"
    random_reward.rng = rng  # checkpoint.py saves and restores it, so a resumed run shuffles the same way
    return random_reward


def load_reward_func(spec: str) -> RewardFunc:
    """Your own reward function from "package.module:function" or "path/to/file.py:function" (TRL's signature).

    A spec that does not import, or names no callable, is a one-line RewardError naming the spec.
    """
    return load_callable(spec, "reward_funcs", RewardError)


def _name(func) -> str:
    return getattr(func, "__name__", type(func).__name__)


@contextlib.contextmanager
def _time_limit(seconds: float | None, func):
    """Raise RewardTimeout in the block once `seconds` have passed (None or 0: no limit). A SIGALRM timer, so it
    works in the main thread only (elsewhere: no limit), and it stops Python code, sleeps and network waits; a call
    stuck inside C code that holds the interpreter (a pathological regular expression, say) is stopped only when
    that call returns. The previous SIGALRM handler is put back afterwards."""
    if not seconds or threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def stop(signum, frame):
        raise RewardTimeout(f"reward function {_name(func)!r} did not return within {seconds:g} s (reward_timeout); "
                            f"give a slower one more time with reward_timeout, or 0 for no limit")

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _call(func, prompts, completions, rows: dict[str, list], timeout: float | None = None,
          context: dict | None = None) -> list:
    """Call one reward function, by keyword as TRL does (`accuracy_reward(completions, solution, **kwargs)` takes
    completions first); on an exception, find the first completion it fails on and say so. timeout: seconds for the
    whole call, the search for the culprit included (_time_limit). context: keyword arguments passed as they are
    (TRL's trainer_state, log_metric, log_extra: reward_logs.py), not per completion as the rows' columns are."""
    with _time_limit(timeout, func):
        return _call_and_name_the_culprit(func, prompts, completions, rows, _taken(func, context or {}))


def _taken(func, context: dict) -> dict:
    """The context arguments func takes: all of them where it has **kwargs (TRL passes them all), else those it
    names, so that a function written without **kwargs keeps working."""
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return context
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return context
    names = {p.name for p in parameters}
    return {k: v for k, v in context.items() if k in names}


def _call_and_name_the_culprit(func, prompts, completions, rows: dict[str, list], context: dict) -> list:
    try:
        values = func(prompts=prompts, completions=completions, **rows, **context)
    except RewardTimeout:
        raise
    except Exception as batch_exc:  # noqa: BLE001 - re-raised with the culprit named
        quiet = {**context, "log_metric": lambda *a: None, "log_extra": lambda *a: None} if context else {}

        def one(i):  # the call on completion i alone (its logging dropped: this is the search, not the run)
            func(prompts=prompts[i : i + 1], completions=completions[i : i + 1],
                 **{k: v[i : i + 1] for k, v in rows.items()}, **quiet)

        for i in range(len(completions)):
            try:
                one(i)
            except RewardTimeout:
                raise
            except Exception as exc:  # noqa: BLE001
                if (i == 0 and len(completions) > 1 and isinstance(exc, TypeError)  # how a bad signature fails
                        and _fails_alike(one, len(completions) - 1, exc)):
                    raise RewardError(
                        f"reward function {_name(func)!r} raised on every completion tried (the first and the "
                        f"last): {exc!r}; it is called by keyword with prompts, completions, completion_ids and each "
                        f"dataset column (and trainer_state, log_metric, log_extra where it takes them), as TRL calls "
                        f"it") from exc
                raise RewardError(
                    f"reward function {_name(func)!r} raised on completion {i} ({completions[i]!r}): {exc!r}"
                ) from exc
        raise RewardError(f"reward function {_name(func)!r} raised on the batch: {batch_exc!r}") from batch_exc
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise RewardError(f"reward function {_name(func)!r} returned {type(values).__name__}, "
                          f"expected a list of {len(completions)} numbers")
    return list(values)


def _fails_alike(one, i: int, first: Exception) -> bool:
    """Whether one(i) raises what the first completion's call raised (a signature error, not a completion's)."""
    try:
        one(i)
    except RewardTimeout:
        raise
    except Exception as exc:  # noqa: BLE001
        return type(exc) is type(first) and str(exc) == str(first)
    return False


def score_completions(
    reward_funcs: Sequence[RewardFunc],
    prompts: list[str],
    completions: list[str],
    rows: dict[str, list],
    *,
    steps: dict | None = None,
    timeout: float | None = None,
    context: dict | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Call every reward function on the batch. `rows` maps column name -> list of N values. timeout: seconds each
    function's call may take (reward_timeout), then a RewardTimeout naming it; None: no limit. context: keyword
    arguments every call gets as they are (RewardLogs.kwargs(): TRL's trainer_state, log_metric, log_extra).

    A function j may return, for a completion, StepRewards (step_rewards.py: process supervision) instead of a
    float; its entry is then the mean of its step rewards, and `steps`, when given (a dict), receives
    steps[j] = each completion's StepRewards (None where it has no step). At most one function may return steps.

    Returns:
        rewards_per_func: (N, F) float, NaN where a function returned None ("does not apply").
        unscorable: (N,) bool, True where any function returned NaN or inf (or a number beyond float32's range).
    """
    n = len(completions)
    out = torch.full((n, len(reward_funcs)), float("nan"))
    unscorable = torch.zeros(n, dtype=torch.bool)
    step_func = None
    for j, func in enumerate(reward_funcs):
        values = _call(func, prompts, completions, rows, timeout, context)
        if len(values) != n:
            raise RewardError(f"reward function {_name(func)!r} returned {len(values)} values for {n} completions")
        if any(isinstance(v, StepRewards) for v in values):
            if step_func is not None:
                raise RewardError(f"reward functions {step_func!r} and {_name(func)!r} both return step rewards; "
                                  f"one function may grade the steps (add the other's steps to it)")
            step_func, graded = _name(func), []
            values = _step_means(func, values, _texts(completions, rows), graded)
            if steps is not None:
                steps[j] = graded
        for i, v in enumerate(values):
            if v is None:
                continue
            stored = torch.tensor(_number(func, i, v), dtype=out.dtype)  # 1e39 is finite in Python, inf in float32
            if torch.isfinite(stored):
                out[i, j] = stored
            else:
                unscorable[i] = True
    return out, unscorable


def _number(func, i: int, v) -> float:
    """A reward function's value as a float (numpy / torch scalars and bools too), or a RewardError."""
    if isinstance(v, (str, bytes)):  # float("1") would work, but a string is a bug in the function
        raise RewardError(f"reward function {_name(func)!r} returned a non-number for completion {i}: {v!r}")
    try:
        return float(v)
    except OverflowError:
        return math.inf  # an int beyond float range
    except (TypeError, ValueError, RuntimeError):
        raise RewardError(f"reward function {_name(func)!r} returned a non-number for completion {i}: {v!r}") from None


def _texts(completions: list, rows: dict[str, list]) -> list[str]:
    """The text step ends index: the completion's (with tools, the whole multi-turn text, column completion_text)."""
    return rows.get("completion_text") or [completion_text(c) for c in completions]


def _step_means(func, values: list, texts: list[str], steps: list) -> list:
    """A step reward function's values -> one number per completion (the mean step reward; None without steps);
    its StepRewards checked against each completion's text and appended to `steps` (None without steps)."""
    means = []
    for i, v in enumerate(values):
        if v is not None and not isinstance(v, StepRewards):
            raise RewardError(f"reward function {_name(func)!r} returned StepRewards for some completions and "
                              f"{v!r} for completion {i}; return StepRewards (or None) for each")
        problem = None if v is None else v.problem(len(texts[i]))
        if problem:
            raise RewardError(f"reward function {_name(func)!r}, completion {i} ({texts[i][:80]!r}): {problem}")
        has_steps = v is not None and len(v) > 0
        means.append(v.mean if has_steps else None)
        steps.append(v if has_steps else None)
    return means


def combine_rewards(rewards_per_func: torch.Tensor, unscorable: torch.Tensor, weights: Sequence[float]) -> torch.Tensor:
    """(N, F) -> (N,): r_i = sum_j w_j r_ij over the functions that apply; NaN if unscorable or none applies."""
    w = torch.as_tensor(list(weights), dtype=rewards_per_func.dtype)
    total = (rewards_per_func * w).nansum(dim=1)
    none_applies = rewards_per_func.isnan().all(dim=1)
    return total.masked_fill(unscorable | none_applies, float("nan"))


def build_reward_funcs(names: list[str], task, max_completion_length: int, *, overlong_buffer_len: int | None = None,
                       seed: int = 0) -> list[RewardFunc]:
    """Reward names -> functions: correctness, format (the task's), r1_format / r1_format_soft (the R1 tags, any
    task), overlong (DAPO), random (control), math_verify (LaTeX answers), steps (the task's step checker) and
    arithmetic_steps (any chain of equations) for process supervision, or your own as "module:function" /
    "path/file.py:function".

    overlong_buffer_len: DAPO's soft-punishment zone before max_completion_length (default a quarter of it);
    seed: the shuffle of the "random" control's rewards."""
    funcs = []
    for name in names:
        if not isinstance(name, str):  # a function (or reward model) handed over from Python: used as it is
            if not callable(name):
                raise RewardError(f"reward_funcs: {name!r:.60} ({type(name).__name__}) is neither a reward's name nor "
                                  f"callable; give a name, a function f(prompts, completions, **row), or a model")
            funcs.append(name)
        elif ":" in name:
            funcs.append(load_reward_func(name))
        elif name in ("r1_format", "r1_format_soft"):
            funcs.append(r1_format if name == "r1_format" else r1_format_soft)
        elif name == "correctness":
            if not task.graded:
                raise RewardError(f"reward_funcs: 'correctness' grades answers, and the {task.name} task's rows have "
                                  f"none; give your own reward functions")
            funcs.append(task.correctness_reward)
        elif name == "steps":  # process supervision: the task's own step checker (step_rewards.py)
            if getattr(task, "step_reward", None) is None:
                raise RewardError(f"reward_funcs: the task {task.name} has no step checker ('steps'); use "
                                  f"arithmetic_steps for chains of equations, or your own step reward function")
            funcs.append(task.step_reward)
        elif name == "arithmetic_steps":
            funcs.append(arithmetic_steps)
        elif name == "format":
            funcs.append(task.format_reward)
        elif name == "overlong":
            buffer_len = overlong_buffer_len or max(1, max_completion_length // 4)
            funcs.append(overlong_penalty(max_completion_length, buffer_len))
        elif name == "random":
            funcs.append(shuffled(task.correctness_reward, seed=seed))
        elif name == "math_verify":  # LaTeX answers, graded by math-verify in a worker process (extra "math")
            funcs.append(math_verify_reward)
        else:
            raise RewardError(f"reward_funcs: unknown reward {name!r} (known: correctness, format, r1_format, "
                              f"r1_format_soft, overlong, random, math_verify, steps, arithmetic_steps, or "
                              f"module:function / path/file.py:function, or a reward model's directory)")
    return funcs


def math_verify_reward(prompts, completions, answer, **row) -> list[float]:
    """1.0 if math-verify finds the completion's final answer (its last ``<answer>`` tag's content, else the whole
    text) equal to the row's ``answer``, else 0.0: LaTeX answers, graded in a worker process (math_verify_grader.py;
    extra "math"). TRL's reward signature: ``answer`` is the dataset column, one value per completion."""
    from .sandbox.math_verify_grader import math_verify_scores

    texts = [completion_text(c) for c in completions]
    return math_verify_scores([answer_tag(t) if answer_tag(t) is not None else t for t in texts], list(answer))


def reward_func_name(func) -> str:
    """How config.yaml names a reward function handed over as an object: the built-in names build_reward_funcs
    reads (correctness, format, r1_format, ...), a model's path (an object with `name_or_path`), else
    "module:function" (user_code.callable_name)."""
    builtin = {"correctness_reward": "correctness", "format_reward": "format", "r1_format": "r1_format",
               "r1_format_soft": "r1_format_soft", "math_verify_reward": "math_verify"}
    name = getattr(func, "__name__", None)
    if name in builtin and getattr(func, "__module__", "").startswith("minigrpo."):
        return builtin[name]
    if isinstance(getattr(func, "name_or_path", None), str) and func.name_or_path:
        return func.name_or_path
    return callable_name(func)


def reward_names(funcs: list[RewardFunc]) -> list[str]:
    """The names metrics.jsonl logs each reward function under (rewards/<name>/mean)."""
    return [getattr(f, "__name__", f"reward_{j}") for j, f in enumerate(funcs)]

