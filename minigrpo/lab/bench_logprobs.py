"""`minigrpo bench-logprobs`: the training pass's log-probs (forward + backward), side by side: time and memory.

The log-probs of the completion tokens, with their gradient, are most of a training step's compute and memory
(logprobs.py). This times and measures that pass alone, on two shapes, against the ways to compute the same numbers:

  time    Qwen2.5-0.5B's width (hidden 896, 14 query / 2 key-value heads, MLP 4,864), 6 blocks, a 32,768-token
          vocabulary, tied embedding and head, every weight trained; one 154-token prompt, G = 8 completions of 256
          tokens; log-probs and entropies (as the trainer asks for them), forward + backward. CPU time and wall
          time of one pass: the median over `--repeats` passes after a warm-up, in each of `--rounds` rounds;
          and the pass's matrix-multiply FLOPs (torch's FlopCounterMode), what no implementation can do without.
  memory  the same width, 2 blocks, Qwen2.5's 151,936-token vocabulary, the tied embedding and head frozen (as
          under LoRA); two 32-token prompts x G = 4 completions of varied length (64 to 256 tokens); the peak one
          pass adds above what was live before it, read two ways: the resident set (peak_memory.PeakMemory, what
          the machine pays) and the live tensors (live_tensors.LiveTensorBytes, deterministic). The body alone
          (the decoder's hidden states for the same rows, summed, backward) is measured the same way, and the
          head's share is (pass - body) / one float32 logits copy (rows x 256 x vocabulary).

The sides:
  shared prefix  minigrpo's `completion_logprobs` (each group's prompt once; the default)
  not shared     the same with share_prompts=False (Config.shared_prefix): every row runs its own prompt
  plain          `plain_completion_logprobs`: one forward of prompt + completion with logits_to_keep, then
                 log_softmax and gather over the full logits (what TRL did before 1.16's fused head)
  TRL 1.16       TRL's own pass: `add_fused_lm_head` and `model(..., labels=..., fused_lm_head=True)`, entropy on,
                 as GRPOTrainer calls it (only where TRL is installed: pip install -e ".[bench]")
  --baseline DIR the shared and not-shared sides again with another checkout's package (for example
                 `git worktree add /tmp/prev <commit>`): a change to the path, measured against what it changed.
                 A checkout from before Config.shared_prefix existed shared prompts whenever gradient
                 checkpointing was off; its "not shared" side is reached as under checkpointing (the flag its
                 choice read), without checkpointing anything.

Each side runs in a process of its own (so its memory is its own, and another checkout's package can be imported),
the sides in turn and in reverse order in the next round, so that they see the same machine load. On a shared
machine read the CPU-time ratios, not the seconds.

    minigrpo bench-logprobs                              # both measurements, 2 threads, 2 rounds
    minigrpo bench-logprobs --baseline /tmp/prev --json docs/bench_logprobs.json
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

__all__ = ["SHAPES", "main"]

# The two measurements' shapes (see the module docstring); "quick" variants for the test suite.
SHAPES = {
    "time": dict(layers=6, vocab=32768, prompts=1, num_generations=8, prompt_tokens=154, completion_tokens=256,
                 min_completion_tokens=256, frozen_head=False),
    "memory": dict(layers=2, vocab=151936, prompts=2, num_generations=4, prompt_tokens=32, completion_tokens=256,
                   min_completion_tokens=64, frozen_head=True),
}
QUICK = dict(layers=1, vocab=4096, prompts=2, num_generations=2, prompt_tokens=8, completion_tokens=16,
             min_completion_tokens=4)
WIDTH = dict(hidden_size=896, intermediate_size=4864, num_attention_heads=14, num_key_value_heads=2,
             rope_theta=1e6, rms_norm_eps=1e-6, max_position_embeddings=1024, tie_word_embeddings=True)
SIDES = {"shared": "shared prefix", "unshared": "not shared", "plain": "plain", "trl": "TRL 1.16"}
REPO = Path(__file__).resolve().parents[2]  # the checkout this file belongs to


# ---------------------------------------------------------------------------------------------------------
# One side, in its own process (run with the side's checkout on PYTHONPATH: only `minigrpo.logprobs` and
# `minigrpo.loading.peak_memory` are imported from it, which every checkout since the head in blocks has)
# ---------------------------------------------------------------------------------------------------------
def _model_and_rows(shape: dict, quick: bool):
    from transformers import AutoConfig, AutoModelForCausalLM

    width = dict(WIDTH, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2) if quick \
        else WIDTH
    config = AutoConfig.for_model("qwen2", num_hidden_layers=shape["layers"], vocab_size=shape["vocab"], **width)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.train()
    if shape["frozen_head"]:
        model.get_output_embeddings().weight.requires_grad_(False)  # tied: the embedding too
    g = torch.Generator().manual_seed(1)
    G, U, P, T = shape["num_generations"], shape["prompts"], shape["prompt_tokens"], shape["completion_tokens"]
    prompt_ids = torch.randint(3, shape["vocab"], (U, P), generator=g).repeat_interleave(G, dim=0)  # (B, P)
    prompt_mask = torch.ones_like(prompt_ids)
    completion_ids = torch.randint(3, shape["vocab"], (U * G, T), generator=g)  # (B, T)
    lengths = torch.randint(shape["min_completion_tokens"], T + 1, (U * G,), generator=g)
    lengths[0] = T
    completion_mask = (torch.arange(T) < lengths.unsqueeze(1)).long()  # right-padded
    return model, (prompt_ids, prompt_mask, completion_ids * completion_mask, completion_mask)


def _pass_function(side: str, model, ids):
    """A function running one forward + backward of `side` on the rows `ids`."""
    import inspect

    import minigrpo.logprobs as logprobs

    mask = ids[3]
    if side == "plain":
        def forward():
            return logprobs.plain_completion_logprobs(model, *ids, with_entropy=True)[0]
    elif side == "trl":
        from trl.trainer.utils import add_fused_lm_head

        add_fused_lm_head(model, temperature=1.0, outputs=("log_probs", "entropy"))
        input_ids, attention_mask = torch.cat([ids[0], ids[2]], dim=1), torch.cat([ids[1], ids[3]], dim=1)
        T = ids[2].shape[1]
        labels = input_ids.masked_fill(attention_mask == 0, -100)  # as GRPOTrainer's _get_per_token_logps...
        labels[:, :-T] = -100

        def forward():
            return model(input_ids=input_ids, attention_mask=attention_mask, labels=labels,
                         fused_lm_head=True).log_probs[:, -T:]
    elif side == "body":
        decoder = model.get_decoder()

        def forward():  # the hidden states that predict the completion tokens, summed: the body alone
            return logprobs.completion_hidden_states(decoder, model.config, *ids).sum(-1)
    else:
        options = {}
        if "share_prompts" in inspect.signature(logprobs.completion_logprobs).parameters:
            options["share_prompts"] = side == "shared"
        elif side == "unshared":  # a checkout from before the option: it did not share under checkpointing
            model.get_decoder().gradient_checkpointing = True  # read by its choice only; nothing is checkpointed

        def forward():
            return logprobs.completion_logprobs(model, *ids, with_entropy=True, **options)[0]

    def one_pass():
        model.zero_grad(set_to_none=True)
        (forward() * mask).sum().backward()
        model.zero_grad(set_to_none=True)

    return one_pass


def matmul_flops(one_pass) -> int:
    """The matrix-multiply FLOPs of one_pass() (torch's FlopCounterMode: matmuls and attention, not elementwise
    work). An in-place addmm_ (the head's weight gradient in older checkouts) is counted like addmm."""
    from torch.utils import flop_counter

    if torch.ops.aten.addmm_ not in flop_counter.flop_registry:
        def addmm_inplace_flop(self_shape, a_shape, b_shape, *args, **kwargs):
            return flop_counter.mm_flop(a_shape, b_shape)

        flop_counter.register_flop_formula(torch.ops.aten.addmm_)(addmm_inplace_flop)
    with flop_counter.FlopCounterMode(display=False) as counter:
        one_pass()
    return counter.get_total_flops()


def _load_live_tensor_bytes():
    """live_tensors.LiveTensorBytes from this file's own checkout (the side's checkout may not have it)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("live_tensors", Path(__file__).with_name("live_tensors.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.LiveTensorBytes


def run_side(job: dict) -> dict:
    """What one worker process measures: {"cpu": [...], "wall": [...]} per pass, or {"rss": bytes, "live": bytes}."""
    import warnings

    warnings.filterwarnings("ignore", category=FutureWarning)  # an older checkout's cache keyword
    torch.set_num_threads(job["threads"])
    shape = dict(SHAPES[job["measure"]], **(QUICK if job["quick"] else {}))
    model, ids = _model_and_rows(shape, job["quick"])
    one_pass = _pass_function(job["side"], model, ids)
    one_pass()  # warm-up: lazy initialisations, the allocator's first pages
    result = {"tokens": int(ids[3].sum())}
    if job["measure"] == "time":
        result["cpu"], result["wall"] = [], []
        for _ in range(job["repeats"]):
            wall, cpu = time.perf_counter(), time.process_time()
            one_pass()
            result["wall"].append(time.perf_counter() - wall)
            result["cpu"].append(time.process_time() - cpu)
        if job.get("flops"):
            result["flops"] = matmul_flops(one_pass)
        return result
    from minigrpo.loading.peak_memory import PeakMemory

    with PeakMemory("cpu") as rss:
        one_pass()
    with _load_live_tensor_bytes()() as live:
        one_pass()
    rows, T = ids[2].shape
    return dict(result, rss=rss.peak, live=live.peak, logits_copy=rows * T * shape["vocab"] * 4)


# ---------------------------------------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------------------------------------
def _run_worker(job: dict, checkout: Path) -> dict:
    # Run from the checkout's folder, with it first on the path, so that `import minigrpo` finds its package.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(checkout), os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS=str(job["threads"]))
    run_this_file = f"import runpy; runpy.run_path({str(Path(__file__))!r}, run_name='__main__')"
    out = subprocess.run([sys.executable, "-c", run_this_file, "--worker", json.dumps(job)], cwd=checkout, env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"minigrpo bench-logprobs: the {job['side']} side ({checkout}) failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _sides(args) -> list[tuple[str, str, Path]]:
    """(label, side, checkout) for each side to run."""
    sides = [(SIDES[side], side, REPO) for side in ("shared", "unshared", "plain")]
    try:
        import trl  # noqa: F401

        sides.append((SIDES["trl"], "trl", REPO))
    except ImportError:
        print("  (TRL is not installed: its side is left out; pip install -e \".[bench]\")")
    if args.baseline:
        name = Path(args.baseline).name
        sides += [(f"{SIDES[side]}, {name}", side, Path(args.baseline)) for side in ("shared", "unshared")]
    return sides


def measure_time(args, sides) -> dict:
    """{label: {"cpu": [...], "wall": [...]}}: each side's passes, the sides in turn, reversed every other round."""
    results = {label: {"cpu": [], "wall": []} for label, _, _ in sides}
    for round_index in range(args.rounds):
        for label, side, checkout in sides if round_index % 2 == 0 else sides[::-1]:
            job = dict(measure="time", side=side, threads=args.threads, repeats=args.repeats, quick=args.quick,
                       flops=round_index == 0)  # the count is the same every round
            out = _run_worker(job, checkout)
            results[label]["cpu"] += out["cpu"]
            results[label]["wall"] += out["wall"]
            results[label]["flops"] = out.get("flops", results[label].get("flops"))
            print(f"  time, round {round_index + 1}: {label}: CPU {statistics.median(out['cpu']):.2f} s, wall "
                  f"{statistics.median(out['wall']):.2f} s", flush=True)
    return results


def measure_memory(args, sides) -> dict:
    """{label: {"rss": bytes, "live": bytes, "logits_copy": bytes}}, the body alone among them."""
    results = {}
    for label, side, checkout in [("body alone", "body", REPO)] + sides:
        results[label] = _run_worker(dict(measure="memory", side=side, threads=args.threads, quick=args.quick),
                                     checkout)
        print(f"  memory: {label}: resident {results[label]['rss'] / 2**20:,.0f} MiB, live tensors "
              f"{results[label]['live'] / 2**20:,.0f} MiB", flush=True)
    return results


def format_tables(times: dict | None, memory: dict | None) -> str:
    lines = []
    if times:
        plain = times[SIDES["plain"]]
        lines += ["| side | CPU s (median) | wall s (median) | CPU / plain | matmul TFLOP | TFLOP / plain |",
                  "|---|---|---|---|---|---|"]
        for label, t in times.items():
            cpu, wall = statistics.median(t["cpu"]), statistics.median(t["wall"])
            flops = (f"{t['flops'] / 1e12:.3f} | {t['flops'] / plain['flops']:.2f}" if t.get("flops")
                     and plain.get("flops") else "n/a | n/a")
            lines.append(f"| {label} | {cpu:.2f} | {wall:.2f} | {cpu / statistics.median(plain['cpu']):.2f} | {flops} |")
    if memory:
        body = memory["body alone"]
        lines += ["", "| side | resident MiB | live tensors MiB | head share, resident | head share, live tensors |",
                  "|---|---|---|---|---|"]
        for label, m in memory.items():
            share = lambda key: "" if label == "body alone" else f"{(m[key] - body[key]) / m['logits_copy']:.2f}"  # noqa: E731
            lines.append(f"| {label} | {m['rss'] / 2**20:,.0f} | {m['live'] / 2**20:,.0f} | {share('rss')} | "
                         f"{share('live')} |")
        lines.append(f"(head share: (pass - body alone) / one float32 logits copy, "
                     f"{body['logits_copy'] / 2**20:,.0f} MiB)")
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="minigrpo bench-logprobs", description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", default=None, help="another checkout (a git worktree) to measure beside this one")
    p.add_argument("--threads", type=int, default=2, help="torch threads per side (2: the whole 2-core machine)")
    p.add_argument("--repeats", type=int, default=2, help="timed passes per side and round, after one warm-up")
    p.add_argument("--rounds", type=int, default=2, help="rounds of all sides (the order reversed every other)")
    p.add_argument("--only", choices=["time", "memory"], default=None, help="one of the two measurements")
    p.add_argument("--quick", action="store_true", help="toy sizes (the test suite's check that it runs)")
    p.add_argument("--json", default=None, help="also write the figures to this file")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.baseline and not (Path(args.baseline) / "minigrpo" / "logprobs.py").is_file():
        p.error(f"--baseline: {args.baseline} is not a minigrpo checkout (no minigrpo/logprobs.py in it)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.worker:
        print(json.dumps(run_side(json.loads(args.worker))))
        return 0
    import transformers

    print(f"minigrpo bench-logprobs: forward + backward of the log-probs, each side in its own process; torch "
          f"threads {args.threads}, torch {torch.__version__}, transformers {transformers.__version__}"
          + (", toy sizes (--quick)" if args.quick else ""), flush=True)
    sides = _sides(args)
    times = measure_time(args, sides) if args.only in (None, "time") else None
    memory = measure_memory(args, sides) if args.only in (None, "memory") else None
    print()
    print(format_tables(times, memory))
    if args.json:
        Path(args.json).write_text(json.dumps({"settings": {**vars(args), "shapes": SHAPES, "torch": torch.__version__,
                                                            "transformers": transformers.__version__},
                                               "time": times, "memory": memory}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
