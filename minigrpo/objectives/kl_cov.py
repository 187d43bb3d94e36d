"""KL-Cov — "The Entropy Mechanism of Reinforcement Learning for Reasoning Language Models" (Cui et al. 2025,
arXiv 2505.22617); the companion of Clip-Cov (clip_cov.py, which explains the covariance).

Instead of cutting the high-covariance tokens out, KL-Cov keeps every token's unclipped policy gradient and
puts a KL-like penalty on the few tokens with the largest covariance, holding them close to the old policy:

    Cov_{i,t} = (log pi(o_{i,t}) - mean log pi) * (A_{i,t} - mean A)         (means over the batch's tokens)
    top: the k = max(1, floor(kl_cov_ratio * number of tokens)) tokens with the largest positive Cov
    l_{i,t} = -rho_{i,t} A_{i,t} + ppo_kl_coef * |log rho_{i,t}| * 1[(i, t) in top]

No clipping anywhere. Aggregated over tokens like DAPO. Defaults are verl's: kl_cov_ratio 2e-4, ppo_kl_coef 1
(core_algos.compute_policy_loss_kl_cov). One difference: verl's top-k also takes tokens whose covariance is
<= 0 when fewer than k are positive (tiny or degenerate batches, e.g. every advantage 0); those tokens do not
lower the entropy, so minigrpo leaves them unpenalised and a batch with no signal has loss 0.
"""

from dataclasses import dataclass

import torch

from .common import masked_mean, token_covariance
from .registry import Surrogate, SurrogateInputs, register_loss


def kl_cov_penalised(adv: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor,
                     kl_cov_ratio: float = 2e-4) -> torch.Tensor:
    """(B, T) float, 1 on the tokens KL-Cov penalises. adv (B, 1) or (B, T); logp (B, T), 0 on padding; mask (B, T)."""
    penalised = torch.zeros(mask.numel(), dtype=mask.dtype, device=mask.device)  # flat, then (B, T)
    token_index = mask.reshape(-1).nonzero().squeeze(-1)  # flat indices of completion tokens, in order
    if len(token_index) == 0:
        return penalised.view_as(mask)
    cov = token_covariance(logp, adv, mask).reshape(-1)[token_index]  # (n,)
    k = max(1, int(len(token_index) * kl_cov_ratio))
    top = torch.topk(cov, k).indices  # the same order of candidates as verl's, so the same ties are broken
    top = top[cov[top] > 0]
    penalised[token_index[top]] = 1.0
    return penalised.view_as(mask)


def kl_cov_surrogate(ratio: torch.Tensor, adv: torch.Tensor, log_ratio: torch.Tensor, penalised: torch.Tensor,
                     ppo_kl_coef: float = 1.0) -> torch.Tensor:
    """Per-token -rho A + ppo_kl_coef * |log rho| on the penalised tokens. ratio/log_ratio (B, T) or (B, 1)."""
    return -ratio * adv + ppo_kl_coef * log_ratio.abs() * penalised


@dataclass(frozen=True)
class KlCovOptions:
    kl_cov_ratio: float = 2e-4  # verl: the fraction of tokens penalised (largest covariance)
    ppo_kl_coef: float = 1.0  # verl: the coefficient on |log rho|

    def __post_init__(self):
        if not 0 < self.kl_cov_ratio <= 1:
            raise ValueError(f"kl_cov_ratio: must be in (0, 1], got {self.kl_cov_ratio}")


@register_loss("kl_cov", aggregation="token_sum", options=KlCovOptions, levels=("token",))
def kl_cov_loss(x: SurrogateInputs, opts: KlCovOptions) -> Surrogate:
    penalised = kl_cov_penalised(x.adv, x.logp, x.mask, opts.kl_cov_ratio)  # (B, T)
    per_token_loss = kl_cov_surrogate(x.ratio, x.adv, x.log_ratio, penalised, opts.ppo_kl_coef)
    return Surrogate(per_token_loss, stats={"kl_cov/penalised_frac": masked_mean(penalised, x.mask).item()})
