"""Per-token log-probabilities of the completion tokens under a model — the log pi(o_t | q, o_<t) of the loss.

One forward pass over prompt + completion. Only the last T + 1 positions' logits are computed
(`logits_to_keep`): the prompt's own predictions are never needed. log pi(o_t) is taken as
logit[o_t] - logsumexp(logits), which never materialises a (B, T, V) log-softmax tensor beside the logits.
Logits are divided by the sampling temperature first, so that log pi is the log-prob of the distribution
the tokens were actually sampled from (TRL does the same).
"""

import torch


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns logp (B, T) and, if asked, the per-token entropy (B, T) of the policy (no gradient).

    prompt_ids/prompt_mask: (B, P) left-padded; completion_ids/completion_mask: (B, T) right-padded.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + T)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    # Positions count real tokens only, so a left-padded prompt sees the same positions as in generate().
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    T = completion_ids.shape[1]
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=T + 1
    ).logits  # (B, T + 1, V)
    logits = logits[:, :-1].float() / temperature  # (B, T, V): position t predicts completion token t
    token_logits = logits.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    logp = token_logits - torch.logsumexp(logits, dim=-1)  # (B, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            entropy = torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)  # H = logZ - E[logit]
    return logp, entropy
