"""CISPO — MiniMax-M1 (MiniMax 2025, sec. 3.1), "Clipped IS-weight Policy Optimization".

PPO-clip zeroes the gradient of tokens whose ratio left the trust region; in long reasoning these are often
the rare "fork" tokens (however, wait, ...) that matter most. CISPO instead clips the importance weight
itself, stops its gradient, and keeps a REINFORCE gradient for every token:

    L = -1/(sum_i |o_i|) sum_i sum_t  sg[ min(rho_{i,t}, eps_max) ] * A_{i,t} * log pi_theta(o_{i,t})

Aggregated at token level like DAPO. As in TRL, `epsilon_high` is the absolute cap eps_max (ScaleRL
recommends 5.0), not 1 + eps.
"""

import torch


def cispo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, logp: torch.Tensor, epsilon_max: float) -> torch.Tensor:
    """Per-token -sg[min(rho, eps_max)] * A * log pi. ratio (B, T) or (B, 1); logp (B, T)."""
    weight = torch.clamp(ratio, max=epsilon_max).detach()
    return -weight * adv * logp
