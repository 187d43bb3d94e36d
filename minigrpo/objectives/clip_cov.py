"""Clip-Cov — "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (Cui et al. 2025,
arXiv 2505.22617).

Why entropy collapses: under the policy gradient, a token's contribution to the change in entropy is minus the
covariance between its log-probability and its advantage. Confident tokens (high log pi) with a high advantage
sharpen the policy; empirically that covariance stays positive, so entropy falls and exploration dies. A tiny
fraction of tokens carries most of it. Clip-Cov cuts exactly those tokens out of the gradient:

    Cov_{i,t} = (log pi(o_{i,t}) - mean log pi) * (A_{i,t} - mean A)         (means over the batch's tokens)
    candidates: tokens with cov_lb < Cov_{i,t} < cov_ub that PPO's clip has not already cut
    pick n = max(1, floor(clip_cov_ratio * number of tokens)) candidates at random, and for them set
    l_{i,t} = 0 (value and gradient); every other token keeps PPO-clip's l_{i,t}

Aggregated over tokens like DAPO. Defaults are verl's: clip_cov_ratio 2e-4, cov_lb 1, cov_ub 5
(core_algos.compute_policy_loss_clip_cov, from the paper's code). The random pick uses torch's global generator
unless one is passed (verl uses the global one: same seed, same tokens).
"""

from dataclasses import dataclass

import torch

from .common import masked_mean, token_covariance
from .grpo import clipped_surrogate
from .registry import Surrogate, SurrogateInputs, register_loss


def clip_cov_keep(
    loss_unclipped: torch.Tensor,
    loss_clipped: torch.Tensor,
    adv: torch.Tensor,
    logp: torch.Tensor,
    mask: torch.Tensor,
    clip_cov_ratio: float = 2e-4,
    cov_lb: float = 1.0,
    cov_ub: float = 5.0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(B, T) float, 0 on the tokens Clip-Cov detaches, 1 elsewhere.

    loss_unclipped, loss_clipped: PPO's -rho A and -clip(rho) A ((B, T) or (B, 1)); adv (B, 1) or (B, T);
    logp (B, T), 0 on padding; mask (B, T).
    """
    on_token = mask.bool()
    cov = token_covariance(logp, adv, mask)  # (B, T)
    clipped_by_ppo = (loss_clipped > loss_unclipped) & on_token
    candidates = ((cov > cov_lb) & (cov < cov_ub) & on_token & ~clipped_by_ppo).nonzero()  # (n, 2), row-major
    n_detach = max(int(clip_cov_ratio * mask.sum().item()), 1)
    picked = candidates[torch.randperm(len(candidates), generator=generator)[:n_detach]]
    keep = torch.ones_like(mask)
    keep[picked[:, 0], picked[:, 1]] = 0.0
    return keep


@dataclass(frozen=True)
class ClipCovOptions:
    clip_cov_ratio: float = 2e-4  # verl: the fraction of tokens detached, among those with cov in (lb, ub)
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0

    def __post_init__(self):
        if not 0 < self.clip_cov_ratio <= 1:
            raise ValueError(f"clip_cov_ratio: must be in (0, 1], got {self.clip_cov_ratio}")
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb: {self.clip_cov_lb} must be below clip_cov_ub ({self.clip_cov_ub})")


@register_loss("clip_cov", aggregation="token_sum", options=ClipCovOptions, levels=("token",), takes_delta=True)
def clip_cov_loss(x: SurrogateInputs, opts: ClipCovOptions) -> Surrogate:
    """PPO-clip with a few high-covariance tokens' losses zeroed (detached)."""
    clipped_ratio = torch.clamp(x.ratio, 1 - x.epsilon_low, 1 + x.epsilon_high)
    keep = clip_cov_keep(-x.ratio * x.adv, -clipped_ratio * x.adv, x.adv, x.logp, x.mask, opts.clip_cov_ratio,
                         opts.clip_cov_lb, opts.clip_cov_ub, x.generator)  # (B, T)
    per_token_loss = clipped_surrogate(x.ratio, x.adv, x.epsilon_low, x.epsilon_high, x.delta) * keep
    return Surrogate(per_token_loss, clip_range=(1 - x.epsilon_low, 1 + x.epsilon_high),
                     stats={"clip_cov/detached_frac": masked_mean(1 - keep, x.mask).item()})
