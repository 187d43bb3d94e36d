"""`minigrpo memory`: the command line of the memory measurements (memory.py: one process; memory_sharded.py:
several, sharded or not). Run `minigrpo memory --help`."""

import argparse
import json
import sys
from pathlib import Path

import torch

from .memory import (RESULT_MARKER, SETUPS, SHAPES, format_recipe_table, format_table, measure, measure_setup,
                     recipe_floor)
from .memory import __doc__ as MEMORY_DOC


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minigrpo memory", description=MEMORY_DOC.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", choices=SHAPES,
                   help="model shape, repeatable (default: tiny and qwen2.5-0.5b-2l on CPU; "
                        "tiny, qwen2.5-0.5b and qwen2.5-1.5b on CUDA)")
    p.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated subset of {', '.join(SETUPS)}")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--batch-size", type=int, default=8, help="completions per step")
    p.add_argument("--num-generations", type=int, default=8, help="G, completions per prompt (GRPO's groups)")
    p.add_argument("--prompt-length", type=int, default=32)
    p.add_argument("--completion-length", type=int, default=64)
    p.add_argument("--steps", type=int, default=2, help="optimizer steps measured (2: Adam's moments exist)")
    p.add_argument("--beta", type=float, default=0.0, help="> 0 adds the reference policy (and its KL) everywhere")
    p.add_argument("--lora-r", type=int, default=16)
    p.add_argument("--reward-model", action="store_true",
                   help="a reward model of the policy's shape scores each batch (no gradient); the start is kept for "
                        "the drift")
    p.add_argument("--json", default=None, help="also write the results to this file")
    p.add_argument("--recipe", action="append", default=None,
                   help="a run's YAML config (e.g. recipes/*.yaml): print its memory floor, computed, not measured")
    p.add_argument("--gpu-gib", type=float, default=None,
                   help="with --recipe: the GPU's memory, to split between vLLM's share and the trainer's")
    p.add_argument("--num-processes", type=int, default=1,
                   help="with --recipe: each GPU's share when this many processes train it (DDP, or --fsdp)")
    p.add_argument("--fsdp", action="store_true", help="with --num-processes: sharded with FSDP2 (fsdp: full_shard)")
    p.add_argument("--measure-fsdp", action="store_true",
                   help="measure 1 process against 2 sharded (FSDP2) on the CPU at --shape (default qwen2.5-0.5b-2l)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.measure_fsdp or (args.recipe and (args.num_processes > 1 or args.fsdp)):  # memory_sharded.py
        from .memory_sharded import main as sharded_main, print_recipe_shares

        if args.measure_fsdp:
            return sharded_main(["--shape", (args.shape or ["qwen2.5-0.5b-2l"])[0]])
        return print_recipe_shares(args.recipe, args.num_processes, args.fsdp)
    if args.recipe:
        from ..config import load_config

        for path in args.recipe:
            gpu_bytes = int(args.gpu_gib * 2**30) if args.gpu_gib else None
            print(format_recipe_table(path, recipe_floor(load_config(path), gpu_bytes=gpu_bytes)) + "\n")
        print("Computed from the shapes, not measured. Left out: the decode loop's KV cache (without vLLM), the CUDA "
              "context (~0.5 GB), allocator slack. Prompts taken as 200 tokens.")
        return 0
    if args.child:  # one setup, in this fresh process
        print(RESULT_MARKER + json.dumps(measure_setup(**json.loads(args.child))), flush=True)
        return 0

    from ..loading.models import resolve_device

    device = resolve_device(args.device).type
    shapes = args.shape or (["tiny", "qwen2.5-0.5b", "qwen2.5-1.5b"] if device == "cuda" else ["tiny", "qwen2.5-0.5b-2l"])
    setups = [s.strip() for s in args.setups.split(",") if s.strip()]
    unknown = [s for s in setups if s not in SETUPS]
    if unknown:
        p.error(f"--setups: unknown {', '.join(unknown)} (known: {', '.join(SETUPS)})")
    kwargs = dict(device=device, dtype=args.dtype, batch_size=args.batch_size, num_generations=args.num_generations,
                  prompt_length=args.prompt_length, completion_length=args.completion_length, steps=args.steps,
                  beta=args.beta, lora_r=args.lora_r, reward_model=args.reward_model)
    import bitsandbytes
    import peft
    import transformers

    gpu = f" ({torch.cuda.get_device_name()})" if device == "cuda" else ""
    print(f"device {device}{gpu}, dtype {args.dtype}, batch {args.batch_size} completions x ({args.prompt_length} "
          f"prompt + {args.completion_length} completion tokens), G={args.num_generations}, beta={args.beta}, "
          f"LoRA r={args.lora_r}, {args.steps} steps{', a reward model scoring' if args.reward_model else ''}; "
          f"torch {torch.__version__}, transformers "
          f"{transformers.__version__}, peft {peft.__version__}, bitsandbytes {bitsandbytes.__version__}")
    everything = []
    for shape in shapes:
        results = measure(shape, setups, **kwargs)
        everything += results
        print(f"\n{shape}")
        print(format_table(results, device), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, **kwargs, "results": everything}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
