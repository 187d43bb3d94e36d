"""Off-policy sequence masking and the unbiased KL — DeepSeek-V3.2 (DeepSeek-AI 2025, arXiv 2512.02556, sec. 3).

A completion sampled by an older policy (or by an inference engine that disagrees with the trainer) teaches the
current one badly where the two differ most, and it hurts most when the advantage is negative: pushing down
tokens the current policy no longer produces is noise. DeepSeek-V3.2 drops such completions (eq. 9 as TRL cites
it, TRL's off_policy_mask_threshold = delta):

    KL_i  = 1/|o_i| sum_t ( log pi_sampler(o_{i,t}) - log pi_theta(o_{i,t}) )     (pi_theta detached)
    M_i   = 0 if A_i < 0 and KL_i > delta, else 1;       l_{i,t} <- M_i * l_{i,t}

pi_sampler is the policy that produced the tokens: vLLM's log-probs when it sampled, else pi_old. A token the
sampler gave no log-prob for (NaN) adds 0 to KL_i, as in TRL.

Unbiased KL (TRL's use_bias_correction_kl): the k3 KL term of GRPO is estimated with samples of pi_old, not of
pi_theta; weighting it by the importance ratio, beta * rho_{i,t} * KL_{i,t}, makes its gradient the gradient of
the reverse KL(pi_theta || pi_ref) even off-policy. The ratio keeps its gradient: on-policy (rho = 1) the value
is unchanged but the gradient is not. That is one line in `policy_loss`.
"""

import torch


@torch.no_grad()
def off_policy_sequence_mask(adv: torch.Tensor, logp: torch.Tensor, sampling_logp: torch.Tensor, mask: torch.Tensor,
                             threshold: float) -> torch.Tensor:
    """M: (B, 1) float (adv's shape when adv is (B, T)), 1 = keep. adv (B, 1) or (B, T); logp, sampling_logp,
    mask (B, T), logp and sampling_logp 0 (or anything finite) on padding."""
    kl = torch.nan_to_num(sampling_logp - logp, nan=0.0)  # (B, T)
    mean_kl = (kl * mask).sum(-1, keepdim=True) / mask.sum(-1, keepdim=True).clamp(min=1.0)  # (B, 1)
    return ((adv >= 0) | (mean_kl <= threshold)).to(mask.dtype)
