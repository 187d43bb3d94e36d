"""GMPO — "Geometric-Mean Policy Optimization" (Zhao et al. 2025).

GRPO maximises the arithmetic mean of token rewards rho_{i,t} A_i, which one outlier ratio can dominate.
GMPO maximises their geometric mean instead, with the clipping done per token in log space (eq. 4):

    J = 1/G sum_i  A_i * prod_t [ min( rho_{i,t}^{sgn A_i}, clip(rho_{i,t}^{sgn A_i}, e^{-eps}, e^{eps}) ) ]^{sgn A_i / |o_i|}

In log space, with l_t = log rho_{i,t} and s = sgn(A_i):

    l~_t = s * min(s * l_t, clip(s * l_t, -eps, eps))      (clips l_t at +eps when A > 0, at -eps when A < 0)
    r_i  = exp( 1/|o_i| sum_t l~_t )                        (geometric mean of the clipped token ratios)
    L    = -1/G sum_i A_i r_i

The paper's range is (-0.4, 0.4): wider than GRPO's, since the geometric mean is far less sensitive to
single tokens.
"""

import torch

from .common import sequence_mean


def gmpo_sequence_ratio(log_ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.4):
    """Returns (r, clipped_log_ratio): r (B,) the geometric-mean ratio of each sequence, and the (B, T) l~.

    log_ratio: (B, T) log rho_{i,t}; adv: (B,) sequence advantages; mask (B, T).
    """
    sign = torch.where(adv > 0, 1.0, -1.0).unsqueeze(-1)  # (B, 1)
    signed = sign * log_ratio
    clipped_log_ratio = sign * torch.min(signed, torch.clamp(signed, -epsilon, epsilon))  # (B, T)
    return torch.exp(sequence_mean(clipped_log_ratio, mask)), clipped_log_ratio


def gmpo_surrogate(log_ratio: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, epsilon: float = 0.4):
    """(B, 1) per-sequence loss -A_i r_i; its mean over sequences (GRPO's aggregation of a (B, 1) loss, which
    gives an empty sequence 0) is L. log_ratio (B, T); adv (B, 1); mask (B, T)."""
    ratio, _ = gmpo_sequence_ratio(log_ratio, adv.squeeze(-1), mask, epsilon)  # (B,)
    return -adv * ratio.unsqueeze(-1)
