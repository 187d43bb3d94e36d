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
``format_reward`` checks the shape ``<think>...</think>digits``; ``step_reward`` grades every
step of the scratchpad and the answer (process supervision, minigrpo/step_rewards.py).
"""

import random
import re
from dataclasses import dataclass

from ..step_rewards import StepRewards
from ..rewards import completion_text
from .base import Task

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"  # one token each in minigrpo's tokenizer
_DIGITS = re.compile(r"\d+")
_WELL_FORMED = re.compile(rf"\s*{THINK_OPEN}[^<>]*{THINK_CLOSE}\s*\d+\s*")
_PROMPT = re.compile(r"(\d{1,100})\+(\d{1,100})=")  # longer operands: not this task's (and int() has limits)


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
    min_digits: int = 2  # each operand's number of digits, drawn uniformly in [min_digits, max_digits]
    max_digits: int = 4
    think_share: float = 0.5  # the share of the warm start's targets that work the sum out in the scratchpad

    def make_problem(self, rng: random.Random) -> dict:
        a, b = (rng.randint(10 ** (d - 1), 10**d - 1)
                for d in (rng.randint(self.min_digits, self.max_digits), rng.randint(self.min_digits, self.max_digits)))
        return {"prompt": f"{a}+{b}=", "answer": str(a + b)}

    def target_completion(self, row: dict, rng: random.Random | None = None, think: bool | None = None) -> str:
        """Long or short correct completion; with ``think=None`` a coin (``rng``) picks which, long with
        probability ``think_share``."""
        if think is None:
            think = (rng or random).random() < self.think_share
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

    def step_reward(self, prompts, completions, **row) -> list[StepRewards | None]:
        """Process supervision's reward (TRL's signature): each completion's scratchpad steps and its answer, graded
        by ``scratchpad_steps``; reward_funcs name: ``steps``."""
        return [scratchpad_steps(p if isinstance(p, str) else p[-1]["content"], completion_text(c))
                for p, c in zip(prompts, completions)]


def scratchpad_steps(prompt: str, completion: str, *, grade_missing: bool = True) -> StepRewards | None:
    """The steps of a completion to ``prompt``, each 1.0 if right: one step per column of the sum, right only if it
    is exactly column k's ``dx+dy[+1]=s`` (the prompt's digits, the true incoming carry, the sum), and the answer as
    one more step.

        scratchpad_steps("471+586=", "<think>1+6=7,7+8=14,4+5+1=10</think>1047")
        -> rewards (1.0, 0.0, 1.0, 0.0), ends (13, 20, 36, 40)

    A written step ends after its separator ("," or ``</think>``; the first step holds ``<think>``), the answer at the
    end of the text. Every column is a step: a column the scratchpad does not write is a wrong step ending where the
    scratchpad ends (so ``<think></think>1057`` has three wrong steps and a right answer), and a step beyond the
    columns is wrong. Without that, skipping the hard columns would be rewarded: under process supervision a step
    not written cannot be below the group's mean. Only steps whose separator was written count: an unfinished
    scratchpad's last piece, or a completion that does not open with ``<think>``, leaves the rest to the answer step,
    which is then wrong. The text is compared with strings, never evaluated. None for a prompt that is not ``a+b=``.
    grade_missing=False grades the written steps only (the checker that gets gamed, notebook 11)."""
    match = _PROMPT.fullmatch(prompt.strip())
    if match is None:
        return None
    a, b = (int(x) for x in match.groups())
    expected = scratchpad(a, b).split(",")
    written, ends, scratch_end = _written_columns(completion)
    rewards = [float(k < len(expected) and piece == expected[k]) for k, piece in enumerate(written)]
    missing = max(len(expected) - len(rewards), 0) if grade_missing else 0  # never written: wrong, where it ends
    rewards, ends = rewards + [0.0] * missing, ends + [scratch_end] * missing
    rewards.append(float(ThinkAdditionTask().is_correct(completion, str(a + b))))
    ends.append(len(completion))
    return StepRewards(rewards, ends)


def _written_columns(completion: str) -> tuple[list[str], list[int], int]:
    """The column steps a completion writes (their text, without the separator), the character offset where each
    ends (after its "," or ``</think>``), and where the scratchpad ends (the answer starts): scratchpad_steps' cut."""
    pieces, ends, scratch_end = [], [], 0
    if completion.startswith(THINK_OPEN):
        close = completion.find(THINK_CLOSE)
        body = completion[len(THINK_OPEN):close if close >= 0 else len(completion)]
        split = body.split(",") if body else []
        position = len(THINK_OPEN)
        for k, piece in enumerate(split):
            last = k == len(split) - 1
            if last and close < 0:
                break  # unfinished: its separator was never written
            position += len(piece) + (len(THINK_CLOSE) if last else 1)
            pieces.append(piece)
            ends.append(position)
        scratch_end = close + len(THINK_CLOSE) if close >= 0 else len(completion)
    return pieces, ends, scratch_end


def scratchpad_split(completion: str) -> tuple[list[str], list[int]]:
    """A completion cut into the steps its checker grades (the written columns, then the answer), as a process
    reward model reads them: (the steps' text, where each ends), the `split` of ProcessRewardModel.

        scratchpad_split("<think>1+6=7,7+8=15,4+5+1=10</think>1057")
        -> (["<think>1+6=7,", "7+8=15,", "4+5+1=10</think>", "1057"], [13, 20, 36, 40])

    A step's text is the completion's own, text[ends[k-1]:ends[k]]; with "," as the PRM's score token the PRM reads
    the policy's text with a "," after ``</think>`` and after the answer. The ends are scratchpad_steps'
    with grade_missing=False, so its rewards are the labels of these steps (reward_trainer.step_labelled_row)."""
    _, ends, _ = _written_columns(completion)
    ends = ends + [len(completion)]
    starts = [0, *ends[:-1]]
    return [completion[a:b] for a, b in zip(starts, ends)], ends


def thinking_length(completion: str) -> int:
    """Characters between ``<think>`` and ``</think>`` (0 for an empty or missing scratchpad)."""
    if THINK_OPEN not in completion or THINK_CLOSE not in completion:
        return 0
    return len(completion.split(THINK_OPEN, 1)[1].split(THINK_CLOSE, 1)[0])
