"""SAPO — "Soft Adaptive Policy Optimization" (Gao et al. 2025, Qwen).

Hard clipping switches a token's gradient off abruptly at 1 ± eps. SAPO replaces clip(rho) with a smooth
gate, a scaled sigmoid centred at rho = 1 with a temperature tau per advantage sign:

    f(rho) = 4 / tau * sigmoid(tau * (rho - 1)),      L = -f(rho_{i,t}) * A_{i,t}

At rho = 1 its slope is 1 (the policy gradient); far from 1 it flattens, attenuating off-policy tokens
gradually. Negative-advantage tokens use a slightly higher temperature (TRL defaults: 1.0 / 1.05).
Aggregated like GRPO (sequence mean of token means), as TRL does.
"""

from dataclasses import dataclass

import torch

from .common import masked_mean
from .registry import Surrogate, SurrogateInputs, register_loss


def sapo_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, temperature_pos: float = 1.0, temperature_neg: float = 1.05
) -> torch.Tensor:
    """Per-token -(4/tau) sigmoid(tau (rho - 1)) * A, tau = temperature_pos if A > 0 else temperature_neg."""
    tau = torch.where(adv > 0, temperature_pos, temperature_neg)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    return -gate * adv


def sapo_gate_slope(
    ratio: torch.Tensor, adv: torch.Tensor, temperature_pos: float = 1.0, temperature_neg: float = 1.05
) -> torch.Tensor:
    """The gate's slope d f/d rho = 4 sigmoid(x) (1 - sigmoid(x)), x = tau (rho - 1): 1 at rho = 1, -> 0 far off it.

    Its masked mean is SAPO's diagnostic in place of PPO's clip fraction: how much the gate scales the gradient.
    """
    tau = torch.where(adv > 0, temperature_pos, temperature_neg)
    sig = torch.sigmoid(tau * (ratio - 1))
    return 4 * sig * (1 - sig)


@dataclass(frozen=True)
class SapoOptions:
    sapo_temperature_pos: float = 1.0  # tau for A > 0 (TRL's default)
    sapo_temperature_neg: float = 1.05  # tau for A <= 0

    def __post_init__(self):
        if not (self.sapo_temperature_pos > 0 and self.sapo_temperature_neg > 0):
            raise ValueError("sapo_temperature_pos, sapo_temperature_neg: must be > 0")


@register_loss("sapo", aggregation="sequence_mean", options=SapoOptions)
def sapo_loss(x: SurrogateInputs, opts: SapoOptions) -> Surrogate:
    """SAPO clips nothing: its diagnostic is the gate's mean slope (1 = the plain policy gradient)."""
    taus = (opts.sapo_temperature_pos, opts.sapo_temperature_neg)
    slope = sapo_gate_slope(x.ratio, x.adv, *taus)
    return Surrogate(sapo_surrogate(x.ratio, x.adv, *taus),
                     stats={"sapo/gate_slope_mean": masked_mean(slope.detach(), x.mask).item()})
