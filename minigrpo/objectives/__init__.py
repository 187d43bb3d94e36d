"""Policy objectives of the GRPO family, one file per idea, behind one dispatcher with TRL's names.

    loss_type   surrogate                         aggregation                      file
    ---------   -------------------------------   ------------------------------   ----------------
    grpo        PPO-clip                          mean_i of mean_t                 grpo.py
    bnpo        PPO-clip                          mean over the batch's tokens     grpo.py
    dr_grpo     PPO-clip                          sum / (B * L_max)                dr_grpo.py
    dapo        PPO-clip (use epsilon_high=0.28)  sum / number of tokens           dapo.py
    cispo       sg[min(rho, eps_max)] A log pi    sum / number of tokens           cispo.py
    sapo        soft sigmoid gate                 mean_i of mean_t                 sapo.py
    gmpo        geometric mean of clipped rho     mean_i                           gmpo.py

    importance_sampling_level   ratio
    -------------------------   ---------------------------------------------------------------
    token                       rho_{i,t} = pi(o_t) / pi_old(o_t)
    sequence                    GSPO: s_i = exp(mean_t log rho_{i,t}), one per sequence    gspo.py
    sequence_token              GSPO-token: value s_i, gradient per token                  gspo.py

`policy_loss` equals TRL 1.16's `GRPOTrainer._compute_loss` in value and gradient for every loss_type
and level TRL has (tests/test_trl_parity.py checks it against TRL's own code).
"""

import math

import torch

from ..kl import kl_divergence
from .cispo import CISPO_DEFAULT_EPSILON_MAX, cispo_surrogate
from .common import clip_stats, masked_mean
from .dapo import dapo_aggregate
from .dr_grpo import dr_grpo_aggregate
from .gmpo import gmpo_loss
from .grpo import bnpo_aggregate, clipped_surrogate, grpo_aggregate
from .gspo import sequence_log_ratio, sequence_token_log_ratio
from .sapo import sapo_gate_slope, sapo_surrogate

__all__ = ["policy_loss", "LOSS_TYPES", "IMPORTANCE_SAMPLING_LEVELS"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "gmpo")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "grpo",
    importance_sampling_level: str = "token",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    kl_estimator: str = "k3",
    max_completion_length: int | None = None,
    num_items_in_batch: float | torch.Tensor | None = None,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    gmpo_epsilon: float = 0.4,
    token_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of one batch, and its diagnostics.

    Args:
        logp:      (B, T) log pi_theta of the completion tokens, with gradient.
        old_logp:  (B, T) log pi_old, the policy that sampled them (no gradient).
        adv:       (B,) one advantage per completion, or (B, T) per token (process supervision).
        mask:      (B, T) float, 1 on completion tokens, 0 on padding. Padding positions of the log-prob
                   tensors may hold anything (even -inf): they are zeroed before any arithmetic.
        loss_type, importance_sampling_level: see the module docstring.
        epsilon, epsilon_high: clip range [1 - epsilon, 1 + epsilon_high]; epsilon_high defaults to epsilon.
            For cispo, epsilon_high is the absolute cap eps_max on the weight (TRL's convention); unset, it is
            5.0 (ScaleRL), not TRL's fallback to epsilon, which would cap every weight at 0.2 (see cispo.py).
        delta:     two-sided clipping: cap on the unclipped ratio (INTELLECT-2); None = off.
        beta, ref_logp, kl_estimator: KL-in-loss, beta * KL(pi || pi_ref) added to every token's loss.
        max_completion_length: L_max, required by dr_grpo.
        num_items_in_batch: token count dividing dapo/cispo sums (default: this batch's).
        sapo_temperature_pos/neg: SAPO's gate temperatures. gmpo_epsilon: GMPO's log-space clip range.
        token_weights: (B, T) or (B, 1), no gradient: each token's loss is multiplied by it before the KL term
            and the aggregation — the vLLM importance-sampling correction (engine_mismatch.py; TRL's
            `per_token_loss * importance_sampling_ratio`). None = 1. Not for gmpo (no per-token loss).

    Returns:
        loss: scalar tensor to minimise.
        stats: python floats — clip_ratio/{low,high,region}_mean, ratio_mean, approx_kl (old -> new policy,
            CleanRL's diagnostic), and kl when beta > 0. sapo clips nothing: its clip ratios are 0.0 and it adds
            sapo/gate_slope_mean, its gate's mean slope (1 = the plain policy gradient).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {importance_sampling_level!r}"
        )
    if beta != 0.0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp, the reference policy's log-probs")
    if token_weights is not None and loss_type == "gmpo":
        raise ValueError("token_weights: gmpo has no per-token loss to weight")
    if loss_type == "dr_grpo" and max_completion_length is None:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length (its constant normaliser)")
    if epsilon_high is None:
        epsilon_high = CISPO_DEFAULT_EPSILON_MAX if loss_type == "cispo" else epsilon
    mask = mask.to(logp.dtype)
    on_token = mask.bool()
    seq_adv = adv if adv.dim() == 1 else None
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # (B, 1) or (B, T)

    # Token log-ratio log rho_{i,t}; padding is set to 0 so garbage there cannot reach the loss as NaN.
    log_ratio = torch.where(on_token, logp - old_logp, 0.0)  # (B, T)
    if importance_sampling_level == "sequence":
        log_ratio = sequence_log_ratio(log_ratio, mask)  # (B, 1)
    elif importance_sampling_level == "sequence_token":
        log_ratio = sequence_token_log_ratio(torch.where(on_token, logp, 0.0), log_ratio, mask)  # (B, T)
    ratio = torch.exp(log_ratio)

    # The surrogate, per token (or per sequence for GSPO's (B, 1) ratio).
    if loss_type == "gmpo":
        if seq_adv is None or importance_sampling_level != "token":
            raise ValueError("gmpo builds its own sequence ratio: it needs adv of shape (B,) and importance_sampling_level='token'")
        per_token_loss = None
    elif loss_type == "cispo":
        per_token_loss = cispo_surrogate(ratio, adv, torch.where(on_token, logp, 0.0), epsilon_high)
    elif loss_type == "sapo":
        per_token_loss = sapo_surrogate(ratio, adv, sapo_temperature_pos, sapo_temperature_neg)
    else:
        per_token_loss = clipped_surrogate(ratio, adv, epsilon, epsilon_high, delta)
    if token_weights is not None:
        per_token_loss = per_token_loss * token_weights  # (B, T) or (B, 1): the sampler-mismatch correction

    stats: dict[str, float] = {}
    if beta != 0.0:
        kl = kl_divergence(torch.where(on_token, logp, 0.0), torch.where(on_token, ref_logp, 0.0), kl_estimator)
        stats["kl"] = masked_mean(kl.detach(), mask).item()

    # Aggregation: how the per-token losses become one number. This is where grpo/dr_grpo/dapo differ.
    if loss_type == "gmpo":
        loss = gmpo_loss(log_ratio, seq_adv, mask, gmpo_epsilon)
        if beta != 0.0:
            loss = loss + beta * grpo_aggregate(kl, mask)
    else:
        if beta != 0.0:
            per_token_loss = per_token_loss + beta * kl  # (B, 1) + (B, T) broadcasts for GSPO
        if loss_type in ("grpo", "sapo"):
            loss = grpo_aggregate(per_token_loss, mask)
        elif loss_type == "bnpo":
            loss = bnpo_aggregate(per_token_loss, mask)
        elif loss_type == "dr_grpo":
            loss = dr_grpo_aggregate(per_token_loss, mask, max_completion_length)
        else:  # dapo, cispo
            loss = dapo_aggregate(per_token_loss, mask, num_items_in_batch)

    with torch.no_grad():
        if loss_type == "gmpo":
            # GMPO clips log-ratios at ±gmpo_epsilon, i.e. token ratios at e^±eps.
            stats.update(clip_stats(ratio, adv, mask, math.exp(-gmpo_epsilon), math.exp(gmpo_epsilon)))
        elif loss_type == "cispo":
            # CISPO only caps the weight from above (TRL's cispo_clip_ratio); it has no lower clip.
            stats.update(clip_stats(ratio, adv, mask, 0.0, epsilon_high))
        elif loss_type == "sapo":
            # SAPO clips nothing: its clip ratios are 0 (kept so every loss logs the same keys). What it does
            # instead is attenuate: sapo/gate_slope_mean is the mean d f/d rho, 1 on-policy, -> 0 far off it.
            stats.update({"clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0})
            stats["sapo/gate_slope_mean"] = masked_mean(sapo_gate_slope(ratio, adv, sapo_temperature_pos,
                                                                        sapo_temperature_neg), mask).item()
        else:
            stats.update(clip_stats(ratio, adv, mask, 1 - epsilon, 1 + epsilon_high))
        stats["ratio_mean"] = masked_mean(ratio, mask).item()
        token_log_ratio = torch.where(on_token, logp - old_logp, 0.0)
        stats["approx_kl"] = masked_mean(torch.exp(token_log_ratio) - 1 - token_log_ratio, mask).item()
    return loss, stats
