"""Advantages: how good was each completion, relative to its siblings?

GRPO samples G completions for the same prompt and uses the group itself as the baseline — no critic.
All functions here are pure torch and take a flat reward tensor of N = num_prompts * G values, grouped
consecutively: rows i*G .. i*G+G-1 belong to prompt i.

Group-relative advantage (DeepSeekMath, Shao et al. 2024, eq. 3 / sec. 4.1.2, "outcome supervision"):

    A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)

Two conventions for std exist and give different numbers for small G:
  * std="population" (divide by G) — the worked examples in papers and blog posts. With eps = 0,
    rewards [1, 1, 0, 0] give exactly [+1, +1, -1, -1], and six 1s and four 0s give +0.8165 / -1.2247.
  * std="sample" (Bessel-corrected, divide by G - 1) — what TRL computes (with eps = 1e-4 added to the std).
    [1, 1, 0, 0] then gives ±0.866.
Variants selected by `scale` (TRL's `scale_rewards`):
  * "group": divide by the group's std (GRPO).
  * "batch": centre on the group mean, divide by the std of the whole batch (Lite PPO / TRL "batch").
  * "none":  mean-centred only, A_i = r_i - mean (Dr. GRPO, Liu et al. 2025, sec. 3.1: dividing by the std
             up-weights questions that are too easy or too hard).

Degenerate groups — every completion got the same reward — carry no signal: A = 0 exactly (never NaN,
never a rounding residue divided by eps). NaN rewards mark unscorable completions: they are left out of
their group's mean and std and get advantage 0.
"""

import torch

__all__ = ["group_advantages", "rloo_advantages", "process_advantages", "kl_penalized_rewards"]


def _nan_std(x: torch.Tensor, dim: int, *, unbiased: bool) -> torch.Tensor:
    """Std over `dim`, ignoring NaNs; 0 where fewer than 2 values (population: fewer than 1) are present."""
    count = (~x.isnan()).sum(dim, keepdim=True)
    mean = x.nanmean(dim, keepdim=True)
    sq_dev = ((x - mean) ** 2).nansum(dim, keepdim=True)
    denom = (count - 1) if unbiased else count
    var = sq_dev / denom.clamp(min=1)
    return var.sqrt().squeeze(dim)


def _all_equal(x: torch.Tensor, dim: int) -> torch.Tensor:
    """True where the non-NaN values along `dim` are all equal (or absent).

    Tested exactly (max == min) rather than via std ~ 0, so that [0.1, 0.1, 0.1] — whose float mean is not
    exactly 0.1 — still gives an advantage of exactly 0 instead of a rounding residue divided by eps.
    """
    scored = ~x.isnan()
    hi = x.masked_fill(~scored, -torch.inf).amax(dim)
    lo = x.masked_fill(~scored, torch.inf).amin(dim)
    return ~(hi > lo)


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scale: str = "group",
    std: str = "sample",
    eps: float = 1e-4,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages, A_i = (r_i - mean_group) / (std + eps).

    Args:
        rewards: (N,) float, N = num_prompts * group_size, groups consecutive. NaN = unscorable.
        group_size: G, completions per prompt.
        scale: "group" (GRPO), "batch" (std over the whole batch), "none" (Dr. GRPO: r - mean only).
        std: "sample" (Bessel-corrected, TRL) or "population" (the papers' worked examples).
        eps: added to the std (TRL: 1e-4). Irrelevant for scale="none".

    Returns:
        adv: (N,) advantages; exactly 0 for NaN rewards and for every member of a zero-std group.
        zero_std: (N,) bool, True for members of groups whose (non-NaN) rewards are all equal —
            the mean of this is `frac_reward_zero_std`, the fraction of prompts that teach nothing.
    """
    if scale not in ("group", "batch", "none"):
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    if std not in ("sample", "population"):
        raise ValueError(f"std must be 'sample' or 'population', got {std!r}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards cannot be split into groups of {group_size}")
    unbiased = std == "sample"
    rewards = rewards if rewards.is_floating_point() else rewards.float()  # float64 stays float64
    grouped = rewards.view(-1, group_size)  # (num_prompts, G)

    group_mean = grouped.nanmean(dim=1, keepdim=True)  # (num_prompts, 1); NaN if the whole group is NaN
    scored = ~grouped.isnan()
    zero_std_group = _all_equal(grouped, 1)  # (num_prompts,); also True for all-NaN and single-score groups

    centred = grouped - group_mean  # (num_prompts, G)
    if scale == "group":
        scale_by = _nan_std(grouped, 1, unbiased=unbiased).unsqueeze(1) + eps  # (num_prompts, 1)
    elif scale == "batch":
        scale_by = _nan_std(rewards.view(1, -1), 1, unbiased=unbiased) + eps  # (1,)
    else:
        scale_by = torch.ones(1, dtype=grouped.dtype)
    # With eps = 0 a spread too small for the float type ([0, 1e-30]) has std 0: no usable signal, A = 0.
    adv = centred / scale_by.clamp(min=torch.finfo(grouped.dtype).tiny)
    adv = adv.masked_fill(zero_std_group.unsqueeze(1) | ~scored | (scale_by == 0), 0.0)
    zero_std = zero_std_group.repeat_interleave(group_size)
    return adv.view(-1), zero_std


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """REINFORCE Leave-One-Out advantages (Kool et al. 2019; Ahmadian et al. 2024, "Back to Basics").

        A_i = r_i - 1/(G-1) * sum_{j != i} r_j  =  G/(G-1) * (r_i - mean(r))

    Each completion's baseline is the mean of its G-1 siblings, so the baseline does not depend on r_i and
    the estimator stays unbiased. No std scaling. NaN rewards are left out (their advantage is 0, and the
    baseline of the others is the mean of the remaining scored siblings).

    Args:
        rewards: (N,) float, grouped consecutively by `group_size` (G >= 2).
    Returns:
        adv: (N,)
    """
    if group_size < 2:
        raise ValueError("RLOO needs group_size >= 2 (a leave-one-out baseline needs a sibling)")
    grouped = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)  # (num_prompts, G)
    scored = ~grouped.isnan()
    r = grouped.nan_to_num(0.0)
    count = scored.sum(dim=1, keepdim=True)  # (num_prompts, 1)
    others_sum = r.sum(dim=1, keepdim=True) - r
    others_count = (count - 1).clamp(min=1)
    adv = r - others_sum / others_count
    adv = adv.masked_fill(~scored | (count < 2) | _all_equal(grouped, 1).unsqueeze(1), 0.0)  # exact 0, no residue
    return adv.view(-1)


def process_advantages(
    step_rewards: torch.Tensor,
    step_end: torch.Tensor,
    step_mask: torch.Tensor,
    group_size: int,
    num_tokens: int,
    *,
    eps: float = 1e-4,
) -> torch.Tensor:
    """Process supervision (DeepSeekMath, sec. 4.1.3): per-step rewards -> per-token advantages.

    Each completion i is cut into K_i reasoning steps; step k ends at token index(i, k) and gets reward
    r_i^k. All step rewards of the group (over every completion and step) are normalised together,

        r~_i^k = (r_i^k - mean(R)) / (std(R) + eps),   R = { r_j^k : j in group, k <= K_j },

    and the advantage of token t is the sum of the normalised rewards of the steps that end at or after t:

        A_{i,t} = sum_{index(i,k) >= t} r~_i^k

    Args:
        step_rewards: (N, K) rewards per step, padded.
        step_end:     (N, K) long, token index at which each step ends (inclusive), padded with anything.
        step_mask:    (N, K) 1 for real steps, 0 for padding.
        group_size:   G; groups are consecutive rows.
        num_tokens:   T, length of the completion tensor the advantages are for.
    Returns:
        adv: (N, T) per-token advantages (population std within each group, as in the paper's
        normalisation; a group whose step rewards are all equal gets 0).
    """
    N, K = step_rewards.shape
    valid = step_mask.bool()
    r = step_rewards.float().masked_fill(~valid, float("nan")).view(-1, group_size * K)  # (P, G*K)
    mean = r.nanmean(dim=1, keepdim=True)
    sd = _nan_std(r, 1, unbiased=False).unsqueeze(1)
    norm = ((r - mean) / (sd + eps)).nan_to_num(0.0)
    norm = norm.masked_fill(_all_equal(r, 1).unsqueeze(1), 0.0).view(N, K)  # (N, K)
    t = torch.arange(num_tokens, device=step_rewards.device)  # (T,)
    ends_at_or_after = step_end.unsqueeze(1) >= t.view(1, -1, 1)  # (N, T, K)
    return (norm.unsqueeze(1) * ends_at_or_after * valid.unsqueeze(1)).sum(-1)  # (N, T)


def kl_penalized_rewards(
    rewards: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """KL-in-reward, the InstructGPT / PPO-RLHF alternative to GRPO's KL-in-loss.

        r'_i = r_i - beta * sum_t (log pi(o_t) - log pi_ref(o_t))     (the k1 estimate of KL(pi || pi_ref))

    The penalty is folded into the reward before advantages are computed, so it is normalised with the
    group like any other reward; the loss then uses beta = 0. Shapes: rewards (N,), logp/ref_logp/mask (N, T).
    Log-probs are treated as constants here (no gradient flows through the reward).
    """
    kl_seq = ((logp - ref_logp).detach() * mask).sum(-1)  # (N,)
    return rewards - beta * kl_seq
