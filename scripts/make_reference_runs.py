"""Rebuild the reference runs that notebook 03 plots: GRPO, the random-reward control and the SFT control.

    OMP_NUM_THREADS=1 python scripts/make_reference_runs.py              # all three, a few minutes
    OMP_NUM_THREADS=1 python scripts/make_reference_runs.py --only sft   # one of them (sft reads grpo's wall time)

The shipped runs were made with OMP_NUM_THREADS=1 on a 2-core CPU shared with other jobs: one torch thread per
process avoids OpenMP's busy-waiting when the cores are oversubscribed (see scripts/run_notebooks.py).

Each run is trained from the shipped think_addition warm start with the settings below (the same as the full
lesson of notebooks/03_train_grpo.ipynb), then its small files are copied to data/reference_runs/<name>/:

    metrics.jsonl    one line per step (advantages included: 128 numbers per step, for the histograms)
    summary.json     greedy accuracy before / after on the first 200 test problems, wall time, ...
    config.yaml      (GRPO runs) or sft_config.json (SFT): the settings used

Models, completion logs and PNGs are not kept (the notebook draws the plots from metrics.jsonl).
Figures depend on the CPU only through the wall time: GRPO and the random control are deterministic in the seed;
the SFT control trains for as many steps as fit in GRPO's training time, so its step count varies by machine.
"""

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing

from minigrpo.config import Config  # noqa: E402
from minigrpo.sft import train_sft  # noqa: E402
from minigrpo.tasks import DATA_DIR, get_task  # noqa: E402
from minigrpo.trainer import train  # noqa: E402

REFERENCE_DIR = DATA_DIR / "reference_runs"
KEEP = ("metrics.jsonl", "summary.json", "config.yaml", "sft_config.json")

# The lesson's runs (notebook 03, full mode). GRPO: defaults of Config (lr 1e-4, G = 8, 128 completions a step).
# Every evaluation uses the same first 200 test problems (eval_limit): before, during (every 5 steps) and after.
GRPO = dict(task="think_addition", max_steps=40, eval_steps=5, eval_num_problems=200, eval_limit=200,
            eval_num_samples=0, save_model=False, seed=0)
RANDOM = dict(GRPO, max_steps=20, reward_funcs=["random"])
SFT = dict(task="think_addition", learning_rate=3e-4, warmup_steps=10, batch_size=128, eval_steps=5,
           eval_num_problems=200, eval_limit=200, seed=0)


def think_completion(row, rng):
    """The reference completion with its scratchpad: what GRPO ends up writing, given to SFT to imitate."""
    return get_task("think_addition").target_completion(row, rng, think=True)


def keep_small_files(run_dir: Path, name: str) -> Path:
    target = REFERENCE_DIR / name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for filename in KEEP:
        if (run_dir / filename).exists():
            shutil.copy(run_dir / filename, target / filename)
    return target


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["grpo", "random_reward", "sft"], nargs="+",
                        default=["grpo", "random_reward", "sft"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only:
            run_dir = Path(tmp) / name
            if name == "sft":
                grpo_seconds = json.loads((REFERENCE_DIR / "grpo" / "summary.json").read_text())["wall_seconds"]
                summary = train_sft(output_dir=run_dir, target_completion=think_completion, max_steps=10_000,
                                    max_seconds=grpo_seconds, progress=False, **SFT)
            else:
                settings = GRPO if name == "grpo" else RANDOM
                summary = train(Config(output_dir=str(run_dir), **settings), progress=False)
            target = keep_small_files(run_dir, name)
            print(f"{name}: greedy accuracy {summary['accuracy_before']:.1%} -> {summary['accuracy_after']:.1%} "
                  f"in {summary['steps']} steps, {summary['wall_seconds']:.0f} s of training -> {target}", flush=True)


if __name__ == "__main__":
    main()
