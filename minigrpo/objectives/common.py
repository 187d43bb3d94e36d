"""Pieces every objective shares: masked means and the clip diagnostics."""

import torch


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over the positions where mask is 1.

    x is (B, T) per token, or (B, 1) with one value per sequence (sequence-level ratios), in which case the
    mean is over the B sequences — the convention TRL logs with. Returns 0 for an all-zero mask.
    """
    if x.shape[-1] == 1 and mask.shape[-1] != 1:
        return x.sum() / max(x.shape[0], 1)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


def sequence_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) -> (B,): each sequence's mean over its own tokens (0 for an empty sequence)."""
    return (x * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


@torch.no_grad()
def clip_stats(
    ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, low: float, high: float
) -> dict[str, float]:
    """Fraction of tokens whose ratio left the trust region [low, high] on the side that stops the gradient.

    A ratio below `low` only clips when the advantage is negative, above `high` only when it is positive
    (PPO's min() lets the other side through). ratio/adv: (B, T) or (B, 1); mask (B, T).
    """
    is_low = ((ratio < low) & (adv < 0)).float()
    is_high = ((ratio > high) & (adv > 0)).float()
    return {
        "clip_ratio/low_mean": masked_mean(is_low, mask).item(),
        "clip_ratio/high_mean": masked_mean(is_high, mask).item(),
        "clip_ratio/region_mean": masked_mean(torch.maximum(is_low, is_high), mask).item(),
    }


@torch.no_grad()
def token_covariance(logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) centred product (log pi - mean log pi) * (A - mean A), the means over the batch's completion tokens.

    Each term of the covariance between log-probability and advantage (Clip-Cov, KL-Cov). logp (B, T) with 0 on
    padding; adv (B,), (B, 1) or (B, T), a (B,) or (B, 1) advantage counts once per token; mask (B, T).
    """
    adv = (adv.unsqueeze(-1) if adv.dim() == 1 else adv).expand_as(mask)
    n = mask.sum().clamp(min=1.0)
    mean_adv = (adv * mask).sum() / n
    mean_logp = (logp * mask).sum() / n
    return (adv - mean_adv) * (logp - mean_logp)
