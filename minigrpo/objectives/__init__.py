"""Policy objectives of the GRPO family, one file per idea, behind one dispatcher with TRL's names.

    loss_type   surrogate                            aggregation                      file
    ---------   ----------------------------------   ------------------------------   ----------------
    grpo        PPO-clip                             mean_i of mean_t                 grpo.py
    bnpo        PPO-clip                             mean over the batch's tokens     grpo.py
    dr_grpo     PPO-clip                             sum / (B * L_max)                dr_grpo.py
    dapo        PPO-clip (use epsilon_high=0.28)     sum / number of tokens           dapo.py
    luspo       PPO-clip (use level "sequence")      mean_i of sum_t (|o_i| x GSPO)   luspo.py
    cispo       sg[min(rho, eps_max)] A log pi       sum / number of tokens           cispo.py
    sapo        soft sigmoid gate                    mean_i of mean_t                 sapo.py
    gmpo        geometric mean of clipped rho        mean_i                           gmpo.py
    vespo       sg[phi(prod_t rho)] A log pi         sum / number of tokens           vespo.py
    gpg         A log pi (no ratio, no clip)         sum / number of tokens           gpg.py
    clip_cov    PPO-clip, high-cov tokens cut out    sum / number of tokens           clip_cov.py
    kl_cov      rho A, |log rho| on high-cov tokens  sum / number of tokens           kl_cov.py

    importance_sampling_level   ratio
    -------------------------   ---------------------------------------------------------------
    token                       rho_{i,t} = pi(o_t) / pi_old(o_t)
    sequence                    GSPO: s_i = exp(mean_t log rho_{i,t}), one per sequence    gspo.py
    sequence_token              GSPO-token: value s_i, gradient per token                  gspo.py

Options that choose which tokens learn, for every loss type: `off_policy_mask_threshold` (DeepSeek-V3.2's
off-policy sequence mask, off_policy_mask.py), `top_entropy_quantile` (only the high-entropy tokens, entropy.py),
`token_weights` (the vLLM sampler correction, engine_mismatch.py); and two additions to the loss:
`entropy_coef` (an entropy bonus, entropy.py) and `beta` (KL to a reference, unbiased with
`use_bias_correction_kl`). `delta` (two-sided clipping) is verl's dual-clip `clip_ratio_c` (grpo.py).

`policy_loss` equals TRL 1.16's `GRPOTrainer._compute_loss` in value and gradient for every loss_type and option
TRL has (tests/test_trl_parity.py, tests/test_parity_round2.py), and verl's core_algos for gpg, clip_cov,
kl_cov and dual-clip (tests/test_parity_round2.py).
"""

import math

import torch

from ..kl import kl_divergence
from .cispo import CISPO_DEFAULT_EPSILON_MAX, cispo_surrogate
from .clip_cov import clip_cov_keep
from .common import clip_stats, masked_mean
from .dapo import dapo_aggregate
from .dr_grpo import dr_grpo_aggregate
from .entropy import high_entropy_mask
from .gmpo import gmpo_surrogate
from .gpg import gpg_surrogate
from .grpo import bnpo_aggregate, clipped_surrogate, grpo_aggregate
from .gspo import sequence_log_ratio, sequence_token_log_ratio
from .kl_cov import kl_cov_penalised, kl_cov_surrogate
from .luspo import luspo_aggregate
from .off_policy_mask import off_policy_sequence_mask
from .sapo import sapo_gate_slope, sapo_surrogate
from .vespo import vespo_surrogate, vespo_weight

__all__ = ["policy_loss", "LOSS_TYPES", "IMPORTANCE_SAMPLING_LEVELS", "CONFIG_OPTIONS"]

LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo", "luspo", "cispo", "sapo", "gmpo", "vespo", "gpg", "clip_cov",
              "kl_cov")
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")
# policy_loss's keyword arguments that are Config fields of the same name (the trainer passes them through)
CONFIG_OPTIONS = ("use_bias_correction_kl", "off_policy_mask_threshold", "top_entropy_quantile", "gmpo_epsilon",
                  "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg", "clip_cov_ratio",
                  "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef", "entropy_coef")
NO_CLIP = (None, None)  # losses that clip nothing log clip ratios of 0 (every loss logs the same keys)


def policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str = "grpo",
    importance_sampling_level: str = "token",
    epsilon: float = 0.2,
    epsilon_high: float | None = None,
    delta: float | None = None,
    beta: float = 0.0,
    ref_logp: torch.Tensor | None = None,
    kl_estimator: str = "k3",
    use_bias_correction_kl: bool = False,
    max_completion_length: int | None = None,
    num_items_in_batch: float | torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
    off_policy_mask_threshold: float | None = None,
    sampling_logp: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
    entropy_coef: float = 0.0,
    sapo_temperature_pos: float = 1.0,
    sapo_temperature_neg: float = 1.05,
    gmpo_epsilon: float = 0.4,
    vespo_k_pos: float = 2.0,
    vespo_lambda_pos: float = 3.0,
    vespo_k_neg: float = 3.0,
    vespo_lambda_neg: float = 2.0,
    clip_cov_ratio: float = 2e-4,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
    kl_cov_ratio: float = 2e-4,
    ppo_kl_coef: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of one batch, and its diagnostics.

    Args:
        logp:      (B, T) log pi_theta of the completion tokens, with gradient.
        old_logp:  (B, T) log pi_old, the policy that sampled them (no gradient).
        adv:       (B,) one advantage per completion, or (B, T) per token (process supervision).
        mask:      (B, T) float, 1 on completion tokens, 0 on padding. Padding positions of the log-prob
                   tensors may hold anything (even -inf): they are zeroed before any arithmetic.
        loss_type, importance_sampling_level: see the module docstring.
        epsilon, epsilon_high: clip range [1 - epsilon, 1 + epsilon_high]; epsilon_high defaults to epsilon.
            For cispo, epsilon_high is the absolute cap eps_max on the weight (TRL's convention); unset, it is
            5.0 (ScaleRL), not TRL's fallback to epsilon, which would cap every weight at 0.2 (see cispo.py).
        delta:     two-sided clipping: cap on the unclipped ratio (INTELLECT-2; verl's dual-clip); None = off.
        beta, ref_logp, kl_estimator: KL-in-loss, beta * KL(pi || pi_ref) added to every token's loss;
            use_bias_correction_kl weights it by rho (DeepSeek-V3.2's unbiased KL, off_policy_mask.py).
        max_completion_length: L_max, required by dr_grpo.
        num_items_in_batch: token count dividing the token-sum losses (dapo, cispo, vespo, gpg, clip_cov,
            kl_cov); default: this batch's.
        token_weights: (B, T) or (B, 1), no gradient: each token's loss is multiplied by it before the KL term
            and the aggregation — the vLLM importance-sampling correction (engine_mismatch.py; TRL's
            `per_token_loss * importance_sampling_ratio`); vespo folds it into its sequence weight instead.
            None = 1. Not for gmpo (no per-token loss).
        off_policy_mask_threshold, sampling_logp: drop negative-advantage completions whose mean
            log pi_sampler - log pi_theta exceeds the threshold (off_policy_mask.py); sampling_logp (B, T) is the
            sampler's log-probs (vLLM's), default old_logp. None = off.
        entropies: (B, T) per-token entropy of pi_theta; needed by top_entropy_quantile < 1 (the policy loss
            keeps only the top fraction of tokens by entropy) and entropy_coef != 0 (loss - coef * mean entropy;
            for its gradient the entropies must carry theirs). See entropy.py.
        sapo_temperature_pos/neg: SAPO's gate temperatures. gmpo_epsilon: GMPO's log-space clip range.
        vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg: VESPO's kernel (vespo.py).
        clip_cov_ratio, clip_cov_lb, clip_cov_ub: Clip-Cov (clip_cov.py); kl_cov_ratio, ppo_kl_coef: KL-Cov.
        generator: for Clip-Cov's random pick (None = torch's global generator, as verl).

    Returns:
        loss: scalar tensor to minimise.
        stats: python floats — clip_ratio/{low,high,region}_mean (0.0 for losses that clip nothing), ratio_mean,
            approx_kl (old -> new policy, CleanRL's diagnostic), kl when beta > 0, and per option:
            sapo/gate_slope_mean (SAPO's mean gate slope, 1 = the plain policy gradient), vespo/phi_seq_mean,
            clip_cov/detached_frac, kl_cov/penalised_frac, off_policy_mask/kept_frac (of completions),
            entropy_mask/kept_frac (of tokens), policy_loss (the loss before the entropy bonus).
    """
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {LOSS_TYPES}, got {loss_type!r}")
    if importance_sampling_level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(
            f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {importance_sampling_level!r}"
        )
    if beta != 0.0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp, the reference policy's log-probs")
    if loss_type == "gmpo" and (adv.dim() != 1 or importance_sampling_level != "token"):
        raise ValueError("gmpo builds its own sequence ratio: it needs adv of shape (B,) and importance_sampling_level="
                         "'token'")
    if loss_type == "gmpo" and token_weights is not None:
        raise ValueError("token_weights: gmpo has no per-token loss to weight")
    if loss_type == "dr_grpo" and max_completion_length is None:
        raise ValueError("loss_type='dr_grpo' needs max_completion_length (its constant normaliser)")
    if entropies is None and (top_entropy_quantile < 1.0 or entropy_coef != 0.0):
        raise ValueError("top_entropy_quantile < 1 and entropy_coef need entropies, the policy's per-token entropy")
    if epsilon_high is None:
        epsilon_high = CISPO_DEFAULT_EPSILON_MAX if loss_type == "cispo" else epsilon
    mask = mask.to(logp.dtype)
    on_token = mask.bool()
    # Padding may hold garbage (even -inf): zero it once, so it cannot reach the loss or the gradient as NaN.
    logp = torch.where(on_token, logp, 0.0)  # (B, T)
    old_logp = torch.where(on_token, old_logp, 0.0)
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # (B, 1) or (B, T)

    # 1. The ratio: per token, or one per sequence (GSPO).
    token_log_ratio = logp - old_logp  # (B, T) log rho_{i,t}, 0 on padding
    if importance_sampling_level == "sequence":
        log_ratio = sequence_log_ratio(token_log_ratio, mask)  # (B, 1)
    elif importance_sampling_level == "sequence_token":
        log_ratio = sequence_token_log_ratio(logp, token_log_ratio, mask)  # (B, T)
    else:
        log_ratio = token_log_ratio
    ratio = torch.exp(log_ratio)

    # 2. The surrogate, per token ((B, 1) per sequence for GSPO's ratio and GMPO), and the range its clip
    #    diagnostics count against. This is where the loss types differ.
    stats: dict[str, float] = {}
    clip_range = (1 - epsilon, 1 + epsilon_high)
    if loss_type == "cispo":
        per_token_loss = cispo_surrogate(ratio, adv, logp, epsilon_high)
        clip_range = (0.0, epsilon_high)  # CISPO only caps the weight from above (TRL's cispo_clip_ratio)
    elif loss_type == "sapo":
        per_token_loss = sapo_surrogate(ratio, adv, sapo_temperature_pos, sapo_temperature_neg)
        clip_range = NO_CLIP
        slope = sapo_gate_slope(ratio, adv, sapo_temperature_pos, sapo_temperature_neg)
        stats["sapo/gate_slope_mean"] = masked_mean(slope.detach(), mask).item()
    elif loss_type == "gmpo":
        per_token_loss = gmpo_surrogate(token_log_ratio, adv, mask, gmpo_epsilon)  # (B, 1), one per sequence
        clip_range = (math.exp(-gmpo_epsilon), math.exp(gmpo_epsilon))  # log-ratios clipped at ±gmpo_epsilon
    elif loss_type == "vespo":
        phi = vespo_weight(token_log_ratio, adv, mask, token_weights, vespo_k_pos, vespo_lambda_pos, vespo_k_neg,
                           vespo_lambda_neg)  # (B, 1)
        per_token_loss = vespo_surrogate(phi, adv, logp)
        token_weights = None  # already inside phi
        clip_range = NO_CLIP
        stats["vespo/phi_seq_mean"] = masked_mean(phi, mask).item()
    elif loss_type == "gpg":
        per_token_loss = gpg_surrogate(adv, logp)
        clip_range = NO_CLIP
    elif loss_type == "kl_cov":
        penalised = kl_cov_penalised(adv, logp, mask, kl_cov_ratio)  # (B, T)
        per_token_loss = kl_cov_surrogate(ratio, adv, log_ratio, penalised, ppo_kl_coef)
        clip_range = NO_CLIP
        stats["kl_cov/penalised_frac"] = masked_mean(penalised, mask).item()
    else:  # grpo, bnpo, dr_grpo, dapo, luspo, clip_cov: PPO-clip
        per_token_loss = clipped_surrogate(ratio, adv, epsilon, epsilon_high, delta)
        if loss_type == "clip_cov":
            keep = clip_cov_keep(-ratio * adv, -torch.clamp(ratio, 1 - epsilon, 1 + epsilon_high) * adv, adv, logp,
                                 mask, clip_cov_ratio, clip_cov_lb, clip_cov_ub, generator)  # (B, T)
            per_token_loss = per_token_loss * keep
            stats["clip_cov/detached_frac"] = masked_mean(1 - keep, mask).item()

    # 3. Which tokens learn, and how much: the off-policy sequence mask, the top-entropy tokens, the sampler
    #    correction (TRL's order). Each is a no-gradient weight on the per-token loss.
    if off_policy_mask_threshold is not None:
        sampling_logp = old_logp if sampling_logp is None else torch.where(on_token, sampling_logp, 0.0)
        keep_sequence = off_policy_sequence_mask(adv, logp, sampling_logp, mask, off_policy_mask_threshold)
        per_token_loss = per_token_loss * keep_sequence
        stats["off_policy_mask/kept_frac"] = keep_sequence.mean().item()
    effective_mask = mask  # the tokens the policy loss acts on (for the entropy bonus)
    if top_entropy_quantile < 1.0:
        entropy_mask = high_entropy_mask(entropies, mask, top_entropy_quantile).to(mask.dtype)
        per_token_loss = per_token_loss * entropy_mask
        effective_mask = mask * entropy_mask
        stats["entropy_mask/kept_frac"] = masked_mean(entropy_mask, mask).item()
    if token_weights is not None:
        per_token_loss = per_token_loss * token_weights  # (B, T) or (B, 1)

    # 4. KL to the reference, added to every token's loss.
    if beta != 0.0:
        kl = kl_divergence(logp, torch.where(on_token, ref_logp, 0.0), kl_estimator)  # (B, T)
        if use_bias_correction_kl:
            kl = kl * ratio  # unbiased KL gradient off-policy; rho keeps its gradient
        stats["kl"] = masked_mean(kl.detach(), mask).item()
        per_token_loss = per_token_loss + beta * kl  # (B, 1) + (B, T) broadcasts for GSPO

    # 5. Aggregation: how the per-token losses become one number.
    if loss_type in ("grpo", "sapo", "gmpo"):
        loss = grpo_aggregate(per_token_loss, mask)
    elif loss_type == "bnpo":
        loss = bnpo_aggregate(per_token_loss, mask)
    elif loss_type == "dr_grpo":
        loss = dr_grpo_aggregate(per_token_loss, mask, max_completion_length)
    elif loss_type == "luspo":
        loss = luspo_aggregate(per_token_loss, mask)
    else:  # dapo, cispo, vespo, gpg, clip_cov, kl_cov
        loss = dapo_aggregate(per_token_loss, mask, num_items_in_batch)

    # 6. The entropy bonus: - coef * mean entropy over the tokens the loss acts on, whatever the aggregation.
    if entropy_coef != 0.0:
        stats["policy_loss"] = loss.item()
        loss = loss - entropy_coef * (entropies * effective_mask).sum() / effective_mask.sum().clamp(min=1.0)

    with torch.no_grad():
        if clip_range is NO_CLIP:
            stats.update({"clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0})
        else:
            stats.update(clip_stats(ratio, adv, mask, *clip_range))
        stats["ratio_mean"] = masked_mean(ratio, mask).item()
        stats["approx_kl"] = masked_mean(torch.exp(token_log_ratio) - 1 - token_log_ratio, mask).item()
    return loss, stats
