"""``addition``: three-digit addition with a fixed format, the fastest GRPO demo.

    prompt      "347+586="
    completion  "933"  (then <eos>)

Both operands are drawn uniformly from 100..999, so every prompt is 8 characters and every
answer 3 or 4 digits. The completion must be the answer's digits and nothing else.
"""

import random
import re
from dataclasses import dataclass

from .base import Task

_DIGITS = re.compile(r"\d+")


@dataclass(frozen=True)
class AdditionTask(Task):
    name: str = "addition"
    max_completion_length: int = 6  # at most 4 answer digits + eos, plus slack to let a wrong model ramble

    def make_problem(self, rng: random.Random) -> dict:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        return {"prompt": f"{a}+{b}=", "answer": str(a + b)}

    def target_completion(self, row: dict, rng: random.Random | None = None) -> str:
        return row["answer"]

    def extract_answer(self, completion: str) -> str | None:
        text = completion.strip()
        return text if _DIGITS.fullmatch(text) else None

    def is_well_formed(self, completion: str) -> bool:
        return self.extract_answer(completion) is not None
