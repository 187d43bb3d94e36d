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

import math
from dataclasses import dataclass

import torch

from .common import sequence_mean
from .registry import Surrogate, SurrogateInputs, register_loss


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


@dataclass(frozen=True)
class GmpoOptions:
    gmpo_epsilon: float = 0.4  # the log-space clip range (the paper's (-0.4, 0.4))

    def __post_init__(self):
        if not self.gmpo_epsilon > 0:
            raise ValueError(f"gmpo_epsilon: must be > 0, got {self.gmpo_epsilon}")


@register_loss("gmpo", aggregation="sequence_mean", options=GmpoOptions, levels=("token",),
               takes_token_weights=False, sequence_advantages_only=True)
def gmpo_loss(x: SurrogateInputs, opts: GmpoOptions) -> Surrogate:
    """GMPO builds its own sequence ratio from token log-ratios and (B,) advantages; no per-token loss to weight.
    Its clip diagnostics count token ratios outside [e^-eps, e^eps] (log-ratios clipped at +-eps)."""
    eps = opts.gmpo_epsilon
    return Surrogate(gmpo_surrogate(x.token_log_ratio, x.adv, x.mask, eps), clip_range=(math.exp(-eps), math.exp(eps)))
