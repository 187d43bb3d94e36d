"""Data-parallel training over several processes: the few collectives the trainer needs, with plain
torch.distributed.

    accelerate launch --multi_gpu --num_processes 2 -m minigrpo train ...     (or: torchrun --nproc-per-node 2 -m minigrpo train ...)

Both launchers start the same command once per process and set WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT; `setup()` reads them (a plain `python -m minigrpo train` is world size 1, and nothing here does
anything). On CPU the processes talk over gloo, on GPUs over NCCL, one GPU per process.

How a GRPO step is split, and why its statistics stay exact:

    global batch      generation_batch_size completions = P prompts x G
    rank r            prompts [r P/W, (r+1) P/W) of the same seeded prompt stream, all G completions of each
                      -> a group never straddles two processes, so mean/std of its rewards need no communication
    gradients         each rank's loss is normalised so that the *average* of the ranks' gradients is the
                      gradient of the global-batch loss (see `trainer.py`: dapo/cispo/bnpo divide by the global
                      token count), then averaged with one all-reduce per optimizer step -> every rank holds the
                      same weights after every step, as DistributedDataParallel guarantees
    metrics           gathered to rank 0, which alone evaluates, logs, checkpoints and saves

This is DistributedDataParallel's arithmetic without its wrapper: DDP overlaps the same all-reduce with the
backward pass, in buckets. The wrapper is left out so the trainer calls the model directly (generation,
evaluation and saving all need the bare model). Sharded training (FSDP, DeepSpeed ZeRO) is not supported:
every process holds a whole copy of the model, gradients and optimizer state.
"""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

__all__ = ["setup", "cleanup", "launched_processes", "world_size", "rank", "is_main", "all_reduce_sum", "average_gradients",
           "gather_objects", "broadcast_object"]


def setup(device: torch.device) -> torch.device:
    """Join the process group if a launcher started several processes; returns this process's device.

    With CUDA, process r of a machine uses GPU LOCAL_RANK; on CPU every process uses the CPU (gloo).
    """
    if launched_processes() <= 1 or dist.is_initialized():
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    # Rank 0 evaluates alone while the others wait at their next collective: allow it time.
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=timedelta(hours=2))
    return device


def cleanup() -> None:
    # setup() starts a group only for several processes; a group of one is vLLM's own (rollout_vllm.py), not ours to end
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()
        dist.destroy_process_group()


def launched_processes() -> int:
    """How many processes the launcher (accelerate, torchrun) started: known before joining the group."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def is_main() -> bool:
    return rank() == 0


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """The sum of x over all processes (a new tensor; x itself is left alone). World size 1: x."""
    if world_size() == 1:
        return x
    x = x.detach().clone()
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    return x


def average_gradients(parameters) -> None:
    """p.grad <- mean over processes of p.grad, for every trainable parameter, in one all-reduce.

    Gradients are flattened into one buffer so the whole model costs one collective, as DDP's buckets do.
    A parameter without a gradient on this rank (unused in its forward) contributes zeros.
    """
    W = world_size()
    if W == 1:
        return
    params = [p for p in parameters if p.requires_grad]
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])  # (sum of numel,)
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= W
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).to(p.dtype)
        offset += n


def gather_objects(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every process (pickled: for small things, e.g. metrics)."""
    if world_size() == 1:
        return [obj]
    out = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj):
    """Rank 0's obj, on every process."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
