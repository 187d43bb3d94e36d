"""Each GPU's share of a run's memory over W processes: computed from the shapes (`sharded_floor`), and measured
on the CPU (`measure_side_by_side`).

    minigrpo memory --recipe R --num-processes 8 --fsdp     each GPU's share of the recipe, computed
    minigrpo memory --measure-fsdp                           1 process vs 2 sharded (FSDP2), measured on the CPU

What sharding divides (parallel/ddp_fsdp.py). With DistributedDataParallel every process holds everything one
process would, for its 1/W of the batch, plus DDP's gradient buckets (a second copy of the gradients, flat, for
the all-reduce). With FSDP2 (`fsdp: full_shard`) weights, gradients, AdamW's moments and the reference copy are
divided by W; what is added is what a process gathers to compute: the root's parameters (embeddings, final norm,
output head) for the whole training pass, and two decoder blocks at a time (the one computing, the next one
fetched). Sampling gathers the whole model (parallel/ddp_fsdp.full_weights), so its floor is the whole weights plus the
shards; a process's floor is the larger of its training and its sampling floor. Activations come from
memory.recipe_floor at the process's share of the batch; under FSDP2 every row runs its own prompt (the log-probs
take one pass, see parallel/ddp_fsdp.py), so a shared prefix saves nothing there.

Measured: on the CPU, the peak resident set of each process over two GRPO optimizer steps of the trainer's own
update (`trainer.grpo_update` through `parallel.ddp_fsdp.wrap`), one process against two under torchrun with FSDP2, on
random token ids at a fixed length, at Qwen2.5-0.5B's width and vocabulary cut to 2 blocks ("qwen2.5-0.5b-2l").
Each process first loads the whole model and then shards it; that transient is reported apart ("load"). Not
measured: any GPU, NCCL, sampling's gathered copy, more than 2 processes.
"""

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from ..errors import ConfigError
from .memory import DTYPE_BYTES, HUB_SHAPES, RESULT_MARKER, qwen_config, recipe_floor, shape_dir

__all__ = ["sharded_floor", "format_sharded_table", "fit_table", "measure_step", "measure_side_by_side"]

GIB = 2**30


def model_config(cfg):
    """The model config a recipe trains: a known hub name's published shape, else the model's config.json."""
    from transformers import AutoConfig

    from ..tasks import get_task

    name = cfg.model_name_or_path
    if name in HUB_SHAPES:
        return qwen_config(HUB_SHAPES[name])
    return AutoConfig.from_pretrained(name or get_task(cfg.task).model_dir)


def root_and_block_params(config) -> tuple[int, int, int]:
    """(all, root, one block) parameter counts of a causal LM, counted on the meta device: the root is what no
    decoder block holds (embeddings, final norm, an untied head)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    blocks = model.get_decoder().layers
    block = sum(p.numel() for p in blocks[0].parameters())
    return total, total - block * len(blocks), block


def sharded_floor(cfg, num_processes: int, fsdp: bool, prompt_length: int = 200) -> dict:
    """One process's share of `cfg`'s memory when W = num_processes processes train it, in bytes (see the module
    docstring): recipe_floor's parts at 1/W of the batch, divided by W where FSDP2 shards them, plus `gathered`
    (FSDP2), `ddp_buckets` (DDP), `training` and `sampling` floors; `floor` is the larger."""
    W = num_processes
    prompts = cfg.generation_batch_size // cfg.num_generations
    if W < 1 or prompts % W:
        raise ConfigError(f"num_processes: {prompts} prompts per step cannot be split into whole groups over {W}")
    if fsdp:  # what config.py refuses for fsdp (vLLM, 4-bit), refused here too
        dataclasses.replace(cfg, fsdp="full_shard")
    share = dataclasses.replace(cfg, generation_batch_size=cfg.generation_batch_size // W,
                                shared_prefix=cfg.shared_prefix and not (fsdp and W > 1))
    floor = recipe_floor(share, prompt_length)
    sharded = ("weights", "gradients", "optimizer", "reference")
    floor.update(num_processes=W, fsdp=fsdp, gathered=0, ddp_buckets=0, offloaded=0)
    if fsdp and W > 1:
        for key in sharded:
            floor[key] = -(-floor[key] // W)
        config = model_config(cfg)
        total, root, block = root_and_block_params(config)
        compute_bytes = 2 if cfg.bf16 or cfg.fp16 else DTYPE_BYTES[cfg.dtype]  # MixedPrecisionPolicy: 16 bits
        options = cfg.fsdp_config or {}
        # reshard_after_forward false: every block stays gathered from its forward to its backward
        blocks_held = config.num_hidden_layers if options.get("reshard_after_forward") is False else 2
        floor["gathered"] = (root + blocks_held * block) * compute_bytes
        if options.get("cpu_offload"):  # the shards live in CPU memory
            floor["offloaded"] = sum(floor[key] for key in sharded)
        shards_on_gpu = sum(floor[key] for key in sharded) - floor["offloaded"]
        floor["sampling"] = total * DTYPE_BYTES[cfg.dtype] + shards_on_gpu
    elif W > 1:
        floor["ddp_buckets"] = floor["gradients"]
    if not (fsdp and W > 1):
        floor["sampling"] = sum(floor[key] for key in sharded)
    if fsdp and W > 1:  # MixedPrecisionPolicy gathers the blocks in 16 bits: no autocast copies beside them
        floor["autocast_copies"] = 0
    floor["training"] = (sum(floor[key] for key in sharded) - floor["offloaded"] + floor["gathered"]
                         + floor["ddp_buckets"] + floor["logits"] + floor["activations"] + floor["autocast_copies"])
    floor["floor"] = max(floor["training"], floor["sampling"])
    return floor


def format_sharded_table(path: str, floor: dict) -> str:
    """One recipe's per-process share as a Markdown table (GiB)."""
    W, engine = floor["num_processes"], "FSDP2" if floor["fsdp"] else "DDP" if floor["num_processes"] > 1 else "one"
    gib = lambda b: f"{b / GIB:.2f}"  # noqa: E731
    rows = [("weights", floor["weights"]), ("gradients", floor["gradients"]), ("AdamW moments", floor["optimizer"]),
            ("reference model (beta > 0, no LoRA)", floor["reference"]),
            ("gathered to compute: root + blocks (FSDP2)", floor["gathered"]),
            ("DDP's gradient buckets", floor["ddp_buckets"]),
            ("of the above, offloaded to CPU memory (cpu_offload)", floor["offloaded"]),
            (f"logits, one block of the head ({floor['block_tokens']} tokens)", floor["logits"]),
            (f"activations, estimated ({floor['mini_batch']} completions per micro-batch)", floor["activations"]),
            ("16-bit copies of the float32 weights (autocast, kept for backward)", floor["autocast_copies"]),
            ("**training floor**", floor["training"]),
            ("**sampling floor** (whole weights gathered)", floor["sampling"]), ("**per GPU**", floor["floor"])]
    lines = [f"`{path}` ({floor['setup']}) on {W} process(es), {engine}, each GPU's share:", "",
             "| part | GiB |", "|---|---|"] + [f"| {name} | {gib(b)} |" for name, b in rows]
    return "\n".join(lines)


def print_recipe_shares(recipe_paths: list[str], num_processes: int, fsdp: bool) -> int:
    """`minigrpo memory --recipe R --num-processes W [--fsdp]`: each recipe's per-GPU table."""
    from ..config import load_config

    for path in recipe_paths:
        print(format_sharded_table(path, sharded_floor(load_config(path), num_processes, fsdp)) + "\n")
    print("Computed from the shapes, not measured on any GPU. Left out: the decode loop's KV cache, the CUDA context "
          "(~0.5 GB), NCCL's buffers, allocator slack. Prompts taken as 200 tokens.")
    return 0


# What fits where: the README's table (computed, not measured on GPUs).
FIT_RUNS = {
    "Qwen2.5-1.5B full fine-tuning": dict(model_name_or_path="Qwen/Qwen2.5-1.5B-Instruct"),
    "Qwen2.5-7B LoRA r=16": dict(model_name_or_path="Qwen/Qwen2.5-7B-Instruct", use_peft=True, dtype="bfloat16"),
}
FIT_SETTINGS = dict(bf16=True, num_generations=16, generation_batch_size=128, gradient_accumulation_steps=16,
                    max_completion_length=512, gradient_checkpointing=True, task="gsm8k")


def fit_table(gpu_gib: float = 24, layouts=((1, False), (2, False), (2, True), (8, True))) -> str:
    """Per-GPU floors (GiB) of FIT_RUNS on 1, 2 and 8 GPUs, DDP or FSDP2, and whether each fits a gpu_gib GPU."""
    from ..config import Config

    head = "| run (8 prompts x 16 completions, 512 tokens, micro-batches of 8 / W) | " + " | ".join(
        f"{W} x {gpu_gib:.0f} GB {'FSDP2' if fsdp else 'DDP' if W > 1 else ''}".strip() for W, fsdp in layouts) + " |"
    lines = [head, "|---" * (len(layouts) + 1) + "|"]
    for name, settings in FIT_RUNS.items():
        cfg = Config(**FIT_SETTINGS, **settings)
        cells = []
        for W, fsdp in layouts:
            floor = sharded_floor(cfg, W, fsdp)["floor"] / GIB
            cells.append(f"{floor:.1f} GiB {'fits' if floor + 0.5 <= gpu_gib * 1e9 / GIB else 'no'}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# Measured on the CPU
# ---------------------------------------------------------------------------------------------------------
def measure_step(model_dir: str, *, batch_size: int = 16, num_generations: int = 8, prompt_length: int = 32,
                 completion_length: int = 64, steps: int = 2) -> dict:
    """In this process (one of W under torchrun, or alone): load, shard when W > 1 (FSDP2), then `steps` GRPO
    optimizer steps on this process's 1/W of a random batch; returns what it held and its peaks, in bytes above
    the resident set just before loading."""
    from ..advantages import group_advantages
    from ..batch import Batch
    from ..config import Config
    from ..loading.models import load_model
    from ..parallel import ddp_fsdp, processes
    from ..loading.peak_memory import current_memory_bytes, peak_memory_bytes, reset_peak_memory
    from ..trainer import grpo_update
    from .memory import _import_model_code, synthetic_batch

    processes.setup(torch.device("cpu"))
    W, rank = processes.world_size(), processes.rank()
    _import_model_code(model_dir)
    torch.manual_seed(0)
    reset_peak_memory("cpu")
    baseline = current_memory_bytes("cpu")
    model = load_model(model_dir, "cpu")
    policy, _ = processes.wrap(model, fsdp="full_shard")  # one process: the model's own forward
    load_peak = peak_memory_bytes("cpu") - baseline  # the whole model, before it was sharded
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    reset_peak_memory("cpu")
    after_setup = current_memory_bytes("cpu") - baseline
    batch, rewards = synthetic_batch(model.config.vocab_size, batch_size, prompt_length, completion_length)
    mine = slice(rank * batch_size // W, (rank + 1) * batch_size // W)
    ids = [batch[k][mine] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")]
    adv, _ = group_advantages(rewards, num_generations)
    cfg = Config(num_generations=num_generations, generation_batch_size=batch_size // W)
    for _ in range(steps):
        grpo_update(policy, optimizer, Batch.of_completions(*ids, adv=adv[mine]), cfg,
                    max_completion_length=completion_length)
    moments = [s[key] for s in optimizer.state.values() for key in ("exp_avg", "exp_avg_sq")]
    result = {"world_size": W, "rank": rank, "params_held": ddp_fsdp.local_numel(model.parameters()),
              "optimizer_state_held": ddp_fsdp.local_numel(moments), "load_peak_bytes": load_peak,
              "after_setup_bytes": after_setup, "step_peak_bytes": peak_memory_bytes("cpu") - baseline}
    del policy
    processes.cleanup()
    return result


def measure_side_by_side(shape: str = "qwen2.5-0.5b-2l", processes: int = 2, workdir=None, **kwargs) -> list[dict]:
    """measure_step in one process, then in `processes` processes under torchrun (FSDP2), one after the other on
    the same model directory; returns every process's result."""
    with tempfile.TemporaryDirectory(prefix="minigrpo-memory-") as tmp:
        model_dir = str(shape_dir(shape, workdir or tmp))
        request = json.dumps({"model_dir": model_dir, **kwargs})
        package_parent = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_parent, os.environ.get("PYTHONPATH", "")])}
        child = ["-m", "minigrpo.lab.memory_sharded", "--child", request]
        results = []
        for command in ([sys.executable, *child], [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                                                   str(processes), "--master-port", str(_free_port()), *child]):
            proc = subprocess.run(command, capture_output=True, text=True, env=env)
            # Each process prints one marked line, in one write; the lines of two processes can meet on one line
            # of the shared pipe, so every marker's JSON object is read on its own.
            found = [json.JSONDecoder().raw_decode(piece.lstrip())[0] for piece in proc.stdout.split(RESULT_MARKER)[1:]]
            if proc.returncode != 0 or not found:
                raise RuntimeError(f"memory: {' '.join(command[:6])} failed:\n{proc.stderr[-3000:]}")
            results += sorted(found, key=lambda r: r["rank"])
        return [{"shape": shape, **r} for r in results]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def format_measured(results: list[dict], predicted: dict[int, int] | None = None) -> str:
    """The side-by-side measurement as a plain-text table (MiB above the resident set before loading)."""
    mib = lambda b: f"{b / 2**20:,.0f}"  # noqa: E731
    head = (f"{'processes':>9s} {'rank':>4s} {'params held':>12s} {'AdamW held':>12s} {'load MiB':>9s} "
            f"{'held MiB':>9s} {'step peak MiB':>13s}" + (f" {'computed MiB':>12s}" if predicted else ""))
    lines = [head, "-" * len(head)]
    for r in results:
        line = (f"{r['world_size']:>9d} {r['rank']:>4d} {r['params_held']:>12,d} {r['optimizer_state_held']:>12,d} "
                f"{mib(r['load_peak_bytes']):>9s} {mib(r['after_setup_bytes']):>9s} {mib(r['step_peak_bytes']):>13s}")
        lines.append(line + (f" {mib(predicted[r['world_size']]):>12s}" if predicted else ""))
    return "\n".join(lines)


def predicted_static(shape: str, world_size: int) -> int:
    """Weights, gradients and AdamW moments (float32) held by one of world_size processes under FSDP2, plus what
    it gathers to compute (root + 2 blocks): the part of measure_step's peak that sharding divides."""
    from .memory import QWEN2_5

    if shape not in QWEN2_5:
        raise ValueError(f"shape: {shape!r} has no computed figure here")
    total, root, block = root_and_block_params(qwen_config(shape))
    gathered = (root + 2 * block) * 4 if world_size > 1 else 0
    return -(-total * 4 * 4 // world_size) + gathered


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m minigrpo.lab.memory_sharded", description=__doc__.split("\n")[0])
    p.add_argument("--shape", default="qwen2.5-0.5b-2l")
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(RESULT_MARKER + json.dumps(measure_step(**json.loads(args.child))), flush=True)
        return 0
    results = measure_side_by_side(args.shape, args.processes)
    predicted = {W: predicted_static(args.shape, W) for W in {r["world_size"] for r in results}}
    print(f"{args.shape}: 1 process vs {args.processes} (FSDP2), CPU, gloo; MiB above the resident set before "
          f"loading. computed: weights + gradients + AdamW moments held, plus root + 2 blocks gathered")
    print(format_measured(results, predicted))
    return 0


if __name__ == "__main__":
    sys.exit(main())
