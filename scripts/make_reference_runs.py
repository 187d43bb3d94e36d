"""Rebuild the reference runs that the notebooks plot: notebook 03's GRPO, random-reward and SFT runs,
notebook 04's six variants (GRPO, Dr. GRPO, DAPO, GSPO, GMPO, RLOO) and notebook 06's GRPO vs PPO with a critic.

    OMP_NUM_THREADS=1 python scripts/make_reference_runs.py                  # notebook 03: all three, a few minutes
    OMP_NUM_THREADS=1 python scripts/make_reference_runs.py --only sft       # one of them (sft reads grpo's wall time)
    OMP_NUM_THREADS=1 python scripts/make_reference_runs.py --notebook 04    # the six variants, 40 steps each,
                                                                             # Dr. GRPO's loss alone, and three of
                                                                             # them on seeds 1 and 2 (15 runs)
    OMP_NUM_THREADS=1 python scripts/make_reference_runs.py --notebook 04 --only gspo gmpo
    OMP_NUM_THREADS=1 python scripts/make_reference_runs.py --notebook 06    # GRPO, PPO, PPO with a slow critic, and
                                                                             # GRPO with PPO's loss and whitening

The shipped runs were made with the three commands above (no --only), one at a time on an otherwise idle 2-core CPU
with OMP_NUM_THREADS=1 (one torch thread per process also avoids OpenMP's busy-waiting when the cores are
oversubscribed, see scripts/run_notebooks.py): notebook 03's three in 2 minutes, 04's six in 6, 06's three in 5,
wall time including evaluation. Each command runs its runs one after another in one process, on the same idle
machine (step times still drift by 10-30% from run to run). They were made with the rollout and log-prob code of the
commit that ships them (rollout.py's decode loop), so the notebooks' live runs in full mode reproduce their first
steps exactly; a change that moves those numbers, even by rounding, means remaking them.

Each run is trained from the shipped think_addition warm start with the settings below (notebook 03: the same
as its full lesson; notebook 04: its full lesson's live runs are the first 10 of these 40 steps), then its small
files are copied to data/reference_runs/<name>/ (notebook 04: data/reference_runs/variants/<name>/; notebook 06:
data/reference_runs/ppo_vs_grpo/<name>/):

    metrics.jsonl    one line per step (advantages included: 128 numbers per step, for the histograms)
    summary.json     greedy accuracy before / after on the first 200 test problems, wall time, ...
    config.yaml      the settings used (SFT's own under `sft:`)
    correct_after.json  (notebooks 04 and 06) the trained model's greedy result on each of those 200 problems,
                     1 right / 0 wrong, so that two runs can be compared problem by problem (evaluate.mcnemar)

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
from minigrpo.evaluate import evaluate  # noqa: E402
from minigrpo.loading.models import load_model_and_tokenizer  # noqa: E402
from minigrpo.ppo_trainer import PPOConfig, train_ppo  # noqa: E402
from minigrpo.sft import train_sft  # noqa: E402
from minigrpo.tasks import DATA_DIR, get_task  # noqa: E402
from minigrpo.trainer import train  # noqa: E402

REFERENCE_DIR = DATA_DIR / "reference_runs"
KEEP = ("metrics.jsonl", "summary.json", "config.yaml", "correct_after.json")

# The lesson's runs (notebook 03, full mode). GRPO: defaults of Config (lr 1e-4, G = 8, 128 completions a step).
# Every evaluation uses the same first 200 test problems (eval_limit): before, during (every 5 steps) and after.
GRPO = dict(task="think_addition", max_steps=40, eval_steps=5, eval_num_problems=200, eval_limit=200,
            eval_num_samples=0, save_model=False, seed=0)
RANDOM = dict(GRPO, max_steps=20, reward_funcs=["random"])
SFT = dict(task="think_addition", learning_rate=3e-4, warmup_steps=10, eval_steps=5, eval_num_problems=200,
           eval_limit=200, seed=0)
SFT_BATCH_SIZE = 128

# Notebook 04: the variants side by side, same seed, same 40 steps, same evaluation (first 200 test problems, every
# 10 steps). Every run splits each batch of 128 completions into 2 mini-batches (steps_per_generation=2, two optimizer
# steps per batch): the second mini-batch is off-policy, so ratios differ from 1 and clipping can fire. With one
# mini-batch the ratio is exactly 1 and GRPO, GSPO and GMPO would differ only through their aggregation.
VARIANT_BASE = dict(task="think_addition", max_steps=40, steps_per_generation=2, eval_steps=10,
                    eval_num_problems=200, eval_limit=200, eval_num_samples=0, save_model=False, seed=0)
VARIANTS = {
    "grpo": dict(loss_type="grpo"),
    "dr_grpo": dict(loss_type="dr_grpo", scale_rewards="none"),
    # DAPO without its overlong reward: with L_max = 48 and L_cache = L_max / 4 = 12 it would penalise correct
    # scratchpads of 37-41 tokens (7% of the test problems); truncated completions are masked instead.
    "dapo": dict(loss_type="dapo", epsilon_high=0.28, dynamic_sampling=True, mask_truncated_completions=True),
    # TRL's GSPO recipe (paper_index.md): sequence-level ratio, loss_type="grpo", beta=0, epsilon 3e-4 / 4e-4.
    "gspo": dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
    "gmpo": dict(loss_type="gmpo"),  # log-space clip gmpo_epsilon = 0.4 (the paper's)
    "rloo": dict(loss_type="grpo", advantage_estimator="rloo"),
}
# The length-bias test of notebook 04: Dr. GRPO's loss alone (the constant 1/(G L_max) instead of GRPO's 1/|o_i|),
# with GRPO's advantages (scale_rewards="group"), so that the two differ in the aggregation only.
LENGTH_BIAS = {"dr_loss": dict(loss_type="dr_grpo")}
# Seed-to-seed variation, measured: GRPO, Dr. GRPO and Dr. GRPO's loss alone again on seeds 1 and 2 (seed 0 is the
# runs above), everything else the same, so that notebook 04 sets the variants' differences against a measured band.
SEED_RUNS = {f"{name}_seed{seed}": (name, seed) for name in ("grpo", "dr_grpo", "dr_loss") for seed in (1, 2)}

# Notebook 06: GRPO and PPO with a critic on the same budget: Config's defaults (16 prompts x G = 8 completions a
# step, lr 1e-4, one optimizer step per batch, no KL), seed 0, 50 steps, greedy accuracy on the first 200 test
# problems every 5 steps. PPO: PPOConfig's defaults (critic lr 1e-3, lam 1); the third run gives the critic the
# policy's learning rate, 1e-4 (TRL's default), to show a critic that lags. The fourth is GRPO with the two other
# things PPO does differently besides its critic: the loss averaged over all the batch's tokens (loss_type="bnpo")
# and one scale for the whole batch instead of each group's std (scale_rewards="batch"), so that GRPO against it
# is the baseline alone, or close to it.
PPO_VS_GRPO_BASE = dict(task="think_addition", max_steps=50, eval_steps=5, eval_num_problems=200, eval_limit=200,
                        eval_num_samples=0, save_model=False, seed=0)
PPO_VS_GRPO = {"grpo": None, "ppo": PPOConfig(), "ppo_critic_lr_1e-4": PPOConfig(critic_learning_rate=None),
               "grpo_bnpo_batch": None}
GRPO_LIKE_PPO = dict(loss_type="bnpo", scale_rewards="batch")
NOTEBOOK_RUNS = {"03": ["grpo", "random_reward", "sft"], "04": [*VARIANTS, *LENGTH_BIAS, *SEED_RUNS],
                 "06": list(PPO_VS_GRPO)}


def think_completion(row, rng):
    """The reference completion with its scratchpad: what GRPO ends up writing, given to SFT to imitate."""
    return get_task("think_addition").target_completion(row, rng, think=True)


def keep_small_files(run_dir: Path, target: Path) -> Path:
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for filename in KEEP:
        if (run_dir / filename).exists():
            shutil.copy(run_dir / filename, target / filename)
    return target


def variant_config(name: str, run_dir: Path, **overrides) -> Config:
    """Notebook 04's run `name`: the shared settings plus the variant's own, as a Config (a seed run: its
    variant's settings on its seed)."""
    if name in SEED_RUNS:
        name, seed = SEED_RUNS[name]
        overrides = {"seed": seed, **overrides}
    fields = {**VARIANTS, **LENGTH_BIAS}[name]
    return Config(output_dir=str(run_dir), **{**VARIANT_BASE, **fields, **overrides})


def write_correct_after(run_dir: Path, summary: dict) -> None:
    """The trained model's greedy result on each evaluation problem (1 right, 0 wrong) as correct_after.json,
    checked against the run's own accuracy_after: the model saved at the end is the model the run evaluated."""
    task = get_task("think_addition")
    model, tokenizer = load_model_and_tokenizer(run_dir / "model")
    rows = task.load("test")[:summary["num_test_problems"]]
    correct = evaluate(model, tokenizer, task, rows, per_problem=True)["correct_greedy"]
    assert sum(correct) / len(rows) == summary["accuracy_after"], (run_dir, sum(correct) / len(rows), summary)
    (run_dir / "correct_after.json").write_text(json.dumps([int(c) for c in correct]) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--notebook", choices=list(NOTEBOOK_RUNS), default="03", help="whose runs to make")
    parser.add_argument("--only", nargs="+", help="some of that notebook's runs (default: all of them)")
    args = parser.parse_args()
    names = args.only or NOTEBOOK_RUNS[args.notebook]
    unknown = [n for n in names if n not in NOTEBOOK_RUNS[args.notebook]]
    if unknown:
        parser.error(f"--only: {unknown} not among notebook {args.notebook}'s runs {NOTEBOOK_RUNS[args.notebook]}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            run_dir = Path(tmp) / name
            target = REFERENCE_DIR / name
            # Notebooks 04 and 06 keep the model until its per-problem results are written (correct_after.json).
            if args.notebook == "06":
                extra = GRPO_LIKE_PPO if name == "grpo_bnpo_batch" else {}
                cfg = Config(output_dir=str(run_dir), **{**PPO_VS_GRPO_BASE, **extra, "save_model": True})
                ppo = PPO_VS_GRPO[name]
                summary = train(cfg, progress=False) if ppo is None else train_ppo(cfg, ppo, progress=False)
                write_correct_after(run_dir, summary)
                target = REFERENCE_DIR / "ppo_vs_grpo" / name
            elif args.notebook == "04":
                summary = train(variant_config(name, run_dir, save_model=True), progress=False)
                write_correct_after(run_dir, summary)
                target = REFERENCE_DIR / "variants" / name
            elif name == "sft":
                grpo_seconds = json.loads((REFERENCE_DIR / "grpo" / "summary.json").read_text())["wall_seconds"]
                cfg = Config(output_dir=str(run_dir), max_steps=10_000, save_model=False, **SFT)
                summary = train_sft(cfg, batch_size=SFT_BATCH_SIZE, target_completion=think_completion,
                                    max_seconds=grpo_seconds, progress=False)
            else:
                settings = GRPO if name == "grpo" else RANDOM
                summary = train(Config(output_dir=str(run_dir), **settings), progress=False)
            target = keep_small_files(run_dir, target)
            print(f"{name}: greedy accuracy {summary['accuracy_before']:.1%} -> {summary['accuracy_after']:.1%} "
                  f"in {summary['steps']} steps, {summary['wall_seconds']:.0f} s of training -> {target}", flush=True)


if __name__ == "__main__":
    main()
