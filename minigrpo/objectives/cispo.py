"""CISPO — MiniMax-M1 (MiniMax 2025, sec. 3.1), "Clipped IS-weight Policy Optimization".

PPO-clip zeroes the gradient of tokens whose ratio left the trust region; in long reasoning these are often
the rare "fork" tokens (however, wait, ...) that matter most. CISPO instead clips the importance weight
itself, stops its gradient, and keeps a REINFORCE gradient for every token:

    L = -1/(sum_i |o_i|) sum_i sum_t  sg[ min(rho_{i,t}, eps_max) ] * A_{i,t} * log pi_theta(o_{i,t})

Aggregated at token level like DAPO. As in TRL, `epsilon_high` is the absolute cap eps_max (ScaleRL
recommends 5.0), not 1 + eps.

Left unset, `epsilon_high` means eps_max = 5.0 here (ScaleRL's cap), not `epsilon`. TRL falls back to
`epsilon` = 0.2: every weight is then capped far below 1, and the update is 0.2 x REINFORCE with no
importance weighting at all — not the paper's algorithm. Pass `epsilon_high=0.2` to reproduce TRL.
"""

import torch

from .registry import Surrogate, SurrogateInputs, register_loss

CISPO_DEFAULT_EPSILON_MAX = 5.0  # the cap when epsilon_high is unset (ScaleRL); TRL would use epsilon = 0.2


def cispo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, logp: torch.Tensor, epsilon_max: float) -> torch.Tensor:
    """Per-token -sg[min(rho, eps_max)] * A * log pi. ratio (B, T) or (B, 1); logp (B, T)."""
    weight = torch.clamp(ratio, max=epsilon_max).detach()
    return -weight * adv * logp


@register_loss("cispo", aggregation="token_sum", default_epsilon_high=CISPO_DEFAULT_EPSILON_MAX)
def cispo_loss(x: SurrogateInputs, opts) -> Surrogate:
    """epsilon_high is eps_max; CISPO only caps the weight from above (TRL's cispo_clip_ratio counts against it)."""
    return Surrogate(cispo_surrogate(x.ratio, x.adv, x.logp, x.epsilon_high), clip_range=(0.0, x.epsilon_high))
