"""Where a run's numbers and samples go as it trains: metrics.jsonl, completions.jsonl, and optionally
TensorBoard or Weights & Biases (`report_to`, TRL's name; off by default).

    output_dir/config.yaml         the settings the run ran with (write_config), written at its start
    output_dir/metrics.jsonl       one JSON line per step (metrics.py names them)
    output_dir/completions.jsonl   one JSON line per logged group: the first `log_completions_groups` prompts of
                                   each step, every completion of their group with its reward from every reward
                                   function, advantage, length and whether it was cut off (`minigrpo show RUN`)
    output_dir/tensorboard/        report_to: tensorboard — the metrics as scalars, the completions as a text table
    output_dir/wandb/              report_to: wandb — the same, as a run and a wandb.Table; offline unless you set
                                   WANDB_MODE=online (then `wandb sync` is not needed)

Only the main process writes. Both trainers use it.
"""

import json
import os
from pathlib import Path

import yaml
from tqdm.auto import tqdm

from ..errors import ConfigError
from ..metrics import finite_or_none, json_line

__all__ = ["RunLog", "completion_records", "REPORT_TO", "step_line", "write_config"]

REPORT_TO = ("tensorboard", "wandb")


def write_config(out: Path, config: dict, **extra) -> None:
    """out/config.yaml: the run's settings (a Config's to_dict()), then `extra`, which may override one, in order."""
    (out / "config.yaml").write_text(yaml.safe_dump({**config, **extra}, sort_keys=False))


def completion_records(step: int, batch, reward_names: list[str], correct: list[bool], num_groups: int,
                       group_size: int) -> list[dict]:
    """The first num_groups groups of a Batch as completions.jsonl lines: {"step", "group", "prompt", "answer"
    (when the row has one), "completions": [{"text", "reward", "rewards": {name: value}, "advantage", "length",
    "truncated", "correct"}]}, and with tools each completion's "messages" (the model's turns and the tool's, as
    TRL's messages) and "tool_calls"; with a step reward function, its "step_rewards"; with columns that reward
    functions logged (log_extra), "extra": {column: value}. Rewards that no function could
    score are null. length: the policy's tokens; advantage: per-token advantages' mean over them."""
    records = []
    lengths = batch.policy_mask.sum(1).long().tolist()
    completion_adv = batch.completion_adv  # a per-token advantage: its mean over the completion's tokens
    for g in range(min(num_groups, len(batch.rows) // group_size)):
        rows = range(g * group_size, (g + 1) * group_size)
        first = batch.rows[rows[0]]
        record = {"step": step, "group": g, "prompt": first["prompt"]}
        if "answer" in first:
            record["answer"] = first["answer"]
        record["completions"] = [{
            "text": batch.completions[i],
            "reward": batch.rewards[i].item(),
            "rewards": {name: batch.rewards_per_func[i, j].item() for j, name in enumerate(reward_names)},
            "advantage": round(completion_adv[i].item(), 6),
            "length": lengths[i],
            "truncated": bool(batch.is_truncated[i]),
            "correct": None if correct[i] is None else bool(correct[i]),  # None: nothing to grade
            **({"messages": batch.messages[i], "tool_calls": int(batch.tool_counts["calls"][i])}
               if batch.messages is not None else {}),
            **({"step_rewards": [r for r in batch.step_rewards[i].tolist() if r == r]}  # NaN padding left out
               if batch.step_rewards is not None else {}),
            **({"extra": {column: _plain(values[i]) for column, values in batch.logged_columns.items()}}
               if batch.logged_columns else {}),  # what reward functions logged with log_extra
        } for i in rows]
        records.append(finite_or_none(record))
    return records


def _plain(value):
    """A logged value as JSON holds it: numbers, text, booleans and None as they are, anything else as its str."""
    return value if value is None or isinstance(value, (str, int, float, bool)) else str(value)


class RunLog:
    """The run's log files (and report_to's loggers), opened once. `resume_step` > 0 appends to what a resumed
    run left (checkpoint.py has already cut both files back to that step)."""

    def __init__(self, out: Path, reward_names: list[str], *, group_size: int, log_completions: bool = True,
                 log_completions_groups: int = 2, report_to: list[str] | None = None, config: dict | None = None,
                 resume_step: int = 0, enabled: bool = True, print_every: int = 0):
        """group_size: completions per prompt (groups are consecutive rows); log_completions(_groups): whether to
        write completions.jsonl, and how many groups per step; report_to: "tensorboard", "wandb"; config: the
        run's settings, for W&B's run page; print_every: print one line of the step's main metrics every N steps
        (0: never; TRL's logging_steps)."""
        self.enabled, self.reward_names, self.writers, self.print_every = enabled, reward_names, [], print_every
        self.group_size, self.log_completions_groups = group_size, log_completions_groups
        if not enabled:
            return
        mode = "a" if resume_step else "w"
        self.metrics = open(out / "metrics.jsonl", mode)
        self.completions = open(out / "completions.jsonl", mode) if log_completions else None
        for name in report_to or ():
            self.writers.append(_TensorBoard(out) if name == "tensorboard" else _WandB(out, config or {}))

    def log(self, step: int, row: dict, batch: dict, correct: list[bool]) -> None:
        """One step: its metrics line, and (for completions.jsonl or report_to) its first groups' completions.
        batch: this process's (batch.Batch); correct: the task's verdict on each of its completions, in order."""
        if not self.enabled:
            return
        completions = []
        if self.completions is not None or self.writers:
            completions = completion_records(step, batch, self.reward_names, correct, self.log_completions_groups,
                                             self.group_size)
        self.metrics.write(json_line(row))
        self.metrics.flush()
        if self.completions is not None and completions:
            self.completions.writelines(json.dumps(r, allow_nan=False) + "\n" for r in completions)
            self.completions.flush()
        scalars = {k: v for k, v in finite_or_none(row).items() if isinstance(v, (int, float)) and k != "step"}
        for writer in self.writers:
            writer.log(step, scalars, completions)
        if self.print_every and step % self.print_every == 0:
            tqdm.write(step_line(row))

    def close(self) -> None:
        if not self.enabled:
            return
        self.metrics.close()
        if self.completions is not None:
            self.completions.close()
        for writer in self.writers:
            writer.close()


PRINTED = (("reward", "reward {:.3f}"), ("frac_reward_zero_std", "zero-std groups {:.0%}"),
           ("completions/mean_length", "length {:.1f}"), ("entropy", "entropy {:.3f}"), ("kl", "kl {:.4f}"),
           ("eval/accuracy_greedy", "held-out greedy accuracy {:.1%}"), ("step_seconds", "{:.2f} s"))


def step_line(row: dict) -> str:
    """One printed line for a metrics row: "step 10: reward 0.412, zero-std groups 38%, length 21.3, ..."."""
    shown = [text.format(row[key]) for key, text in PRINTED if isinstance(row.get(key), (int, float))]
    return f"step {row['step']}: " + ", ".join(shown)


def _table_rows(completions: list[dict]) -> list[list]:
    """completions.jsonl records -> rows of TRL's completions table: step, prompt, completion, reward, advantage."""
    return [[r["step"], str(r["prompt"]), c["text"], c["reward"], c["advantage"]]
            for r in completions for c in r["completions"]]


class _TensorBoard:
    def __init__(self, out: Path):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ConfigError(f"report_to: tensorboard needs the tensorboard package ({exc}); "
                              "pip install tensorboard") from None
        self.writer = SummaryWriter(log_dir=str(out / "tensorboard"))

    def log(self, step, scalars, completions):
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)
        if completions:
            lines = ["| step | prompt | completion | reward | advantage |", "|---|---|---|---|---|"]
            lines += ["| " + " | ".join(str(x).replace("|", "\\|").replace("\n", " ") for x in row) + " |"
                      for row in _table_rows(completions)]
            self.writer.add_text("completions", "\n".join(lines), step)
        self.writer.flush()

    def close(self):
        self.writer.close()


class _WandB:
    def __init__(self, out: Path, config: dict):
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError(f"report_to: wandb needs the wandb package ({exc}); pip install wandb") from None
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "minigrpo"), dir=str(out), config=config,
                              name=out.name, mode=os.environ.get("WANDB_MODE", "offline"),
                              reinit="create_new")

    def log(self, step, scalars, completions):
        data = dict(scalars)
        if completions:
            data["completions"] = self.wandb.Table(columns=["step", "prompt", "completion", "reward", "advantage"],
                                                   data=_table_rows(completions))
        self.run.log(data, step=step)

    def close(self):
        self.run.finish()
