"""Plots of training runs, read from their metrics.jsonl. The CLI (`minigrpo plot`) and the notebooks call
these same functions, so they always draw the same picture.

Every function takes one or more run directories (or already-loaded metric lists) and draws them on
shared axes, one line per run, labelled by the run's name.
"""

import json
import math
from pathlib import Path

import matplotlib.pyplot as plt

__all__ = ["load_metrics", "plot_curve", "plot_advantage_histogram", "plot_before_after", "plot_runs", "smooth"]


def load_metrics(run_dir: str | Path) -> list[dict]:
    """The lines of run_dir/metrics.jsonl, one dict per step."""
    with open(Path(run_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average that skips None/NaN (window 1 = raw)."""
    out, buf = [], []
    for v in values:
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            buf.append(v)
            buf = buf[-window:]
        out.append(sum(buf) / len(buf) if buf else math.nan)
    return out


def _series(metrics: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(m["step"], m[key]) for m in metrics if m.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def plot_curve(runs: dict[str, list[dict]], key: str, *, ax=None, ylabel: str | None = None, title: str | None = None,
               window: int = 10, style: str = "-"):
    """One metric against the step, for every run in {label: metrics}; smoothed with a trailing window."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    for label, metrics in runs.items():
        steps, values = _series(metrics, key)
        if steps:
            ax.plot(steps, smooth(values, window) if window > 1 else values, style, label=label)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel or key)
    ax.set_title(title or key)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return ax


def plot_advantage_histogram(metrics: list[dict], *, ax=None, steps: list[int] | None = None, title: str | None = None):
    """Histogram of the raw advantages logged at a few steps (first, middle, last by default)."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    logged = [m for m in metrics if m.get("advantages")]
    if steps is None and logged:
        steps = sorted({logged[0]["step"], logged[len(logged) // 2]["step"], logged[-1]["step"]})
    for m in logged:
        if m["step"] in (steps or []):
            ax.hist(m["advantages"], bins=30, alpha=0.5, label=f"step {m['step']}")
    ax.set_xlabel("advantage")
    ax.set_ylabel("completions")
    ax.set_title(title or "advantages (zero-std groups pile up at 0)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)
    return ax


def plot_before_after(run_dirs: list[str | Path], ax) -> None:
    """Mark each run's greedy accuracy before and after training (summary.json, the whole test split) on ax."""
    for d in run_dirs:
        path = Path(d) / "summary.json"
        if path.exists():
            s = json.loads(path.read_text())
            ax.plot([0, s["steps"]], [s["accuracy_before"], s["accuracy_after"]], "k*", markersize=9,
                    label=f"{Path(d).name}: before / after ({s['num_test_problems']} test problems)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def plot_runs(run_dirs: list[str | Path], out_dir: str | Path, *, window: int = 10) -> list[Path]:
    """Write the standard figures for one or several runs into out_dir; returns the PNG paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {Path(d).name: load_metrics(d) for d in run_dirs}
    figures = {
        "reward.png": [("reward", "mean reward", "reward per step (training samples)")],
        "accuracy.png": [("eval/accuracy_greedy", "greedy accuracy", "held-out greedy accuracy")],
        "length.png": [
            ("completion_length_mean", "tokens", "completion length (all)"),
            ("completion_length_correct_mean", "tokens", "completion length (correct answers)"),
            ("completion_length_incorrect_mean", "tokens", "completion length (wrong answers)"),
        ],
        "zero_std.png": [("frac_reward_zero_std", "fraction of groups", "groups with zero reward std (no signal)")],
        "clip_entropy.png": [
            ("clip_ratio/region_mean", "fraction of tokens", "clipped tokens"),
            ("entropy", "nats / token", "policy entropy"),
        ],
    }
    paths = []
    for filename, panels in figures.items():
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.8), squeeze=False)
        for ax, (key, ylabel, title) in zip(axes[0], panels):
            plot_curve(runs, key, ax=ax, ylabel=ylabel, title=title, window=1 if key.startswith("eval/") else window,
                       style="o-" if key.startswith("eval/") else "-")
        if filename == "accuracy.png":
            plot_before_after(run_dirs, axes[0][0])
        fig.tight_layout()
        fig.savefig(out_dir / filename, dpi=100)
        plt.close(fig)
        paths.append(out_dir / filename)
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 3.8), squeeze=False)
    for ax, (label, metrics) in zip(axes[0], runs.items()):
        plot_advantage_histogram(metrics, ax=ax, title=f"advantages — {label}")
    fig.tight_layout()
    fig.savefig(out_dir / "advantages.png", dpi=100)
    plt.close(fig)
    paths.append(out_dir / "advantages.png")
    return paths
