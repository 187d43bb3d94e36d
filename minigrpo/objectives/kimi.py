"""Kimi K2.5's policy loss and its KL term (Kimi Team 2026, "Kimi K2.5: Visual Agentic Intelligence", arXiv
2602.02276, sec. 4.4.2 "Policy Optimization", eq. 1).

K responses per prompt x come from the previous policy pi_old; K2.5 maximises, with N the batch's token count,

    L_RL = E_x [ 1/N sum_j sum_i  Clip(rho_{j,i}, alpha, beta) (r(x, y_j) - mean_r(x))  -  tau (log rho_{j,i})^2 ]

Two lines differ from GRPO's:

  * Clip is a gradient mask, applied "regardless of the sign of the advantages": a token whose ratio left
    [alpha, beta] gets no gradient at all. PPO's min() only stops the side where the update would go on (rho above
    1 + eps with A > 0, below 1 - eps with A < 0) and lets a token pulled back toward pi_old keep its gradient.
    The report's reason: to bound the off-policy drift "amplified by discrepancies between training and inference
    frameworks", which it found essential for long multi-step tool use. In code that is torch.clamp: value
    clip(rho), gradient 1 inside, 0 outside.
  * The KL term tau (log rho)^2 pulls every token's log-ratio back to 0, clipped or not: a quadratic trust region
    on the log-ratio. It is 2 tau times the k2 estimator of KL(pi_theta || pi_old) (kl.py). Kimi k1.5 (arXiv
    2501.12599, sec. 2.3.2) derived the same quadratic from online mirror descent, per sequence and halved: its
    gradient is (r - mean_r) grad log pi(y) - tau/2 grad (log pi(y) / pi_old(y))^2. K2.5 moves it to tokens.

The advantage is r - mean_r, no std: train K2.5's objective with scale_rewards="none" (the estimator's job, not the
loss's). Aggregated as DAPO (sum over the batch's tokens / N).

What the paper leaves open, and what minigrpo reads: alpha, beta, tau have no values in the report; minigrpo
clips the ratio to [1 - epsilon, 1 + epsilon_high] (Config's epsilon, 0.2) and takes tau = `kl_tau` = 1e-3,
prime-rl's default. The text says "log-ratios within the interval [alpha, beta]" while alpha, beta > 0 and the
equation clips the ratio; only the ratio reading contains rho = 1 (on-policy), so that is the one implemented.

prime-rl's default loss (src/prime_rl/trainer/rl/loss.py, `default_loss_fn`) adds this term, kl_tau (log rho)^2
with kl_tau = 1e-3, to DPPO-Binary-TV's policy gradient, not to K2.5's clip (dppo.py: loss_type="dppo_tv" with
kl_tau=1e-3 is its gradient wherever rho <= delta). Against the paper: (1) its trust region is DPPO's mask on
pi - pi_sampler, conditioned on the advantage's sign; (2) its masked tokens contribute 0 to the loss's value
(K2.5's Clip gives clip(rho) A, with no gradient); (3) pi_old is the inference engine's log-probs; (4) the
advantage is scaled by adv_tau (1.0). The KL term itself is the same: no 1/2, on every token of the loss mask.
"""

from dataclasses import dataclass

import torch

from .common import masked_mean
from .registry import Surrogate, SurrogateInputs, register_loss

KIMI_DEFAULT_KL_TAU = 1e-3  # prime-rl's kl_tau; the paper gives no value


def log_ratio_penalty(token_log_ratio: torch.Tensor, tau: float) -> torch.Tensor:
    """Per-token tau (log pi_theta - log pi_old)^2, Kimi K2.5's KL term. token_log_ratio (B, T), 0 on padding."""
    return tau * token_log_ratio.square()


def kimi_clip_surrogate(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """Per-token -Clip(rho, low, high) A: the value clipped, the gradient 0 outside [low, high] whatever A's sign.
    ratio (B, T); adv (B, 1) or (B, T)."""
    return -torch.clamp(ratio, low, high) * adv


@dataclass(frozen=True)
class KimiOptions:
    kl_tau: float = KIMI_DEFAULT_KL_TAU  # tau of tau (log rho)^2 (prime-rl's name and default)

    def __post_init__(self):
        if not self.kl_tau >= 0:
            raise ValueError(f"kl_tau: must be >= 0, got {self.kl_tau}")


@register_loss("kimi", aggregation="token_sum", options=KimiOptions, levels=("token",))
def kimi_loss(x: SurrogateInputs, opts: KimiOptions) -> Surrogate:
    """alpha = 1 - epsilon, beta = 1 + epsilon_high. The clip diagnostics count tokens outside [alpha, beta] on
    either side, whatever A's sign (they all lose their gradient)."""
    low, high = 1 - x.epsilon_low, 1 + x.epsilon_high
    per_token_loss = kimi_clip_surrogate(x.ratio, x.adv, low, high) + log_ratio_penalty(x.token_log_ratio, opts.kl_tau)
    with torch.no_grad():
        below, above = (x.ratio < low).to(x.mask.dtype), (x.ratio > high).to(x.mask.dtype)
        stats = {"clip_ratio/low_mean": masked_mean(below, x.mask).item(),
                 "clip_ratio/high_mean": masked_mean(above, x.mask).item(),
                 "clip_ratio/region_mean": masked_mean(below + above, x.mask).item(),
                 "kimi/log_ratio_sq_mean": masked_mean(x.token_log_ratio.square(), x.mask).item()}
    return Surrogate(per_token_loss, stats=stats)
