"""Mixed precision: the forward passes in 16 bits, the weights, the optimizer and the loss in float32.

Two 16-bit formats, one switch each (TRL's names):

    bf16   bfloat16: float32's 8 exponent bits, 7 of mantissa. Any gradient float32 can hold, bfloat16 can hold
           (coarsely): nothing to scale. Ampere and later (A100, RTX 30xx/40xx, H100).
    fp16   float16: 5 exponent bits, 10 of mantissa. Values below 2^-24 (6e-8) are 0 and above 65,504 are inf. The
           cards without bfloat16 matrix units have only this one: a free Colab T4, RTX 20xx, V100.

A GRPO loss is a mean over thousands of tokens, so each token's share of the gradient is small, and the
gradients that reach the early layers are smaller still: in float16 many of them round to 0 and the update
silently loses them. Loss scaling (Micikevicius et al. 2018, "Mixed Precision Training", section 3.2) moves them
into range:

    backward of S * loss                 every gradient is S times larger, representable in float16
    g = grad / S                         unscaled in float32 (the weights' dtype), before clipping and the step
    any g inf or nan  ->  skip the step, S <- S / 2        (the scaled backward overflowed float16's 65,504)
    growth_interval steps with none  ->  S <- 2 S          (as large as it can be without overflowing)

`torch.amp.GradScaler` keeps S (65,536 to start) and does the bookkeeping; `optimizer_step` below reports which
steps it skipped, and the trainer counts them in metrics.jsonl (grad_scaler/skipped_steps, grad_scaler/scale), as
transformers' Trainer counts its skipped optimizer steps. The first steps of a run often overflow while S falls to
its level: a few skipped steps at the start are expected; skipped steps all along mean the forward itself
overflows float16 (use bf16, or float32). The scaler's state is part of a checkpoint (checkpoint.py): a resumed run
continues with the same S.

Where float32 stays, and why:
  * The trained weights and AdamW's moments: an update lr * m / sqrt(v) is about 1e-6 of a weight, below
    float16's resolution of 2^-11 relative, so a float16 weight would not move. Hence fp16 needs float32 trainable
    weights (dtype float32 for full fine-tuning; LoRA's adapter is float32 whatever the base's dtype: peft keeps
    it so), and GradScaler refuses to unscale float16 gradients. config.py says so in one line.
  * The log-probs and the entropy (logprobs.py): the logits are cast to float32 before the log-softmax and the
    logsumexp over the vocabulary. The loss's signal is the ratio exp(logp - old_logp), a difference of numbers of
    size 1-20 that must be right to ~1e-3; float16's 3 significant digits would make it noise, and a logsumexp over
    151,936 float16 terms overflows. The matrix products (the model's and the output head's) run in 16 bits.
  * The loss: policy_loss runs outside autocast, on those float32 log-probs, and so do the advantages, the KL
    term and the aggregation. Sampling draws from float32 probabilities (rollout.next_token).

Several processes: with DistributedDataParallel every process holds the same averaged gradients, so every scaler
decides alike. Under FSDP2 (parallel/ddp_fsdp.py) each process holds a shard of the gradients, and an overflow in one
shard must stop every process's step: the gradients are DTensors, whose inf check torch reduces over the processes
(the max of every process's "found inf"; torch.distributed.tensor's found_inf_reduce_handler), so the same scaler
serves there too (tests/test_fsdp.py plants an overflow in one process's shard: both skip the step).
"""

import math

import torch


__all__ = ["autocast_dtype", "grad_scaler", "scaled_backward", "optimizer_step"]


def autocast_dtype(bf16: bool, fp16: bool) -> torch.dtype | None:
    """The dtype the forward passes autocast to: bfloat16, float16, or None (no autocast: the weights' dtype)."""
    if bf16 and fp16:
        raise ValueError("bf16 and fp16: choose one 16-bit format")
    return torch.bfloat16 if bf16 else torch.float16 if fp16 else None


def grad_scaler(device: torch.device, *, enabled: bool) -> torch.amp.GradScaler | None:
    """A loss scaler for fp16 training on `device`, starting at S = 65,536 and halving on an overflow (torch's and
    transformers' defaults); None when not enabled."""
    return torch.amp.GradScaler(device.type) if enabled else None


def scaled_backward(loss: torch.Tensor, scaler) -> None:
    """loss.backward(), of S * loss when a scaler is given (the gradients are then S times the true ones)."""
    (loss if scaler is None else scaler.scale(loss)).backward()


def optimizer_step(optimizer, parameters, max_grad_norm: float, scaler=None, *, where: str = "") -> tuple[float, bool]:
    """One optimizer step on the gradients backward left: unscale (with a scaler), clip to max_grad_norm (math.inf:
    no clipping), step. Returns (the gradient's norm before clipping, whether the step was skipped).

    A non-finite gradient norm skips the step with a scaler (an fp16 overflow: the scale is halved and the run goes
    on) and, without one, raises FloatingPointError naming `where`, before the weights change."""
    if scaler is not None:
        scaler.unscale_(optimizer)  # float32 gradients / S: the norm and the clipping see the true gradient
    grad_norm = clip_grad_norm(parameters, max_grad_norm)
    skipped = not math.isfinite(grad_norm)
    if scaler is None:
        if skipped:  # a finite loss can still have an inf/nan gradient
            raise FloatingPointError(f"{where}the gradient norm is {grad_norm} — stopping before the weights are "
                                     "changed")
        optimizer.step()
        return grad_norm, False
    scaler.step(optimizer)  # skipped by the scaler itself when unscale_ found an inf or nan
    scaler.update()  # S / 2 after an overflow; 2 S after growth_interval clean steps
    return grad_norm, skipped


def clip_grad_norm(parameters, max_norm: float) -> float:
    """torch's clip_grad_norm_ (the norm of the global gradient, sharded or not) as a float."""
    norm = torch.nn.utils.clip_grad_norm_(list(parameters), max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor, the same on every process
        norm = norm.full_tensor()
    return norm.item()
