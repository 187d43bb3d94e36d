"""Policy objectives of the GRPO family: one file per loss type, each registering itself (registry.py), and
`policy_loss`, the pipeline every loss type goes through, with TRL's names.

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
    dppo_tv     sg[min(rho, C)] A log pi, masked     sum / number of tokens           dppo.py
                where pi - pi_old leaves [-d, d]
    dppo_kl     the same, masked on a binary KL      sum / number of tokens           dppo.py
    dro         A log pi - beta/2 (log rho)^2        sum / number of tokens           dro.py
    kimi        Clip(rho) A - tau (log rho)^2,       sum / number of tokens           kimi.py
                the clip a mask whatever A's sign

    importance_sampling_level   ratio
    -------------------------   ---------------------------------------------------------------
    token                       rho_{i,t} = pi(o_t) / pi_old(o_t)
    sequence                    GSPO: s_i = exp(mean_t log rho_{i,t}), one per sequence    gspo.py
    sequence_token              GSPO-token: value s_i, gradient per token                  gspo.py

Options that choose which tokens learn, for every loss type: `off_policy_mask_threshold` (DeepSeek-V3.2's
off-policy sequence mask, off_policy_mask.py), `top_entropy_quantile` (only the high-entropy tokens, entropy.py),
`token_weights` (the vLLM sampler correction, engine_mismatch.py); and two additions to the loss:
`entropy_coef` (an entropy bonus, entropy.py) and `beta` (KL to a reference, unbiased with
`use_bias_correction_kl`). `delta` (two-sided clipping) is verl's dual-clip `clip_ratio_c` (grpo.py); for DPPO it
is the same option's other use in verl, the cap C of its truncated importance weight (dppo.py).

The pipeline: ratio (per token, or per sequence) -> the loss type's surrogate -> which tokens learn (off-policy
mask, top-entropy tokens, sampler weights) -> KL to the reference -> the loss type's aggregation -> entropy bonus.
Loss types differ only in the surrogate and the aggregation (and their own options); everything else is shared.
A loss type registered from outside (`register_loss`, registry.py) goes through the same pipeline.

`policy_loss` equals TRL 1.16's `GRPOTrainer._compute_loss` in value and gradient for every loss_type and option
TRL has (tests/test_trl_parity.py, tests/test_trl_verl_parity.py), and verl's core_algos for gpg, clip_cov,
kl_cov, dual-clip, dppo_tv, dppo_kl and dro (tests/test_trl_verl_parity.py).
"""

import importlib
import pkgutil

import torch

from ..kl import kl_divergence
from .aggregation import AGGREGATIONS, aggregate, micro_batch_share
from .common import clip_stats, masked_mean
from .entropy import high_entropy_mask
from .gspo import sequence_log_ratio, sequence_token_log_ratio
from .off_policy_mask import off_policy_sequence_mask
from .registry import LOSSES, LossType, Surrogate, SurrogateInputs, get_loss, register_loss

from . import grpo, dapo, dr_grpo, luspo  # noqa: E402,F401 - the table's first rows: GRPO, then each aggregation's own

for _module in pkgutil.iter_modules(__path__):  # every file here registers its loss types: a new file is enough
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["policy_loss", "register_loss", "get_loss", "LOSSES", "AGGREGATIONS", "LossType", "Surrogate", "SurrogateInputs",
           "LOSS_TYPES", "IMPORTANCE_SAMPLING_LEVELS"]

LOSS_TYPES = tuple(LOSSES)  # the built-in loss types, read from the table (tests and docs iterate over them)
IMPORTANCE_SAMPLING_LEVELS = ("token", "sequence", "sequence_token")
NO_CLIP_STATS = {"clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0}


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
    generator: torch.Generator | None = None,
    mini_batch_rows: int | None = None,
    mini_batch_tokens: torch.Tensor | float | None = None,
    dp_size: int = 1,
    **loss_options,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of one batch, and its diagnostics.

    Args:
        logp:      (B, T) log pi_theta of the completion tokens, with gradient.
        old_logp:  (B, T) log pi_old, the policy that sampled them (no gradient).
        adv:       (B,) one advantage per completion, or (B, T) per token (process supervision, the optimal token
                   baseline).
        mask:      (B, T) float, 1 on the tokens the loss acts on (completion tokens the policy sampled), 0 on
                   padding and tool output. Padding positions of the log-prob tensors may hold anything (even
                   -inf): they are zeroed before any arithmetic.
        loss_type: an entry of the table (LOSSES); importance_sampling_level: see the module docstring.
        epsilon, epsilon_high: clip range [1 - epsilon, 1 + epsilon_high]; epsilon_high defaults to the loss
            type's default (cispo: 5.0, its cap eps_max, see cispo.py), else to epsilon.
        delta:     two-sided clipping: cap on the unclipped ratio (INTELLECT-2; verl's dual-clip); None = off, or
                   the loss type's default (dppo: 20, the cap of its truncated importance weight).
        beta, ref_logp, kl_estimator: KL-in-loss, beta * KL(pi || pi_ref) added to every token's loss;
            use_bias_correction_kl weights it by rho (DeepSeek-V3.2's unbiased KL, off_policy_mask.py).
        max_completion_length: L_max, for the "constant" aggregation (dr_grpo).
        num_items_in_batch: token count dividing the "token_sum" losses (dapo, cispo, ...), over all dp_size
            processes; default: this batch's.
        token_weights: (B, T) or (B, 1), no gradient: each token's loss times it, before the KL term and the
            aggregation — the vLLM importance-sampling correction (engine_mismatch.py; TRL's
            `per_token_loss * importance_sampling_ratio`). None = 1.
        off_policy_mask_threshold, sampling_logp: drop negative-advantage completions whose mean
            log pi_sampler - log pi_theta exceeds the threshold (off_policy_mask.py); sampling_logp (B, T),
            default old_logp. None = off.
        entropies: (B, T) per-token entropy of pi_theta; needed by top_entropy_quantile < 1 (only the top fraction
            of tokens by entropy learn) and entropy_coef != 0 (loss - coef * mean entropy, with its gradient).
        generator: for loss types that draw at random (clip_cov; None = torch's global generator, as verl).
        mini_batch_rows, mini_batch_tokens, dp_size: this batch is a micro-batch of a mini-batch of
            mini_batch_rows completions on each of dp_size processes, with mini_batch_tokens loss tokens on all of
            them: the loss returned is its share of the mini-batch's (aggregation.py). None: the batch is whole.
        **loss_options: the loss type's own options by name (e.g. vespo_k_pos=2.0; LossType.options).

    Returns:
        loss: scalar tensor to minimise.
        stats: python floats — clip_ratio/{low,high,region}_mean (0.0 for losses that clip nothing), ratio_mean,
            approx_kl (old -> new policy, CleanRL's diagnostic), kl when beta > 0, the loss type's own (e.g.
            sapo/gate_slope_mean), off_policy_mask/kept_frac (of completions), entropy_mask/kept_frac (of
            tokens), policy_loss (the loss before the entropy bonus).
    """
    entry = get_loss(loss_type)
    _check_inputs(entry, importance_sampling_level, adv, token_weights, beta, ref_logp, entropies,
                  top_entropy_quantile, entropy_coef)
    if epsilon_high is None:
        epsilon_high = epsilon if entry.default_epsilon_high is None else entry.default_epsilon_high
    delta = (entry.default_delta if delta is None else delta) if entry.takes_delta else None
    mask = mask.to(logp.dtype)
    on_token = mask.bool()
    logp, old_logp = torch.where(on_token, logp, 0.0), torch.where(on_token, old_logp, 0.0)  # (B, T), garbage gone
    adv = adv.unsqueeze(-1) if adv.dim() == 1 else adv  # (B, 1) or (B, T)

    # 1. The ratio: per token, or one per sequence (GSPO, gspo.py).
    token_log_ratio = logp - old_logp  # (B, T) log rho_{i,t}, 0 on padding
    log_ratio = {"token": lambda: token_log_ratio,
                 "sequence": lambda: sequence_log_ratio(token_log_ratio, mask),  # (B, 1)
                 "sequence_token": lambda: sequence_token_log_ratio(logp, token_log_ratio, mask)}[importance_sampling_level]()
    ratio = torch.exp(log_ratio)

    # 2. The loss type's surrogate: where the variants differ.
    x = SurrogateInputs(ratio, log_ratio, token_log_ratio, logp, adv, mask, epsilon, epsilon_high, delta,
                        token_weights if entry.folds_token_weights else None, generator, old_logp)
    surrogate = entry.fn(x, entry.make_options(loss_options))
    stats = dict(surrogate.stats)

    # 3. Which tokens learn, and how much (TRL's order); each a no-gradient weight on the per-token loss.
    per_token_loss, learn_mask = _select_tokens(surrogate.per_token_loss, adv, logp, old_logp, mask, sampling_logp,
                                                off_policy_mask_threshold, entropies, top_entropy_quantile, stats)
    if token_weights is not None and not entry.folds_token_weights:
        per_token_loss = per_token_loss * token_weights  # (B, T) or (B, 1)

    # 4. KL to the reference, added to every token's loss.
    if beta != 0.0:
        kl = kl_divergence(logp, torch.where(on_token, ref_logp, 0.0), kl_estimator)  # (B, T)
        if use_bias_correction_kl:
            kl = kl * ratio  # unbiased KL gradient off-policy; rho keeps its gradient
        stats["kl"] = masked_mean(kl.detach(), mask).item()
        per_token_loss = per_token_loss + beta * kl  # (B, 1) + (B, T) broadcasts for GSPO

    # 5. The loss type's aggregation, the entropy bonus over the tokens that learn, a micro-batch's share.
    loss = aggregate(entry.aggregation, per_token_loss, mask, num_items_in_batch, max_completion_length, dp_size)
    if entropy_coef != 0.0:
        stats["policy_loss"] = loss.item()
        loss = loss - entropy_coef * (entropies * learn_mask).sum() / learn_mask.sum().clamp(min=1.0)
    if mini_batch_rows is not None:  # a micro-batch: its share of the mini-batch's loss, on one of dp_size processes
        loss = loss * micro_batch_share(entry.aggregation, mask, mini_batch_rows, mini_batch_tokens, dp_size)

    with torch.no_grad():
        clip_range = surrogate.clip_range
        clipped = NO_CLIP_STATS if clip_range is None else clip_stats(ratio, adv, mask, *clip_range)
        stats.update({key: value for key, value in clipped.items() if key not in surrogate.stats})  # its own win
        stats["ratio_mean"] = masked_mean(ratio, mask).item()
        stats["approx_kl"] = masked_mean(torch.exp(token_log_ratio) - 1 - token_log_ratio, mask).item()
    return loss, stats


def _check_inputs(entry: LossType, level, adv, token_weights, beta, ref_logp, entropies, top_entropy_quantile,
                  entropy_coef) -> None:
    """One-line ValueErrors for inputs the pipeline or the loss type cannot use."""
    if level not in IMPORTANCE_SAMPLING_LEVELS:
        raise ValueError(f"importance_sampling_level must be one of {IMPORTANCE_SAMPLING_LEVELS}, got {level!r}")
    if level not in entry.levels:
        raise ValueError(f"{entry.name} takes importance_sampling_level {', '.join(entry.levels)}, not {level!r}")
    if entry.sequence_advantages_only and adv.dim() != 1:
        raise ValueError(f"{entry.name} needs one advantage per completion, adv of shape (B,)")
    if token_weights is not None and not entry.takes_token_weights:
        raise ValueError(f"token_weights: {entry.name} has no per-token loss to weight")
    if beta != 0.0 and ref_logp is None:
        raise ValueError("beta > 0 needs ref_logp, the reference policy's log-probs")
    if entropies is None and (top_entropy_quantile < 1.0 or entropy_coef != 0.0):
        raise ValueError("top_entropy_quantile < 1 and entropy_coef need entropies, the policy's per-token entropy")


def _select_tokens(per_token_loss, adv, logp, old_logp, mask, sampling_logp, off_policy_mask_threshold, entropies,
                   top_entropy_quantile, stats) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 3: the off-policy sequence mask (off_policy_mask.py) and the top-entropy tokens (entropy.py). Returns
    the weighted per-token loss and the mask of tokens that learn (for the entropy bonus); adds their stats."""
    learn_mask = mask
    if off_policy_mask_threshold is not None:
        sampling_logp = old_logp if sampling_logp is None else torch.where(mask.bool(), sampling_logp, 0.0)
        keep_sequence = off_policy_sequence_mask(adv, logp, sampling_logp, mask, off_policy_mask_threshold)
        per_token_loss = per_token_loss * keep_sequence
        stats["off_policy_mask/kept_frac"] = keep_sequence.mean().item()
    if top_entropy_quantile < 1.0:
        entropy_mask = high_entropy_mask(entropies, mask, top_entropy_quantile).to(mask.dtype)
        per_token_loss = per_token_loss * entropy_mask
        learn_mask = mask * entropy_mask
        stats["entropy_mask/kept_frac"] = masked_mean(entropy_mask, mask).item()
    return per_token_loss, learn_mask
