"""GRPO's clipped surrogate and its aggregation (DeepSeekMath, Shao et al. 2024, eq. 3).

    J(theta) = 1/G sum_i 1/|o_i| sum_t [ min( rho_{i,t} A_{i,t}, clip(rho_{i,t}, 1-eps_low, 1+eps_high) A_{i,t} )
                                         - beta * KL_{i,t} ]
    rho_{i,t} = pi_theta(o_{i,t} | q, o_{i,<t}) / pi_old(o_{i,t} | q, o_{i,<t})

The loss is -J. Two lines of it are the whole of PPO's trust region: the unclipped and the clipped term,
and the pessimistic min of the two. Every other variant in this folder reuses `clipped_surrogate` and
changes either the ratio (GSPO), the aggregation (Dr. GRPO, DAPO) or the surrogate itself (CISPO, SAPO, GMPO).

Two-sided clipping (`delta`, INTELLECT-2, Prime Intellect 2025, arXiv 2505.07291) caps the unclipped ratio at delta:

    l = max( -min(rho, delta) A, -clip(rho, 1-eps_low, 1+eps_high) A )

It is verl's dual-clip PPO (`clip_ratio_c`, Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep
RL", arXiv 1912.09729): for A < 0 dual-clip takes min(-c A, max(-rho A, -clip(rho) A)) = -A min(c, max(rho,
1-eps_low)), the same number as -A max(min(rho, delta), clip(rho)) with delta = c; for A > 0 dual-clip does nothing, and neither
does delta (clip(rho) <= 1+eps_high < delta, so the min picks it). The two agree, value and gradient, whenever
delta > 1 + eps_high (the papers' condition; config.validate refuses a smaller delta): tests/test_trl_verl_parity.py
checks it against verl's compute_policy_loss_vanilla. verl also clamps log rho to [-20, 20] first.
"""

import torch

from .registry import Surrogate, SurrogateInputs, register_loss


def clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, epsilon_low: float, epsilon_high: float, delta: float | None = None
) -> torch.Tensor:
    """Per-token PPO-clip loss, -min(rho A, clip(rho, 1-eps_low, 1+eps_high) A).

    ratio: (B, T) token ratios or (B, 1) sequence ratios; adv: (B, 1) or (B, T). Returns their broadcast shape.
    delta: two-sided clipping (INTELLECT-2): the unclipped ratio is also capped at delta (> 1 + eps_high),
        which bounds the update for negative advantages, where plain PPO-clip lets rho grow without limit.
    """
    clipped_ratio = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    if delta is not None:
        ratio = torch.clamp(ratio, max=delta)
    loss_unclipped = -ratio * adv
    loss_clipped = -clipped_ratio * adv
    return torch.max(loss_unclipped, loss_clipped)  # = -min(rho A, clip(rho) A)


def ppo_clip(x: SurrogateInputs, opts) -> Surrogate:
    """PPO-clip as a loss type's surrogate, its clip diagnostics counted against [1 - eps_low, 1 + eps_high]."""
    per_token_loss = clipped_surrogate(x.ratio, x.adv, x.epsilon_low, x.epsilon_high, x.delta)
    return Surrogate(per_token_loss, clip_range=(1 - x.epsilon_low, 1 + x.epsilon_high))


register_loss("grpo", aggregation="sequence_mean", takes_delta=True)(ppo_clip)
register_loss("bnpo", aggregation="token_mean", takes_delta=True)(ppo_clip)
