"""Process supervision's rewards: a reward function that grades each reasoning step, and where its steps end.

A reward function has TRL's signature (rewards.py). For process supervision it returns, for a completion, a
`StepRewards` instead of a float: each step's reward and where the step ends in the completion's text,

    "<think>1+6=7,7+8=15,4+5+1=10</think>1057"
     step 1: "<think>1+6=7,"  ends at 13      reward 1.0
     step 2: "7+8=15,"        ends at 20      reward 1.0
     step 3: "4+5+1=10</think>" ends at 36    reward 1.0
     step 4: "1057"           ends at 40      reward 1.0   (the answer, one more step)

    StepRewards(rewards=(1.0, 1.0, 1.0, 1.0), ends=(13, 20, 36, 40))

An end is a character offset: step k is text[ends[k-1]:ends[k]]. Offsets are into the completion's text as the
function received it (the string, or the assistant message's content); with tools, into the whole multi-turn text,
which the functions then receive as the column `completion_text`. Characters are mapped to the completion's own
sampled tokens through the tokenizer's offsets (`token_starts`): a step ends at the token holding its last
character; a step that ends at the end of the text ends at the completion's last token (eos included), so the
decision to stop is credited too. Tokens a tool wrote keep their advantage but never enter the loss (the trainer's
loss mask is the policy's tokens).

How outcome and step rewards mix, with `advantage_estimator="process"` (DeepSeekMath, Shao et al. 2024, sec. 4.1.3):
  * one reward function may return StepRewards: its steps, times its reward weight, are the steps;
  * the other reward functions' weighted sum (the outcome reward, where any of them applies) is one more step,
    ending at the completion's last token; so `--reward-funcs steps correctness` grades the scratchpad's steps and
    the answer, and a checker that grades the answer itself (think_addition's `steps`) needs no outcome function;
  * every step reward of a group is normalised together, and token t's advantage is the sum of the normalised
    rewards of the steps that end at or after t (advantages.process_advantages);
  * `prefix_step_rewards`: each step's reward becomes the lowest so far (with a 0/1 checker, every step after the
    first error gets 0, the outcome step included), so a right step after a wrong one is not rewarded.
With any other estimator, a step reward function counts as the mean of its step rewards (rewards/<name>/mean:
the step accuracy of a 0/1 checker). A completion a function returns None for, or StepRewards with no step, is one
that function does not apply to; a NaN or inf step reward makes the completion unscorable, as a NaN reward does.

`arithmetic_steps` is a step checker for any chain of equations; think_addition's (tasks/think_addition.py) checks
its scratchpad. Neither evaluates the model's text: numbers are compared as strings, or parsed by the calculator
tool's parser (tools/builtin.py), which walks the syntax tree and allows only arithmetic.

**Grade the steps a problem has, not only the steps written.** Token t's advantage sums the normalised rewards of the
steps after it, so where a step is more often wrong than the group's mean, *not writing it* raises the advantage of
everything before: a checker that grades only what is written rewards skipping the hard steps. Measured on
long_addition (7-8 columns, the warm start's written steps ~50% right) with such a checker: completions shrank from
64 to 33 tokens within 50 steps, the policy wrote the first columns and stopped, and greedy accuracy fell from 13% to
0% by step 10. think_addition's checker therefore counts a column not written as a wrong step; `arithmetic_steps`
cannot know how many steps a chain needs, so pair it with an outcome reward and watch the length.
"""

import bisect
import math
from dataclasses import dataclass

import torch

__all__ = ["StepRewards", "arithmetic_steps", "equation_is_right", "token_starts", "step_token_ends", "step_tensors",
           "steps_with_outcome"]


@dataclass(frozen=True)
class StepRewards:
    """One completion's steps: rewards[k] is step k's reward, ends[k] the character offset where it ends."""

    rewards: tuple[float, ...]
    ends: tuple[int, ...]

    def __post_init__(self):  # lists are fine: stored as tuples
        object.__setattr__(self, "rewards", tuple(self.rewards))
        object.__setattr__(self, "ends", tuple(self.ends))

    def __len__(self) -> int:
        return len(self.rewards)

    def problem(self, text_length: int) -> str | None:
        """What is wrong with these steps for a text of text_length characters, or None."""
        if len(self.rewards) != len(self.ends):
            return f"{len(self.rewards)} step rewards for {len(self.ends)} step ends"
        if not all(_is_number(r) for r in self.rewards):
            return f"step rewards must be numbers, got {self.rewards!r}"
        if any(not isinstance(e, int) or isinstance(e, bool) for e in self.ends):
            return f"step ends must be integer character offsets, got {self.ends!r}"
        if any(not 0 <= e <= text_length for e in self.ends) or list(self.ends) != sorted(self.ends):
            return f"step ends must rise within the text's {text_length} characters, got {self.ends!r}"
        return None

    @property
    def mean(self) -> float:
        """The mean step reward (NaN without steps): what the function scores with an outcome estimator."""
        return sum(map(_as_float, self.rewards)) / len(self.rewards) if self.rewards else math.nan


def _is_number(value) -> bool:
    """A float, an int or a scalar that converts to one (numpy, torch); not a string."""
    if isinstance(value, (str, bytes)):
        return False
    try:
        float(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):
        return isinstance(value, int)  # an int beyond float range: inf, so unscorable, not malformed
    return True


# ---------------------------------------------------------------------------------------------------------------
# A step checker for chains of equations
# ---------------------------------------------------------------------------------------------------------------
def equation_is_right(line: str) -> bool:
    """True when `line` is an equation "a = b [= c ...]" whose sides the calculator's parser gives one value.

    Integers must be equal; a side with a float (a division) must agree to 1e-9 relative. Anything the parser
    refuses (names, calls, strings, a number too large, more than 1000 characters) makes the step wrong."""
    from .tools.builtin import CalculatorError, evaluate_arithmetic  # the tool's parser: an ast walk, no eval

    sides = line.split("=")
    if len(sides) < 2 or not all(side.strip() for side in sides):
        return False
    try:
        values = [evaluate_arithmetic(side) for side in sides]
    except CalculatorError:
        return False
    first = values[0]
    return all(v == first if isinstance(v, int) and isinstance(first, int)
               else math.isclose(v, first, rel_tol=1e-9, abs_tol=1e-12) for v in values[1:])


def arithmetic_steps(prompts, completions, **row) -> list[StepRewards]:
    """Step rewards for a chain of equations, one step per non-blank line, 1.0 when the line's equation holds.

        "12 * 3 = 36\\n36 + 5 = 41\\n41 - 1 = 39"   ->   rewards (1.0, 1.0, 0.0), ends (12, 24, 35)

    A step ends after its newline (the last one at the end of the text). A completion with no non-blank line is one
    step of reward 0 covering the whole text (nothing shown, nothing right). Checks the steps written, not the answer
    nor the steps a chain would need (module docstring): pair it with an outcome reward (e.g. correctness)."""
    from .prompts import completion_text

    texts = row.get("completion_text") or [completion_text(c) for c in completions]
    out = []
    for text in texts:
        rewards, ends, start = [], [], 0
        for line in text.splitlines(keepends=True):
            start += len(line)
            if line.strip():
                rewards.append(float(equation_is_right(line.strip())))
                ends.append(start)
        out.append(StepRewards(rewards, ends) if rewards else StepRewards((0.0,), (len(text),)))
    return out


# ---------------------------------------------------------------------------------------------------------------
# From characters to the completion's tokens, and the step tensors the estimator reads
# ---------------------------------------------------------------------------------------------------------------
def token_starts(tokenizer, texts: list[str], ids_rows: list[list[int]]) -> list[list[int]]:
    """For each completion, the character offset in its text at which each of its sampled tokens starts.

    texts[i] is ids_rows[i] decoded with special tokens skipped (what the rollout returns). The text is encoded again
    with the tokenizer's offsets (one batched call); where that gives back the sampled ids (special tokens, which
    hold no character, left out), its offsets are the answer, and a special token starts where the next character
    is. Where it does not (a sampler may pick a tokenization the tokenizer would not), each token's start is the
    length of the text decoded up to it."""
    special = set(getattr(tokenizer, "all_special_ids", ()))
    try:
        encoded = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        encoded_ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    except (NotImplementedError, TypeError, ValueError, KeyError):  # a slow tokenizer has no offsets
        encoded_ids = offsets = [None] * len(texts)
    starts = []
    for text, ids, again, spans in zip(texts, ids_rows, encoded_ids, offsets):
        ordinary = [t for t in ids if t not in special]
        if again is not None and list(again) == ordinary:
            spans = iter(spans)
            starts.append(_fill_special([None if t in special else next(spans)[0] for t in ids], len(text)))
        else:
            starts.append([len(tokenizer.decode(ids[:k], skip_special_tokens=True)) for k in range(len(ids))])
    return starts


def _fill_special(row: list[int | None], text_length: int) -> list[int]:
    """Special tokens (None) start where the next ordinary token does, or at the end of the text."""
    following = text_length
    for k in range(len(row) - 1, -1, -1):
        row[k] = following if row[k] is None else row[k]
        following = row[k]
    return row


def _as_float(value) -> float:
    try:
        return float(value)
    except OverflowError:
        return math.inf


def step_token_ends(ends: tuple[int, ...], starts: list[int], text_length: int) -> list[int]:
    """Character offsets where steps end -> the index of the token holding each step's last character.

    A step ending at the end of the text ends at the last token (eos included); a step of no character that
    ends before any token ends at token 0."""
    last = len(starts) - 1
    return [last if end >= text_length else max(bisect.bisect_left(starts, end) - 1, 0) for end in ends]


def step_tensors(steps: list[StepRewards | None], starts: list[list[int]], text_lengths: list[int]
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The steps of N completions as padded tensors: step_rewards (N, K) float, NaN where a completion has fewer
    than K steps (or none: None), and step_end (N, K) long, the token index where each step ends (0 on padding)."""
    K = max((len(s) for s in steps if s is not None), default=0)
    step_rewards = torch.full((len(steps), K), math.nan)
    step_end = torch.zeros((len(steps), K), dtype=torch.long)
    for i, s in enumerate(steps):
        if s is not None and len(s):
            step_rewards[i, :len(s)] = torch.tensor([_as_float(r) for r in s.rewards], dtype=torch.float32)
            step_end[i, :len(s)] = torch.tensor(step_token_ends(s.ends, starts[i], text_lengths[i]))
    return step_rewards, step_end


def steps_with_outcome(step_rewards: torch.Tensor, step_end: torch.Tensor, rewards_per_func: torch.Tensor,
                       rewards: torch.Tensor, completion_mask: torch.Tensor, weights, step_func: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """The steps advantage_estimator="process" normalises, (N, K + 1) each: the graded steps (N, K) times their
    function's weight, then the outcome, the other functions' weighted sum (NaN where none of them applies), as one
    more step ending at the completion's last token. A completion no function could score (rewards NaN) has none.

    rewards_per_func: (N, F), column step_func the step function's; rewards: (N,) the combined reward;
    completion_mask: (N, T) right-padded."""
    w = torch.as_tensor(list(weights), dtype=rewards_per_func.dtype)  # (F,)
    others = rewards_per_func.clone()
    others[:, step_func] = math.nan
    outcome = (others * w).nansum(1).masked_fill(others.isnan().all(1), math.nan)  # (N,)
    last_token = completion_mask.sum(1).long() - 1  # (N,) right-padded: the eos, or the last token of a cut one
    steps = torch.cat([step_rewards * w[step_func], outcome.unsqueeze(1)], 1)  # (N, K + 1)
    ends = torch.cat([step_end, last_token.unsqueeze(1)], 1)
    return steps.masked_fill(rewards.isnan().unsqueeze(1), math.nan), ends
