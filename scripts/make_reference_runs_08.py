"""Rebuild notebook 08's reference runs: LUSPO, VESPO, Clip-Cov, KL-Cov, pass@k, GFPO and more, beside GRPO
on think_addition.

    OMP_NUM_THREADS=1 python scripts/make_reference_runs_08.py                 # all of them, one after another
    OMP_NUM_THREADS=1 python scripts/make_reference_runs_08.py --only luspo    # some of them

The shipped runs were made with `--only grpo luspo clip_cov kl_cov pass_at_k gfpo_length top_entropy_0.2 gspo
vespo` (in that order); gpg and off_policy_mask are defined but were not made (notebook 08's Try this).

Every run takes notebook 04's settings (scripts/make_reference_runs.py's VARIANT_BASE: seed 0, 40 steps of 16
prompts x G = 8 completions, steps_per_generation=2 so that the second mini-batch is off-policy and ratios differ
from 1, greedy accuracy on the first 200 test problems every 10 steps) and changes the Config fields below. The
"grpo" and "gspo" runs have the settings of notebook 04's GRPO and GSPO runs (data/reference_runs/variants/); the
script prints both GRPO accuracies, which differ if the code changed between the two sets of runs. Notebook 08
compares its runs with its own grpo and gspo runs only, made with the same code as the rest of them.

Each run's small files go to data/reference_runs/more_variants/<name>/: metrics.jsonl, summary.json, config.yaml,
correct_after.json (each test problem's greedy result, for McNemar's test, as notebook 04's) and (grpo,
pass_at_k, gfpo_length) pass_at_k.json
(8 samples per test problem at temperature 1 from the trained model, pass@1..8: made after training from the saved
model, with torch's seed set to 0 first, so that sampling for it does not change the run itself); grpo/ also
pass_at_k_before.json, the same for the shipped warm start (every run's "before").
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_reference_runs import REFERENCE_DIR, VARIANT_BASE, keep_small_files, write_correct_after  # noqa: E402

from minigrpo.config import Config  # noqa: E402
from minigrpo.evaluate import evaluate  # noqa: E402
from minigrpo.loading.models import load_model_and_tokenizer  # noqa: E402
from minigrpo.tasks import DATA_DIR, get_task  # noqa: E402
from minigrpo.trainer import train  # noqa: E402

TARGET_DIR = REFERENCE_DIR / "more_variants"
PASS_K_SAMPLES = 8
# name -> the Config fields that make the run (on top of VARIANT_BASE). In the order they are made.
RUNS = {
    "grpo": dict(loss_type="grpo"),
    # LUSPO = GSPO's sequence ratio and its range (notebook 04's GSPO: TRL's recipe), each completion's term times
    # its length.
    "luspo": dict(loss_type="luspo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
    # verl's defaults: Clip-Cov detaches 2e-4 of the tokens among cov in (1, 5); KL-Cov penalises 2e-4 of them
    # (the largest cov), each at least one token per mini-batch.
    "clip_cov": dict(loss_type="clip_cov"),
    "kl_cov": dict(loss_type="kl_cov"),
    "pass_at_k": dict(advantage_estimator="pass_at_k", pass_k=4),
    # GFPO: sample 16 per prompt (twice the generation), train on the 8 shortest: the same 128 completions a step.
    "gfpo_length": dict(num_generations=16, generation_batch_size=256, num_remains_in_group=8, gfpo_filter="length"),
    "top_entropy_0.2": dict(top_entropy_quantile=0.2),  # "Beyond the 80/20 rule": the top 20% of tokens by entropy
    # notebook 04's GSPO (TRL's recipe) again, with this code: LUSPO's comparison
    "gspo": dict(loss_type="grpo", importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
    "vespo": dict(loss_type="vespo"),  # Config's kernel: k = 2, lambda = 3 for A >= 0; k = 3, lambda = 2 for A < 0
    "gpg": dict(loss_type="gpg", advantage_estimator="gpg"),
    "off_policy_mask": dict(off_policy_mask_threshold=0.002),  # per-token sampler KL; GRPO's approx_kl 1e-4..8e-3
}
PASS_AT_K_RUNS = ("grpo", "pass_at_k", "gfpo_length")  # pass@1..8 after training (about half a minute each)


def write_pass_at_k(run_dir: Path, summary: dict, model_dir: Path | None = None, filename: str = "pass_at_k.json"
                    ) -> None:
    """pass@1..8 of the trained model (or of the model in model_dir) with 8 samples per test problem."""
    task = get_task("think_addition")
    model, tokenizer = load_model_and_tokenizer(model_dir or run_dir / "model")
    rows = task.load("test")[:summary["num_test_problems"]]
    torch.manual_seed(0)
    result = evaluate(model, tokenizer, task, rows, num_samples=PASS_K_SAMPLES)
    kept = {k: v for k, v in result.items() if k.startswith("pass@") or k in ("num_problems", "accuracy_sampled")}
    (run_dir / filename).write_text(json.dumps(kept, indent=1) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=list(RUNS), help="some of the runs (default: all of them)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.only or RUNS:
            run_dir = Path(tmp) / name
            cfg = Config(output_dir=str(run_dir), **{**VARIANT_BASE, **RUNS[name], "save_model": True})
            summary = train(cfg, progress=False)
            write_correct_after(run_dir, summary)
            if name in PASS_AT_K_RUNS:
                write_pass_at_k(run_dir, summary)
            if name == "grpo":  # the same run as notebook 04's; and the warm start's pass@k, the "before" of all
                write_pass_at_k(run_dir, summary, model_dir=DATA_DIR / "models" / "think_addition",
                                filename="pass_at_k_before.json")
                shipped = json.loads((REFERENCE_DIR / "variants" / "grpo" / "summary.json").read_text())
                print(f"grpo: accuracy after {summary['accuracy_after']:.1%}, notebook 04's shipped GRPO run "
                      f"{shipped['accuracy_after']:.1%} (equal unless the code changed since those were made)")
            target = keep_small_files(run_dir, TARGET_DIR / name)
            for extra in ("pass_at_k.json", "pass_at_k_before.json"):
                if (run_dir / extra).exists():
                    (target / extra).write_text((run_dir / extra).read_text())
            print(f"{name}: greedy accuracy {summary['accuracy_before']:.1%} -> {summary['accuracy_after']:.1%} "
                  f"in {summary['steps']} steps, {summary['wall_seconds']:.0f} s of training -> {target}", flush=True)


if __name__ == "__main__":
    main()
