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

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["group_advantages", "rloo_advantages", "process_advantages", "prefix_step_rewards", "kl_penalized_rewards",
           "reinforce_pp_advantages", "reinforce_pp_baseline_advantages", "opo_advantages",
           "grpo_passk_advantages", "pass_at_k_advantages", "gpg_advantages", "normalize_then_sum_advantages",
           "gfpo_keep", "maxrl_advantages", "remax_advantages", "optimal_token_baseline_advantages",
           "AdvantageInputs", "ADVANTAGE_ESTIMATORS", "ESTIMATOR_NEEDS", "register_advantage", "compute_advantages",
           "process_supervision"]


def _nan_std(x: torch.Tensor, dim: int, *, unbiased: bool) -> torch.Tensor:
    """Std over `dim`, ignoring NaNs; 0 where fewer than 2 values (population: fewer than 1) are present."""
    count = (~x.isnan()).sum(dim, keepdim=True)
    dev = x - x.nanmean(dim, keepdim=True)
    sq_dev = (dev**2).nansum(dim, keepdim=True)
    denom = (count - 1) if unbiased else count
    var = sq_dev / denom.clamp(min=1)
    if sq_dev.isinf().any():  # deviations beyond ~1.8e19 overflow float32 when squared: measure them in units of
        # the group's largest, so that huge but finite rewards still get their advantages
        scale = dev.abs().nan_to_num(0.0).amax(dim, keepdim=True).clamp(min=torch.finfo(x.dtype).tiny)
        scaled = (((dev / scale) ** 2).nansum(dim, keepdim=True) / denom.clamp(min=1)).sqrt() * scale
        return torch.where(sq_dev.isinf(), scaled, var.sqrt()).squeeze(dim)
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

    Computed without a (N, T, K) tensor: each step's r~ is added at its end token, then summed from the right
    (a reverse cumulative sum over t). A step that ends at or beyond T counts for every token; one that ends
    before token 0 (index < 0) for none.

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
    valid = step_mask.bool() & (step_end >= 0)
    r = step_rewards.float().masked_fill(~step_mask.bool(), float("nan")).view(-1, group_size * K)  # (P, G*K)
    mean = r.nanmean(dim=1, keepdim=True)
    sd = _nan_std(r, 1, unbiased=False).unsqueeze(1)
    norm = ((r - mean) / (sd + eps)).nan_to_num(0.0)
    norm = norm.masked_fill(_all_equal(r, 1).unsqueeze(1), 0.0).view(N, K)  # (N, K)
    at_end = torch.zeros(N, num_tokens + 1, dtype=norm.dtype, device=norm.device)  # (N, T+1), column T: "beyond"
    at_end.scatter_add_(1, step_end.clamp(0, num_tokens).long(), norm * valid)  # r~ placed on its step's end
    return at_end.flip(1).cumsum(1).flip(1)[:, :num_tokens]  # (N, T) sum over the steps ending at or after t


def prefix_step_rewards(step_rewards: torch.Tensor) -> torch.Tensor:
    """Each step's reward -> the lowest reward of the steps up to it (in order; NaN padding at the end of a row).

        r'_i^k = min_{j <= k} r_i^j

    With 0/1 step rewards, every step after the first wrong one gets 0 (the "prefix" scheme: a step counts as right
    only when every step before it is right too); a process reward model's probabilities become those of the
    prefix's weakest step. Shape (N, K) -> (N, K)."""
    return torch.cummin(step_rewards.nan_to_num(math.inf), dim=1).values.masked_fill(step_rewards.isnan(), math.nan)


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


# ---------------------------------------------------------------------------------------------------------
# More baselines and normalisations (REINFORCE++, OPO, pass@k, GPG, GDPO)
# ---------------------------------------------------------------------------------------------------------
def _token_whiten(values: torch.Tensor, weights: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps), mean and Bessel-corrected var weighted by `weights` (token counts).

    verl's masked_whiten over a (N, T) tensor whose rows are constant is this with weights = tokens per row.
    Fewer than two tokens: the variance divides by 1 instead of 0.
    """
    n = weights.sum()
    mean = (values * weights).sum() / n.clamp(min=1e-8)
    var = ((values - mean) ** 2 * weights).sum() / (n - 1).clamp(min=1.0)
    return (values - mean) * torch.rsqrt(var + eps)


def reinforce_pp_advantages(rewards: torch.Tensor, mask: torch.Tensor, *, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++ (Hu et al. 2025, arXiv 2501.03262): no critic and no group, the return-to-go whitened over the
    batch's tokens,

        G_{i,t} = sum_{s >= t} gamma^(s - t) r_{i,s}          A_{i,t} = (G_{i,t} - mean G) / sqrt(var G + 1e-8)

    mean and (Bessel-corrected) var over every completion token of the batch; verl's
    compute_reinforce_plus_plus_outcome_advantage. With one outcome reward at the last token and gamma = 1,
    G_{i,t} = r_i: the reward whitened over tokens, so a long completion weighs more in the batch statistics.

    Args:
        rewards: (N,) one outcome reward per completion, placed on its last completion token, or (N, T) token
            rewards (e.g. the reward minus a per-token KL penalty). NaN = unscorable: reward 0 and left out.
        mask: (N, T) 1 on completion tokens. A masked-out token inside a completion (tool output) carries the
            return past it unchanged, as in verl.
    Returns:
        adv: (N, T), 0 on padding.
    """
    mask = mask.to(torch.float64 if rewards.dtype == torch.float64 else torch.float32)
    scored = torch.ones(mask.shape[0], dtype=torch.bool)
    if rewards.dim() == 1:
        scored = ~rewards.isnan()
        positions = torch.arange(mask.shape[1], dtype=mask.dtype)
        last = (mask * (positions + 1)).argmax(-1)  # (N,) index of each completion's last token
        token_rewards = torch.zeros_like(mask)
        token_rewards[torch.arange(mask.shape[0]), last] = rewards.nan_to_num(0.0).to(mask.dtype) * (mask.sum(-1) > 0)
    else:
        token_rewards = rewards.to(mask.dtype)
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(mask.shape[0], dtype=mask.dtype)
    for t in reversed(range(mask.shape[1])):  # carried through masked-out tokens unchanged
        running = torch.where(mask[:, t] > 0, token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running * mask[:, t]
    weights = mask * scored.unsqueeze(-1)
    return _token_whiten(returns, weights) * weights


def reinforce_pp_baseline_advantages(rewards: torch.Tensor, group_size: int, mask: torch.Tensor) -> torch.Tensor:
    """REINFORCE++-baseline (Hu et al. 2025, arXiv 2501.03262): the group mean as baseline, then the batch's
    whitening instead of GRPO's per-group std,

        A_i = (x_i - mean_tok x) / sqrt(var_tok x + 1e-8),      x_i = r_i - mean(r_group)

    mean_tok / var_tok over every completion token of the batch (x_i counted |o_i| times, Bessel-corrected), as
    verl's compute_reinforce_plus_plus_baseline_outcome_advantage. Dividing by one batch-wide std keeps easy and
    hard prompts on one scale (GRPO's per-group std inflates near-degenerate groups).

    Args:
        rewards: (N,), groups of `group_size` consecutive rows; NaN = unscorable (left out, advantage 0).
        mask: (N, T) 1 on completion tokens (only its row sums, the lengths, are used).
    Returns:
        adv: (N,), one per completion (0 for unscorable or empty completions).
    """
    grouped = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)
    centred = (grouped - grouped.nanmean(dim=1, keepdim=True)).view(-1)  # (N,)
    centred = centred.masked_fill(_all_equal(grouped, 1).repeat_interleave(group_size), 0.0)
    scored = ~centred.isnan()
    lengths = mask.sum(-1).to(centred.dtype) * scored  # (N,) weight of each completion in the batch statistics
    adv = _token_whiten(centred.nan_to_num(0.0), lengths)
    return adv.masked_fill(lengths == 0, 0.0)


def opo_advantages(rewards: torch.Tensor, group_size: int, lengths: torch.Tensor) -> torch.Tensor:
    """OPO's length-weighted baseline ("On-Policy RL with Optimal Reward Baseline", Hao et al. 2025,
    arXiv 2505.23585).

    The variance-minimising baseline is b* = E[||grad log pi(o)||^2 r] / E[||grad log pi(o)||^2]; taking the squared
    gradient norm proportional to the completion's length gives a length-weighted mean of the group's rewards:

        b = sum_j |o_j| r_j / sum_j |o_j|          A_i = r_i - b              (no std scaling)

    as verl's compute_opo_outcome_advantage. Args: rewards (N,), groups consecutive, NaN = unscorable (left out,
    advantage 0); lengths (N,) completion lengths |o_i|. Returns adv (N,).
    """
    grouped = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)
    scored = ~grouped.isnan()
    weight = lengths.to(grouped.dtype).view(-1, group_size) * scored  # (P, G)
    r = grouped.nan_to_num(0.0)
    baseline = (weight * r).sum(1, keepdim=True) / weight.sum(1, keepdim=True).clamp(min=1e-8)  # (P, 1)
    adv = (r - baseline).masked_fill(~scored | _all_equal(grouped, 1).unsqueeze(1), 0.0)
    return adv.view(-1)


def grpo_passk_advantages(rewards: torch.Tensor, group_size: int, *, scale: bool = True,
                          eps: float = 1e-6) -> torch.Tensor:
    """GRPO for pass@k: only the best completion of each group gets an advantage, the margin over the runner-up,

        A_{i*} = (r_max - r_second) / (std(r_group) + eps),    i* = argmax_i r_i;    A_i = 0 for i != i*

    (verl's compute_grpo_passk_outcome_advantage, citing Tang et al. 2025, arXiv 2503.19595): the group is
    scored by its best member, as pass@k scores k attempts. std is the sample std (verl: torch.std); scale=False
    drops it (verl's norm_adv_by_std_in_grpo=False). Ties for the best give margin 0. NaN rewards never win.
    Args: rewards (N,), groups consecutive (G >= 2). Returns adv (N,).
    """
    if group_size < 2:
        raise ValueError("grpo_passk needs group_size >= 2 (a best and a runner-up)")
    grouped = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)
    values = grouped.nan_to_num(-torch.inf)
    top2 = values.topk(2, dim=1).values  # (P, 2)
    margin = (top2[:, 0] - top2[:, 1]).nan_to_num(0.0, posinf=0.0)  # fewer than two scored: no margin
    if scale:
        margin = margin / (_nan_std(grouped, 1, unbiased=True) + eps)
    adv = torch.zeros_like(grouped)
    adv[torch.arange(len(grouped)), values.argmax(1)] = margin
    return adv.view(-1)


def pass_at_k_advantages(rewards: torch.Tensor, group_size: int, k: int) -> torch.Tensor:
    """Pass@k training, the analytic advantage ("Pass@k Training for Adaptively Balancing Exploration and
    Exploitation of Large Reasoning Models", Chen et al. 2025, arXiv 2508.10751).

    Score every k-subset of the group by its best member (pass@k: 1 if any of the k is correct) and give each
    completion the mean normalised score of the subsets it is in. For 0/1 rewards, N completions of which N_neg
    are wrong, this has a closed form (no sampling of subsets):

        R     = 1 - C(N_neg, k) / C(N, k)                    mean score of a k-subset (unbiased pass@k)
        sigma = sqrt(R (1 - R))
        A_pos = (1 - R) / sigma                              every subset with a correct answer scores 1
        A_neg = (1 - R - C(N_neg - 1, k - 1) / C(N - 1, k - 1)) / sigma
                                                             a wrong answer's subsets all fail with that chance

    k = 1 is GRPO with population std. A group with every answer right, or too few wrong ones to fill a k-subset,
    has sigma = 0 and advantage 0. Args: rewards (N,) in {0, 1}, NaN = unscorable (left out, advantage 0);
    1 <= k <= group_size. Returns adv (N,).
    """
    if not 1 <= k <= group_size:
        raise ValueError(f"pass@k needs 1 <= k <= group_size={group_size}, got k={k}")
    grouped = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)
    scored = ~grouped.isnan()
    if not ((grouped == 0) | (grouped == 1) | ~scored).all():
        raise ValueError("pass@k advantages need 0/1 rewards (a completion is right or wrong)")
    adv = torch.zeros_like(grouped)
    for p, (row, ok) in enumerate(zip(grouped, scored)):
        n, n_neg = int(ok.sum()), int((row[ok] == 0).sum())
        if n < k:
            continue
        mean = 1 - math.comb(n_neg, k) / math.comb(n, k)
        sigma = math.sqrt(mean * (1 - mean))
        if sigma == 0.0:
            continue
        a_neg = (1 - mean - math.comb(n_neg - 1, k - 1) / math.comb(n - 1, k - 1)) / sigma if n_neg else 0.0
        adv[p] = torch.where(row == 1, row.new_tensor((1 - mean) / sigma), row.new_tensor(a_neg)).masked_fill(~ok, 0.0)
    return adv.view(-1)


def gpg_advantages(rewards: torch.Tensor, group_size: int, *, f_norm: float = 1.0) -> torch.Tensor:
    """GPG's advantage (Chu et al. 2025, arXiv 2504.02546; the loss is objectives/gpg.py):

        A_i = alpha * (r_i - mean(r_group)) / F_norm,       alpha = N / (N - M)

    M = the completions of all-equal groups (advantage 0, no gradient): the token-mean loss divides by all N
    completions' tokens, and alpha scales the batch back up as if only the N - M informative ones were there.
    F_norm = 1 in the paper (no std scaling). verl's compute_gpg_outcome_advantage counts non-zero raw rewards
    instead of informative completions (alpha = N / #{r_i != 0}); the two agree when every all-equal group is all
    zeros and no informative completion has reward 0 (tests/test_trl_verl_parity.py). NaN rewards: left out.
    Args: rewards (N,), groups consecutive. Returns adv (N,).
    """
    adv, zero_std = group_advantages(rewards, group_size, scale="none")
    informative = (~zero_std).sum()
    alpha = rewards.numel() / informative.clamp(min=1)
    return alpha * adv / f_norm


def normalize_then_sum_advantages(rewards_per_func: torch.Tensor, group_size: int,
                                  weights: torch.Tensor | None = None, *, eps: float = 1e-4) -> torch.Tensor:
    """GDPO ("Group reward-Decoupled Normalization Policy Optimization", arXiv 2601.05242) = TRL's
    multi_objective_aggregation="normalize_then_sum".

    With several reward functions, GRPO sums them and normalises the sum: a reward with a large spread drowns
    the others. GDPO normalises each reward function in its group first, sums with the weights, then normalises
    the sum over the batch:

        r~_{i,k} = (r_{i,k} - mean_group(r_k)) / (std_group(r_k) + eps)
        s_i = sum_k w_k r~_{i,k}            A_i = (s_i - mean_batch(s)) / (std_batch(s) + eps)

    As TRL 1.16: sample stds, eps = 1e-4; a function's NaN (it does not apply) is left out of its group's stats and
    adds 0 to s_i; a completion no function scored is left out of the batch stats and gets A = 0. minigrpo also
    gives exactly 0 to the members of groups where every function's rewards are all equal (no signal; TRL leaves
    a rounding residue there). verl's compute_gdpo_outcome_advantage whitens the sum over tokens instead.

    Args: rewards_per_func (N, K); weights (K,) (None = 1). Returns adv (N,).
    """
    r = rewards_per_func if rewards_per_func.is_floating_point() else rewards_per_func.float()
    N, K = r.shape
    weights = torch.ones(K, dtype=r.dtype) if weights is None else torch.as_tensor(weights, dtype=r.dtype)
    grouped = r.view(-1, group_size, K)  # (P, G, K)
    flat = grouped.transpose(1, 2).reshape(-1, group_size)  # (P*K, G): one row per (prompt, function)
    constant = _all_equal(flat, 1).view(-1, 1, K)  # (P, 1, K)
    normalised = (grouped - grouped.nanmean(1, keepdim=True)) / (_nan_std(flat, 1, unbiased=True).view(-1, 1, K) + eps)
    normalised = normalised.masked_fill(constant, 0.0)
    summed = (normalised.nan_to_num(0.0) * weights).sum(-1).view(-1)  # (N,)
    unscorable = r.isnan().all(-1)
    summed = summed.masked_fill(unscorable, math.nan)
    adv = (summed - summed.nanmean()) / (_nan_std(summed.view(1, -1), 1, unbiased=True) + eps)
    no_signal = constant.all(-1).repeat_interleave(group_size, dim=1).view(-1)
    return adv.nan_to_num(0.0).masked_fill(no_signal | unscorable, 0.0)


def gfpo_keep(rewards: torch.Tensor, lengths: torch.Tensor, group_size: int, k: int, metric: str = "length"
              ) -> torch.Tensor:
    """GFPO's filter (Shrivastava et al. 2025, "Sample More to Think Less", sec. 3): which k of each group of G
    sampled completions to train on.

        metric="length"            the k shortest:                       score_i = -|o_i|
        metric="token_efficiency"  the k with the most reward per token: score_i = r_i / |o_i|

    The advantages are then computed on the k kept completions alone, with their own mean and std (GRPO on a
    group of k); the G - k others are dropped (advantage 0). Sampling more and keeping the short ones is how GFPO
    curbs length growth without a length penalty in the reward. Ties go to the earlier completion; the kept ones
    stay in their sampled order. A NaN reward (unscorable) ranks last under token_efficiency.

    Args:
        rewards: (N,) grouped consecutively by group_size. lengths: (N,) completion tokens.
    Returns:
        keep: (N,) bool, exactly k True per group.
    """
    if metric not in ("length", "token_efficiency"):
        raise ValueError(f"metric must be 'length' or 'token_efficiency', got {metric!r}")
    if not 1 <= k <= group_size:
        raise ValueError(f"k must be in 1..{group_size}, got {k}")
    lengths = lengths.to(torch.float64).view(-1, group_size)  # (num_prompts, G)
    if metric == "length":
        score = -lengths
    else:
        score = (rewards.to(torch.float64).view(-1, group_size) / lengths.clamp(min=1)).nan_to_num(-math.inf)
    order = torch.sort(score, dim=1, descending=True, stable=True).indices  # best first, ties: earlier first
    keep = torch.zeros_like(score, dtype=torch.bool).scatter(1, order[:, :k], True)
    return keep.view(-1)



# ---------------------------------------------------------------------------------------------------------
# Baselines that are not the group's mean and std (MaxRL, ReMax, the optimal token baseline)
# ---------------------------------------------------------------------------------------------------------
def maxrl_advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """MaxRL ("Maximum Likelihood Reinforcement Learning", Tajwar, Zeng et al. 2026, arXiv 2602.02710): the group
    mean as baseline, and the mean again as the scale,

        A_i = (r_i - mean(r_group)) / mean(r_group)          (GRPO divides by the std instead)

    With 0/1 rewards the mean is the prompt's pass rate p: the maximum-likelihood gradient of log p is grad p / p,
    so a hard prompt (p small) weighs 1/p, where RL's expected reward (pass@1) weighs every prompt alike and GRPO's
    std weighs 1/sqrt(p(1 - p)), which falls again as p -> 1. The paper's estimator averages the score function
    over the successful samples only, unbiased for the maximum-likelihood objective truncated at order G (G = 1 is
    REINFORCE, G -> infinity exact maximum likelihood); with the mean as a control variate that is the line above
    (as prime-rl's `max_rl` algorithm has it; TRL's docs list a MaxRLTrainer). Meant for rewards >= 0, canonically
    0/1: a group whose mean is <= 0 (every answer wrong: no success to learn from) gets 0, as does an all-equal
    group. NaN rewards: left out of the mean, advantage 0. Args: rewards (N,), groups consecutive. Returns (N,).
    """
    grouped = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)  # (P, G)
    mean = grouped.nanmean(dim=1, keepdim=True)  # (P, 1), the pass rate for 0/1 rewards
    adv = (grouped - mean) / mean.clamp(min=torch.finfo(grouped.dtype).tiny)
    no_signal = ~(mean > 0) | _all_equal(grouped, 1).unsqueeze(1) | grouped.isnan()
    return adv.masked_fill(no_signal, 0.0).view(-1)


def remax_advantages(rewards: torch.Tensor, greedy_rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for Aligning
    Large Language Models", arXiv 2310.10505, Algorithm 1): the baseline of a prompt is the reward of its greedy
    completion, a second sample that costs no critic,

        A_i = r_i - r(greedy completion of prompt(i))

    An estimate of how much better a sample is than what the policy would say without sampling: unbiased (the
    greedy answer does not depend on the sample), no std. It needs no group (G = 1 works), and unlike GRPO's it
    gives a signal to a group whose samples all scored alike when the greedy answer scored otherwise. verl's
    `remax` (compute_remax_outcome_advantage): the same, per token. minigrpo samples the greedy completion with the
    group, one more row per prompt (collect.py). A NaN reward, or a NaN greedy reward: advantage 0.
    Args: rewards (N,), groups consecutive; greedy_rewards (P,), one per prompt. Returns (N,).
    """
    grouped = (rewards if rewards.is_floating_point() else rewards.float()).view(-1, group_size)  # (P, G)
    adv = grouped - greedy_rewards.to(grouped.dtype).view(-1, 1)
    return adv.nan_to_num(nan=0.0).view(-1)


def optimal_token_baseline_advantages(rewards: torch.Tensor, old_logp: torch.Tensor, sum_pi_squared: torch.Tensor,
                                      mask: torch.Tensor, group_size: int, *, policy_tokens_only: bool = False,
                                      handle_zero_tail: bool = True, eps: float = 1e-8) -> torch.Tensor:
    """The optimal token baseline, OTB ("The Optimal Token Baseline: Variance Reduction for Long-Horizon LLM-RL", Li et
    al. 2026, arXiv 2602.07078; verl's `optimal_token_baseline` and, with policy_tokens_only,
    `tir_optimal_token_baseline`): one baseline per token position t of a group, weighted by how much each
    trajectory's gradient could have moved up to t,

        w_{i,j} = 1 - 2 pi_old(o_{i,j}) + sum_v pi_old(v | o_{i,<j})^2     (the squared norm of the logits' score)
        W_{i,t} = sum_{j <= t} w_{i,j}                                      (cumulative path variance)
        B_t     = sum_i G_{i,t} W_{i,t} / (sum_i W_{i,t} + eps)             (over the group's trajectories at t)
        A_{i,t} = G_{i,t} - B_t

    where G_{i,t} is the return from t: r_i at every token, for one outcome reward. Against GRPO: the baseline is
    not one number per group but a weighted mean per position, and it is not divided by a std. Why: the baseline
    that minimises the gradient's variance weighs each sample's return by its squared gradient norm, and long
    rollouts make that norm, hence the variance, explode (the paper's "training collapse"). w is the paper's
    Logit-Gradient Proxy for a token's squared norm, from forward-pass probabilities only: trajectories that were
    uncertain (pi spread over many tokens) weigh more, confident ones (pi(o) near 1, w near 0) less. The per-token
    advantage differs along a completion even with one reward. The paper reports group size 4 matching 32.

    Conventions (verl's): where one trajectory of the group is not empty, its baseline is 0 (its advantage is its
    return); handle_zero_tail: past the second-longest trajectory the longest is alone, and its baseline there is 0
    rather than its own return. policy_tokens_only (the multi-turn, tool form): t counts the policy's own tokens only,
    so a tool's answer neither moves W nor shifts the positions compared across the group; without it t is the
    position in the completion and mask's 0s (tool output) are skipped in place. Unlike verl, a group whose scored
    rewards are all equal — a lone completion among them — gets exactly 0, as in every estimator here (verl leaves
    eps-sized residues, gives a lone trajectory its return and the longest completion's tail its whole return), and
    a NaN reward leaves its trajectory out (advantage 0).

    Args: rewards (N,), groups consecutive; old_logp (N, T) log pi_old of the sampled tokens; sum_pi_squared (N, T)
    sum_v pi_old(v)^2 at each position (logprobs.py computes it in the head's blocks); mask (N, T) 1 on the policy's
    tokens (tool output 0). Returns adv (N, T), 0 off the mask.
    """
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    mask = mask.to(old_logp.dtype) * ~rewards.isnan().unsqueeze(1)  # an unscorable trajectory is left out
    order = None
    if policy_tokens_only:  # each row's policy tokens moved to the left, in order: t counts them
        order = torch.sort((mask == 0).to(torch.int8), dim=1, stable=True).indices  # (N, T), a permutation per row
        old_logp, sum_pi_squared, mask = (x.gather(1, order) for x in (old_logp, sum_pi_squared, mask))
    w = (1 - 2 * old_logp.exp() + sum_pi_squared) * mask  # (N, T)
    weight = w.cumsum(dim=1) * mask  # (N, T) W_{i,t} on the trajectory's tokens
    returns = rewards.nan_to_num(0.0).unsqueeze(1) * mask  # (N, T) G_{i,t}
    P, T = len(rewards) // group_size, mask.shape[1]
    baseline = ((returns * weight).view(P, group_size, T).sum(1)
                / (weight.view(P, group_size, T).sum(1) + eps))  # (P, T)
    baseline = baseline.unsqueeze(1).repeat(1, group_size, 1)  # (P, G, T)
    lengths = mask.sum(1).view(P, group_size)  # (P, G)
    baseline = baseline.masked_fill(((lengths > 0).sum(1) <= 1).view(P, 1, 1), 0.0)  # a lone trajectory: none
    if handle_zero_tail and group_size > 1:
        top2 = lengths.topk(2, dim=1).values  # (P, 2)
        alone = ((lengths == top2[:, :1]).sum(1) == 1) & (top2[:, 0] > top2[:, 1])  # (P,)
        tail = torch.arange(T, device=mask.device) >= top2[:, 1:2]  # (P, T) past the second-longest
        longest = torch.nn.functional.one_hot(lengths.argmax(1), group_size).bool()  # (P, G)
        baseline = baseline.masked_fill(alone.view(P, 1, 1) & longest.unsqueeze(2) & tail.unsqueeze(1), 0.0)
    adv = (returns - baseline.view(-1, T)) * mask  # (N, T)
    adv = adv.masked_fill(_all_equal(rewards.view(P, group_size), 1).repeat_interleave(group_size).unsqueeze(1), 0.0)
    return adv if order is None else torch.zeros_like(adv).scatter(1, order, adv)



# ---------------------------------------------------------------------------------------------------------------
# The table of estimators (verl's `register_adv_est`): one name, one function of the batch's rewards. Config's
# `advantage_estimator` choices, the CLI and the docs read it; an estimator registered from outside trains like
# these. An estimator that needs more than the rewards says so once, in `needs` (ESTIMATOR_NEEDS): the loop then
# samples or computes it, only for that estimator.
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class AdvantageInputs:
    """What an estimator may read: rewards (N,) grouped consecutively by group_size, NaN = unscorable; and what
    only some estimators need (None unless asked for, ESTIMATOR_NEEDS)."""

    rewards: torch.Tensor  # (N,)
    group_size: int
    lengths: torch.Tensor  # (N,) completion tokens, for the estimators that weigh by length
    scale_rewards: str = "group"  # "group", "batch" or "none" (group_advantages' scale)
    std_type: str = "sample"  # "sample" or "population"
    pass_k: int = 4  # k of pass_at_k
    greedy_rewards: torch.Tensor | None = None  # (P,) "greedy_rewards": each prompt's greedy completion's reward
    old_logp: torch.Tensor | None = None  # (N, T) "token_stats": log pi_old of each sampled token ...
    sum_pi_squared: torch.Tensor | None = None  # (N, T) ... sum_v pi_old(v)^2 at its position ...
    mask: torch.Tensor | None = None  # (N, T) ... and the policy's tokens (tool output 0)
    # process supervision (advantage_estimator "process"): the steps of each completion, the outcome the last one
    step_rewards: torch.Tensor | None = None  # (N, K) each step's reward, NaN where a completion has no k-th step
    step_end: torch.Tensor | None = None  # (N, K) long, the token index where each step ends
    num_tokens: int = 0  # T, the width of the completion tensor the (N, T) advantages are for
    prefix_steps: bool = False  # each step's reward the lowest so far (prefix_step_rewards)

    @property
    def token_mask(self) -> torch.Tensor:
        """(N, T_max) 1 on each completion's tokens, for the per-token estimators (REINFORCE++)."""
        return (torch.arange(int(self.lengths.max())) < self.lengths[:, None]).float()


ADVANTAGE_ESTIMATORS: dict[str, Callable[[AdvantageInputs], torch.Tensor]] = {}
ESTIMATOR_NEEDS: dict[str, frozenset[str]] = {}  # name -> what it reads beyond the rewards (AdvantageInputs' notes)
NEEDS = ("greedy_rewards", "token_stats")


def register_advantage(name: str, *, needs: tuple[str, ...] = ()) -> Callable:
    """Decorator: fn(x: AdvantageInputs) -> adv (N,), or (N, T) per token, becomes advantage_estimator `name`.
    needs: "greedy_rewards" (one greedy completion per prompt, sampled and scored with the group), "token_stats"
    (old log-probs, sum pi^2 and the policy's tokens: a per-token estimator)."""
    unknown = set(needs) - set(NEEDS)
    if unknown:
        raise ValueError(f"needs: {', '.join(sorted(unknown))} is not one of {', '.join(NEEDS)}")

    def add(fn):
        ADVANTAGE_ESTIMATORS[name], ESTIMATOR_NEEDS[name] = fn, frozenset(needs)
        return fn

    return add


register_advantage("grpo")(lambda x: group_advantages(x.rewards, x.group_size, scale=x.scale_rewards, std=x.std_type)[0])
register_advantage("rloo")(lambda x: rloo_advantages(x.rewards, x.group_size))
# REINFORCE++ is per token (N, T), the same on every token of a completion: its mean is the completion's advantage
register_advantage("reinforce_plus_plus")(
    lambda x: reinforce_pp_advantages(x.rewards, x.token_mask).sum(-1) / x.lengths.clamp(min=1))
register_advantage("reinforce_plus_plus_baseline")(
    lambda x: reinforce_pp_baseline_advantages(x.rewards, x.group_size, x.token_mask))
register_advantage("opo")(lambda x: opo_advantages(x.rewards, x.group_size, x.lengths))
register_advantage("grpo_passk")(lambda x: grpo_passk_advantages(x.rewards, x.group_size, scale=x.scale_rewards != "none"))
register_advantage("pass_at_k")(lambda x: pass_at_k_advantages(x.rewards, x.group_size, x.pass_k))
register_advantage("gpg")(lambda x: gpg_advantages(x.rewards, x.group_size))
# A = (r - mean) / mean: the pass rate as the scale (prime-rl's name)
register_advantage("max_rl")(lambda x: maxrl_advantages(x.rewards, x.group_size))
# A = r - r(greedy completion of the prompt), sampled with the group
register_advantage("remax", needs=("greedy_rewards",))(
    lambda x: remax_advantages(x.rewards, x.greedy_rewards, x.group_size))
# A_t = G_t - sum_i G_t W_t / sum_i W_t, W_t = sum_{j <= t} (1 - 2 pi_j + sum_v pi_v^2): per token, (N, T), which the
# loss reads as it is (process supervision's shape); the tir_ form counts the policy's tokens only (tools)
register_advantage("optimal_token_baseline", needs=("token_stats",))(
    lambda x: optimal_token_baseline_advantages(x.rewards, x.old_logp, x.sum_pi_squared, x.mask, x.group_size))
register_advantage("tir_optimal_token_baseline", needs=("token_stats",))(
    lambda x: optimal_token_baseline_advantages(x.rewards, x.old_logp, x.sum_pi_squared, x.mask, x.group_size,
                                                policy_tokens_only=True))


@register_advantage("process")
def process_supervision(x: AdvantageInputs) -> torch.Tensor:
    """Process supervision, (N, T) per-token advantages from the batch's step rewards (process_advantages): the
    steps of the function that grades them and, as one more step at the last token, the outcome (collect.py and
    step_rewards.py say how they are gathered); with prefix_steps, each step's reward is first the lowest so far.

    Without step rewards the outcome is the only step, at the last token: every token of a completion gets the
    completion's normalised reward, which is GRPO's advantage with the population std, returned as (N,)."""
    if x.step_rewards is None:
        return group_advantages(x.rewards, x.group_size, std="population")[0]
    steps = prefix_step_rewards(x.step_rewards) if x.prefix_steps else x.step_rewards
    return process_advantages(steps.nan_to_num(0.0), x.step_end, ~steps.isnan(), x.group_size, x.num_tokens)


def compute_advantages(x: AdvantageInputs, estimator: str = "grpo", *, rewards_per_func: torch.Tensor | None = None,
                       reward_weights: list[float] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(adv, zero_std (N,)) of the batch: the estimator's advantages ((N,), or (N, T) for a per-token estimator), or
    GDPO's from each reward function's rewards when rewards_per_func (N, F) is given
    (multi_objective_aggregation="normalize_then_sum"). zero_std marks the groups whose rewards are all equal
    (frac_reward_zero_std), whatever the estimator; for process supervision, the groups where no token's advantage
    differs from 0."""
    if estimator not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"advantage_estimator must be one of {', '.join(ADVANTAGE_ESTIMATORS)}, got {estimator!r}")
    fields = {"greedy_rewards": ("greedy_rewards",), "token_stats": ("old_logp", "sum_pi_squared", "mask")}
    missing = [f for need in ESTIMATOR_NEEDS.get(estimator, ()) for f in fields[need] if getattr(x, f) is None]
    if missing:
        raise ValueError(f"advantage_estimator {estimator!r} needs AdvantageInputs' {', '.join(missing)}")
    rewards = x.rewards if x.rewards.is_floating_point() else x.rewards.float()
    zero_std = _all_equal(rewards.view(-1, x.group_size), 1).repeat_interleave(x.group_size)
    if rewards_per_func is not None:
        return normalize_then_sum_advantages(rewards_per_func, x.group_size, torch.tensor(reward_weights)), zero_std
    adv = ADVANTAGE_ESTIMATORS[estimator](x)
    if estimator == "process" and adv.dim() == 2:  # the steps, not the rewards, vary: no signal = every token at 0
        zero_std = (adv == 0).view(-1, x.group_size * adv.shape[1]).all(1).repeat_interleave(x.group_size)
    return adv, zero_std
