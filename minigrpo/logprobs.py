"""Per-token log-probabilities of the completion tokens under a model — the log pi(o_t | q, o_<t) of the loss.

A forward pass over prompt + completion; logits are computed only where they predict a completion token
(the prompt's own predictions are never needed). log pi(o_t) is taken as
logit[o_t] - logsumexp(logits), which never materialises a (B, T, V) log-softmax tensor beside the logits.
Logits are divided by the sampling temperature first, so that log pi is the log-prob of the distribution
the tokens were actually sampled from (TRL does the same).

Padding costs no compute: completions in a group differ a lot in length (a short answer, a long scratchpad),
and a batch padded to its longest row spends much of its forward and backward on pad tokens. So rows are
sorted by length and run in a few chunks of similar length, each trimmed to its own longest prompt and
completion (`length_chunks`). Pad positions are masked either way, so the log-probs are the same as for one
padded batch (up to float rounding); positions outside the completion mask come back as 0.

And each prompt is computed once, not once per completion: the G completions of a group share its prompt, so
the distinct prompts run first, in one forward pass for all chunks (`_prompt_forward`), and the completions of
each chunk attend to their prompt's keys and values (`_logprobs`).
"""

import torch
import torch.nn.functional as F
from transformers import DynamicCache


def completion_logprobs(
    model,
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    completion_ids: torch.Tensor,
    completion_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    trim_padding: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns logp (B, T) and, if asked, the per-token entropy (B, T) of the policy (no gradient).

    prompt_ids/prompt_mask: (B, P) left-padded; completion_ids/completion_mask: (B, T) right-padded.
    trim_padding=False runs the whole padded batch in one forward pass (the simple way; same numbers).
    """
    if not trim_padding:
        return _logprobs_padded(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature, with_entropy)
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    prompt_logits, prompt_cache, which = _prompt_forward(model, prompt_ids, prompt_mask)
    chunks, inverse = trimmed_chunks(prompt_mask, completion_mask)
    parts = []
    for idx, p, t in chunks:
        logp, entropy = _logprobs(
            model, prompt_logits, prompt_cache, which[idx], prompt_mask[idx, P - p:], completion_ids[idx, :t],
            completion_mask[idx, :t], temperature, with_entropy,
        )
        mask = completion_mask[idx, :t]
        parts.append((F.pad(logp * mask, (0, T - t)), None if entropy is None else F.pad(entropy * mask, (0, T - t))))
    logp = torch.cat([lp for lp, _ in parts])[inverse]  # (B, T)
    entropy = torch.cat([e for _, e in parts])[inverse] if with_entropy else None
    return logp, entropy


def trimmed_chunks(prompt_mask: torch.Tensor, completion_mask: torch.Tensor) -> tuple[list, torch.Tensor]:
    """The batch split by `length_chunks`: [(idx, p, t)] per chunk — its rows, its longest prompt p and longest
    completion t (keep a chunk's last p prompt columns, prompts being left-padded, and its first t completion
    columns) — and `inverse`, which puts rows concatenated chunk by chunk back in the batch's order."""
    P, T = prompt_mask.shape[1], completion_mask.shape[1]
    device = prompt_mask.device
    # Real extent of each row: prompts end at column P (left-padded), completions start at column 0.
    prompt_lengths = (prompt_mask.ne(0) * torch.arange(P, 0, -1, device=device)).amax(1).tolist()
    completion_lengths = (completion_mask.ne(0) * torch.arange(1, T + 1, device=device)).amax(1).tolist()
    chunks, order = [], []
    for rows in length_chunks(prompt_lengths, completion_lengths):
        p = max(max(prompt_lengths[i] for i in rows), 1)
        t = max(max(completion_lengths[i] for i in rows), 1)
        chunks.append((torch.tensor(rows, device=device), p, t))
        order += rows
    return chunks, torch.tensor(order, device=device).argsort()


def length_chunks(prompt_lengths: list[int], completion_lengths: list[int], chunk_cost: int = 64) -> list[list[int]]:
    """Rows grouped into chunks of similar length, so that each chunk can be trimmed to its longest row.

    Rows are sorted by completion length; a chunk of rows i..j-1 costs (j - i) * (longest prompt + longest
    completion) tokens of compute, plus `chunk_cost` tokens for the extra forward call. The split with the least
    total cost is found by dynamic programming: best[j] = min_i best[i] + cost(i, j).
    (chunk_cost 64 was the fastest of 64 / 128 / 256 / 512 on the shipped model on a CPU, forward + backward.)
    """
    order = sorted(range(len(completion_lengths)), key=lambda i: (completion_lengths[i], prompt_lengths[i]))
    best, cut = [0] + [float("inf")] * len(order), [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        longest_prompt = 0
        for i in range(j - 1, -1, -1):  # chunk = sorted rows i..j-1; its longest completion is row j-1's
            longest_prompt = max(longest_prompt, prompt_lengths[order[i]])
            cost = best[i] + chunk_cost + (j - i) * (longest_prompt + completion_lengths[order[j - 1]])
            if cost < best[j]:
                best[j], cut[j] = cost, i
    chunks, j = [], len(order)
    while j > 0:
        chunks.append(order[cut[j]:j])
        j = cut[j]
    return chunks[::-1]


def _prompt_forward(model, prompt_ids, prompt_mask):
    """The distinct prompts of a batch (B, P), run once. Rows that share a prompt (the G completions of a group)
    share its forward pass: returns the last-position logits (U, V) and the KV cache (U, ...) of the U distinct
    prompts, and which[b], the distinct prompt of row b."""
    prompts, which = torch.unique(prompt_ids, dim=0, return_inverse=True)  # (U, P), (B,)
    first = torch.zeros(len(prompts), dtype=torch.long, device=prompt_ids.device).scatter_(
        0, which.flip(0), torch.arange(len(which) - 1, -1, -1, device=prompt_ids.device))  # a row of each prompt
    cache = DynamicCache(config=model.config)
    position_ids = (prompt_mask[first].cumsum(dim=1) - 1).clamp(min=0)  # real tokens only, as in generate()
    logits = model(input_ids=prompts, attention_mask=prompt_mask[first], position_ids=position_ids,
                   past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # (U, V)
    return logits, cache, which


def _logprobs(model, prompt_logits, prompt_cache, which, prompt_mask, completion_ids, completion_mask, temperature,
              with_entropy):
    """One chunk: completions (B, T) on top of their prompts' keys and values. Row b picks prompt which[b] from
    the cache, keeping its last p columns (prompt_mask is (B, p): the chunk's prompts, left padding trimmed).
    Indexing is differentiable, so the gradient of every completion flows into its prompt's activations."""
    p = prompt_mask.shape[1]
    cache = DynamicCache(config=model.config)
    for layer_idx, prompt_layer in enumerate(prompt_cache.layers):
        cache.update(prompt_layer.keys[which, :, -p:], prompt_layer.values[which, :, -p:], layer_idx)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)  # (B, p + T)
    position_ids = prompt_mask.sum(dim=1, keepdim=True) + torch.arange(completion_ids.shape[1], device=prompt_mask.device)
    completion_logits = model(input_ids=completion_ids, attention_mask=attention_mask, position_ids=position_ids,
                              past_key_values=cache, use_cache=True).logits  # (B, T, V)
    # The prompt's last position predicts completion token 0; completion position t predicts token t + 1.
    # Taken apart and joined as log-probs (B, T), not as logits: with a 152k vocabulary, joining the logits would
    # copy a (B, T, V) tensor forward and backward.
    first = _token_logprobs(prompt_logits[which].unsqueeze(1), completion_ids[:, :1], temperature, with_entropy)
    rest = _token_logprobs(completion_logits[:, :-1], completion_ids[:, 1:], temperature, with_entropy)
    logp = torch.cat([first[0], rest[0]], dim=1)  # (B, T)
    return logp, torch.cat([first[1], rest[1]], dim=1) if with_entropy else None


def _logprobs_padded(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature, with_entropy):
    """One forward pass over a (B, P + T) batch."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + T)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    # Positions count real tokens only, so a left-padded prompt sees the same positions as in generate().
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    T = completion_ids.shape[1]
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=T + 1
    ).logits  # (B, T + 1, V)
    return _token_logprobs(logits[:, :-1], completion_ids, temperature, with_entropy)  # position t predicts token t


def _token_logprobs(logits, completion_ids, temperature, with_entropy):
    """log pi(o_t) = logit[o_t] - logsumexp(logits), and optionally the entropy, from logits (B, T, V)."""
    logits = logits.float()
    if temperature != 1.0:  # dividing by 1 would still copy the (B, T, V) logits
        logits = logits / temperature
    log_z = torch.logsumexp(logits, dim=-1)  # (B, T)
    logp = logits.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1) - log_z  # (B, T)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            entropy = log_z - (torch.softmax(logits, dim=-1) * logits).sum(-1)  # H = logZ - E[logit]
    return logp, entropy
