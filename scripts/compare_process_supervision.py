"""Outcome against process supervision, in two worlds, three seeds each: held-out accuracy over time.

    OMP_NUM_THREADS=1 python scripts/compare_process_supervision.py                      # both worlds, seeds 0 1 2
    OMP_NUM_THREADS=1 python scripts/compare_process_supervision.py --worlds long_addition --seeds 0
    python scripts/compare_process_supervision.py --report                               # the shipped runs' table

The two worlds:
  * think_addition, the main job's: the shipped warm start (~26% greedy, 42% of its sampled scratchpads end in a
    right answer), its default GRPO run (`minigrpo train`, 16 prompts x G=8, lr 1e-4), 100 steps;
  * long_addition, the world where process supervision should pay (scripts/make_long_world.py): 7- and 8-digit
    operands, always worked out column by column; its warm start gets most steps right but samples a right answer
    rarely, so nearly every group of 8 is all-wrong and outcome supervision has almost nothing to learn from.

Each run is `minigrpo train --task WORLD` with the settings below and one of two rewards:
  * outcome: `reward_funcs [correctness, steps]`, `reward_weights [1, 0]`, `advantage_estimator grpo`: the answer's
    correctness trains; the step checker is only logged (weight 0), so its process/* metrics are there to compare;
  * process: `reward_funcs [steps]`, `advantage_estimator process`: think_addition's step checker, every column step
    and the answer as the last step (step_rewards.py; tasks/think_addition.py).
The two runs of a seed start from the same weights and draw the same prompts; they part after the first update.
Greedy held-out accuracy is measured before and after on the test split's first `eval_limit` problems and every 10
steps on its first 200.

The small files of each run (config.yaml, summary.json, and metrics.jsonl without its per-completion `advantages`
lists, floats to 5 significant digits) go to data/reference_runs/process_supervision/<world>/<outcome|process>_seed<N>/ (notebook 11 plots them);
`--report` prints the table from them, and writes results.json beside them.
"""

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing

from minigrpo.config import load_config  # noqa: E402
from minigrpo.tasks import DATA_DIR  # noqa: E402
from minigrpo.trainer import train  # noqa: E402

TARGET_DIR = DATA_DIR / "reference_runs" / "process_supervision"
WORLDS = {
    "think_addition": dict(task="think_addition", max_steps=100, eval_steps=10, eval_num_problems=200, eval_limit=500,
                           eval_num_samples=0),
    "long_addition": dict(task="long_addition", max_steps=60, eval_steps=10, eval_num_problems=200, eval_limit=500,
                          eval_num_samples=0),
}
VARIANTS = {
    "outcome": dict(reward_funcs=["correctness", "steps"], reward_weights=[1.0, 0.0], advantage_estimator="grpo"),
    "process": dict(reward_funcs=["steps"], advantage_estimator="process"),
}
DROPPED = ("advantages",)  # per-completion lists: most of a metrics.jsonl's size, not plotted


def small_line(line: dict) -> str:
    """A metrics line as shipped: without DROPPED, floats to 5 significant digits."""
    return json.dumps({k: float(f"{v:.5g}") if isinstance(v, float) else v
                       for k, v in line.items() if k not in DROPPED}) + "\n"


def run(world: str, variant: str, seed: int, out: Path, max_steps: int | None) -> Path:
    """Train one run in a temporary folder; copy its small files to out/<world>/<variant>_seed<seed>/."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = {**WORLDS[world], **VARIANTS[variant], "seed": seed, "save_model": False,
                    "log_completions": False, "output_dir": str(Path(tmp) / "run")}
        if max_steps:
            settings["max_steps"] = max_steps
        train(load_config(None, settings), progress=False)
        target = out / world / f"{variant}_seed{seed}"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name in ("config.yaml", "summary.json"):
            shutil.copy(Path(tmp) / "run" / name, target / name)
        lines = [json.loads(x) for x in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
        (target / "metrics.jsonl").write_text("".join(small_line(line) for line in lines))
    return target


def run_summary(path: Path) -> dict:
    """What the table reads of one run: accuracy before / over time / after, and the step means that explain it."""
    summary = json.loads((path / "summary.json").read_text())
    metrics = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    mean = lambda key, rows=metrics: statistics.fmean(m[key] for m in rows if m.get(key) is not None)  # noqa: E731
    first, last = metrics[:10], metrics[-10:]
    return {
        "accuracy_before": summary["accuracy_before"], "accuracy_after": summary["accuracy_after"],
        "eval": {m["step"]: m["eval/accuracy_greedy"] for m in metrics if "eval/accuracy_greedy" in m},
        "frac_reward_zero_std_first10": mean("frac_reward_zero_std", first),
        "frac_reward_zero_std": mean("frac_reward_zero_std"),
        "train_accuracy_first10": mean("accuracy", first), "train_accuracy_last10": mean("accuracy", last),
        "step_accuracy_first10": mean("process/step_accuracy", first),
        "step_accuracy_last10": mean("process/step_accuracy", last),
        "adv_token_abs_mean": mean("process/adv_token_abs_mean"), "grad_norm": mean("grad_norm"),
        "frac_steps_clipped": statistics.fmean(m["grad_norm"] > 1.0 for m in metrics),
        "wall_seconds": summary["wall_seconds"], "steps": len(metrics),
    }


def report(out: Path) -> str:
    """The comparison as markdown tables (mean over seeds, then each seed), and results.json in `out`."""
    results, lines = {}, []
    for world in WORLDS:
        runs = {v: {p.name: run_summary(p) for p in sorted((out / world).glob(f"{v}_seed*"))} for v in VARIANTS}
        if not any(runs.values()):
            continue
        results[world] = runs
        steps = sorted({s for v in runs.values() for r in v.values() for s in r["eval"]})
        lines += [f"\n{world}: greedy held-out accuracy (first 200 test problems every 10 steps; before/after: the first "
                  f"{WORLDS[world]['eval_limit']}), mean over seeds [each seed]", "",
                  "| | before | " + " | ".join(f"step {s}" for s in steps) + " | after | zero-std groups | "
                  "steps right, first/last 10 | mean abs(A) per token | grad norm (clipped) |",
                  "|---" * (len(steps) + 7) + "|"]
        for variant, by_seed in runs.items():
            if not by_seed:
                continue
            rs = list(by_seed.values())
            cell = lambda f: f"{statistics.fmean(f(r) for r in rs):.1%} [" + " ".join(f"{f(r):.0%}" for r in rs) + "]"  # noqa
            lines.append(f"| {variant} ({len(rs)} seeds) | {cell(lambda r: r['accuracy_before'])} | "
                         + " | ".join(cell(lambda r, s=s: r["eval"].get(s, float("nan"))) for s in steps)
                         + f" | {cell(lambda r: r['accuracy_after'])} | "
                         f"{statistics.fmean(r['frac_reward_zero_std'] for r in rs):.2f} | "
                         f"{statistics.fmean(r['step_accuracy_first10'] for r in rs):.1%} / "
                         f"{statistics.fmean(r['step_accuracy_last10'] for r in rs):.1%} | "
                         f"{statistics.fmean(r['adv_token_abs_mean'] for r in rs):.2f} | "
                         f"{statistics.fmean(r['grad_norm'] for r in rs):.2f} "
                         f"({statistics.fmean(r['frac_steps_clipped'] for r in rs):.0%}) |")
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worlds", nargs="+", default=list(WORLDS), choices=list(WORLDS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=TARGET_DIR, help="where the runs' small files go")
    parser.add_argument("--max-steps", type=int, default=None, help="a shorter run, to try the script")
    parser.add_argument("--report", action="store_true", help="only print the table of the runs already in --out")
    args = parser.parse_args()
    if not args.report:
        for world in args.worlds:
            for seed in args.seeds:
                for variant in args.variants:
                    print(f"{world} {variant} seed {seed}: {run(world, variant, seed, args.out, args.max_steps)}",
                          flush=True)
    print(report(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
