"""What TRL hands a reward function besides the data: `trainer_state`, `log_metric` and `log_extra`.

TRL 1.16 calls every reward function as

    f(prompts=..., completions=..., completion_ids=..., **dataset_columns,
      trainer_state=..., log_metric=..., log_extra=...)

so a reward can follow the run (a curriculum that reads `trainer_state.global_step / trainer_state.max_steps`) and
log what it saw: `log_metric(name, value)` a number, averaged over the step into its line of metrics.jsonl (TRL's
logs: the same name), `log_extra(column, values)` one value per completion, written beside each completion in
completions.jsonl (under "extra"; TRL: a column of its completions table). minigrpo passes the same three.
"""

from collections import defaultdict
from dataclasses import dataclass

from .errors import MinigrpoError
from .parallel import processes

__all__ = ["TrainerState", "RewardLogs", "LoggedColumnError"]


class LoggedColumnError(MinigrpoError, ValueError):
    """A reward function's log_extra column that is not one value per completion."""


@dataclass
class TrainerState:
    """transformers' TrainerState, the part a reward schedule reads, counted as TRL counts: optimizer steps done
    before this batch (global_step) and in the whole run (max_steps). minigrpo's steps are batches of
    steps_per_generation x num_iterations optimizer steps each."""

    global_step: int = 0
    max_steps: int = 0


class RewardLogs:
    """One run's trainer_state and the two loggers, handed to every reward call (`kwargs()`); the trainer takes what
    was logged: `take_columns(n)` after each scoring (n completions), `take_metrics()` after each step."""

    def __init__(self, state: TrainerState | None = None):
        self.state = state or TrainerState()
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._columns: dict[str, list] = {}

    def kwargs(self) -> dict:
        return {"trainer_state": self.state, "log_metric": self.log_metric, "log_extra": self.log_extra}

    def log_metric(self, name: str, value: float) -> None:
        """TRL's log_metric: one number for this batch (several calls in a step are averaged)."""
        self._metrics[str(name)].append(float(value))

    def log_extra(self, column: str, values: list) -> None:
        """TRL's log_extra: one value per completion scored by this call, in order."""
        self._columns.setdefault(str(column), []).extend(values)

    def take_columns(self, num_completions: int) -> dict[str, list]:
        """The columns logged since the last take, each one value per completion of the scoring just done."""
        columns, self._columns = self._columns, {}
        for column, values in columns.items():
            if len(values) != num_completions:
                raise LoggedColumnError(f"log_extra: column {column!r} got {len(values)} values for {num_completions} "
                                 f"completions (one per completion of the call)")
        return columns

    def take_metrics(self) -> dict[str, float]:
        """The mean of each metric logged since the last take, over every process's values (every process calls
        this once a step: with several, it gathers)."""
        metrics, self._metrics = self._metrics, defaultdict(list)
        pooled = defaultdict(list)
        for rank_metrics in processes.gather_objects(dict(metrics)):
            for name, values in rank_metrics.items():
                pooled[name] += values
        return {name: sum(values) / len(values) for name, values in sorted(pooled.items())}
