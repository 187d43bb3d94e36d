"""The distribution a sampler with top-k / top-p really draws from, and its log-probabilities.

With top_k > 0 or top_p < 1 a sampler does not draw from the policy's softmax p but from a truncated,
renormalised one: keep the k most likely tokens, then the smallest set of most likely tokens whose probability
reaches top_p (HF's TopKLogitsWarper then TopPLogitsWarper, vLLM's apply_top_k_top_p, in that order), and

    pi_S(v) = p(v) / sum_{u in S} p(u)   for v in S,   0 outside S.

The loss's ratio pi_theta(o) / pi_old(o), the KL to the reference and the sampler-mismatch correction must all be
taken under that distribution, or they are biased: the full softmax's log p(o) is log pi_S(o) + log p(S), and
p(S) < 1 varies from token to token (TRL #6789). So every log-prob here — the old policy's, the reference's and
the current one's — is that of the policy's own truncated sampler: top-k / top-p applied to its own logits,
renormalised. On-policy the old and current policies are the same weights, so their kept sets are the same and
the ratio is exactly 1 in value, as it must be. The kept set is a step function of the logits: it carries no
gradient (the gradient of log pi_S(o) is that of logit_o - logsumexp over S).

The token actually sampled always counts as kept: the trainer recomputes the logits the sampler saw, and at a
float-level tie on the set's edge it could otherwise drop a token the sampler kept (log-prob -inf).
"""

import torch

__all__ = ["truncates", "drop_mask", "truncate_logits"]


def truncates(top_k: int, top_p: float) -> bool:
    """Whether these settings sample from anything but the full softmax."""
    return top_k > 0 or top_p < 1.0


def drop_mask(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """(n, V) True where a sampler with these settings can never draw the token, from logits (n, V) already
    divided by the temperature. Top-k keeps the k largest logits (ties at the k-th kept, as HF does); top-p then
    sorts what is left ascending and drops tokens while the cumulative probability is <= 1 - top_p, always
    keeping the most likely (HF's TopPLogitsWarper)."""
    drop = torch.zeros_like(logits, dtype=torch.bool)
    if top_k > 0 and top_k < logits.shape[-1]:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]  # (n, 1)
        drop = logits < kth
    if top_p < 1.0:
        sorted_logits, sorted_idx = logits.masked_fill(drop, float("-inf")).sort(dim=-1)  # ascending
        sorted_drop = sorted_logits.softmax(dim=-1).cumsum(dim=-1) <= 1 - top_p
        sorted_drop[..., -1] = False  # the most likely token always stays
        drop = drop | sorted_drop.scatter(-1, sorted_idx, sorted_drop)
    return drop


def truncate_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0,
                    keep: torch.Tensor | None = None) -> torch.Tensor:
    """logits (..., V) with the tokens the sampler drops set to -inf, so that log_softmax gives log pi_S. keep:
    token ids (...) that stay whatever the rule says (the sampled tokens). The set is chosen without gradient."""
    if not truncates(top_k, top_p):
        return logits
    with torch.no_grad():
        drop = drop_mask(logits.detach(), top_k, top_p)
        if keep is not None:
            drop.scatter_(-1, keep.unsqueeze(-1), False)
    return logits.masked_fill(drop, float("-inf"))
