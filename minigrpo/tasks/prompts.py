"""``prompts``: rows with a prompt and no answer, scored by your reward functions alone (TRL's prompt-only datasets).

    GRPOTrainer(model=..., reward_funcs=reward_len, train_dataset=load_dataset("trl-lib/tldr", split="train"))
    minigrpo train --task prompts --dataset rows.jsonl --reward-funcs my_rewards.py:reward_len --model ...

There is nothing to grade: no correctness reward, no held-out accuracy before, during or after training (the run
says so), no `accuracy` in metrics.jsonl; every row trains (no tenth is held out from rows handed over in Python).
The rewards, lengths and every other metric are logged as for any task. GRPOTrainer picks this task for a
train_dataset whose rows have no "answer" or "solution" column.
"""

from dataclasses import dataclass
from pathlib import Path

from .answers import AnswerTask
from .sources import read_dataset


@dataclass(frozen=True)
class PromptsTask(AnswerTask):
    """Your rows {"prompt": ..., any other columns}: the reward functions see every column; nothing is graded."""

    name: str = "prompts"
    graded = False  # no answer to grade: evaluate() and the step metrics leave accuracy out
    required_columns: tuple[str, ...] = ()

    def load(self, split: str, dataset: str | None = None, dataset_config: str | None = None) -> list[dict]:
        """The train split's rows (a single file: all of them); the test split is empty: nothing to evaluate."""
        if split == "test":
            return []
        if dataset is not None and Path(dataset).expanduser().is_file():
            return self.checked_rows(read_dataset(dataset, None), f"dataset_name: {dataset}")
        return super().load(split, dataset, dataset_config)

    def prepare_row(self, row: dict) -> dict:
        return row

    def grade(self, completion, row: dict) -> bool:
        raise TypeError("the prompts task has no answers to grade (task.graded is False)")
