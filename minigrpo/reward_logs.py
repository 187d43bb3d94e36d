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
    """A reward function's log_extra column that is not one value per completion, or a log_metric name that is one of
    the step's own."""


# Names every trainer adds to a step's line after its metrics (a logged metric of the same name would be lost)
LINE_NAMES = frozenset({"step", "learning_rate", "critic_learning_rate", "step_seconds", "generate_seconds",
                        "tokens_per_second", "eval/accuracy_greedy"})


@dataclass
class TrainerState:
    """transformers' TrainerState, the part a reward schedule reads, counted as TRL counts: optimizer steps done
    before this batch (global_step) and in the whole run (max_steps). minigrpo's steps are batches of
    steps_per_generation x num_iterations optimizer steps each."""

    global_step: int = 0
    max_steps: int = 0
    epoch: float = 0.0  # passes over the training prompts before this batch


class RewardLogs:
    """One run's trainer_state and the two loggers, handed to every reward call (`kwargs()`); the trainer takes what
    was logged: `take_columns(n)` after each scoring (n completions), `take_metrics()` after each step."""

    def __init__(self, state: TrainerState | None = None, updates_per_step: int = 1, epoch_steps: float = 0.0):
        self.state, self.updates_per_step, self.epoch_steps = state or TrainerState(), updates_per_step, epoch_steps
        self._metrics: dict[str, list[float]] = defaultdict(list)
        self._columns: dict[str, list] = {}

    @classmethod
    def for_run(cls, max_steps: int, updates_per_step: int = 1, epoch_steps: float = 0.0) -> "RewardLogs":
        """A run of max_steps steps (batches) of updates_per_step optimizer steps each (TRL counts those);
        epoch_steps: batches per pass over the training prompts."""
        return cls(TrainerState(max_steps=max_steps * updates_per_step), updates_per_step, epoch_steps)

    def at(self, step: int) -> "RewardLogs":
        """Itself, its trainer_state set to the start of step (counted from 1): the optimizer steps before it."""
        self.state.global_step = (step - 1) * self.updates_per_step
        self.state.epoch = (step - 1) / self.epoch_steps if self.epoch_steps else 0.0
        return self

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
                raise LoggedColumnError(f"log_extra: column {column!r} got {len(values)} values for "
                                        f"{num_completions} completions (one per completion of the call)")
        return columns

    def take_metrics(self, taken=()) -> dict[str, float]:
        """The mean of each metric logged since the last take, over every process's values (every process calls
        this once a step: with several, it gathers). taken: the names the step's line already has (LINE_NAMES are
        added after), which a logged metric may not overwrite: one line instead, on every process alike."""
        metrics, self._metrics = self._metrics, defaultdict(list)
        pooled = defaultdict(list)
        for rank_metrics in processes.gather_objects(dict(metrics)):
            for name, values in rank_metrics.items():
                pooled[name] += values
        clash = sorted(set(pooled) & (set(taken) | LINE_NAMES))
        if clash:
            raise LoggedColumnError(f"log_metric: {', '.join(map(repr, clash))} is one of the step's own metrics; log "
                                    f"it under another name (e.g. 'rewards/{clash[0]}')")
        return {name: sum(values) / len(values) for name, values in sorted(pooled.items())}
