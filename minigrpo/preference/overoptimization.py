"""Over-optimizing a learned reward, measured: best-of-n against a proxy, the KL it costs, and Gao et al.'s forms.

A learned reward model is a proxy for the reward we mean (here the checker: the gold reward). Optimize the proxy and
the gold reward first rises with it, then falls while the proxy keeps rising (Goodhart). Gao, Schulman & Hilton
2022 ("Scaling Laws for Reward Model Overoptimization", eqs. 1-2) found the gold reward's gain R over the initial
policy to follow, in d = sqrt(KL(pi || pi_init)),

    best-of-n       R_bon(d) = d (alpha_bon - beta_bon d)
    RL (PPO)        R_RL(d)  = d (alpha_RL  - beta_RL log d)

Best-of-n: draw n completions, keep the one the proxy scores highest. Its KL from the sampling policy is, in the
closed form used by Stiennon et al. 2020 (appendix G.3) and Gao et al. (sec. 2.2),

    KL_bon(n) = log n - (n - 1) / n

It is exact for a policy whose completions never repeat (each has a vanishing probability) and an upper bound
otherwise (Beirami et al. 2024, "Theoretical guarantees on the best-of-n alignment policy"): best-of-n moves a
policy that often writes the same completion less than this, so a d computed from it is the most the selection
can have cost.

Its expected scores can be estimated without bias from m >= n samples per prompt (Nakano et al. 2021,
"WebGPT", appendix): sort a prompt's m samples by proxy score; the i-th lowest is the best of a random n-subset
with probability C(i - 1, n - 1) / C(m, n), so

    E[score of the proxy's best of n] = sum_i C(i - 1, n - 1) / C(m, n) * score_(i)

Both forms are linear in (alpha, beta), so a least-squares fit through the origin (R(0) = 0 by definition) gives
them, and R^2 says how much of the gain's variation the form explains (NaN for a flat gain).
"""

import math

import torch

__all__ = ["kl_best_of_n", "best_of_n", "fit_gao"]


def kl_best_of_n(n: int) -> float:
    """KL(pi_bon || pi) in nats of best-of-n sampling, log n - (n - 1) / n (0 for n = 1): exact when no
    completion has a sizeable probability, an upper bound otherwise (module docstring)."""
    return math.log(n) - (n - 1) / n


def best_of_n(proxy: torch.Tensor, scores: torch.Tensor, n: int) -> float:
    """The expected `scores` (e.g. the gold reward, or the proxy itself) of the completion the proxy ranks first
    among n drawn without replacement from each prompt's m samples, averaged over prompts: the unbiased estimator
    of the module docstring. proxy, scores: (P, m) for P prompts; 1 <= n <= m. Ties in the proxy are broken by
    the samples' order."""
    P, m = proxy.shape
    if not 1 <= n <= m:
        raise ValueError(f"n must be in 1..{m}, got {n}")
    order = proxy.argsort(dim=1, stable=True)  # (P, m) ascending
    ranked = scores.gather(1, order).double()  # (P, m): the score of the i-th lowest proxy, i = 1..m
    i = torch.arange(n, m + 1, dtype=torch.float64)  # the ranks that can be the best of n
    log_choose = lambda a, b: torch.lgamma(a + 1) - torch.lgamma(b + 1) - torch.lgamma(a - b + 1)  # noqa: E731
    weight = (log_choose(i - 1, torch.tensor(n - 1.0)) - log_choose(torch.tensor(float(m)), torch.tensor(float(n)))
              ).exp()  # (m - n + 1,) C(i - 1, n - 1) / C(m, n), summing to 1
    return (ranked[:, n - 1:] * weight).sum(dim=1).mean().item()


def fit_gao(d, gain, form: str) -> dict:
    """Least-squares (alpha, beta) of gain = d (alpha - beta d) (form "bon") or d (alpha - beta log d) (form "rl"),
    through the origin, and R^2 = 1 - SS_res / SS_tot (NaN when the gain does not vary). d, gain: sequences of the
    same length (d > 0 for "rl")."""
    d = torch.as_tensor(d, dtype=torch.float64)
    gain = torch.as_tensor(gain, dtype=torch.float64)
    if form == "bon":
        design = torch.stack([d, -d * d], dim=1)
    elif form == "rl":
        design = torch.stack([d, -d * d.log()], dim=1)
    else:
        raise ValueError(f"form must be 'bon' or 'rl', got {form!r}")
    alpha, beta = torch.linalg.lstsq(design, gain.unsqueeze(1)).solution.squeeze(1).tolist()
    residual = gain - design @ torch.tensor([alpha, beta], dtype=torch.float64)
    total = ((gain - gain.mean()) ** 2).sum().item()
    r2 = 1 - (residual**2).sum().item() / total if total > 0 else math.nan  # a flat curve: nothing to explain
    return {"alpha": alpha, "beta": beta, "r2": r2}
