"""Data-parallel training over several processes, on torch's own engines: DistributedDataParallel (every process
holds the whole model) or FSDP2 (`fsdp="full_shard"`: parameters, gradients and optimizer state sharded).

    accelerate launch --multi_gpu --num_processes 2 -m minigrpo train ...     (or: torchrun --nproc-per-node 2 -m minigrpo train ...)
    ... train --fsdp full_shard                                                 (the same, sharded)

Both launchers start the same command once per process and set WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and
MASTER_PORT; `setup()` reads them (a plain `python -m minigrpo train` is world size 1, and nothing here does
anything: the trainer calls the bare model, as it always has). On CPU the processes talk over gloo, on GPUs over
NCCL, one GPU per process.

How a GRPO step is split, and why its statistics stay exact:

    global batch      generation_batch_size completions = P prompts x G
    rank r            prompts [r P/W, (r+1) P/W) of the same seeded prompt stream, all G completions of each
                      -> a group never straddles two processes, so mean/std of its rewards need no communication
    gradients         each rank's loss is normalised so that the *average* of the ranks' gradients is the
                      gradient of the global-batch loss (trainer.py: dapo/cispo/bnpo divide by the global token
                      count / W); DDP all-reduces and divides by W in backward, FSDP2 reduce-scatters and divides
                      by W -> every rank takes the same optimizer step, on its whole copy or on its shard
    metrics           gathered to rank 0, which alone evaluates, logs and saves

The engines (`wrap`). Both need the loss's forward to be *their* module's forward: DDP registers its gradient
hooks there, FSDP2 all-gathers a module's parameters in its pre-forward hook and frees them after. The policy's
log-probs are not one `model(...)` call (logprobs.py runs the decoder, then the output head in blocks, reading
`head.weight` itself), so `LogprobForward` makes `completion_logprobs` a module's forward and the engine wraps that.
    DDP     DistributedDataParallel(LogprobForward(model)); gradient accumulation's micro-batches but the last run
            under `no_sync` (one all-reduce per optimizer step, as before).
    FSDP2   fully_shard on each decoder block, then on LogprobForward (the root: embeddings, final norm, head), so
            the head's weight is whole while the log-probs are computed. Each process must make the same
            collectives in the same order, and FSDP2 all-gathers a block at each of its calls: so the log-probs
            take one decoder call per forward (`one_pass`), not logprobs.py's length groups, whose number differs
            from process to process. Mixed precision through MixedPrecisionPolicy (bf16 / fp16: the blocks compute
            in 16 bits, gradients are reduced in float32; fp16's scaler skips a step on every process when one
            shard overflows: mixed_precision.py); `fsdp_config`: cpu_offload,
            activation_checkpointing, reshard_after_forward.
            The reference (beta > 0): a full copy sharded the same way, or, with LoRA, the sharded policy with
            its adapter switched off. Not sharded (config.py refuses them in one line): vLLM's engine (it
            would need the whole weights gathered at each sync) and 4-bit bitsandbytes weights; PPO's critic
            (ppo_trainer.py runs in one process).
Everything else calls the bare model, which the engines leave in place: sampling, evaluation and saving. Under
FSDP2 sampling runs inside `full_weights`: each process gathers the whole model once (one all-gather per
block), samples alone (the decode loop calls the layers directly, at its own number of steps), and frees it.
So sampling needs the whole parameters on each GPU for its duration; gradients and AdamW's moments, most of the
memory in full fine-tuning, stay sharded. The final model is gathered to rank 0 (`full_state_dict`) and saved as
one ordinary Hugging Face folder; checkpoints are written sharded, by every process (checkpoint.py).

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

from .errors import ConfigError
from .logprobs import completion_logprobs as _completion_logprobs

__all__ = ["setup", "cleanup", "launched_processes", "world_size", "rank", "is_main", "all_reduce_sum",
           "gather_objects", "broadcast_object", "LogprobForward", "wrap", "completion_logprobs", "no_sync",
           "full_weights", "clip_grad_norm", "full_state_dict", "is_sharded", "local_numel"]

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


# ---------------------------------------------------------------------------------------------------------
# The engines
# ---------------------------------------------------------------------------------------------------------
class LogprobForward(torch.nn.Module):
    """logprobs.completion_logprobs(model, ...) as this module's forward, for DDP and FSDP2 to wrap.

    one_pass: one decoder call per forward (FSDP2: the same collectives on every process; see the docstring)."""

    def __init__(self, model, one_pass: bool = False):
        super().__init__()
        self.model, self.one_pass = model, one_pass

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask, **kwargs):
        if self.one_pass:
            kwargs["one_pass"] = True
        return _completion_logprobs(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask, **kwargs)


class AdapterOffForward:
    """A LoRA run's reference under FSDP2: the sharded policy's forward with its adapter switched off."""

    def __init__(self, policy, peft_model):
        self.policy, self.peft_model = policy, peft_model

    def __call__(self, *args, **kwargs):
        with self.peft_model.disable_adapter():
            return self.policy(*args, **kwargs)


def wrap(model, ref_model=None, *, fsdp: str = "", fsdp_config: dict | None = None,
         compute_dtype: torch.dtype | None = None):
    """(policy, reference): what the loss's log-probs are computed with, for this run's W processes.

    W = 1: (model, ref_model) themselves. fsdp "": DistributedDataParallel around the policy; the reference (no
    gradient) stays as it is. fsdp "full_shard": the policy sharded with FSDP2, and the reference too (a full
    copy sharded the same way, or, with LoRA, the sharded policy with its adapter switched off).
    model and ref_model stay the bare models the rest of the trainer calls; FSDP2 shards their parameters in place,
    so build the optimizer from model.parameters() after this call. compute_dtype: FSDP2's parameter dtype in
    forward and backward (bfloat16 / float16 under bf16 / fp16; None: the weights' own).
    """
    if world_size() == 1:
        return model, ref_model
    if not fsdp:
        device = next(model.parameters()).device
        ddp = torch.nn.parallel.DistributedDataParallel(
            LogprobForward(model), device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=False)  # buffers (rotary tables) are equal everywhere and never trained
        return ddp, ref_model
    from .models import AdapterDisabled

    options = fsdp_config or {}
    policy = _shard(model, options, compute_dtype)
    if isinstance(ref_model, AdapterDisabled):
        return policy, AdapterOffForward(policy, ref_model.peft_model)
    return policy, None if ref_model is None else _shard(ref_model, options, compute_dtype)


def _shard(model, options: dict, compute_dtype: torch.dtype | None) -> "LogprobForward":
    """fully_shard on each decoder block (the classes the model names in _no_split_modules), then on
    LogprobForward(model), the root that holds the rest; returns the root, initialised."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    device = next(model.parameters()).device
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft
    block_names = set(getattr(base, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in block_names]
    if not blocks:
        raise ConfigError(f"fsdp: {type(base).__name__} names no decoder block class (_no_split_modules) to shard by")
    kwargs = dict(mesh=init_device_mesh(device.type, (world_size(),)),
                  mp_policy=MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
                  if compute_dtype is not None else MixedPrecisionPolicy(),
                  offload_policy=CPUOffloadPolicy(pin_memory=device.type == "cuda") if options.get("cpu_offload")
                  else OffloadPolicy())
    for block in blocks:
        fully_shard(block, reshard_after_forward=options.get("reshard_after_forward", True), **kwargs)
    root = fully_shard(LogprobForward(model, one_pass=True), **kwargs)
    root.blocks_reshard_after_forward = options.get("reshard_after_forward", True)  # restored by full_weights
    # FSDP2 makes the first module to run forward the root. Evaluation and sampling call the blocks before any
    # forward of the root: name it now.
    root._get_fsdp_state()._lazy_init()
    return root


def is_sharded(policy) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(policy, FSDPModule)


def completion_logprobs(model, *ids, **kwargs):
    """logprobs.completion_logprobs, through the engine's forward when `model` is one of `wrap`'s policies.

    FSDP2 keeps the root's parameters gathered from its forward until the backward that follows; a forward without
    gradient (old and reference log-probs) has none, so it is reset here: resharded, and forgotten."""
    if not isinstance(model, (LogprobForward, AdapterOffForward, torch.nn.parallel.DistributedDataParallel)):
        return _completion_logprobs(model, *ids, **kwargs)
    out = model(*ids, **kwargs)
    root = model.policy if isinstance(model, AdapterOffForward) else model
    if is_sharded(root) and not torch.is_grad_enabled():
        root.reset_iter_state()
    return out


def no_sync(policy, last_micro_batch: bool):
    """DDP: skip the all-reduce on every micro-batch but the last (their gradients add up locally first).
    FSDP2 reduce-scatters each micro-batch's gradient into the sharded one (less memory); others: nothing."""
    if isinstance(policy, torch.nn.parallel.DistributedDataParallel) and not last_micro_batch:
        return policy.no_sync()
    return contextlib.nullcontext()


@contextlib.contextmanager
def full_weights(*policies):
    """Inside: every FSDP2-sharded policy holds its whole parameters on every process, so the bare model runs
    alone on each (sampling, evaluation) with no collectives; after: sharded again. Every process must enter
    (the gathering is collective); any may then compute alone. Not sharded: nothing happens."""
    sharded = [p for p in policies if is_sharded(p)]
    for policy in sharded:
        policy.set_reshard_after_forward(False)  # a block's forward must not free what was gathered here
        policy.unshard()  # the root's group (embeddings, norm, head) ...
        for module in policy.modules():
            if is_sharded(module) and module is not policy:
                module.unshard()  # ... and each block's
    try:
        yield
    finally:
        for policy in sharded:
            # Frees the gathered parameters and forgets the forwards just run (FSDP2 orders its backward
            # prefetches by them, and each process ran its own number).
            policy.reset_iter_state()
            policy.set_reshard_after_forward(policy.blocks_reshard_after_forward)
            policy.set_reshard_after_forward(False, recurse=False)  # the root never frees before backward


def clip_grad_norm(parameters, max_norm: float) -> float:
    """torch's clip_grad_norm_ (the norm of the global gradient, sharded or not) as a float."""
    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor, the same on every process
        norm = norm.full_tensor()
    return norm.item()


def full_state_dict(model) -> dict | None:
    """The whole model's state dict on rank 0 (on the CPU), None elsewhere; every process must call it.
    A tied parameter (the head sharing the embeddings) appears once, under its first name, as save_pretrained
    writes it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    seen, tied = set(), []
    for name, param in model.named_parameters(remove_duplicate=False):
        if id(param) in seen:
            tied.append(name)
        seen.add(id(param))
    return {k: v for k, v in state.items() if k not in tied} if is_main() else None


def local_numel(tensors) -> int:
    """Elements this process holds: a sharded tensor's local shard, a plain tensor's all."""
    return sum(t.to_local().numel() if hasattr(t, "to_local") else t.numel() for t in tensors)
