"""The engine–trainer mismatch: the log-probs vLLM sampled with against the trainer's, measured and corrected.

vLLM samples with its own kernels (paged attention, weights repacked for its GEMM on the CPU, often bf16 on a
GPU); the trainer scores the same tokens with the HF forward. So one token gets two log-probs, and

    delta_{i,t} = log pi_train(o_{i,t}) - log pi_vllm(o_{i,t})          over completion tokens (mask = 1)

is not zero. The policy gradient assumes the tokens came from pi_train; they came from pi_vllm. Where the two
disagree a lot (a bf16 sampler on a long completion, a sampler with stale weights) the update is off-policy
without knowing it (Yao et al. 2025, "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training").

Measured every step (`mismatch_stats`, names as TRL 1.16 logs them where TRL has the quantity):

    sampling/sampling_logp_difference/mean   mean_{i,t} |delta_{i,t}|
    sampling/sampling_logp_difference/max    max_{i,t}  |delta_{i,t}|
    sampling/sequence_kl/mean                mean_i sum_t (exp(delta_{i,t}) - delta_{i,t} - 1)
        KL(pi_vllm || pi_train) of whole completions: the tokens are samples of pi_vllm, and
        r - 1 - log r with r = pi_train / pi_vllm is Schulman's k3, an unbiased, never negative estimate of
        each token's KL; a sequence's KL is the sum over its tokens (chain rule). minigrpo's own metric.
    sampling/importance_sampling_ratio/{min,mean,max}   of the weight w below (over tokens, or sequences)

Corrected (`importance_weights`): TRL 1.16's `vllm_importance_sampling_correction`, a weight on each token's loss,

    token_*     w_{i,t} = exp(delta_{i,t})                      (B, T)
    sequence_*  w_i     = exp(sum_t delta_{i,t})                (B, 1), the same for every token of o_i
    *_truncate  w <- clamp(w, C_min, C_max)                     truncated IS (TIS, Yao et al. 2025)
    *_mask      w <- w * 1[C_min <= w <= C_max]                 masked IS (MIS; IcePop, Ling team 2025)

    L = aggregate_{i,t}( w_{i,t} * loss_{i,t} )                  objectives.policy_loss(token_weights=w)

delta uses the trainer's log-probs *at sampling time* (old_logp, before any update of this batch), so w is a
constant: no gradient flows through it. C_min, C_max are TRL's vllm_importance_sampling_clip_min / _clip_max
(None = no bound on that side; TRL's defaults: sequence_mask, C_max = 3). A token vLLM returned no log-prob
for (NaN) gets delta = 0, weight 1, as in TRL, and is left out of the measured differences.
"""

import math

import torch

__all__ = ["IMPORTANCE_SAMPLING_MODES", "importance_weights", "mismatch_stats", "sampler_correction"]

IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


def logp_difference(trainer_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """delta = log pi_train - log pi_vllm on completion tokens, 0 on padding and where vLLM gave NaN. (B, T)"""
    return torch.nan_to_num((trainer_logp - sampling_logp) * mask, nan=0.0)


@torch.no_grad()
def importance_weights(trainer_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor, *,
                       mode: str = "sequence_mask", clip_min: float | None = None,
                       clip_max: float | None = 3.0) -> torch.Tensor:
    """The IS weight w of the module docstring: (B, T) for token_* modes, (B, 1) for sequence_* modes.

    trainer_logp, sampling_logp: (B, T) log-probs of the sampled tokens; mask: (B, T) 1 on completion tokens.
    """
    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"mode must be one of {IMPORTANCE_SAMPLING_MODES}, got {mode!r}")
    delta = logp_difference(trainer_logp, sampling_logp, mask)  # (B, T)
    if mode.startswith("sequence"):
        delta = delta.sum(-1, keepdim=True)  # (B, 1): log of the completion's probability ratio
    weight = torch.exp(delta)
    if mode.endswith("truncate"):
        return weight if clip_min is None and clip_max is None else torch.clamp(weight, min=clip_min, max=clip_max)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    return weight.masked_fill((weight < low) | (weight > high), 0.0)


@torch.no_grad()
def mismatch_stats(trainer_logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor,
                   weight: torch.Tensor | None = None, mode: str = "sequence_mask") -> dict[str, float]:
    """The sampling/* metrics of the module docstring, as python floats. weight: importance_weights' output for
    `mode`, or None when the correction is off (then no importance_sampling_ratio metrics)."""
    on_token = mask.bool()
    abs_delta = (trainer_logp - sampling_logp).abs()[on_token & ~sampling_logp.isnan()]
    delta = logp_difference(trainer_logp, sampling_logp, mask).double()  # float64: the k3 of a tiny delta is ~delta^2/2
    sequence_kl = ((torch.expm1(delta) - delta) * mask).sum(-1)  # (B,) k3 per token, summed per completion
    stats = {
        "sampling/sampling_logp_difference/mean": abs_delta.mean().item() if abs_delta.numel() else 0.0,
        "sampling/sampling_logp_difference/max": abs_delta.max().item() if abs_delta.numel() else 0.0,
        "sampling/sequence_kl/mean": sequence_kl.mean().item(),
    }
    if weight is not None:
        flat = weight.flatten() if mode.startswith("sequence") else weight[on_token]  # sequences, or completion tokens
        for name, reduce in (("min", torch.min), ("mean", torch.mean), ("max", torch.max)):
            stats[f"sampling/importance_sampling_ratio/{name}"] = reduce(flat).item() if flat.numel() else 0.0
    return stats


def sampler_correction(old_logp: torch.Tensor, sampling_logp: torch.Tensor | None, loss_mask: torch.Tensor, *,
                       correct: bool, mode: str, clip_min: float | None, clip_max: float | None
                       ) -> tuple[torch.Tensor | None, dict]:
    """With an engine that returns its sampling log-probs (vLLM): TRL's importance weight per token (None when
    `correct` is off: vllm_importance_sampling_correction) and the sampling/* mismatch statistics. Without one:
    (None, {})."""
    if sampling_logp is None:
        return None, {}
    sampling_logp = sampling_logp.to(old_logp.device)
    is_weight = None
    if correct:
        is_weight = importance_weights(old_logp, sampling_logp, loss_mask, mode=mode, clip_min=clip_min,
                                       clip_max=clip_max)
    return is_weight, mismatch_stats(old_logp, sampling_logp, loss_mask, is_weight, mode)
