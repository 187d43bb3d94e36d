"""``think_addition``: addition where the policy chooses how long it thinks.

    prompt      "3471+586="
    completion  "<think>1+6=7,7+8=15,4+5+1=10,3+0+1=4</think>4057"   (long: a worked scratchpad)
           or   "<think></think>4057"                                (short: answer straight away)

Operands have 2 to 4 digits each (chosen independently), so problems vary in size. The
scratchpad adds column by column from the right, one ``x+y=s`` step per column, with ``+1``
when a carry comes in and ``0`` for a digit the shorter operand lacks. The answer's digits
can then be read off the steps: the last sum in full, then the other sums' last digits
from right to left.

The supervised warm start sees long and short completions 50/50, so from the first GRPO
step both lengths are sampled and the reward can push the length either way.

Rewards: ``correctness_reward`` looks only at the digits after ``</think>``; the separate
``format_reward`` checks the shape ``<think>...</think>digits``.
"""

import random
import re
from dataclasses import dataclass

from .base import Task

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # one token each in minigrpo's tokenizer
_DIGITS = re.compile(r"\d+")
_WELL_FORMED = re.compile(rf"\s*{THINK_OPEN}[^<>]*{THINK_CLOSE}\s*\d+\s*")


def scratchpad(a: int, b: int) -> str:
    """Column-by-column addition of a and b, e.g. scratchpad(3471, 586) == "1+6=7,7+8=15,4+5+1=10,3+0+1=4"."""
    x, y = str(a), str(b)
    width = max(len(x), len(y))
    x, y = x.zfill(width), y.zfill(width)
    steps, carry = [], 0
    for i in range(width - 1, -1, -1):  # rightmost column first
        dx, dy = int(x[i]), int(y[i])
        total = dx + dy + carry
        steps.append(f"{dx}+{dy}" + ("+1" if carry else "") + f"={total}")
        carry = total // 10
    return ",".join(steps)


@dataclass(frozen=True)
class ThinkAdditionTask(Task):
    name: str = "think_addition"
    max_completion_length: int = 48  # longest target: 4 steps "9+9+1=19" + tags + 5 digits + eos = 43

    def make_problem(self, rng: random.Random) -> dict:
        a, b = (rng.randint(10 ** (d - 1), 10**d - 1) for d in (rng.randint(2, 4), rng.randint(2, 4)))
        return {"prompt": f"{a}+{b}=", "answer": str(a + b)}

    def target_completion(self, row: dict, rng: random.Random | None = None, think: bool | None = None) -> str:
        """Long or short correct completion; with ``think=None`` a fair coin (``rng``) picks which."""
        if think is None:
            think = (rng or random).random() < 0.5
        a, b = (int(s) for s in row["prompt"].rstrip("=").split("+"))
        pad = scratchpad(a, b) if think else ""
        return f"{THINK_OPEN}{pad}{THINK_CLOSE}{row['answer']}"

    def extract_answer(self, completion: str) -> str | None:
        if THINK_CLOSE not in completion:
            return None
        after = completion.rsplit(THINK_CLOSE, 1)[1].strip()
        return after if _DIGITS.fullmatch(after) else None

    def is_well_formed(self, completion: str) -> bool:
        return _WELL_FORMED.fullmatch(completion) is not None


def thinking_length(completion: str) -> int:
    """Characters between ``<think>`` and ``</think>`` (0 for an empty or missing scratchpad)."""
    if THINK_OPEN not in completion or THINK_CLOSE not in completion:
        return 0
    return len(completion.split(THINK_OPEN, 1)[1].split(THINK_CLOSE, 1)[0])
