"""``countdown``: reach a target number from 3 or 4 given numbers with + - * /, the task of TinyZero
(Pan et al. 2025, "Countdown-Tasks-3to4") and nano-aha-moment.

    nums        [44, 19, 35]          target  98
    completion  <think> 44 + 19 = 63, 63 + 35 = 98 </think> <answer> 44 + 19 + 35 </answer>

The rule, as TinyZero's checker has it: **every number used exactly once**, any of the four operators and
parentheses, exact arithmetic (division may leave a fraction on the way, as long as the expression equals the
target). Exactly once, not "at most once": it makes the search a search (all numbers must fit), and it is what
the published runs reward, so their curves are comparable.

The generator draws 3 or 4 numbers in 1..99 and builds the target from a random expression over all of them, so
every problem has a solution (the row's ``answer``); it keeps targets that are whole numbers in 1..999 (4 numbers
overshoot more often, so about 64% of the shipped problems have 3). Division need not be exact on the way:
``84 / 9 * 3`` is fine, since the whole is a whole number.

The checker never evaluates text. The content of the last ``<answer>...</answer>`` must be at most 200 characters
of ASCII digits, ``+ - * /``, parentheses and spaces (TinyZero's own filter, less its ``.``), so ``0x2C``, ``4_4``,
names, quotes and brackets fail before parsing. Then ``ast.parse`` and a walk of the tree that accepts only integer
literals, the four binary operators, unary minus and parentheses; anything else (``**``, ``//``, ``%``) makes the
answer wrong. Unary minus is allowed (``-(3 - 5) * 4``): it uses no number, and TinyZero's filter lets it through.
The literals must be the row's numbers, each once, *before* anything is computed, so nothing a completion writes
can make the arithmetic large; division by zero is simply wrong.

Rows (TRL's conversational format; the prompt is TinyZero's, with DeepSeek-R1's system prompt; the files in
data/tasks/countdown/ store only nums, target and answer, and ``prepare_row`` writes the prompt when they load):

    {"prompt": [{"role": "system", ...}, {"role": "user", "content": "Using the numbers [44, 19, 35], ..."}],
     "nums": [44, 19, 35], "target": 98, "answer": "44 + 19 + 35"}
"""

import ast
import random
import re
from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from ..rewards import completion_text, has_r1_blocks
from .answers import R1_SYSTEM_PROMPT, answer_tag
from .base import Task

__all__ = ["CountdownTask", "evaluate_expression", "countdown_prompt"]

MAX_EXPRESSION_CHARS = 200  # a 4-number expression with spaces and parentheses needs ~40
MAX_PARENTHESES = 20  # more "(" than this is refused before parsing (ast.parse and the walk recurse); 4 numbers need 3
ALPHABET = re.compile(r"[0-9+\-*/() \t\r\n]*")  # ASCII only: re's \d would also match other scripts' digits
OPERATORS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b,
             ast.Mult: lambda a, b: a * b, ast.Div: lambda a, b: a / b}


def countdown_prompt(nums: list[int], target: int) -> list[dict]:
    """The chat prompt for one problem: R1's system prompt and TinyZero's instruction."""
    user = (f"Using the numbers {nums}, create an equation that equals {target}. You can use basic arithmetic "
            f"operations (+, -, *, /) and each number must be used exactly once. Show your work in <think> </think> "
            f"tags. And return the final answer in <answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>.")
    return [{"role": "system", "content": R1_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _literals(node) -> list[int] | None:
    """The integer literals of an allowed expression tree, or None if any node is not allowed."""
    if isinstance(node, ast.Expression):
        return _literals(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return [node.value]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return _literals(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
        left, right = _literals(node.left), _literals(node.right)
        return None if left is None or right is None else left + right
    return None


def _value(node) -> Fraction:
    """The exact value of an allowed tree (checked by _literals first). Raises ZeroDivisionError."""
    if isinstance(node, ast.Expression):
        return _value(node.body)
    if isinstance(node, ast.Constant):
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp):
        return -_value(node.operand)
    return OPERATORS[type(node.op)](_value(node.left), _value(node.right))


def evaluate_expression(expression: str, nums: list[int]) -> Fraction | None:
    """The exact value of ``expression`` if it is made of +, -, *, /, parentheses and exactly the integers ``nums``
    (each once); None for anything else: other numbers, a number missing or reused, any other character or
    syntax, division by zero, an expression too long or too deeply nested. Never raises, never evaluates text."""
    if len(expression) > MAX_EXPRESSION_CHARS or expression.count("(") > MAX_PARENTHESES:
        return None
    if not ALPHABET.fullmatch(expression):
        return None
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    literals = _literals(tree)
    if literals is None or Counter(literals) != Counter(int(n) for n in nums):
        return None
    try:
        return _value(tree)  # the literals are the row's few small numbers: nothing here can grow large
    except ZeroDivisionError:
        return None


@dataclass(frozen=True)
class CountdownTask(Task):
    name: str = "countdown"
    max_completion_length: int = 512  # room for a real model's search; TinyZero allows 1024
    required_columns: tuple[str, ...] = ("nums", "target")
    data_script: str = "scripts/make_countdown.py"

    # ---- problem generation ---------------------------------------------------------------------
    def make_problem(self, rng: random.Random) -> dict:
        while True:
            nums = [rng.randint(1, 99) for _ in range(rng.choice((3, 4)))]
            expression = _random_expression(rng, nums)
            value = evaluate_expression(expression, nums)
            if value is not None and value.denominator == 1 and 1 <= value <= 999:
                return self.prepare_row({"nums": nums, "target": int(value), "answer": expression})

    def prepare_row(self, row: dict) -> dict:
        """{"nums", "target", ...} -> the same row with its chat prompt first (the shipped files, like TinyZero's
        Countdown-Tasks-3to4 on the hub, store only numbers and target). A row with a "prompt" is kept as it is."""
        if "prompt" in row or "nums" not in row or "target" not in row:
            return row
        return {"prompt": countdown_prompt(row["nums"], row["target"]), **row}

    def make_rows(self, n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
        """``n`` distinct problems (no two with the same numbers and target), deterministic in ``seed``."""
        rng, rows, seen = random.Random(seed), [], set(exclude)
        while len(rows) < n:
            row = self.make_problem(rng)
            key = problem_key(row)
            if key not in seen:
                seen.add(key)
                rows.append(row)
        return rows

    def target_completion(self, row: dict, rng: random.Random | None = None) -> str:
        return f"<think>\n{row['answer']} = {row['target']}\n</think>\n<answer>\n{row['answer']}\n</answer>"

    # ---- grading --------------------------------------------------------------------------------
    def extract_answer(self, completion: str) -> str | None:
        return answer_tag(completion)

    def grade(self, completion, row: dict) -> bool:
        expression = answer_tag(completion_text(completion))
        if expression is None:
            return False
        value = evaluate_expression(expression, row["nums"])
        return value is not None and value == row["target"]

    def is_well_formed(self, completion: str) -> bool:
        return has_r1_blocks(completion)


def problem_key(row: dict) -> str:
    """What makes two problems the same: their numbers (in any order) and target."""
    return f"{sorted(row['nums'])}->{row['target']}"


def _random_expression(rng: random.Random, nums: list[int]) -> str:
    """A random expression using every number once: shuffle, then join neighbours with random operators under a
    random bracketing (combine two adjacent sub-expressions until one is left)."""
    parts = [str(n) for n in rng.sample(nums, len(nums))]
    while len(parts) > 1:
        i = rng.randrange(len(parts) - 1)
        op = rng.choice("+-*/")
        joined = f"{parts[i]} {op} {parts[i + 1]}"
        parts[i:i + 2] = [joined if len(parts) == 2 else f"({joined})"]
    return parts[0]
