"""What every task is: a problem generator, a grader, and the reward functions built on the grader.

A task grades and rewards with the same code (as nanochat's tasks do): ``is_correct`` is
what evaluation counts, and ``correctness_reward`` is that same check turned into 1.0/0.0.
The reward functions use TRL's signature, ``f(prompts, completions, **row) -> list[float]``,
where every extra dataset column (here ``answer``) arrives as a list with one entry per
completion. So they plug into minigrpo's trainer and into ``trl.GRPOTrainer`` alike.

Graders never raise: an empty or garbled completion is simply wrong (0.0).
"""

import os
import random
from dataclasses import dataclass
from pathlib import Path

from ..rewards import completion_text
from .sources import DataError, json_lines, read_dataset

# data/ sits next to the package in a clone or an editable install: <repo>/minigrpo/tasks/base.py -> <repo>/data.
# MINIGRPO_DATA_DIR points elsewhere (e.g. for a wheel install that does not ship data/).
DATA_DIR = Path(os.environ.get("MINIGRPO_DATA_DIR", Path(__file__).resolve().parents[2] / "data"))


@dataclass(frozen=True)
class Task:
    """Base class; subclasses define ``make_problem``, ``target_completion``, ``extract_answer``, ``is_well_formed``."""

    name: str
    max_completion_length: int  # suggested max new tokens for GRPO on this task (eos included)

    # ---- where the task's files live ----------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        return DATA_DIR / "tasks" / self.name

    @property
    def model_dir(self) -> Path:
        """The default policy: a tiny Llama warm-started to ~25% greedy accuracy, with its tokenizer."""
        return DATA_DIR / "models" / self.name

    required_columns: tuple[str, ...] = ("answer",)  # what grade() reads from a row, besides the prompt
    graded = True  # grade() checks a completion (False: the prompts task, scored by reward functions alone)
    dataset: str | None = None  # where load() reads rows by default: None = data/tasks/<name>/; or a hub name
    dataset_config: str | None = None
    data_script: str = "scripts/make_tiny_world.py"  # what writes data/tasks/<name>/, named when a file is missing

    def load(self, split: str, dataset: str | None = None, dataset_config: str | None = None) -> list[dict]:
        """The rows of ``split`` ("train" or "test"): ``{"prompt": ..., "answer": ..., ...}``.

        From ``dataset`` when given (a file, a folder or a hub name: sources.py), else from the task's own
        source: ``data/tasks/<name>/<split>.jsonl`` for the shipped tasks. Each row passes ``prepare_row``
        (e.g. GSM8K's question -> a chat prompt) and is then checked: a row without a "prompt" (a string or a
        list of messages) or without the task's required columns raises DataError naming the row.
        """
        dataset = dataset or self.dataset
        if dataset is None:
            path = self.data_dir / f"{split}.jsonl"
            if not path.exists():
                raise FileNotFoundError(f"{path} not found; rebuild it with `python {self.data_script}`")
            return read_rows(path, self.required_columns, self.prepare_row)
        rows = read_dataset(dataset, split, dataset_config or self.dataset_config)
        return self.checked_rows(rows, f"dataset_name: {dataset} ({split} split)")

    def checked_rows(self, rows: list[dict], source: str) -> list[dict]:
        """Rows read elsewhere (a dataset file, or a datasets.Dataset handed to train()), each passed through
        ``prepare_row`` and checked; a bad row is a DataError naming ``source`` and the row's number."""
        rows = [self.prepare_row(row) for row in rows]
        for number, row in enumerate(rows, start=1):
            problem = check_row(row, self.required_columns)
            if problem:
                raise DataError(f"{source}, row {number}: {problem}")
        return rows

    def prepare_row(self, row: dict) -> dict:
        """A row as the dataset stores it -> a row with a "prompt" (identity here; GSM8K builds the prompt)."""
        return row

    # ---- problem generation ---------------------------------------------------------------------
    def make_problem(self, rng: random.Random) -> dict:
        """One random problem ``{"prompt": ..., "answer": ...}`` drawn with ``rng``."""
        raise NotImplementedError

    def target_completion(self, row: dict, rng: random.Random | None = None) -> str:
        """A correct completion for supervised warm-up (text only; the caller appends eos)."""
        raise NotImplementedError

    def make_rows(self, n: int, seed: int, exclude: set[str] = frozenset()) -> list[dict]:
        """``n`` distinct problems, deterministic in ``seed``, none whose prompt is in ``exclude``."""
        rng = random.Random(seed)
        rows, seen = [], set(exclude)
        while len(rows) < n:
            row = self.make_problem(rng)
            if row["prompt"] not in seen:
                seen.add(row["prompt"])
                rows.append(row)
        return rows

    # ---- grading --------------------------------------------------------------------------------
    def extract_answer(self, completion: str) -> str | None:
        """The final answer written in ``completion``, or None when there is none."""
        raise NotImplementedError

    def is_well_formed(self, completion: str) -> bool:
        """Whether ``completion`` has the task's output format (right or wrong)."""
        raise NotImplementedError

    def is_correct(self, completion: str, answer: str) -> bool:
        predicted = self.extract_answer(completion_text(completion))
        return predicted is not None and predicted == str(answer).strip()

    def grade(self, completion, row: dict) -> bool:
        """Whether ``completion`` solves the problem of ``row``: what evaluation counts and the reward pays.
        Here the row's ``answer``; a task whose check needs other columns (countdown: the numbers and the
        target) overrides this."""
        return self.is_correct(completion_text(completion), row["answer"])

    # ---- rewards (TRL's reward-function signature) ----------------------------------------------
    def correctness_reward(self, prompts, completions, **kwargs) -> list[float]:
        """1.0 for a correct final answer, else 0.0. The dataset's columns (e.g. ``answer``) come as lists with one
        value per completion; anything else in kwargs (TRL also passes ``trainer_state``) is not a column."""
        n = len(completions)
        columns = {k: v for k, v in kwargs.items() if isinstance(v, (list, tuple)) and len(v) == n}
        return [float(self.grade(c, {k: v[i] for k, v in columns.items()})) for i, c in enumerate(completions)]

    def format_reward(self, prompts, completions, **row) -> list[float]:
        """1.0 for a well-formed completion, else 0.0; says nothing about correctness."""
        return [float(self.is_well_formed(completion_text(c))) for c in completions]


def read_rows(path: Path, required: tuple[str, ...] = ("answer",), prepare=None) -> list[dict]:
    """The rows of a JSONL file of problems, each passed through ``prepare`` (a task's ``prepare_row``) and
    checked, so bad data fails here and not deep in training."""
    rows = []
    for number, row in json_lines(path):
        if prepare is not None and isinstance(row, dict):
            row = prepare(row)
        problem = check_row(row, required)
        if problem:
            raise DataError(f"{path}:{number}: {problem}")
        rows.append(row)
    return rows


def check_row(row, required: tuple[str, ...] = ("answer",)) -> str | None:
    """What is wrong with a dataset row, or None: a "prompt" (a string, or a non-empty list of
    {"role", "content"} messages, TRL's two formats) and the ``required`` columns."""
    if not isinstance(row, dict):
        return f"expected an object, got {type(row).__name__}"
    prompt = row.get("prompt")
    messages_ok = isinstance(prompt, list) and prompt and all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in prompt)
    if not (isinstance(prompt, str) or messages_ok):
        return ('expected a "prompt": a string or a list of {"role": ..., "content": ...} messages'
                if "prompt" in row else f'no "prompt" column (columns: {", ".join(map(repr, row)) or "none"})')
    missing = [c for c in required if c not in row]
    if missing == ["answer"]:  # the answer task (GRPOTrainer's for a train_dataset), or a task like it
        return ("missing column 'answer' (or TRL's 'solution'), the final answer that the accuracy before, during "
                "and after training is graded against; rows with no answer, scored by reward functions alone, are "
                "the prompts task's (task: prompts)")
    return f"missing column(s) {', '.join(map(repr, missing))} that this task grades with" if missing else None
