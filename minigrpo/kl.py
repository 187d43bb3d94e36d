"""Per-token estimators of KL(pi_theta || pi_ref) from samples of pi_theta.

We only see log-probs of the sampled tokens, so the KL is estimated per token (Schulman, "Approximating
KL Divergence", 2020). With log r = log pi_ref(o_t) - log pi_theta(o_t), o_t ~ pi_theta:

    k1 = -log r                     unbiased, high variance, negative on some samples
    k2 = (log r)^2 / 2              biased, low variance, always >= 0
    k3 = (r - 1) - log r            unbiased, low variance, always >= 0   (GRPO, DeepSeekMath eq. 4)

As a *loss* term the choice matters for the gradient, not only the value: the expected gradient of k1 on
on-policy samples is zero (E[grad log pi] = 0), so k1 belongs in the reward (`kl_penalized_rewards` in
advantages.py), while k2 and k3 give a useful gradient in the loss (k2's gradient is the true gradient of the
reverse KL on-policy). Notebook 2 compares the three against the exact KL of two small distributions.
"""

import torch

__all__ = ["kl_divergence", "sequence_kl", "KL_ESTIMATORS"]

KL_ESTIMATORS = ("k1", "k2", "k3")


def kl_divergence(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token KL(pi || pi_ref) estimate.

    Args:
        logp:     (B, T) log pi_theta of the sampled tokens.
        ref_logp: (B, T) log pi_ref of the same tokens.
        estimator: "k1", "k2" or "k3" (see module docstring).
    Returns:
        (B, T) per-token estimate (mask it yourself; padding positions hold whatever the inputs held).
    """
    log_r = ref_logp - logp  # (B, T)
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        return torch.exp(log_r) - log_r - 1
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def sequence_kl(logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """KL(pi || pi_ref) between whole completions, one estimate per sampled completion y ~ pi: k3 summed over its
    tokens,

        KL_seq(y) = sum_t k3_t,        E_{y ~ pi}[KL_seq(y)] = KL(pi(. | q) || pi_ref(. | q))   in nats

    unbiased because the sequence KL is the sum over positions of the per-token KLs at the sampled prefixes (the
    chain rule), and k3's expectation at each prefix is that token's KL; never negative, unlike the sum of k1.
    This is the drift of Gao et al. 2022 ("Scaling Laws for Reward Model Overoptimization"), who plot the gold
    reward against d = sqrt(KL).

    logp, ref_logp: (B, T) of the sampled tokens; mask: (B, T), 1 on the completion's tokens. Returns (B,)."""
    return (kl_divergence(logp, ref_logp, "k3") * mask).sum(dim=-1)
