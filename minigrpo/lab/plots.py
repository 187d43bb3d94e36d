"""Plots of training runs and of the math, for the CLI (`minigrpo plot`) and the notebooks alike, so both
always draw the same picture.

Training runs (read from metrics.jsonl / summary.json): `plot_curve`, `plot_completion_lengths`,
`plot_advantage_histogram`, `plot_run_overview` (one run on one figure), `plot_run_comparison` (several runs on one
figure, e.g. the variants of notebook 04), `plot_length_drift`, `plot_before_after`, `plot_runs` (the CLI's standard
figures), `plot_seeds` (several seeds of several variants: each seed thin, their mean thick; notebook 11). They take {label: metrics} and draw every run on shared axes, one line per run. PPO's critic (notebook
06, metrics of ppo_trainer.train_ppo): `plot_critic`, `plot_advantage_variance`, `plot_critic_runs`.

Memory (notebook 05): `plot_memory` draws `memory.measure`'s results (or a `minigrpo memory --json` file's), the
measured peak of each setup beside its weights, gradients and Adam moments.

The math (notebooks 01 and 02): `plot_advantage_vs_num_correct`, `plot_histograms`, `plot_token_heatmap`,
`plot_surrogate`, `plot_kl_samples`, `plot_token_ratios`. They draw numbers computed by the package's own
functions (passed in as tensors or as callables), never a re-implementation.

Every function draws on `ax` when given one (else on a new figure) and returns the axes.
"""

import json
import math
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import torch

__all__ = [
    "load_metrics", "load_summary", "load_config", "on_policy", "eval_label", "flat_note", "smooth", "plot_curve", "plot_completion_lengths", "plot_advantage_histogram",
    "plot_run_overview", "plot_run_comparison", "plot_length_drift", "plot_before_after", "plot_runs",
    "plot_critic", "plot_advantage_variance", "plot_critic_runs",
    "plot_advantage_vs_num_correct", "plot_histograms", "plot_token_heatmap",
    "plot_surrogate", "plot_kl_samples", "plot_token_ratios", "plot_memory", "plot_sampling_mismatch",
    "plot_first_steps", "plot_advantage_heatmap", "plot_seeds",
]


def load_metrics(run_dir: str | Path) -> list[dict]:
    """The lines of run_dir/metrics.jsonl, one dict per step (metrics.py names the keys)."""
    with open(Path(run_dir) / "metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def load_summary(run_dir: str | Path) -> dict:
    """run_dir/summary.json: accuracy before / after, wall time, steps."""
    return json.loads((Path(run_dir) / "summary.json").read_text())


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing moving average that skips None/NaN (window 1 = raw)."""
    out, buf = [], []
    for v in values:
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            buf.append(v)
            buf = buf[-window:]
        out.append(sum(buf) / len(buf) if buf else math.nan)
    return out


X_LABELS = {"step": "step", "seconds": "training time (s, evaluation excluded)"}


def _series(metrics: list[dict], key: str, x: str = "step") -> tuple[list[float], list[float]]:
    """(x, value) of every line that has `key`; x = "step", or "seconds": training time summed over step_seconds."""
    if x not in X_LABELS:
        raise ValueError(f"x must be one of {list(X_LABELS)}, got {x!r}")
    points, seconds = [], 0.0
    for m in metrics:
        seconds += m.get("step_seconds", 0.0)
        if m.get(key) is not None:
            points.append((m["step"] if x == "step" else seconds, m[key]))
    return [p[0] for p in points], [p[1] for p in points]


def _label(ax, xlabel: str | None, ylabel: str, title: str, *, legend_size: int = 8, grid: str | None = "both"):
    """Axis labels and title, a light grid (None: none; "y": horizontal lines only), a legend if a line is labelled."""
    if xlabel is not None:
        ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if grid:
        ax.grid(alpha=0.3, axis=grid)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend_size)
    return ax


def plot_curve(runs: dict[str, list[dict]], key: str, *, ax=None, ylabel: str | None = None, title: str | None = None,
               window: int = 10, style: str = "-", x: str = "step", start: dict[str, float] | None = None,
               ylim: tuple[float, float] | None = None):
    """One metric against the step (or training time, x="seconds"), for every run in {label: metrics}.

    window: trailing moving average (1 = raw), then said in the title. start: {label: value at step 0} prepended
    to that run's line, e.g. the accuracy before training from summary.json, so an evaluation curve starts where
    training started (drawn alone when the run logged no evaluation during training). ylim: the y range, e.g.
    (0, 1) for a fraction, so that a small change is not drawn as a large one.
    """
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    for label, metrics in runs.items():
        xs, values = _series(metrics, key, x)
        values = smooth(values, window) if window > 1 else values
        if start and label in start:
            xs, values = [0, *xs], [start[label], *values]
        if xs:
            ax.plot(xs, values, style if len(xs) > 1 else "o", label=label)
    if ylim is not None:
        ax.set_ylim(*ylim)
    return _label(ax, X_LABELS[x], ylabel or key, smoothed_title(title or key, window))


def smoothed_title(title: str, window: int) -> str:
    """A plot's title, saying so when its curves are trailing means rather than the logged values."""
    return title if window <= 1 else f"{title} ({window}-step trailing mean)"


def plot_completion_lengths(runs: dict[str, list[dict]], *, ax=None, window: int = 5, title: str | None = None):
    """Completion length per step: all completions (solid), correct ones (dashed), wrong ones (dotted); one colour
    per run. On think_addition a correct answer is long: it wrote its scratchpad."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    parts = (("completions/mean_length", "-", "all"), ("completions/mean_length_correct", "--", "correct"),
             ("completions/mean_length_incorrect", ":", "wrong"))
    for i, (label, metrics) in enumerate(runs.items()):
        for key, style, part in parts:
            xs, values = _series(metrics, key)
            if xs:
                ax.plot(xs, smooth(values, window), style, color=f"C{i}", label=f"{label}: {part}" if label else part)
    return _label(ax, "step", "tokens per completion (eos included)",
                  smoothed_title(title or "completion length (training samples)", window), legend_size=7)


def plot_advantage_histogram(metrics: list[dict], *, ax=None, steps: list[int] | None = None, title: str | None = None):
    """Histogram of the raw advantages logged at a few steps (first, middle, last by default), on shared bins."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    logged = [m for m in metrics if m.get("advantages")]
    if steps is None and logged:
        steps = sorted({logged[0]["step"], logged[len(logged) // 2]["step"], logged[-1]["step"]})
    chosen = [m for m in logged if m["step"] in (steps or [])]
    if chosen:
        low = min(min(m["advantages"]) for m in chosen)
        high = max(max(m["advantages"]) for m in chosen)
        bins = torch.linspace(low, high if high > low else low + 1, 31).tolist()
        for m in chosen:
            ax.hist(m["advantages"], bins=bins, alpha=0.45, label=f"step {m['step']}")
    return _label(ax, "advantage", "completions", title or "advantages (zero-std groups pile up at 0)", grid=None)


FRACTION_YLIM = (-0.04, 1.04)  # 0..1 with a margin, so that a curve at exactly 0 or 1 does not hide on the frame


def plot_run_overview(metrics: list[dict], summary: dict | None = None, *, title: str = "", window: int = 3):
    """One GRPO run on a 2 x 3 grid: reward, held-out accuracy, zero-std groups, completion lengths, the advantages
    of every step (a heat map), entropy. Returns the figure. summary (summary.json) adds the before / after marks."""
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    run = {"": metrics}  # one run: the figure's title names it, the panels need no legend for it
    plot_curve(run, "reward", ax=axes[0, 0], ylabel="mean reward (= accuracy of the samples)", window=window,
               title="reward of the training samples")
    plot_curve({"during training": metrics}, "eval/accuracy_greedy", ax=axes[0, 1], ylabel="greedy accuracy", window=1,
               style="o-", title="held-out greedy accuracy",
               start={"during training": summary["accuracy_before"]} if summary else None)
    if summary:
        axes[0, 1].plot([summary["steps"]], [summary["accuracy_after"]], "k*", markersize=10,
                        label=f"after ({summary['num_test_problems']} problems)")
        axes[0, 1].legend(fontsize=8)
    plot_curve(run, "frac_reward_zero_std", ax=axes[0, 2], ylabel="fraction of groups", window=window,
               title="frac_reward_zero_std (groups with no signal)", ylim=FRACTION_YLIM)
    plot_completion_lengths(run, ax=axes[1, 0], window=window)
    plot_advantage_heatmap(metrics, ax=axes[1, 1])
    plot_curve(run, "entropy", ax=axes[1, 2], ylabel="nats / token", window=window, title="policy entropy")
    for ax in (axes[0, 0], axes[0, 2], axes[1, 2]):
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


COMPARISON_PANELS = (  # (metric, y label, title) of plot_run_comparison, row by row
    ("eval/accuracy_greedy", "greedy accuracy", "held-out greedy accuracy"),
    ("reward", "mean reward (= sample accuracy)", "reward of the training samples"),
    ("frac_reward_zero_std", "fraction of groups", "frac_reward_zero_std (no signal)"),
    ("completions/mean_length", "tokens (eos included)", "completion length: all samples"),
    ("completions/mean_length_correct", "tokens (eos included)", "completion length: right answers"),
    ("completions/mean_length_incorrect", "tokens (eos included)", "completion length: wrong answers"),
    ("entropy", "nats / token", "policy entropy"),
    ("clip_ratio/region_mean", "fraction clipped (symlog)", "clip_ratio/region_mean"),
    ("approx_kl", "nats / token", "approx_kl (old -> new policy)"),
)


def plot_run_comparison(runs: dict[str, list[dict]], start: dict[str, float] | None = None, *, title: str = "",
                        window: int = 3, style: str = "-"):
    """Several runs on one 3 x 3 grid of shared axes: accuracy, reward, zero-std groups; completion length of all,
    right and wrong answers; entropy, clip ratio, approx KL. One colour per run, one legend for the figure.

    start: {label: greedy accuracy before training} (summary.json's accuracy_before) so accuracy curves start at
    step 0. Returns the figure. The length panels share a y range, so right and wrong answers compare by eye; the
    clip-ratio panel is linear below 0.1% and logarithmic above, so 0.1% and 30% both read.
    """
    fig, axes = plt.subplots(3, 3, figsize=(15, 11))
    for ax, (key, ylabel, panel_title) in zip(axes.flat, COMPARISON_PANELS):
        is_eval = key.startswith("eval/")
        plot_curve(runs, key, ax=ax, ylabel=ylabel, title=panel_title, window=1 if is_eval else window,
                   style="o-" if is_eval else style, start=start if is_eval else None)
        if ax.get_legend() is not None:
            ax.get_legend().remove()
        if key.startswith("clip_ratio/"):  # 0.1% and 30% on one axis: linear below 1e-3, logarithmic above
            ax.set_yscale("symlog", linthresh=1e-3)
    low = min(ax.get_ylim()[0] for ax in axes[1])
    high = max(ax.get_ylim()[1] for ax in axes[1])
    for ax in axes[1]:
        ax.set_ylim(low, high)
    handles, labels = axes[0, 1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=min(len(labels), 6), fontsize=10, frameon=False,
               bbox_to_anchor=(0.5, 0.965))
    fig.suptitle(title + (f"  (curves: moving average over {window} steps; accuracy: raw)" if window > 1 else ""),
                 fontsize=13)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    return fig


WATCH_PANELS = (  # (metric, y label, title) of plot_first_steps, after its reward and accuracy panels
    ("frac_reward_zero_std", "fraction of groups (no signal)", "frac_reward_zero_std"),
    ("reward_std", "std of the reward (what GRPO learns from)", "reward_std"),
    ("completions/clipped_ratio", "fraction of completions cut off", "completions/clipped_ratio"),
)


def plot_first_steps(runs: dict[str, list[dict]], start: dict[str, float] | None = None, *, title: str = "",
                     window: int = 1):
    """The metrics to watch in a run's first steps, for several runs on a 2 x 3 grid (one colour per run): the reward
    the run optimises; accuracy, the task's grader on the training samples (solid) and on held-out problems
    (greedy, circles; start: {label: accuracy before training} puts step 0 on it); completion length of all, right
    and wrong answers; zero-std groups; reward std; cut-off completions. Returns the figure.

    The reward and the accuracy share a panel row on purpose: a reward that rises while accuracy does not says the
    reward pays for something else (length, form) or its checker is broken.
    """
    fig, axes = plt.subplots(2, 3, figsize=(16, 8))
    plot_curve(runs, "reward", ax=axes[0, 0], ylabel="mean reward (what the run optimises)", window=window,
               title="reward")
    for i, (label, metrics) in enumerate(runs.items()):
        xs, values = _series(metrics, "accuracy")
        axes[0, 1].plot(xs, smooth(values, window), "-", color=f"C{i}", alpha=0.6, label=f"{label}: training samples")
        xs, values = _series(metrics, "eval/accuracy_greedy")
        if start and label in start:
            xs, values = [0, *xs], [start[label], *values]
        axes[0, 1].plot(xs, values, "o--", color=f"C{i}", label=f"{label}: held-out, greedy")
    axes[0, 1].set_ylim(*FRACTION_YLIM)
    _label(axes[0, 1], "step", "fraction right", smoothed_title("accuracy: the task's grader", window),
           legend_size=7)
    plot_completion_lengths(runs, ax=axes[0, 2], window=window)
    for ax, (key, ylabel, panel_title) in zip(axes[1], WATCH_PANELS):
        plot_curve(runs, key, ax=ax, ylabel=ylabel, title=panel_title, window=window,
                   ylim=FRACTION_YLIM if key != "reward_std" else None)
    fig.suptitle(title, fontsize=13)
    fig.tight_layout()
    return fig


def plot_length_drift(runs: dict[str, list[dict]], *, first: int = 5, last: int = 10, ax=None,
                      title: str | None = None):
    """Change in mean completion length between the first `first` and the last `last` logged steps of each run,
    for all samples, right answers and wrong answers: one group of three bars per run.

    The length-bias claim (Dr. GRPO) is about the wrong answers: under GRPO's 1/|o_i| a long wrong answer is
    penalised less per token, so wrong answers may drift longer.
    """
    ax = ax or plt.subplots(figsize=(9, 3.8))[1]
    parts = (("completions/mean_length", "all"), ("completions/mean_length_correct", "right answers"),
             ("completions/mean_length_incorrect", "wrong answers"))
    width = 0.8 / len(parts)
    colors = ("0.6", "#2a9d8f", "#e76f51")  # not the runs' colours C0.., which the bars are not
    for j, (key, part) in enumerate(parts):
        drifts = []
        for metrics in runs.values():
            values = [m[key] for m in metrics if m.get(key) is not None]
            head, tail = values[:first], values[-last:]
            drifts.append(sum(tail) / len(tail) - sum(head) / len(head) if head and tail else math.nan)
        xs = [i + (j - (len(parts) - 1) / 2) * width for i in range(len(runs))]
        ax.bar(xs, drifts, width, color=colors[j], label=part)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xticks(range(len(runs)))
    ax.set_xticklabels(list(runs))
    return _label(ax, None, "change in tokens per completion",
                  title or f"length drift: mean of the last {last} steps minus mean of the first {first}", grid="y")


def plot_before_after(run_dirs: list[str | Path], ax) -> None:
    """Mark each run's greedy accuracy before and after training (summary.json, the whole test split) on ax."""
    for d in run_dirs:
        path = Path(d) / "summary.json"
        if path.exists():
            s = json.loads(path.read_text())
            ax.plot([0, s["steps"]], [s["accuracy_before"], s["accuracy_after"]], "k*", markersize=9,
                    label=f"{Path(d).name}: before / after (greedy, all {s['num_test_problems']} held-out problems)")
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8)


def plot_sampling_mismatch(runs: dict[str, list[dict]], *, axes=None):
    """The sampler's log-probs (vLLM's, or lab/cast_engine.py's) against the trainer's, per step (engine_mismatch.py),
    for every run in {label: metrics}: left, mean (solid) and max (dashed) |delta log p| over completion tokens on a
    log scale (a run whose differences are all 0 is said so on the panel); right, the importance weight applied to the
    loss, min (dotted), mean (solid) and max (dashed). Runs whose engine is the policy itself draw nothing."""
    axes = axes if axes is not None else plt.subplots(1, 2, figsize=(12, 3.8))[1]
    diff, ratio = "sampling/sampling_logp_difference", "sampling/importance_sampling_ratio"
    for colour, (label, metrics) in zip(plt.rcParams["axes.prop_cycle"].by_key()["color"], runs.items()):
        for ax, key, stats in ((axes[0], diff, ("mean", "max")), (axes[1], ratio, ("min", "mean", "max"))):
            for stat in stats:
                xs, values = _series(metrics, f"{key}/{stat}")
                style = {"min": ":", "mean": "-", "max": "--"}[stat]
                ax.plot(xs, values, style, color=colour, label=f"{label} {stat}" if xs else None)
    if any(v > 0 for line in axes[0].get_lines() for v in line.get_ydata()):
        axes[0].set_yscale("log")  # a run with differences of exactly 0 is then off the panel: named in the legend
    for label, metrics in runs.items():
        if metrics and all(m.get(f"{diff}/max") == 0 for m in metrics):
            axes[0].plot([], [], " ", label=f"{label}: every difference exactly 0")
    _label(axes[0], "step", "|log p_trainer - log p_sampler|", "sampler–trainer log-prob difference (completion tokens)")
    _label(axes[1], "step", "importance weight", "the importance-sampling weight on the loss")
    return axes


FRACTIONS = ("frac_reward_zero_std", "eval/accuracy_greedy")  # drawn on 0..1 (FRACTION_YLIM)
SHARED_Y = ("length.png",)  # panels of one quantity compared across them (all / right / wrong answers): one y range


def load_config(run_dir: str | Path) -> dict:
    """run_dir/config.yaml (the settings the run used), or {} when there is none."""
    import yaml

    path = Path(run_dir) / "config.yaml"
    return (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}


def on_policy(config: dict) -> bool:
    """Whether a run's ratio pi / pi_old is exactly 1 at every update: one optimizer step per batch
    (num_iterations 1, steps_per_generation 1), so nothing can be clipped (trainer.py: old_logp = logp.detach())."""
    return config.get("num_iterations", 1) == 1 and config.get("steps_per_generation", 1) == 1


def eval_label(run_dir: str | Path) -> str:
    """What a run's in-training accuracy points are: "greedy, first 200 held-out problems, every 10 steps"."""
    config, summary_path = load_config(run_dir), Path(run_dir) / "summary.json"
    if not config:
        return "greedy, held-out problems"
    total = json.loads(summary_path.read_text()).get("num_test_problems") if summary_path.exists() else None
    n = min(config.get("eval_num_problems", 200), total or math.inf)
    return f"greedy, first {n} held-out problems, every {config.get('eval_steps')} steps"


def flat_note(ax, text: str) -> None:
    """A note across a panel that is flat by construction, so a line at 0 is not read as a finding."""
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", fontsize=8, color="0.25", wrap=True,
            bbox={"boxstyle": "round", "facecolor": "white", "edgecolor": "0.7", "alpha": 0.9})


def plot_runs(run_dirs: list[str | Path], out_dir: str | Path, *, window: int = 10) -> list[Path]:
    """Write the standard figures for one or several runs into out_dir; returns the PNG paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    runs = {Path(d).name: load_metrics(d) for d in run_dirs}
    figures = {
        "reward.png": [("reward", "mean reward", "reward per step (training samples)")],
        "accuracy.png": [("eval/accuracy_greedy", "greedy accuracy", "held-out greedy accuracy")],
        "length.png": [
            ("completions/mean_length", "tokens", "completion length (all)"),
            ("completions/mean_length_correct", "tokens", "completion length (correct answers)"),
            ("completions/mean_length_incorrect", "tokens", "completion length (wrong answers)"),
        ],
        "zero_std.png": [("frac_reward_zero_std", "fraction of groups", "groups with zero reward std (no signal)")],
        "clip_entropy.png": [
            ("clip_ratio/region_mean", "fraction of tokens", "clipped tokens"),
            ("entropy", "nats / token", "policy entropy"),
        ],
    }
    if any("tools/call_frequency" in m for metrics in runs.values() for m in metrics):  # a run with tools
        figures["tools.png"] = [
            ("tools/call_frequency", "calls per completion", "tool calls"),
            ("eval/accuracy_greedy", "greedy accuracy", "held-out greedy accuracy"),
            ("completions/mean_length", "tokens", "the policy's tokens per completion"),
        ]
    # The in-training accuracy's legend names its sample (the stars name theirs: the whole test split)
    eval_runs = {f"{Path(d).name}: {eval_label(d)}": metrics for d, metrics in zip(run_dirs, runs.values())}
    all_on_policy = all(on_policy(load_config(d)) for d in run_dirs)
    paths = []
    for filename, panels in figures.items():
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 3.8), squeeze=False,
                                 sharey=filename in SHARED_Y)
        for ax, (key, ylabel, title) in zip(axes[0], panels):
            is_eval = key.startswith("eval/")
            plot_curve(eval_runs if is_eval else runs, key, ax=ax, ylabel=ylabel, title=title,
                       window=1 if is_eval else window, style="o-" if is_eval else "-",
                       ylim=FRACTION_YLIM if key in FRACTIONS else None)
            if key == "clip_ratio/region_mean" and all_on_policy:
                flat_note(ax, "0 by construction: one optimizer step per batch (num_iterations 1,\n"
                              "steps_per_generation 1), so pi / pi_old = 1 and no token is clipped")
        if filename in SHARED_Y:
            axes[0][0].set_ylim(bottom=0)
        if filename in ("accuracy.png", "tools.png"):
            plot_before_after(run_dirs, axes[0][0 if filename == "accuracy.png" else 1])
        fig.tight_layout()
        fig.savefig(out_dir / filename, dpi=100)
        plt.close(fig)
        paths.append(out_dir / filename)
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 3.8), squeeze=False)
    for ax, (label, metrics) in zip(axes[0], runs.items()):
        plot_advantage_heatmap(metrics, ax=ax, title=f"advantages per step — {label}")
    fig.tight_layout()
    fig.savefig(out_dir / "advantages.png", dpi=100)
    plt.close(fig)
    paths.append(out_dir / "advantages.png")
    if any("sampling/sampling_logp_difference/mean" in m for metrics in runs.values() for m in metrics):  # vLLM sampled
        fig, axes = plt.subplots(1, 2, figsize=(12, 3.8))
        plot_sampling_mismatch(runs, axes=axes)
        fig.tight_layout()
        fig.savefig(out_dir / "sampling_mismatch.png", dpi=100)
        plt.close(fig)
        paths.append(out_dir / "sampling_mismatch.png")
    return paths


# ---- PPO's critic, for notebook 06 (metric names of ppo_trainer.train_ppo) -------------------------------------
def plot_critic(runs: dict[str, list[dict]], *, axes=None, window: int = 3, group_size: int | None = None):
    """The critic of one or more PPO runs, as two panels (one colour per run):

    left, "does the critic keep up?": the batch's mean reward (solid) and the critic's mean prediction of it,
    V(s_0) at the first completion token, made before the update (dashed). A dashed line under the solid one is
    a critic lagging a policy that improves. Right, its error: mean squared error of V(s_0) against each
    completion's reward (solid), and that of GRPO's baseline on the same batch, each completion's group mean
    (dotted; `adv_var/grpo_unscaled`). Neither can go below the rewards' own noise within a prompt.

    group_size: G of the runs' groups. Given, the group mean's error is drawn as the leave-one-out mean's (RLOO's,
    the fair comparison: a baseline that does not contain the completion's own reward), which is exactly
    (G / (G - 1))^2 times it, since r_i - mean_{j != i} r_j = G / (G - 1) * (r_i - mean_j r_j).
    """
    axes = axes if axes is not None else plt.subplots(1, 2, figsize=(13, 3.8))[1]
    lag_ax, err_ax = axes
    for i, (label, metrics) in enumerate(runs.items()):
        for ax, key, style, part in ((lag_ax, "reward", "-", "mean reward"),
                                     (lag_ax, "value/v0_mean", "--", "critic V(s_0)"),
                                     (err_ax, "value/v0_mse", "-", "critic V(s_0)"),
                                     (err_ax, "adv_var/grpo_unscaled", ":", "group mean (GRPO's baseline)")):
            xs, values = _series(metrics, key)
            if xs and key == "adv_var/grpo_unscaled" and group_size:
                values = [v * (group_size / (group_size - 1)) ** 2 for v in values]
                part = "leave-one-out group mean (RLOO)"
            if xs:
                ax.plot(xs, smooth(values, window), style, color=f"C{i}", label=f"{label}: {part}" if label else part)
    _label(lag_ax, "step", "reward (0 = wrong, 1 = right)", "does the critic keep up? mean reward vs its prediction V(s_0)")
    _label(err_ax, "step", "mean squared error (reward$^2$)", "error of the baseline, measured before the update")
    return axes


ADVANTAGE_VARIANCES = (  # (metric of train_ppo, label, style) for plot_advantage_variance, all on the same batch
    ("adv_var/reward", "no baseline: R", dict(color="k", ls="--", lw=2.5, alpha=0.5)),
    ("adv_var/grpo_unscaled", "group baseline: R - mean(group)", dict(color="C1")),
    ("adv_var/gae_t0", "GAE, first token: A_0", dict(color="C2")),
    ("adv_var/gae_tokens", "GAE, all tokens: A_t", dict(color="C3")),
    ("adv_var/grpo", "GRPO z-score (R - mean) / std, other units", dict(color="C4", ls=":")),
)


def plot_advantage_variance(metrics: list[dict], *, ax=None, window: int = 3, title: str | None = None):
    """Variance over the batch of each advantage estimator, computed on the same PPO batch at every step.

    The first four are in reward units (before PPO's whitening); no baseline is drawn wide and faint, so a line
    on top of it stays visible. GRPO's z-score (dotted) is scaled to std 1 in every group that has a signal, so
    its level says how many groups have one, not how noisy it is.
    """
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    for key, label, style in ADVANTAGE_VARIANCES:
        xs, values = _series(metrics, key)
        if xs:
            ax.plot(xs, smooth(values, window), label=label, **style)
    ax.set_ylim(bottom=0)
    return _label(ax, "step", "variance over the batch (reward$^2$)", title or "advantage variance per estimator, same samples",
                  legend_size=7)


def plot_critic_runs(run_dirs: list[str | Path], out_dir: str | Path, *, window: int = 3) -> Path:
    """Write out_dir/critic.png for PPO runs: `plot_critic` and each run's `plot_advantage_variance`."""
    runs = {Path(d).name: load_metrics(d) for d in run_dirs}
    fig, axes = plt.subplots(1, 2 + len(runs), figsize=(6.5 * (2 + len(runs)), 3.8), squeeze=False)
    plot_critic(runs, axes=axes[0][:2], window=window)
    for ax, (label, metrics) in zip(axes[0][2:], runs.items()):
        plot_advantage_variance(metrics, ax=ax, window=window, title=f"advantage variance — {label}")
    fig.tight_layout()
    Path(out_dir).mkdir(parents=True, exist_ok=True)
    fig.savefig(Path(out_dir) / "critic.png", dpi=100)
    plt.close(fig)
    return Path(out_dir) / "critic.png"


# ---- the math, for notebooks 01 and 02 ----------------------------------------------------------------------
def plot_advantage_vs_num_correct(schemes: dict[str, Callable], group_size: int, *, ax=None, title: str | None = None):
    """Advantage of a right answer (solid) and of a wrong one (dashed) when k of the G answers are right.

    schemes: {label: f(rewards (G,)) -> advantages (G,)}, e.g. a lambda calling `group_advantages`; each is called
    on the 0/1 rewards [1]*k + [0]*(G-k) for k = 0..G. At k = 0 and k = G every advantage is 0: nothing to learn.
    """
    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    num_correct = list(range(group_size + 1))
    for i, (label, scheme) in enumerate(schemes.items()):
        right, wrong = [], []
        for k in num_correct:
            rewards = torch.tensor([1.0] * k + [0.0] * (group_size - k))
            adv = scheme(rewards)
            right.append(adv[0].item() if k > 0 else math.nan)  # no right answer to score when k = 0
            wrong.append(adv[-1].item() if k < group_size else math.nan)
        ax.plot(num_correct, right, "o-", color=f"C{i}", label=f"{label}: right answer")
        ax.plot(num_correct, wrong, "s--", color=f"C{i}", alpha=0.7, label=f"{label}: wrong answer")
    ax.axhline(0, color="k", lw=0.8)
    return _label(ax, f"right answers in the group (k of G = {group_size})", "advantage",
                  title or "advantage of a right and a wrong answer vs the group's success", legend_size=7)


def plot_histograms(values: dict[str, torch.Tensor], *, ax=None, bins: int = 40, xlabel: str = "advantage",
                    ylabel: str = "completions", title: str | None = None):
    """Overlaid histograms on shared bins, one per entry of {label: values (N,)} (NaNs dropped)."""
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    cleaned = {label: torch.as_tensor(v, dtype=torch.float64).flatten() for label, v in values.items()}
    cleaned = {label: v[~v.isnan()] for label, v in cleaned.items()}
    low = min(v.min().item() for v in cleaned.values())
    high = max(v.max().item() for v in cleaned.values())
    edges = torch.linspace(low, high if high > low else low + 1, bins + 1).tolist()
    for label, v in cleaned.items():
        ax.hist(v.tolist(), bins=edges, histtype="step", lw=1.8, label=label)
    return _label(ax, xlabel, ylabel, title or "")


def plot_token_heatmap(values: torch.Tensor, mask: torch.Tensor | None = None, *, ax=None,
                       tokens: list[list[str]] | None = None, row_labels: list[str] | None = None,
                       title: str | None = None, colorbar_label: str = "advantage", fmt: str = "{:+.2f}",
                       limit: float | None = None):
    """A (N, T) per-token quantity as a heat map: rows = completions, columns = token positions.

    Diverging colours centred on 0 (red < 0 < blue); positions where mask is 0 (padding) are left blank. tokens:
    text of each token, printed in its cell above the value; row_labels: one name per completion; limit: the
    colour scale's +-range (default: the largest |value|) — give several maps the same one to compare them.
    """
    values = torch.as_tensor(values, dtype=torch.float64).detach()
    mask = torch.ones_like(values) if mask is None else torch.as_tensor(mask, dtype=torch.float64)
    shown = values.masked_fill(mask == 0, math.nan)
    N, T = values.shape
    ax = ax or plt.subplots(figsize=(min(1.0 + 0.75 * T, 14), 0.6 + 0.55 * N))[1]
    limit = limit or shown.abs().nan_to_num(0.0).max().item() or 1.0
    image = ax.imshow(shown.numpy(), cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto")
    for i in range(N):
        for t in range(T):
            if mask[i, t] == 0:
                continue
            value = values[i, t].item() + 0.0  # + 0.0 turns -0.0 into 0.0
            text = fmt.format(value)
            if tokens is not None and t < len(tokens[i]):
                text = f"{tokens[i][t]}\n{text}"
            dark = abs(value) > 0.55 * limit  # white text on the saturated cells
            ax.text(t, i, text, ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(range(T))
    ax.set_xlabel("token position t")
    ax.set_yticks(range(N))
    ax.set_yticklabels(row_labels or [f"completion {i}" for i in range(N)], fontsize=8)
    ax.set_title(title or "")
    ax.figure.colorbar(image, ax=ax, label=colorbar_label, fraction=0.03, pad=0.02)
    return ax


def plot_surrogate(per_token_losses: dict[str, Callable], adv: float, *, ax=None, ratio_range=(0.4, 1.8),
                   title: str | None = None):
    """The per-token objective -l(rho, A) against the ratio rho, for one advantage A.

    per_token_losses: {label: f(ratio (R,), adv (R,)) -> per-token loss (R,)}, e.g. a lambda calling
    `clipped_surrogate`. Where the objective is flat the token gets no gradient (clipped): those stretches are
    overlaid with faint dots, found with autograd rather than by redoing the clipping here (so no curve is drawn
    dotted: the curves are solid, dashed and dash-dotted).
    """
    ax = ax or plt.subplots(figsize=(5.5, 3.8))[1]
    ratio = torch.linspace(*ratio_range, 281, dtype=torch.float64, requires_grad=True)
    advantage = torch.full_like(ratio, adv)
    for i, (label, fn) in enumerate(per_token_losses.items()):
        objective = -fn(ratio, advantage)
        (grad,) = torch.autograd.grad(objective.sum(), ratio)
        x, y = ratio.detach().numpy(), objective.detach().numpy()
        # Curves often coincide over a stretch: the first is drawn widest and the later ones thinner and dashed
        # on top of it, so none hides another.
        ax.plot(x, y, color=f"C{i}", lw=4.5 - 1.4 * min(i, 2), ls=("-", "--", "-.")[min(i, 2)], label=label)
        flat = (grad == 0).numpy()
        ax.plot(x[flat], y[flat], ".", color=f"C{i}", ms=5, alpha=0.35)
    ax.axvline(1.0, color="k", lw=0.6, ls=":")
    ax.set_xlabel(r"ratio $\rho = \pi_\theta / \pi_{old}$")
    ax.set_ylabel(r"objective per token $-\ell(\rho, A)$")
    ax.set_title(title or f"A = {adv:+g}  (dots: clipped, zero gradient)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return ax


def plot_kl_samples(estimates: dict[str, torch.Tensor], exact_kl: float, *, axes=None):
    """KL estimators on samples: their values (left) and their running mean over samples (right), against the
    exact KL (black line). estimates: {name: per-sample estimate (S,)}, e.g. from `kl_divergence`."""
    axes = axes if axes is not None else plt.subplots(1, 2, figsize=(12, 3.8))[1]
    hist_ax, mean_ax = axes
    plot_histograms(estimates, ax=hist_ax, bins=60, xlabel="per-sample estimate", ylabel="samples",
                    title="per-sample values (unbiased means centred on the black line)")
    hist_ax.axvline(exact_kl, color="k", lw=1.5, label=f"exact KL = {exact_kl:.4f}")
    hist_ax.legend(fontsize=8)
    for i, (name, values) in enumerate(estimates.items()):
        values = torch.as_tensor(values, dtype=torch.float64)
        running = values.cumsum(0) / torch.arange(1, len(values) + 1)
        mean_ax.plot(range(1, len(values) + 1), running.numpy(), color=f"C{i}", label=name)
    mean_ax.axhline(exact_kl, color="k", lw=1.5, label="exact KL")
    mean_ax.set_xscale("log")
    mean_ax.set_xlabel("number of samples")
    mean_ax.set_ylabel("running mean of the estimate")
    mean_ax.set_title("running mean: low variance settles sooner")
    mean_ax.grid(alpha=0.3)
    mean_ax.legend(fontsize=8)
    return axes


def plot_token_ratios(token_ratio: torch.Tensor, references: dict[str, float], *, ax=None,
                      clip_range: tuple[float, float] | None = None, clip_label: str = "clip range",
                      title: str | None = None):
    """Per-token ratios rho_t of one completion (bars) and single numbers summarising them (horizontal lines),
    e.g. their arithmetic mean, GSPO's sequence ratio s_i (geometric mean), GMPO's clipped geometric mean.
    clip_range: a band to shade, named in the legend by clip_label (whose range it is)."""
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    token_ratio = torch.as_tensor(token_ratio, dtype=torch.float64).detach()
    ax.bar(range(len(token_ratio)), token_ratio.numpy(), color="0.75", label=r"token ratio $\rho_t$")
    if clip_range is not None:
        ax.axhspan(*clip_range, color="C2", alpha=0.12, label=f"{clip_label} [{clip_range[0]:.3g}, {clip_range[1]:.3g}]")
    for i, (label, value) in enumerate(references.items()):
        ax.axhline(value, color=f"C{i}", lw=2, ls=["-", "--", "-.", ":"][i % 4], label=f"{label} = {value:.3f}")
    ax.axhline(1.0, color="k", lw=0.6)
    ax.set_xlabel("token position t")
    ax.set_ylabel(r"$\pi_\theta(o_t) / \pi_{old}(o_t)$")
    ax.set_title(title or "one completion: token ratios and sequence-level summaries")
    ax.legend(fontsize=8)
    return ax


# ---- memory, for notebook 05 --------------------------------------------------------------------------------
MEMORY_PARTS = (("weights", "weights", "#264653"), ("gradients", "gradients", "#2a9d8f"),
                ("optimizer", "AdamW moments", "#e9c46a"))


def plot_memory(results: list[dict], device: str, *, estimates: dict[str, dict] | None = None,
                labels: dict[str, str] | None = None, ax=None, title: str | None = None):
    """One bar per setup: the measured memory of a training step (`memory.measure`'s results for one shape).

    CPU: peak RSS minus the RSS before the model was built ("model + step"); CUDA: torch.cuda.max_memory_allocated.
    estimates ({setup: {"weights", "gradients", "optimizer"} in bytes}, `memory.estimate_static_bytes`) adds a
    narrower stacked bar beside each: what the step holds before any activation. labels: {setup: display name}.
    Each measured bar is annotated with its MiB and its share of the PPO-with-critic bar, when there is one.
    """
    ax = ax or plt.subplots(figsize=(7.5, 4))[1]
    mib = 2**20
    used = [(r["peak_bytes"] - (r["baseline_bytes"] if device == "cpu" else 0)) / mib for r in results]
    ppo = next((u for r, u in zip(results, used) if r["setup"] == "ppo-critic"), None)
    width = 0.38 if estimates else 0.6
    offset = -width / 2 if estimates else 0.0
    measured_label = "measured: peak RSS above baseline" if device == "cpu" else "measured: peak allocated"
    bars = ax.bar([i + offset for i in range(len(results))], used, width, color="0.55", label=measured_label)
    for bar, value in zip(bars, used):
        note = f"{value:,.0f}" + (f"\n{value / ppo:.0%} of PPO" if ppo else "")
        ax.annotate(note, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom", fontsize=8)
    tops = list(used)
    if estimates:
        bottoms = [0.0] * len(results)
        for key, part, color in MEMORY_PARTS:
            heights = [estimates[r["setup"]][key] / mib for r in results]
            ax.bar([i + width / 2 for i in range(len(results))], heights, width, bottom=bottoms, color=color,
                   label=f"estimate: {part}")
            bottoms = [b + h for b, h in zip(bottoms, heights)]
        tops += bottoms
    ax.set_xticks(range(len(results)))
    ax.set_xticklabels([(labels or {}).get(r["setup"], r["setup"]) for r in results], fontsize=9)
    ax.set_ylabel("MiB (CPU RSS)" if device == "cpu" else "MiB (CUDA allocated)")
    ax.set_ylim(0, max(tops + [0]) * 1.25 or 1)
    ax.set_title(title or "memory of one training step")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8, loc="upper left")
    return ax


def plot_advantage_heatmap(metrics: list[dict], *, ax=None, bins: int = 25, limit: float | None = None,
                           title: str | None = None):
    """The advantages logged at every step as a step x advantage heat map: column = one step, shade = the share of
    that step's completions whose advantage falls in each row's bin. Where overlaid histograms blend into one
    another, this shows how the whole distribution moves from step to step.

    Bins are symmetric around 0 with 0 at the centre of the middle bin, so the zero-std groups (advantage exactly 0)
    form the middle row. The shade is on a square-root scale so that bins holding a few percent still show next
    to the zero row. limit: the advantage range +-limit (default: the largest |advantage| logged).
    """
    from matplotlib.colors import PowerNorm

    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    logged = [m for m in metrics if m.get("advantages")]
    if not logged:
        return _label(ax, "step", "advantage", title or "advantages (none logged)", grid=None)
    values = [torch.tensor([a for a in m["advantages"] if a is not None], dtype=torch.float64) for m in logged]
    limit = limit or max(v.abs().max().item() for v in values) or 1.0
    bins += 1 - bins % 2  # odd: one bin centred on 0
    width = 2 * limit / bins
    share = torch.stack([torch.histc(v, bins=bins, min=-limit, max=limit) / max(len(v), 1)
                         for v in values])  # (steps, bins)
    steps = [m["step"] for m in logged]
    image = ax.imshow(share.T.numpy(), origin="lower", aspect="auto", cmap="viridis", norm=PowerNorm(0.5, 0, 1),
                      extent=(steps[0] - 0.5, steps[-1] + 0.5, -limit, limit), interpolation="nearest")
    ax.axhline(0, color="w", lw=0.4, alpha=0.5)
    ax.figure.colorbar(image, ax=ax, label="share of the step's completions\n(square-root scale)", fraction=0.046,
                       pad=0.02)
    ax.set_xlabel("step")
    ax.set_ylabel(f"advantage (bins of {width:.2f})")
    ax.set_title(title or "advantages per step (middle row: zero-std groups)")
    return ax


def plot_memory_vs_length(rows: list[dict], *, axes=None, title: str | None = None):
    """`minigrpo bench-length`'s results: peak step memory (left) and step time (right) against completion length,
    minigrpo and TRL, the minigrpo/TRL ratio written at each length. A run with variable lengths (an eos
    probability) is drawn as a hollow marker at its mean completion length. Returns the two axes."""
    axes = axes if axes is not None else plt.subplots(1, 2, figsize=(11, 4))[1]
    # side: (colour, line); the third only with --compare-shared-prefix
    sides = {"minigrpo": ("C0", "o-"), "trl": ("C1", "o-"), "minigrpo, no shared prefix": ("C0", "o--")}
    sides = {side: style for side, style in sides.items() if side in rows[0]}
    panels = [("peak_bytes", 2**20, "peak step memory (MiB)"), ("step_cpu", 1, "step time (CPU s)")]
    for ax, (key, scale, ylabel) in zip(axes, panels):
        fixed = [r for r in rows if not r["eos_probability"] and r["minigrpo"][key] is not None]
        for side, (color, line) in sides.items():
            ax.plot([r["length"] for r in fixed], [r[side][key] / scale for r in fixed], line, color=color,
                    label="TRL" if side == "trl" else side)
            for r in rows:
                if r["eos_probability"] and r[side][key] is not None:
                    ax.plot(r[side]["tokens"] / r["completions"], r[side][key] / scale, "o", mfc="none", color=color,
                            ms=9, label=f"{'TRL' if side == 'trl' else side}, eos p = 1/{1 / r['eos_probability']:.0f}"
                                        f" (at its mean length)")
        for r in fixed:
            ax.annotate(f"{r[key + '_ratio']:.2f}", (r["length"], r["minigrpo"][key] / scale), fontsize=8,
                        textcoords="offset points", xytext=(0, -13), ha="center")
        ax.set_xscale("log", base=2)
        ax.set_xticks([r["length"] for r in fixed], [str(r["length"]) for r in fixed])
        ax.set_ylim(bottom=0)
        _label(ax, "completion length (tokens)", ylabel, f"{ylabel.split(' (')[0]} (numbers: minigrpo/TRL)")
    if title:
        axes[0].figure.suptitle(title)
    return axes


def plot_seeds(runs: dict[str, list[list[dict]]], key: str, *, start: dict[str, list[float]] | None = None, ax=None,
               ylabel: str | None = None, title: str | None = None, window: int = 1, ylim=None):
    """Several seeds of several variants: {variant: [metrics of seed 0, seed 1, ...]}, one colour per variant, a thin
    line per seed and a thick line for their mean (at the steps every seed logged). start: {variant: [value at step 0
    of each seed]} (e.g. accuracy_before), prepended as for plot_curve; window: moving average over steps."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    for colour, (label, seeds) in enumerate(runs.items()):
        by_step = []
        for s, metrics in enumerate(seeds):
            xs, values = _series(metrics, key)
            values = smooth(values, window) if window > 1 else values
            if start and label in start:
                xs, values = [0, *xs], [start[label][s], *values]
            ax.plot(xs, values, "-", color=f"C{colour}", alpha=0.35, linewidth=1)
            by_step.append(dict(zip(xs, values)))
        shared = sorted(set.intersection(*(set(d) for d in by_step))) if by_step else []
        mean = [sum(d[x] for d in by_step) / len(by_step) for x in shared]
        ax.plot(shared, mean, "o-" if len(shared) < 30 else "-", color=f"C{colour}", linewidth=2.2,
                markersize=4, label=f"{label} (mean of {len(seeds)})")
    if ylim is not None:
        ax.set_ylim(*ylim)
    return _label(ax, "step", ylabel or key, smoothed_title(title or key, window))
