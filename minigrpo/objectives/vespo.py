"""VESPO — "Variational Sequence-level Soft Policy Optimization" (Shen et al. 2026, arXiv 2602.10693).

Off-policy samples (stale rollouts, a sampler that differs from the trainer) need an importance weight; the
whole completion's weight W_i = prod_t rho_{i,t} = pi_theta(o_i) / pi_old(o_i) is exact but has huge variance,
and clipping each token (PPO) or taking a length-normalised mean (GSPO) trades that for bias. VESPO keeps the
unnormalised W_i and reshapes it with a smooth kernel, a Gamma-shaped weight normalised so that phi(1) = 1:

    phi(W) = W^k * exp( lambda * (1 - W) )                  (log phi = lambda + k log W - lambda W)

It is ~1 near W = 1, falls to 0 as W -> 0 (power k) and as W -> infinity (exponential decay lambda), and is a
detached coefficient on a REINFORCE gradient:

    L = -1/(sum_i |o_i|) sum_i sum_t  sg[ phi(W_i) ] * A_i * log pi_theta(o_{i,t})

with (k, lambda) = (k_pos, lambda_pos) for A >= 0 and (k_neg, lambda_neg) for A < 0 (TRL's defaults (2, 3) and
(3, 2)). Aggregated over tokens like DAPO. As in TRL 1.16: each token's log-ratio is clamped to [-20, 20] before
the sum, log W to [log 1e-8, 20], lambda to >= 1e-4, a non-finite phi becomes 0, and the sampler correction
(vLLM's pi_old / pi_vllm, engine_mismatch.py) is folded into W (log W += sum_t log w_{i,t}) instead of weighting
each token's loss.
"""

import math
from dataclasses import dataclass

import torch

from .common import masked_mean
from .registry import Surrogate, SurrogateInputs, register_loss

LOG_W_MIN = math.log(1e-8)  # TRL clamps log W (and each log sampler weight) to [log 1e-8, 20]


@torch.no_grad()
def vespo_weight(
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    sampler_weights: torch.Tensor | None = None,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
) -> torch.Tensor:
    """phi(W_i), no gradient. log_ratio (B, T) token log rho (0 on padding); adv (B, 1) or (B, T); mask (B, T).

    sampler_weights: (B, T) or (B, 1) importance weights pi_old / pi_sampler (None = 1). Returns adv's shape.
    """
    log_w = (torch.clamp(log_ratio, -20.0, 20.0) * mask).sum(-1, keepdim=True)  # (B, 1): log prod_t rho_{i,t}
    if sampler_weights is not None:
        log_sampler = torch.clamp(torch.log(sampler_weights), LOG_W_MIN, 20.0)
        if log_sampler.shape[-1] != 1:
            log_sampler = log_sampler * mask  # a token weight counts only on completion tokens
        log_w = log_w + log_sampler.sum(-1, keepdim=True)
    log_w = torch.clamp(log_w, LOG_W_MIN, 20.0)
    k = torch.where(adv >= 0, k_pos, k_neg)
    lam = torch.where(adv >= 0, lambda_pos, lambda_neg).clamp(min=1e-4)
    log_phi = lam + k * log_w - lam * torch.exp(log_w)
    return torch.exp(log_phi).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_surrogate(phi: torch.Tensor, adv: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Per-token -sg[phi(W)] * A * log pi. phi, adv (B, 1) or (B, T); logp (B, T)."""
    return -phi * adv * logp


@dataclass(frozen=True)
class VespoOptions:
    vespo_k_pos: float = 2.0  # phi(W) = W^k e^(lambda (1 - W)) for A >= 0 ...
    vespo_lambda_pos: float = 3.0
    vespo_k_neg: float = 3.0  # ... and for A < 0 (TRL's defaults)
    vespo_lambda_neg: float = 2.0


@register_loss("vespo", aggregation="token_sum", options=VespoOptions, folds_token_weights=True)
def vespo_loss(x: SurrogateInputs, opts: VespoOptions) -> Surrogate:
    """The sampler correction (token_weights) goes into W, not onto each token's loss. Clips nothing."""
    phi = vespo_weight(x.token_log_ratio, x.adv, x.mask, x.token_weights, opts.vespo_k_pos, opts.vespo_lambda_pos,
                       opts.vespo_k_neg, opts.vespo_lambda_neg)  # (B, 1) or (B, T)
    return Surrogate(vespo_surrogate(phi, x.adv, x.logp), stats={"vespo/phi_seq_mean": masked_mean(phi, x.mask).item()})
