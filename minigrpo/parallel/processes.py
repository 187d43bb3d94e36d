"""Several processes, one run: each trains on 1/W of every batch. This file is what the loop asks of the processes,
and with one process (a plain `python -m minigrpo train`) every function here is trivial: world size 1, rank 0, a
collective returns its input, and the policy is the model's own forward (logprobs.LogprobForward). The engines that
average gradients, DistributedDataParallel (every process holds the whole model) or FSDP2 (`fsdp="full_shard"`:
parameters, gradients and optimizer state sharded), live in ddp_fsdp.py, imported only when W > 1.

    accelerate launch --multi_gpu --num_processes 2 -m minigrpo train ...     (or: torchrun --nproc-per-node 2 -m minigrpo train ...)
    ... train --fsdp full_shard                                                 (the same, sharded)

Both launchers start the same command once per process and set WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT; `setup()` reads them. On CPU the processes talk over gloo, on GPUs over NCCL, one GPU per process.

How a GRPO step is split, and why its statistics stay exact:

    global batch      generation_batch_size completions = P prompts x G
    rank r            prompts [r P/W, (r+1) P/W) of the same seeded prompt stream, all G completions of each
                      -> a group never straddles two processes, so mean/std of its rewards need no communication
    gradients         each rank's loss is normalised so that the *average* of the ranks' gradients is the
                      gradient of the global-batch loss (objectives/aggregation.py: dp_size and the global token
                      count); DDP all-reduces and divides by W in backward, FSDP2 reduce-scatters and divides
                      by W -> every rank takes the same optimizer step, on its whole copy or on its shard
    metrics           gathered to rank 0, which alone evaluates, logs and saves

What stays hand-written, and why — the three places where the global batch is more than the sum of its shares:
    all_reduce_sum     the global count of loss tokens that token-sum losses (dapo, cispo, bnpo, ...) divide by:
                       the engines average gradients, they do not know a loss's normaliser
    gather_objects     rewards, for batch-level scaling (scale_rewards="batch") and for logging; each step's
                       statistics, so that rank 0 logs the global batch's metrics
    broadcast_object   rank 0's summary, returned by every process
No gradient is reduced here.
"""

import contextlib
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from ..logprobs import LogprobForward

__all__ = ["setup", "cleanup", "launched_processes", "world_size", "rank", "is_main", "all_reduce_sum",
           "gather_objects", "broadcast_object", "wrap", "no_sync", "full_weights", "full_state_dict",
           "is_sharded", "say"]


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



def wrap(model, ref_model=None, *, fsdp: str = "", fsdp_config: dict | None = None,
         compute_dtype: torch.dtype | None = None):
    """(policy, reference): what every log-prob of the loss is computed with. One process: LogprobForward(model)
    (and of ref_model), logprobs.py's forward called as it is. W > 1: DDP's or FSDP2's engine around it
    (ddp_fsdp.wrap, which says how; build the optimizer from model.parameters() after this call)."""
    if world_size() == 1:
        return LogprobForward(model), None if ref_model is None else LogprobForward(ref_model)
    from .ddp_fsdp import wrap as wrap_engine

    return wrap_engine(model, ref_model, fsdp=fsdp, fsdp_config=fsdp_config, compute_dtype=compute_dtype)


def no_sync(policy, last_micro_batch: bool):
    """DDP: no all-reduce on a micro-batch but the last (ddp_fsdp.no_sync). One process: nothing to do."""
    if world_size() == 1:
        return contextlib.nullcontext()
    from .ddp_fsdp import no_sync as engine_no_sync

    return engine_no_sync(policy, last_micro_batch)


def full_weights(*policies):
    """FSDP2: the whole weights gathered on every process inside (ddp_fsdp.full_weights), for the bare model to
    sample and evaluate with. One process or DDP: the weights are whole already."""
    if world_size() == 1:
        return contextlib.nullcontext()
    from .ddp_fsdp import full_weights as gathered

    return gathered(*policies)


def full_state_dict(model, policy) -> dict | None:
    """FSDP2: the whole model's state dict gathered on rank 0 (every process must call). Otherwise None: the
    model's own weights are whole, and saved as they are."""
    if world_size() == 1:
        return None
    from .ddp_fsdp import full_state_dict as gathered_state, is_sharded

    return gathered_state(model) if is_sharded(policy) else None


def is_sharded(policy) -> bool:
    """Whether the policy is FSDP2's (its checkpoints are written by every process, each its shards)."""
    if world_size() == 1:
        return False
    from .ddp_fsdp import is_sharded as sharded

    return sharded(policy)


def say(message: str) -> None:
    """One line for the person watching (the main process only), printed above any progress bar."""
    if is_main() and os.environ.get("RANK", "0") == "0":  # RANK: before the process group is joined
        tqdm.write(message)
