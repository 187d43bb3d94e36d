"""Entropy: learn only from the high-entropy "forking" tokens, and an entropy bonus.

Top-entropy tokens — "Beyond the 80/20 Rule: High-Entropy Minority Tokens Drive Effective Reinforcement Learning
for LLM Reasoning" (Wang et al. 2025, arXiv 2506.01939). Most tokens of a chain of thought are near-certain
continuations; a minority with high entropy H_{i,t} = -sum_v pi(v) log pi(v) are the forks where the reasoning
chooses a path. Keeping the policy gradient on the top rho fraction by entropy (the paper: rho = 0.2) matches or
beats training on every token:

    tau   = the (1 - rho) quantile of { H_{i,t} : completion tokens of the batch }
    l_{i,t} <- l_{i,t} * 1[ H_{i,t} >= tau ]                       TRL's top_entropy_quantile = rho

Entropy bonus (TRL's entropy_coef): the loss becomes L - c * H_bar, H_bar the mean entropy over the tokens the
policy loss acts on (all completion tokens, or the top-entropy ones), the same whatever the loss type's
normaliser. For it to act, the entropies must carry their gradient (they are a function of the logits).
"""

import torch


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top_entropy_quantile: float) -> torch.Tensor:
    """(B, T) bool, True on the completion tokens whose entropy is in the top `top_entropy_quantile` fraction.

    entropies, mask: (B, T). As TRL 1.16's get_high_entropy_mask: the threshold is torch.quantile (linear
    interpolation) of the completion tokens' entropies in float32, and ties at the threshold are kept — so
    rho = 0 keeps the highest-entropy token(s) only, rho = 1 keeps every token. On one process only: TRL takes
    the quantile over every process's tokens.
    """
    on_token = mask.bool()
    values = entropies.detach()[on_token].float()
    if values.numel() == 0:
        return torch.zeros_like(on_token)
    threshold = torch.quantile(values, 1 - top_entropy_quantile)
    return (entropies.detach() * mask >= threshold) & on_token

