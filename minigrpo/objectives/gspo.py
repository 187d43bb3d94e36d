"""GSPO — "Group Sequence Policy Optimization" (Zheng et al. 2025, Qwen).

GRPO weighs each token by its own ratio rho_{i,t}, a one-sample importance weight with high variance. GSPO
uses one ratio per sequence, the geometric mean of its token ratios (length-normalised, eq. 7):

    s_i = (pi_theta(o_i | q) / pi_old(o_i | q)) ^ (1/|o_i|) = exp( 1/|o_i| sum_t log rho_{i,t} )

and clips s_i in PPO's clipped surrogate (with far smaller eps, e.g. 3e-4 / 4e-4 in the paper).

GSPO-token (eq. 13) keeps the value of s_i but lets each token carry its own advantage, by the detach trick:

    s_{i,t} = sg[s_i] * pi_theta(o_{i,t}) / sg[pi_theta(o_{i,t})]

whose value equals s_i and whose gradient w.r.t. token t is s_i * grad log pi_theta(o_{i,t}).
"""

import torch

from .common import sequence_mean


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) token log-ratios -> (B, 1) log s_i, the masked mean over the sequence."""
    return sequence_mean(log_ratio, mask).unsqueeze(-1)


def sequence_token_log_ratio(logp: torch.Tensor, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, T) log s_{i,t} = sg[log s_i] + log pi(o_t) - sg[log pi(o_t)] — value log s_i, per-token gradient."""
    return sequence_log_ratio(log_ratio, mask).detach() + logp - logp.detach()
