"""`python -m minigrpo.lab.gpu_check` (scripts/gpu_check.sh): what minigrpo checks on a CUDA GPU, in one command.

    tests    pytest -m cuda tests/test_cuda.py, on the GPU (MINIGRPO_TEST_DEVICE=cuda): the decode loop against HF
             generate in bf16 and fp16, the log-prob paths within the dtype, 3 GRPO steps full / LoRA / QLoRA,
             resuming, peak memory within 15% of the prediction
    step     one GRPO step of the Qwen2.5-0.5B-shaped stand-in (lab/standin.py: 24 blocks, 151,936-row embedding,
             random weights), G = 8 completions of 256 tokens on a countdown prompt, bf16 autocast over float32
             weights: minigrpo's step time and peak memory beside TRL's GRPOTrainer on the same batch and settings,
             full fine-tuning and LoRA (bench_length.compare_at_length, alternating the two sides step by step)
    decode   the decode loop's tokens per second beside HF generate's (bench.rollout_comparison), same model, bf16
    memory   each recipe in recipes/ whose predicted floor fits the card: `minigrpo memory --recipe`'s prediction
             beside the peak of the trainer's own update on a random model of the recipe's shape and batch
             (memory.measure_recipe_step), all recipes in one fresh process (nothing else on the GPU)

It prints one table and writes one JSON (--json), with the card, the versions and the date. Nothing is fetched: the
models are random stand-ins drawn on the GPU; TRL (with datasets) and bitsandbytes come from the folder
scripts/gpu_site.sh prepares (BENCHMARKS.md, "GPU", says how to carry it). A part whose package does not import is
reported as not measured, with the reason, and the rest goes on.

--dry-run runs the same code on the CPU at toy sizes (a 2-block stand-in, 16-token completions, the recipes shrunk
to 8 completions): what CI runs (tests/test_gpu_check.py), so the check cannot rot between the times a GPU is at
hand. Its figures mean nothing about speed or memory.

    scripts/gpu_check.sh --json $OUT/gpu_check.json          # on the GPU machine, ~6 minutes on an H100 (estimated)
    python -m minigrpo.lab.gpu_check --dry-run               # here, on the CPU
"""

import argparse
import dataclasses
import datetime
import gc
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import torch

from .memory import HUB_SHAPES, RESULT_MARKER

__all__ = ["main", "SIZES"]

REPO = Path(__file__).resolve().parents[2]
# What each part runs at, on the GPU and in the dry run.
SIZES = {
    "gpu": dict(completion_tokens=256, num_generations=8, warmup=1, steps=2, recipe_prompt_tokens=200, recipe_steps=2),
    "dry-run": dict(completion_tokens=16, num_generations=8, warmup=1, steps=1, recipe_prompt_tokens=16,
                    recipe_steps=1),
}
PARTS = ("tests", "step", "decode", "memory")


# ---------------------------------------------------------------------------------------------------------
# The parts
# ---------------------------------------------------------------------------------------------------------
def run_tests(mode: str, device: str, standin: Path, out: Path) -> dict:
    """pytest -m cuda tests/test_cuda.py on `device` (mode "run"), or only collected ("collect": the invocation is
    right and the tests import). Returns counts, the failed tests' names and the figures the tests print."""
    tests = REPO / "tests" / "test_cuda.py"
    if not tests.is_file():
        return {"not_measured": f"{tests} is not here (an installed package: run the check from a checkout)"}
    junit, log = out / "cuda_tests.xml", out / "cuda_tests.log"
    command = [sys.executable, "-m", "pytest", str(tests), "-m", "cuda", "-q", "-s", "-rfEs", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *(["--collect-only"] if mode == "collect" else [])]
    env = {**os.environ, "MINIGRPO_TEST_DEVICE": device, "MINIGRPO_STANDIN_DIR": str(standin),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    result = {"returncode": done.returncode, "log": str(log), "mode": mode,
              "figures": [line.split("figure: ", 1)[1] for line in done.stdout.splitlines() if "figure: " in line]}
    if mode == "collect":  # "tests/test_cuda.py: 15" (pytest -qq) or "15 tests collected"
        counts = re.findall(r"test_cuda\.py: (\d+)|(\d+) tests? collected", done.stdout)
        result["collected"] = max((int(a or b) for a, b in counts), default=0)
        return result
    if junit.is_file():
        suite = ElementTree.parse(junit).getroot()
        suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
        counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
        problems = [(case, case.find("failure") if case.find("failure") is not None else case.find("error"))
                    for case in suite.iter("testcase")]
        failed = [f"{case.get('name')}: {problem.get('message', '')[:300]}" for case, problem in problems
                  if problem is not None]
        result.update(counts, passed=counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
                      failed=failed)
    return result


def trl_or_reason() -> str | None:
    """None when TRL (and the datasets it needs) import, else why not, in one line."""
    try:
        import datasets  # noqa: F401
        import trl  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - a missing package or one too old for what is installed
        return f"TRL does not import here ({type(exc).__name__}: {str(exc).splitlines()[0][:200]})"
    return None


def measure_steps(standin: Path, device: str, sizes: dict, out: Path) -> dict:
    """minigrpo's GRPO step beside TRL's, full fine-tuning and LoRA, bf16: {setup: bench_length.summarize's row}."""
    reason = trl_or_reason()
    if reason:
        return {"not_measured": reason}
    from ..loading.models import load_tokenizer
    from ..tasks import get_task
    from .bench_length import compare_at_length, summarize

    task = get_task("countdown")
    tokenizer = load_tokenizer(standin)
    length, G = sizes["completion_tokens"], sizes["num_generations"]
    rows = task.load("train")[: sizes["warmup"] + sizes["steps"] + 1]  # TRL's loop asks one step ahead
    results = {}
    for setup in ("full", "lora"):
        args = argparse.Namespace(device=device, prompts=1, num_generations=G, warmup=sizes["warmup"],
                                  steps=sizes["steps"], loss_type="dapo",
                                  learning_rate=1e-6 if setup == "full" else 1e-5,
                                  temperature=1.0, seed=0, compare_shared_prefix=False, flops=False, bf16=True,
                                  lora=setup == "lora", max_completion_length=length)
        sides = compare_at_length(args, standin, tokenizer, task, rows, length, None)
        results[setup] = summarize(length, None, G, sides)
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()
    return results


def measure_decode(standin: Path, device: str, sizes: dict) -> dict:
    """The decode loop's and HF generate's tokens per second (wall), G completions of one countdown prompt,
    float32 weights under bf16 autocast (as the trainer samples), pure sampling, interleaved, warm-up excluded."""
    from ..loading.models import load_model_and_tokenizer
    from ..tasks import get_task
    from .bench import rollout_comparison

    model, tokenizer = load_model_and_tokenizer(standin, device)
    rows = get_task("countdown").load("train")[: sizes["warmup"] + sizes["steps"]]
    args = argparse.Namespace(prompts=1, num_generations=sizes["num_generations"], temperature=1.0,
                              max_completion_length=sizes["completion_tokens"], warmup=sizes["warmup"],
                              steps=sizes["steps"])
    with torch.autocast(device, dtype=torch.bfloat16):
        times = rollout_comparison(model, tokenizer, rows, args, torch.device(device))
    tokens_per_second = {side: statistics.median(wall for wall, _ in values) for side, values in times.items()}
    del model
    return {"minigrpo": tokens_per_second["minigrpo"], "hf": tokens_per_second["hf"],
            "ratio": tokens_per_second["minigrpo"] / tokens_per_second["hf"]}


def measure_recipes(device: str, sizes: dict, workdir: Path, toy: Path | None) -> list[dict]:
    """Every recipe: its predicted floor and, where it fits the card (the dry run: all, shrunk), the measured peak;
    measured in one fresh process, so that nothing of the other parts is on the GPU."""
    request = json.dumps({"device": device, "sizes": sizes, "workdir": str(workdir), "toy": toy and str(toy)})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-m", "minigrpo.lab.gpu_check", "--memory-child", request],
                          capture_output=True, text=True, env=env)
    marked = [line[len(RESULT_MARKER):] for line in done.stdout.splitlines() if line.startswith(RESULT_MARKER)]
    rows = [json.loads(line) for line in marked]
    if done.returncode != 0:
        rows.append({"recipe": "(the measuring process)", "not_measured": f"it failed: {done.stderr[-1500:]}"})
    return rows


def _recipe_rows(request: dict):
    """In the child: yield one result per recipe (see measure_recipes)."""
    from ..config import load_config
    from .memory import measure_recipe_step, recipe_floor, shape_dir

    device, sizes, workdir, toy = request["device"], request["sizes"], Path(request["workdir"]), request["toy"]
    card = torch.cuda.get_device_properties(0).total_memory if device == "cuda" else None
    for path in sorted((REPO / "recipes").glob("*.yaml")):
        cfg = load_config(str(path))
        row = {"recipe": path.stem, "model": cfg.model_name_or_path}
        if toy:  # the dry run: the recipe's settings on the toy stand-in, 8 completions in 2 micro-batches
            cfg = dataclasses.replace(cfg, model_name_or_path=toy, generation_batch_size=8, num_generations=4,
                                      gradient_accumulation_steps=2, max_completion_length=sizes["completion_tokens"])
        predicted = recipe_floor(cfg, sizes["recipe_prompt_tokens"], gpu_bytes=card)
        row.update(predicted_bytes=predicted["floor"], setup=predicted["setup"])
        if card and predicted["floor"] > card:
            yield {**row, "not_measured": f"does not fit the card ({predicted['floor'] / 2**30:.1f} GiB predicted)"}
            continue
        if cfg.load_in_4bit and not _imports("bitsandbytes"):
            yield {**row, "not_measured": "QLoRA: bitsandbytes does not import here"}
            continue
        if cfg.use_vllm:
            row["note"] = "the trainer's part (vLLM's is computed only)"
            cfg = dataclasses.replace(cfg, use_vllm=False)
        if not toy:
            cfg = dataclasses.replace(cfg, model_name_or_path=str(shape_dir(HUB_SHAPES[row["model"]], workdir, device)))
        try:
            measured = measure_recipe_step(cfg, device, sizes["recipe_prompt_tokens"], steps=sizes["recipe_steps"])
        except torch.cuda.OutOfMemoryError as exc:
            yield {**row, "not_measured": f"out of memory ({str(exc).splitlines()[0][:200]})"}
        else:
            peak = measured["peak_bytes"]
            yield {**row, "measured_bytes": peak, "ratio": peak / predicted["floor"],
                   "seconds": round(measured["seconds"], 1)}
        gc.collect()
        if device == "cuda":
            torch.cuda.empty_cache()


def _imports(name: str) -> bool:
    try:
        __import__(name)
    except Exception:  # noqa: BLE001 - bitsandbytes without its CUDA library raises more than ImportError
        return False
    return True


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------
def format_table(report: dict) -> str:
    """One Markdown table: every figure of the check, minigrpo beside its reference and their ratio."""
    gib = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**30 else f"{b / 2**20:.1f} MiB"  # noqa: E731
    lines = ["| check | minigrpo | reference | minigrpo / reference |", "|---|---|---|---|"]
    tests = report.get("tests", {})
    if "not_measured" in tests:
        lines.append(f"| cuda tests | not run: {tests['not_measured']} | | |")
    elif tests.get("mode") == "collect":
        lines.append(f"| cuda tests | {tests.get('collected', 0)} collected (not run) | | |")
    elif tests:
        failed = tests.get("failures", 0) + tests.get("errors", 0)
        lines.append(f"| cuda tests | {tests.get('passed', 0)} passed, {failed} failed, {tests.get('skipped', 0)} "
                     "skipped | | |")
    step = report.get("step", {})
    if "not_measured" in step:
        lines.append(f"| GRPO step vs TRL | not measured: {step['not_measured']} | | |")
    for setup, row in ({} if "not_measured" in step else step).items():
        mg, trl = row["minigrpo"], row["trl"]
        lines.append(f"| GRPO step, {setup}, bf16: wall s | {mg['step_wall']:.3f} | TRL {trl['step_wall']:.3f} | "
                     f"{row['step_wall_ratio']:.2f} |")
        if mg["peak_bytes"] is not None:
            lines.append(f"| GRPO step, {setup}, bf16: peak above start | {gib(mg['peak_bytes'])} | TRL "
                         f"{gib(trl['peak_bytes'])} | {row['peak_bytes_ratio']:.2f} |")
    decode = report.get("decode")
    if decode:
        lines.append(f"| decode tokens/s (wall) | {decode['minigrpo']:,.0f} | HF generate {decode['hf']:,.0f} | "
                     f"{decode['ratio']:.2f} |")
    for row in report.get("memory", []):
        name = f"memory: {row['recipe']}" + (f" ({row['note']})" if row.get("note") else "")
        if "not_measured" in row:
            lines.append(f"| {name} | not measured: {row['not_measured']} | | |")
        else:
            lines.append(f"| {name} | {gib(row['measured_bytes'])} measured | {gib(row['predicted_bytes'])} "
                         f"predicted | {row['ratio']:.2f} |")
    return "\n".join(lines)


def settings(device: str, dry_run: bool) -> dict:
    """The card, the versions and the date: what a figure is worth without them is nothing."""
    versions = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "peft", "trl", "datasets", "bitsandbytes", "accelerate"):
        try:
            versions[name] = __import__(name).__version__
        except Exception:  # noqa: BLE001
            versions[name] = None
    card = torch.cuda.get_device_name(0) if device == "cuda" else f"CPU ({platform.processor() or platform.machine()})"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return {"device": device, "card": card, "dry_run": dry_run, "date": datetime.date.today().isoformat(),
            "commit": commit.stdout.strip() or None, "sizes": SIZES["dry-run" if dry_run else "gpu"], **versions}


def build_standin(device: str, workdir: Path, dry_run: bool) -> Path:
    from .standin import QWEN25_05B_SHAPE, TOY_SHAPE, make_standin_chat_model

    return make_standin_chat_model(workdir / "standin", **(TOY_SHAPE if dry_run else QWEN25_05B_SHAPE), device=device)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m minigrpo.lab.gpu_check", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="the same code on the CPU at toy sizes (what CI runs)")
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {', '.join(PARTS)}")
    p.add_argument("--tests", choices=("run", "collect"), default="run",
                   help="collect: only collect the cuda tests (the main suite runs their CPU variants itself)")
    p.add_argument("--json", default=None, help="write the whole report here")
    p.add_argument("--workdir", default=None, help="where the stand-ins and logs go (default: a temporary folder)")
    p.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.parts = [part.strip() for part in args.parts.split(",") if part.strip()]
    unknown = [part for part in args.parts if part not in PARTS]
    if unknown:
        p.error(f"--parts: unknown {', '.join(unknown)} (known: {', '.join(PARTS)})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.memory_child:
        for row in _recipe_rows(json.loads(args.memory_child)):
            print(RESULT_MARKER + json.dumps(row), flush=True)
        return 0
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA GPU; --dry-run runs the same code on the CPU at toy sizes",
              file=sys.stderr)
        return 2
    sizes = SIZES["dry-run" if args.dry_run else "gpu"]
    with tempfile.TemporaryDirectory(prefix="minigrpo-gpu-check-") as tmp:
        workdir = Path(args.workdir or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        report = {"settings": settings(device, args.dry_run), "seconds": {}}
        print("gpu_check: " + ", ".join(f"{k} {v}" for k, v in report["settings"].items() if k != "sizes"), flush=True)
        clock = time.perf_counter()
        standin = build_standin(device, workdir, args.dry_run)
        report["seconds"]["standin"] = round(time.perf_counter() - clock, 1)
        for part in args.parts:
            clock = time.perf_counter()
            if part == "tests":
                report["tests"] = run_tests(args.tests, device, standin, workdir)
            elif part == "step":
                report["step"] = measure_steps(standin, device, sizes, workdir)
            elif part == "decode":
                report["decode"] = measure_decode(standin, device, sizes)
            else:
                report["memory"] = measure_recipes(device, sizes, workdir, standin if args.dry_run else None)
            report["seconds"][part] = round(time.perf_counter() - clock, 1)
            print(f"gpu_check: {part} done in {report['seconds'][part]} s", flush=True)
        table = format_table(report)
        report["table"] = table
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    print()
    print(table)
    for figure in report.get("tests", {}).get("figures", []):
        print(f"  cuda test: {figure}")
    tests = report.get("tests", {})
    failed = tests.get("failures", 0) + tests.get("errors", 0) if tests.get("mode") == "run" else 0
    return 1 if failed or (tests.get("mode") == "collect" and tests.get("returncode")) else 0


if __name__ == "__main__":
    sys.exit(main())
