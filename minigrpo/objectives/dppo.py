"""DPPO — "Rethinking the Trust Region in LLM Reinforcement Learning" (Qi et al. 2026, arXiv 2602.04879),
Divergence Proximal Policy Optimization, in its Binary-TV and Binary-KL forms (verl's `dppo_tv`, `dppo_kl`).

PPO's trust region is a bound on the sampled token's ratio rho = pi / pi_old, a one-sample estimate of how far the
policy moved. For a large vocabulary it is the wrong yardstick: a rare token going from 1e-5 to 1e-3 has rho = 100
and is clipped though the distribution barely moved, while a likely token falling from 0.99 to 0.8 has rho = 0.81
and passes though a fifth of the probability mass moved. DPPO bounds a divergence instead, approximated on the
binary distribution {the sampled token, everything else} (p = pi(o_t), q = pi_old(o_t)):

    Binary-TV:  D = p - q                                       (the change of the sampled token's probability)
    Binary-KL:  D = q log(q / p) + (1 - q) log((1 - q) / (1 - p))

A token learns unless the update would push D past its threshold on the side the advantage pushes it:

    M_t = [D_t <= delta_high] if A_t > 0 else [D_t >= -delta_low]          (Binary-TV)
    M_t = [D_t <= delta_high or p <= q] if A_t > 0 else [D_t <= delta_low or p >= q]    (Binary-KL)

and the gradient of a kept token is REINFORCE's, weighted by the ratio truncated at C (truncated importance
sampling, TIS; Section 5.4 recommends a large C, 20, as its bias grows as C falls) in place of PPO's dual clip:

    l_t = -A_t * sg[ min(rho_t, C) ] * M_t * log pi_theta(o_t)           (sg: no gradient; M_t: no gradient)

Against GRPO's two lines: the clip of rho becomes the mask M on D, and the surrogate rho A becomes CISPO's form
sg[w] A log pi (its value is not rho A; its gradient, w A grad log pi, is rho A's wherever rho <= C).

verl's options: the divergence thresholds are `clip_ratio` / `clip_ratio_low` / `clip_ratio_high` (default 0.2),
here `epsilon` (delta_low) and `epsilon_high` (delta_high, default epsilon); the authors' script uses 0.15 for TV
and 0.05 for KL. C is verl's `clip_ratio_c`, here `delta`, 20 when unset as in verl's function — but verl's actor
config sets clip_ratio_c = 3.0 for dual-clip PPO, so a verl run that does not set it truncates at 3. Aggregated
as DAPO (verl's default "token-mean"). With `kl_tau` > 0, Kimi K2.5's tau (log rho)^2 is added to every token
(kimi.py): prime-rl's default loss, up to its value (A rho on kept tokens) and its C (none).
"""

from dataclasses import dataclass

import torch

from .common import masked_mean
from .kimi import log_ratio_penalty
from .registry import Surrogate, SurrogateInputs, register_loss

DPPO_DEFAULT_IS_CAP = 20.0  # C when delta is unset: verl's function default, the paper's Section 5.4


def binary_tv(logp: torch.Tensor, old_logp: torch.Tensor) -> torch.Tensor:
    """p - q: the sampled token's probability change, the signed TV distance of the binary distributions."""
    return logp.exp() - old_logp.exp()


def binary_kl(logp: torch.Tensor, old_logp: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """KL(Bernoulli(q) || Bernoulli(p)) = q log(q / p) + (1 - q) log((1 - q) / (1 - p)), with p = exp(logp),
    q = exp(old_logp) and verl's 1e-8 inside the second log (for p or q near 1)."""
    p, q = logp.exp(), old_logp.exp()
    return q * (old_logp - logp) + (1 - q) * torch.log((1 - q + eps) / (1 - p + eps))


@torch.no_grad()
def dppo_trust_region_mask(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, divergence: str,
                           delta_low: float, delta_high: float) -> torch.Tensor:
    """M (B, T) float, 1 = the token learns. logp, old_logp (B, T); adv (B, 1) or (B, T); divergence "tv" or "kl"."""
    if divergence == "tv":
        d = binary_tv(logp, old_logp)
        keep_pos, keep_neg = d <= delta_high, d >= -delta_low
    else:
        d = binary_kl(logp, old_logp)
        rose, fell = logp >= old_logp, logp <= old_logp  # p >= q, p <= q
        keep_pos, keep_neg = (d <= delta_high) | fell, (d <= delta_low) | rose
    return torch.where(adv > 0, keep_pos, keep_neg).to(logp.dtype)


def dppo_surrogate(ratio: torch.Tensor, adv: torch.Tensor, logp: torch.Tensor, keep: torch.Tensor,
                   is_cap: float) -> torch.Tensor:
    """Per-token -A sg[min(rho, C)] M log pi. ratio, logp, keep (B, T); adv (B, 1) or (B, T)."""
    weight = torch.clamp(ratio, max=is_cap).detach()
    return -adv * weight * keep * logp


@dataclass(frozen=True)
class DppoOptions:
    kl_tau: float = 0.0  # Kimi K2.5's tau (log rho)^2 on every token (kimi.py); 0 = verl's loss

    def __post_init__(self):
        if not self.kl_tau >= 0:
            raise ValueError(f"kl_tau: must be >= 0, got {self.kl_tau}")


def _dppo(divergence: str):
    def dppo_loss(x: SurrogateInputs, opts: DppoOptions) -> Surrogate:
        """epsilon, epsilon_high: the divergence thresholds; delta: the IS cap C. The clip diagnostics count the
        masked tokens: high with A > 0 (the probability rose too far), low with A < 0 (fell too far)."""
        keep = dppo_trust_region_mask(x.logp, x.old_logp, x.adv, divergence, x.epsilon_low, x.epsilon_high)
        per_token_loss = dppo_surrogate(x.ratio, x.adv, x.logp, keep, x.delta)
        if opts.kl_tau:
            per_token_loss = per_token_loss + log_ratio_penalty(x.token_log_ratio, opts.kl_tau)
        with torch.no_grad():
            masked = (1 - keep) * (x.adv != 0)  # a token with A = 0 has no gradient to mask
            stats = {"clip_ratio/low_mean": masked_mean(masked * (x.adv < 0), x.mask).item(),
                     "clip_ratio/high_mean": masked_mean(masked * (x.adv > 0), x.mask).item(),
                     "clip_ratio/region_mean": masked_mean(masked, x.mask).item(),
                     "dppo/truncated_frac": masked_mean(keep * (x.ratio > x.delta), x.mask).item()}
        return Surrogate(per_token_loss, stats=stats)

    return dppo_loss


DPPO_CONSTRAINTS = dict(aggregation="token_sum", options=DppoOptions, levels=("token",), takes_delta=True,
                        default_delta=DPPO_DEFAULT_IS_CAP)
register_loss("dppo_tv", **DPPO_CONSTRAINTS)(_dppo("tv"))
register_loss("dppo_kl", **DPPO_CONSTRAINTS)(_dppo("kl"))
