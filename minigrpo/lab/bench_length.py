"""`minigrpo bench-length`: peak memory and step time of one GRPO step as completions grow, minigrpo vs TRL.

For each completion length L (default 64, 128, 256, 512), one TRL GRPOTrainer runs warm-up + timed steps, and
right after each of its steps minigrpo runs its own step on the same prompts (the two sides alternate and see the
same machine load, as in `minigrpo bench --against trl`, whose pieces this reuses). Both sides get the same
weights, prompts, G, max_completion_length = L, loss_type, learning rate and reward, with beta = 0,
num_iterations = 1, float32, temperature 1, top_p 1, top_k 0; TRL with bf16=False, gradient_checkpointing=False
(TRL's defaults are True for both), use_vllm=False, use_liger_kernel=False (Liger's fused linear GRPO loss needs
Triton, so a CUDA GPU), optim adamw_torch; minigrpo with its defaults (the output head in blocks of tokens,
logprobs.py).

Per side and length: the step time (wall and CPU time of the process; on a shared machine CPU time is the steadier)
and the peak memory a step adds on top of what was live when it started (peak_memory.PeakMemory: CUDA's
allocator peak, or on a CPU the peak resident set, reset before each step, whose reset returns freed heap to the
OS first — so each measured step also pays its page faults, on both sides alike). The warm-up steps (Adam's
moments are created there) are neither timed nor measured.

Prompts: the task's (`--task`). The default, countdown, gives a real recipe's prompts: DeepSeek-R1's system prompt
and a Countdown question in TRL's conversational format, through the stand-in's chat template and tokenizer
(standin.py; the task ships no model of its own), ~224 tokens each. `--compare-shared-prefix` adds a third side,
minigrpo with `shared_prefix=False` (every completion runs its prompt again, as TRL does), with its own copy of
the weights and optimizer: the shared prefix's effect, measured in the same run.

Achieved FLOP/s (`--flops`): the matrix-multiply FLOPs of minigrpo's training pass on each measured step's batch,
counted by torch's FlopCounterMode on one extra forward + backward of the log-probs (what ran, recomputation of
the head's blocks included), divided by the step's training CPU time (step - rollout), against this machine's
matrix-multiply peak measured at the start (`matmul_peak`: a float32 (2048 x hidden) @ (hidden x intermediate)
product, the MLP's shape, at the same thread count).

Completion lengths: random weights never sample eos, so every completion runs to L. `--eos-probability p` adds
a run at the largest L where, while sampling, every token is eos with probability p (`force_eos`): lengths are
then geometric, mean about 1/p, cut at L — realistic spread within a group, where dropping finished rows and
trimming padding pay. The two sides sample their own completions, so their token counts differ a little; the
table says how many each had.

    minigrpo bench-length                                   # Qwen2.5-0.5B's shape, 2 layers, G = 8, countdown
    minigrpo bench-length --compare-shared-prefix --flops   # + minigrpo without the shared prefix, + FLOP/s
    minigrpo bench-length --lengths 64,128 --eos-probability 0 --json out.json --plot out.png

Needs TRL (`pip install -e ".[bench]"`), imported lazily by bench.py.
"""

import argparse
import functools
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from ..config import Config
from ..loading.models import add_lora, load_model_and_tokenizer
from ..loading.peak_memory import PeakMemory
from ..logprobs import completion_logprobs
from ..prompts import encode_prompts
from ..tasks import get_task
from .bench import SHAPES, Clock, _sync, build_model_dir, make_trl_trainer, minigrpo_step, task_tokenizer

__all__ = ["force_eos", "compare_at_length", "matmul_peak", "training_pass_flops", "main"]

LENGTHS = (64, 128, 256, 512)


def force_eos(model, eos_token_id: int, probability: float):
    """While sampling (grad disabled), make eos the next token with `probability` at every step, whatever the
    weights say: a forward hook on the output head sets

        logit_eos = logsumexp(the other logits) + log(p / (1 - p))      so that softmax gives eos exactly p

    (at temperature 1). Forwards with grad enabled (training) see the model unchanged. Returns the hook's handle."""
    if not 0 < probability < 1:
        raise ValueError(f"eos_probability: must be in (0, 1), got {probability}")
    log_odds = math.log(probability / (1 - probability))

    def hook(head, inputs, logits):  # logits (..., V)
        if torch.is_grad_enabled():
            return None
        others = logits.float().index_fill(-1, torch.tensor([eos_token_id], device=logits.device), -math.inf)
        logits[..., eos_token_id] = (others.logsumexp(dim=-1) + log_odds).to(logits.dtype)
        return logits

    return model.get_output_embeddings().register_forward_hook(hook)


def _side_step_callback(device, after, measured_from: int, stop_after: int):
    """A TRL callback: times each TRL step and, from step `measured_from` on, measures its peak memory; right after
    each step calls `after(step_index, trl_result)` (which runs minigrpo's step), and stops TRL after `stop_after`."""
    from transformers import TrainerCallback

    class SideBySide(TrainerCallback):
        def __init__(self):
            self.step_index = 0

        def on_step_begin(self, args, state, control, **kw):
            self.memory = PeakMemory(device) if self.step_index >= measured_from else None
            if self.memory is not None:
                self.memory.__enter__()
            self.clock = Clock().start()

        def on_step_end(self, args, state, control, **kw):
            _sync(device)
            step = self.clock.stop()
            if self.memory is not None:
                self.memory.__exit__(None, None, None)
            after(self.step_index, {"step": step, "peak": self.memory and self.memory.peak})
            self.step_index += 1
            control.should_training_stop = self.step_index >= stop_after

    return SideBySide()


def compare_at_length(args, model_dir, tokenizer, task, rows, length: int, eos_probability: float | None) -> dict:
    """warm-up + timed steps of TRL and of minigrpo at max_completion_length = length, alternating; returns
    {"trl": [...], "minigrpo": [...]} (and "minigrpo, no shared prefix": [...] with --compare-shared-prefix), one
    {"step": (wall, cpu), "peak": bytes, "tokens": n} per timed step (minigrpo's also "train_cpu", and with
    --flops "flops": the training pass's matrix-multiply FLOPs). args.bf16, args.lora (the GPU check's,
    lab/gpu_check.py; absent: float32, full fine-tuning): both sides under bf16 autocast over float32 weights, both training the same
    LoRA adapter (r 16, alpha 32, dropout 0.05, every linear layer of the blocks)."""
    device = torch.device(args.device)
    step_args = argparse.Namespace(**{**vars(args), "max_completion_length": length})
    sides = {"minigrpo": True, **({UNSHARED: False} if args.compare_shared_prefix else {})}  # side: shared_prefix
    bf16, lora = getattr(args, "bf16", False), getattr(args, "lora", False)  # the GPU check's settings
    autocast = functools.partial(torch.autocast, device.type, dtype=torch.bfloat16, enabled=bf16)
    runners = {}
    for side, shared_prefix in sides.items():
        model, _ = load_model_and_tokenizer(model_dir, device)
        if lora:  # TRL's side: the same adapter (bench.make_trl_trainer)
            model = add_lora(model, r=16, alpha=32, dropout=0.05)
        cfg = Config(model_name_or_path=str(model_dir), task=task.name, num_generations=args.num_generations,
                     generation_batch_size=args.prompts * args.num_generations, max_completion_length=length,
                     temperature=args.temperature, loss_type=args.loss_type, learning_rate=args.learning_rate,
                     beta=0.0, seed=args.seed, shared_prefix=shared_prefix, bf16=bf16, use_peft=lora)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.learning_rate,
                                      betas=(0.9, 0.999), weight_decay=0.0)
        runners[side] = (model, cfg, optimizer)
    results, captured = {"trl": [], **{side: [] for side in sides}}, {}

    def run_minigrpo(index, trl_result):
        """Right after TRL's step `index`: keep its figures, then each minigrpo side's step on the same prompts."""
        trl_result["tokens"] = captured.pop("tokens")
        step_rows = rows[index * args.prompts:(index + 1) * args.prompts]
        measured = index >= args.warmup
        if measured:
            results["trl"].append(trl_result)
        for side, (model, cfg, optimizer) in runners.items():
            torch.manual_seed(args.seed + index)  # the same completions on every minigrpo side
            with PeakMemory(device) if measured else _NoMemory() as peak:
                out = minigrpo_step(model, tokenizer, optimizer, task, cfg, step_rows, [task.correctness_reward],
                                    device, autocast)
            if measured:
                train_cpu = out["step"][1] - out["rollout"][1]
                flops = training_pass_flops(model, out["inputs"], cfg) if args.flops else None
                results[side].append({"step": out["step"], "train_cpu": train_cpu, "peak": peak.peak,
                                      "tokens": out["tokens"], "flops": flops})

    callback = _side_step_callback(device, run_minigrpo, args.warmup, args.warmup + args.steps)
    with tempfile.TemporaryDirectory(prefix="minigrpo-bench-length-") as out_dir:
        trainer = make_trl_trainer(model_dir, tokenizer, rows, task, step_args, out_dir, callback)
        generate_and_score = trainer._generate_and_score_completions

        def counted_generate_and_score(inputs):
            out = generate_and_score(inputs)
            captured["tokens"] = int(out["completion_mask"].sum().item())
            return out

        trainer._generate_and_score_completions = counted_generate_and_score
        hooks = []
        if eos_probability:
            eos = tokenizer.eos_token_id
            models = [trainer.model] + [model for model, _, _ in runners.values()]
            hooks = [force_eos(m, eos, eos_probability) for m in models]
        trainer.train()
        for hook in hooks:
            hook.remove()
    del trainer, runners
    gc.collect()
    return results


def training_pass_flops(model, inputs, cfg: Config) -> int:
    """The matrix-multiply FLOPs of one training pass over a batch: forward + backward of its log-probs, as
    grpo_update runs them (one mini-batch, the loss's gradient w.r.t. each log-prob taken as 1), counted by
    torch's FlopCounterMode (matmuls and attention; elementwise work is not counted). Gradients are cleared after."""
    model.train()
    with FlopCounterMode(display=False) as counter:
        logp, _ = completion_logprobs(model, inputs.prompt_ids, inputs.prompt_mask, inputs.completion_ids,
                                      inputs.completion_mask, temperature=cfg.temperature, with_entropy=True,
                                      share_prompts=cfg.shared_prefix)
        (logp * inputs.loss_mask).sum().backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def matmul_peak(hidden_size: int, intermediate_size: int, *, device=torch.device("cpu"), rows: int = 2048,
                seconds: float = 3.0) -> float:
    """This machine's float32 matrix-multiply rate in FLOP/s of CPU time (GPU: wall time): (rows x hidden) @
    (hidden x intermediate), a decoder MLP's product, repeated for about `seconds` after one warm-up; the best of
    five rounds."""
    a = torch.randn(rows, hidden_size, device=device)
    b = torch.randn(hidden_size, intermediate_size, device=device)
    flops = 2 * rows * hidden_size * intermediate_size
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    a @ b  # warm-up
    start, n = time.perf_counter(), 0
    while time.perf_counter() - start < seconds / 5 or n < 1:  # how many products fill a round
        a @ b
        n += 1
    best = float("inf")
    for _ in range(5):
        _sync(device)
        t0 = clock()
        for _ in range(n):
            a @ b
        _sync(device)
        best = min(best, clock() - t0)
    return flops * n / max(best, 1e-9)


class _NoMemory:
    peak = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


# ---------------------------------------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------------------------------------
UNSHARED = "minigrpo, no shared prefix"


def summarize(length: int, eos_probability: float | None, completions: int, results: dict) -> dict:
    """Medians over the timed steps, per side, and each minigrpo side's ratios to TRL."""
    row = {"length": length, "eos_probability": eos_probability, "completions": completions}
    for side, steps in results.items():
        row[side] = {
            "step_wall": statistics.median(s["step"][0] for s in steps),
            "step_cpu": statistics.median(s["step"][1] for s in steps),
            "peak_bytes": statistics.median(s["peak"] for s in steps) if steps[0]["peak"] is not None else None,
            "tokens": statistics.median(s["tokens"] for s in steps),
            "steps": len(steps),
        }
        if steps[0].get("flops") is not None:  # achieved matrix-multiply FLOP/s of the training pass
            row[side]["train_flops_per_s"] = statistics.median(s["flops"] / s["train_cpu"] for s in steps)
            row[side]["train_flops"] = statistics.median(s["flops"] for s in steps)
    for side, prefix in (("minigrpo", ""), (UNSHARED, "unshared_")):
        if side in results:
            for key in ("step_wall", "step_cpu", "peak_bytes"):
                mg, trl = row[side][key], row["trl"][key]
                row[f"{prefix}{key}_ratio"] = mg / trl if mg is not None and trl else None
    return row


def format_table(rows: list[dict], peak_flops: float | None = None) -> str:
    """A Markdown table: per length, tokens per step, step time and peak memory of each side, and the ratios to TRL
    (with a minigrpo side without the shared prefix: its ratios too; with FLOP counts: the training pass's
    achieved GFLOP/s and its share of the matrix-multiply peak)."""
    mib = lambda b: "n/a" if b is None else f"{b / 2**20:,.0f}"  # noqa: E731
    ratio = lambda r: "n/a" if r is None else f"{r:.2f}"  # noqa: E731
    unshared = UNSHARED in rows[0]
    flops = "train_flops_per_s" in rows[0]["minigrpo"]
    header = ("| completions | tokens/step minigrpo / TRL | step CPU s minigrpo / TRL | step ratio (CPU, wall) "
              "| peak MiB minigrpo / TRL | peak ratio |")
    if unshared:
        header += " no shared prefix: step CPU s, ratio (CPU) | peak MiB, ratio |"
    if flops:
        header += " training GFLOP/s (share of peak) |"
    lines = [header, "|" + "---|" * header.count(" |")]
    for r in rows:
        mg, trl = r["minigrpo"], r["trl"]
        lengths = f"{r['length']} tokens" if not r["eos_probability"] else (
            f"up to {r['length']}, eos p = 1/{1 / r['eos_probability']:.0f}")
        line = (f"| {lengths} | {mg['tokens']:.0f} / {trl['tokens']:.0f} | {mg['step_cpu']:.3g} / "
                f"{trl['step_cpu']:.3g} | {ratio(r['step_cpu_ratio'])}, {ratio(r['step_wall_ratio'])} | "
                f"{mib(mg['peak_bytes'])} / {mib(trl['peak_bytes'])} | **{ratio(r['peak_bytes_ratio'])}** |")
        if unshared:
            un = r[UNSHARED]
            line += (f" {un['step_cpu']:.3g}, {ratio(r['unshared_step_cpu_ratio'])} | {mib(un['peak_bytes'])}, "
                     f"{ratio(r['unshared_peak_bytes_ratio'])} |")
        if flops:
            shares = []
            for side in ("minigrpo", UNSHARED) if unshared else ("minigrpo",):
                achieved = r[side]["train_flops_per_s"]
                share = f" ({achieved / peak_flops:.0%})" if peak_flops else ""
                shares.append(f"{achieved / 1e9:.1f}{share}")
            line += " " + " / ".join(shares) + " |"
        lines.append(line)
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="minigrpo bench-length", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=list(SHAPES), help="model shape, random weights")
    p.add_argument("--num-layers", type=int, default=2, help="override the shape's layer count (0: keep it)")
    p.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="comma-separated completion lengths")
    p.add_argument("--eos-probability", type=float, default=1 / 256,
                   help="adds a run at the largest length with this eos probability per token (0: none)")
    p.add_argument("--task", default="countdown",
                   help="whose prompts (and tokenizer: the task's shipped model's, else the stand-in's)")
    p.add_argument("--compare-shared-prefix", action="store_true",
                   help="add a minigrpo side with shared_prefix=False (every completion runs its prompt again)")
    p.add_argument("--flops", action="store_true",
                   help="count the training pass's matrix-multiply FLOPs; report FLOP/s against a measured peak")
    p.add_argument("--prompts", type=int, default=1, help="prompts per step")
    p.add_argument("--num-generations", type=int, default=8, help="G")
    p.add_argument("--steps", type=int, default=1, help="timed (and measured) steps per side and length")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (Adam's moments are made there)")
    p.add_argument("--loss-type", default="grpo")
    p.add_argument("--learning-rate", type=float, default=1e-6)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 = steady on a shared CPU)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--plot", default=None, help="also draw them (plots.plot_memory_vs_length) into this PNG")
    args = p.parse_args(argv)
    try:
        args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    except ValueError:
        p.error(f"--lengths: {args.lengths!r} is not a comma-separated list of integers")
    if not args.lengths or min(args.lengths) < 1:
        p.error("--lengths: give at least one length, each >= 1")
    if not 0 <= args.eos_probability < 1:
        p.error(f"--eos-probability: must be in [0, 1), got {args.eos_probability}")
    if args.steps < 1 or args.warmup < 0:
        p.error("--steps must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    args.model, args.num_layers = None, args.num_layers or None  # what bench.build_model_dir reads
    import transformers
    import trl
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    task = get_task(args.task)
    rows = task.load("train")[: (args.warmup + args.steps + 1) * args.prompts]  # TRL's loop asks one step ahead
    runs = [(length, None) for length in args.lengths]
    if args.eos_probability:
        runs.append((max(args.lengths), args.eos_probability))
    summary = []
    with tempfile.TemporaryDirectory(prefix="minigrpo-bench-length-") as tmp:
        tokenizer, tokenizer_source = task_tokenizer(task, Path(tmp))
        model_dir = build_model_dir(args, task, tokenizer, Path(tmp))
        config = transformers.AutoConfig.from_pretrained(model_dir)
        prompt_tokens = [len(ids) for ids in encode_prompts(tokenizer, [row["prompt"] for row in rows])]
        peak_flops = (matmul_peak(config.hidden_size, config.intermediate_size, device=torch.device(args.device))
                      if args.flops else None)
        settings = dict(shape=args.shape, num_hidden_layers=config.num_hidden_layers, hidden_size=config.hidden_size,
                        vocab_size=config.vocab_size, prompts=args.prompts, num_generations=args.num_generations,
                        steps=args.steps, warmup=args.warmup, threads=torch.get_num_threads(), device=args.device,
                        task=task.name, tokenizer=tokenizer_source, prompt_tokens=statistics.median(prompt_tokens),
                        matmul_peak_flops=peak_flops,
                        torch=torch.__version__, transformers=transformers.__version__, trl=trl.__version__)
        print(f"minigrpo bench-length: {args.shape} ({config.num_hidden_layers} layers, hidden {config.hidden_size}, "
              f"vocab {config.vocab_size}, random weights), {args.prompts} prompt(s) x G={args.num_generations} a "
              f"step, {args.steps} measured step(s) per side after {args.warmup} warm-up, float32, beta 0; TRL "
              f"bf16=False gradient_checkpointing=False use_liger_kernel=False; torch threads "
              f"{torch.get_num_threads()}, torch {torch.__version__}, transformers {transformers.__version__}, "
              f"trl {trl.__version__}", flush=True)
        print(f"  prompts: {task.name}'s, through the {tokenizer_source}'s chat template and tokenizer, "
              f"{min(prompt_tokens)}-{max(prompt_tokens)} tokens (median {statistics.median(prompt_tokens):.0f})"
              + (f"; float32 matmul peak {peak_flops / 1e9:.1f} GFLOP/s" if peak_flops else ""), flush=True)
        for length, eos_probability in runs:
            results = compare_at_length(args, model_dir, tokenizer, task, rows, length, eos_probability)
            summary.append(summarize(length, eos_probability, args.prompts * args.num_generations, results))
            print(format_table(summary[-1:], peak_flops).splitlines()[-1], flush=True)
    print()
    print(format_table(summary, peak_flops))
    print("(medians over the measured steps; peak: memory a step adds above what was live at its start)")
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": settings, "rows": summary}, indent=2))
    if args.plot:
        from .plots import plot_memory_vs_length

        axes = plot_memory_vs_length(summary, title=f"{args.shape}, {config.num_hidden_layers} layers, "
                                                    f"{args.prompts * args.num_generations} completions a step")
        axes[0].figure.savefig(args.plot, dpi=100, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
