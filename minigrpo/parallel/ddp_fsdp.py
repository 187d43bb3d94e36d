"""The engines of several processes, on torch's own code: DistributedDataParallel (every process holds the whole
model) or FSDP2 (`fsdp="full_shard"`: parameters, gradients and optimizer state sharded). Imported only when a
launcher started W > 1 processes (processes.py); a run in one process never enters this file.

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
"""
import contextlib

import torch
import torch.distributed as dist

from ..errors import ConfigError
from ..logprobs import LogprobForward

__all__ = ["wrap", "ShardedLogprobForward", "AdapterOffForward", "no_sync", "full_weights", "full_state_dict",
           "is_sharded", "local_numel"]


class ShardedLogprobForward(LogprobForward):
    """LogprobForward as FSDP2's root: one decoder call per forward (`one_pass`: the same collectives on every
    process; see the docstring). FSDP2 keeps the root's parameters gathered from its forward until the backward
    that follows; a forward without gradient (old and reference log-probs) has none, so it is reset after the
    call: resharded, and forgotten."""

    def __init__(self, model):
        super().__init__(model, one_pass=True)

    def __call__(self, *args, **kwargs):
        out = super().__call__(*args, **kwargs)
        if not torch.is_grad_enabled():
            self.reset_iter_state()
        return out


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

    W > 1 only (processes.wrap: one process needs none of this). fsdp "": DistributedDataParallel around the
    policy; the reference (no gradient) stays as it is. fsdp "full_shard": the policy sharded with FSDP2, and the
    reference too (a full copy sharded the same way, or, with LoRA, the sharded policy with its adapter switched
    off).
    model and ref_model stay the bare models the rest of the trainer calls; FSDP2 shards their parameters in place,
    so build the optimizer from model.parameters() after this call. compute_dtype: FSDP2's parameter dtype in
    forward and backward (bfloat16 / float16 under bf16 / fp16; None: the weights' own).
    """
    if not fsdp:
        device = next(model.parameters()).device
        ddp = torch.nn.parallel.DistributedDataParallel(
            LogprobForward(model), device_ids=[device.index] if device.type == "cuda" else None,
            broadcast_buffers=False)  # buffers (rotary tables) are equal everywhere and never trained
        return ddp, ref_model
    from ..loading.models import AdapterDisabled

    options = fsdp_config or {}
    policy = _shard(model, options, compute_dtype)
    if isinstance(ref_model, AdapterDisabled):
        return policy, AdapterOffForward(policy, ref_model.peft_model)
    return policy, None if ref_model is None else _shard(ref_model, options, compute_dtype)


def _shard(model, options: dict, compute_dtype: torch.dtype | None) -> ShardedLogprobForward:
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
    kwargs = dict(mesh=init_device_mesh(device.type, (dist.get_world_size(),)),
                  mp_policy=MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
                  if compute_dtype is not None else MixedPrecisionPolicy(),
                  offload_policy=CPUOffloadPolicy(pin_memory=device.type == "cuda") if options.get("cpu_offload")
                  else OffloadPolicy())
    for block in blocks:
        fully_shard(block, reshard_after_forward=options.get("reshard_after_forward", True), **kwargs)
    root = fully_shard(ShardedLogprobForward(model), **kwargs)
    root.blocks_reshard_after_forward = options.get("reshard_after_forward", True)  # restored by full_weights
    # FSDP2 makes the first module to run forward the root. Evaluation and sampling call the blocks before any
    # forward of the root: name it now.
    root._get_fsdp_state()._lazy_init()
    return root


def is_sharded(policy) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(policy, FSDPModule)


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
    return {k: v for k, v in state.items() if k not in tied} if dist.get_rank() == 0 else None


def local_numel(tensors) -> int:
    """Elements this process holds: a sharded tensor's local shard, a plain tensor's all."""
    return sum(t.to_local().numel() if hasattr(t, "to_local") else t.numel() for t in tensors)
