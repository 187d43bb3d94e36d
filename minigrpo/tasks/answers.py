"""The R1 answer format: the system prompt that asks for it, and reading the final answer back out.

DeepSeek-R1-Zero's template (DeepSeek-AI 2025, Table 1) asks the model to reason inside ``<think>`` and to
answer inside ``<answer>``:

    <think> reasoning process here </think> <answer> answer here </answer>

The checkers read the answer the way the GRPO recipes for GSM8K do (TRL's and Unsloth's notebooks,
open-r1): the last ``<answer>...</answer>``; failing that the last ``\\boxed{...}`` (what Qwen's math-tuned
models write); failing that the last number in the text. Numbers compare by value after ``normalize_number``
drops thousands separators, a ``$`` and a zero fraction, so "1,234", "$1234" and "1234.00" all read 1234; a
fraction of two numbers is a number too ("3/4" equals "0.75"; "The answer is 3/4." reads 3/4, not 4).

For LaTeX answers (``\\frac{3}{4}``, ``2\\sqrt{2}``, intervals) ``AnswerTask(grader="math_verify")`` grades with
math-verify instead (math_verify_grader.py); this numeric checker stays the default and the lesson.

Everything here is plain string work on bounded input: no ``eval``, and nothing that a long or hostile
completion can turn into an exception.
"""

import re
from dataclasses import dataclass
from fractions import Fraction

from ..rewards import answer_tag, has_r1_blocks
from .base import Task

__all__ = ["AnswerTask", "R1_SYSTEM_PROMPT", "GRADERS", "answer_tag", "boxed", "last_number", "normalize_number",
           "number_value", "final_answer", "same_answer"]

GRADERS = ("numeric", "math_verify")  # AnswerTask.grader: this file's checker, or math-verify (math_verify_grader.py)

R1_SYSTEM_PROMPT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. The "
    "assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>."
)

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+(?!\.\d|[\d,]))?")  # "3/4" is one number
_PLAIN_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_FRACTION = re.compile(r"(-?[\d,.$]+)\s*/\s*(\d+)")
MAX_NUMBER_DIGITS = 1000  # a longer digit string is not an answer anyone asked for; it reads as no number


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (nested braces matched), or None when there is none or it is
    not closed."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, begin = 0, start + len("\\boxed{")
    for i in range(begin, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth < 0:
            return text[begin:i].strip()
    return None


def last_number(text: str) -> str | None:
    """The last number written in the text ("1,234.5", "-3", "$40"), as written, or None."""
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def normalize_number(text: str) -> str | None:
    """A number's canonical form, or None if ``text`` is not one number: "1,234" -> "1234", "$40" -> "40",
    "72.0" -> "72", "0.50" -> "0.5", "-0" -> "0", " 7. " -> "7". Commas and "$" anywhere are dropped."""
    text = text.strip().replace(",", "").replace("$", "").rstrip(".").strip()
    if not _PLAIN_NUMBER.fullmatch(text) or len(text) > MAX_NUMBER_DIGITS:
        return None
    sign = "-" if text.startswith("-") else ""
    whole, _, fraction = text.lstrip("-").partition(".")
    whole, fraction = whole.lstrip("0") or "0", fraction.rstrip("0")
    number = whole + ("." + fraction if fraction else "")
    return "0" if number == "0" else sign + number


def final_answer(text: str) -> str | None:
    """The model's final answer: the ``<answer>`` tag's content, else ``\\boxed{}``'s, else the last number."""
    for extract in (answer_tag, boxed, last_number):
        found = extract(text)
        if found is not None:
            return found
    return None


def number_value(text: str) -> Fraction | None:
    """The exact value of one number (``normalize_number``'s forms) or of a fraction of two ("3/4", "-1/2"), or
    None. So "3/4", "0.75" and "6/8" are the same answer."""
    normal = normalize_number(text)
    if normal is not None:
        return Fraction(normal)
    fraction = _FRACTION.fullmatch(text.strip().rstrip(".").strip())
    if fraction is None:
        return None
    numerator, denominator = normalize_number(fraction[1]), normalize_number(fraction[2])
    if numerator is None or denominator is None or Fraction(denominator) == 0:
        return None
    return Fraction(numerator) / Fraction(denominator)


def same_answer(predicted: str | None, reference) -> bool:
    """Numbers (and fractions) compare by value (``number_value``); anything else as stripped, case-folded text."""
    if predicted is None:
        return False
    reference = str(reference)
    a, b = number_value(predicted), number_value(reference)
    if a is not None and b is not None:
        return a == b
    if a is None and b is not None:  # "<answer>The answer is 42</answer>": the number inside
        inner = last_number(predicted)
        return inner is not None and number_value(inner) == b
    return predicted.strip().casefold() == reference.strip().casefold()


@dataclass(frozen=True)
class AnswerTask(Task):
    """``answer``: your own rows ``{"prompt": ..., "answer": ...}``, graded with no code of yours.

        minigrpo train --task answer --dataset my_rows.jsonl --model Qwen/Qwen2.5-0.5B-Instruct

    The completion's final answer (``final_answer``: the ``<answer>`` tag, else ``\\boxed{}``, else the last
    number) must equal the row's ``answer``: by value when both are numbers, else as case-folded text.
    ``is_well_formed`` is the R1 shape ``<think>...</think> <answer>...</answer>``. The task ships no data and
    no model: ``dataset_name`` and ``model_name_or_path`` are required. ``grader="math_verify"`` grades with
    math-verify instead (``dataclasses.replace(get_task("answer"), grader="math_verify")``).
    """

    name: str = "answer"
    max_completion_length: int = 512  # room for a real model's reasoning; the recipes set their own
    grader: str = "numeric"  # GRADERS: "numeric" (this file) or "math_verify" (LaTeX answers, isolated worker)

    def __post_init__(self):
        if self.grader not in GRADERS:
            raise ValueError(f"grader: {self.grader!r} is not one of {', '.join(GRADERS)}")

    def prepare_row(self, row: dict) -> dict:
        """TRL's math datasets (trl-lib/DeepMath-103K, the accuracy_reward examples) call the answer "solution":
        a row without an "answer" gets its "solution" as one (the "solution" column stays, for TRL's rewards)."""
        if "answer" not in row and "solution" in row:
            return {**row, "answer": row["solution"]}
        return row

    def extract_answer(self, completion: str) -> str | None:
        return final_answer(completion)

    def is_correct(self, completion: str, answer) -> bool:
        if self.grader == "math_verify":
            from ..sandbox.math_verify_grader import math_verify_scores

            tagged = answer_tag(completion)  # the tag's content, else the whole text (math-verify finds \boxed{})
            return math_verify_scores([completion if tagged is None else tagged], [answer])[0] == 1.0
        return same_answer(final_answer(completion), answer)

    def is_well_formed(self, completion: str) -> bool:
        return has_r1_blocks(completion)
