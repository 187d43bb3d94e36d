"""GPG — "GPG: A Simple and Strong Reinforcement Learning Baseline for Model Reasoning" (Chu et al. 2025,
arXiv 2504.02546), Group Policy Gradient.

GPG drops PPO's machinery altogether: no importance ratio, no clipping, no critic, no reference model. The loss
is the plain policy gradient (REINFORCE) with the group mean as baseline, averaged over the batch's tokens:

    L = -1/(sum_i |o_i|) sum_i sum_t  A_i * log pi_theta(o_{i,t})

On-policy its gradient equals PPO-clip's (rho = 1, nothing clipped). What GPG adds is in the advantage,
`gpg_advantages` in advantages.py: A_i = alpha * (r_i - mean(r_group)) / F_norm with alpha = N / (N - M), which
rescales the batch as if the M completions of all-equal groups (zero advantage, no gradient) were not there.
verl names this loss "gpg" (core_algos.compute_policy_loss_gpg); aggregated like DAPO ("token-mean").
"""

import torch

from .registry import Surrogate, SurrogateInputs, register_loss


def gpg_surrogate(adv: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    """Per-token -A * log pi. adv (B, 1) or (B, T); logp (B, T), 0 on padding."""
    return -adv * logp


@register_loss("gpg", aggregation="token_sum", levels=("token",))
def gpg_loss(x: SurrogateInputs, opts) -> Surrogate:
    return Surrogate(gpg_surrogate(x.adv, x.logp))  # no ratio, nothing clipped
