"""Per-token log-probabilities of the completion tokens under a model — the log pi(o_t | q, o_<t) of the loss.

The whole idea is `plain_completion_logprobs`: one forward pass over prompt + completion, the logits at the
positions that predict a completion token (position P + t - 1 predicts token t), divided by the sampling
temperature (so that log pi is the log-prob of the distribution the tokens were sampled from; TRL does the
same), then log_softmax and gather. The rest of this file computes the same numbers faster and in less memory:

1. The head in blocks of tokens (`head_logprobs`). The logits are a (tokens x vocabulary) tensor: with
   Qwen2.5's 151,936-token vocabulary, 8 completions x 512 tokens are 2.5 GB per float32 copy, and the plain
   path keeps several copies for backward. Here the model body returns the final hidden states (tokens x hidden,
   896 wide at Qwen2.5-0.5B, 170x smaller) and the output head runs over `block_tokens` positions at a time;
   backward recomputes a block's logits (`ChunkedHeadLogprobs`), so no logits larger than one block ever
   exist. Only real completion tokens go through the head, never padding.
2. Padding costs no compute in the body either: completions in a group differ a lot in length, and a batch
   padded to its longest row spends much of its forward and backward on pad tokens. So rows are sorted by
   length and run in a few groups of similar length, each trimmed to its own longest prompt and completion
   (`length_chunks`). Pad positions are masked either way, so the numbers are the same.
3. Each prompt is computed once, not once per completion (a shared prefix): the G completions of a group share
   its prompt, so the distinct prompts run first, in one forward pass (`_prompt_forward`), and the completions
   attend to their prompt's keys and values (`_completion_hidden_on_prompts`). Backward sums each prompt's
   gradient over its G completions, as the plain path does row by row. With prompts of ~200 tokens and
   completions of ~500 that is a quarter of the training pass's matrix multiplies and activations saved at
   G = 8. Under gradient checkpointing too: the caches here write once (`_RecordedPrompt`) or only read
   (`_SharedPrompt`), so backward's replay of a checkpointed block reads what its forward read. Models with
   sliding-window layers, and `share_prompts=False` (Config.shared_prefix), run prompt + completion in one pass
   per length group (`_completion_hidden_one_pass`): the plain reference the tests compare with.

With top_k > 0 or top_p < 1 every path takes the log-probs of the truncated distribution the sampler drew
from (truncation.py): the tokens it drops are masked out of each position's softmax, on the policy's own logits.

Positions outside the completion mask come back as 0 on every path.
"""

import contextlib

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer
from transformers.modeling_layers import GradientCheckpointingLayer

from .generation.kv_cache import cache_argument
from .loading.models import AdapterDisabled, is_lora
from .truncation import truncate_logits, truncates

__all__ = ["plain_completion_logprobs", "completion_logprobs", "LogprobForward", "head_logprobs", "ChunkedHeadLogprobs",
           "trimmed_chunks", "length_chunks", "BLOCK_ELEMENTS"]

# A block of the head holds at most this many logits (block_tokens x vocabulary): 2^25 float32 = 128 MiB, i.e.
# 220 tokens at Qwen2.5's vocabulary, all tokens at once for a small one. (Head alone, forward + backward of
# 2,048 tokens at Qwen2.5-0.5B's shape, one CPU thread: 110 tokens 33 s CPU, 220 31 s, 512 29 s, peak 0.73 / 0.92 /
# 1.43 GB; plain logits 35-39 s, 5.9 GB.)
BLOCK_ELEMENTS = 2**25

# Config fields of architectures that change the logits after the head (Gemma 2's soft-capping, Cohere's and
# Granite's scales): those models take the plain path.
_LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


# ---------------------------------------------------------------------------------------------------------
# The whole idea
# ---------------------------------------------------------------------------------------------------------
def plain_completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, *,
                              temperature: float = 1.0, with_entropy: bool = False, entropy_grad: bool = False,
                              top_k: int = 0, top_p: float = 1.0, with_sum_pi_squared: bool = False):
    """log pi(o_t | q, o_<t) (B, T) and, if asked, the policy's entropy at each position (B, T; no gradient unless
    entropy_grad, for an entropy bonus in the loss); with_sum_pi_squared: a third output, sum_v pi_v^2 at each
    position (B, T; no gradient), which the optimal token baseline reads (advantages.py).

    prompt_ids/prompt_mask: (B, P) left-padded; completion_ids/completion_mask: (B, T) right-padded.
    One forward pass over the padded (B, P + T) batch, log_softmax over the whole vocabulary (over what top_k /
    top_p keep of it, the sampled token always kept: truncation.py), gather.
    """
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + T)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    # Positions count real tokens only, so a left-padded prompt sees the same positions as in generate().
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)
    T = completion_ids.shape[1]
    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                   logits_to_keep=T + 1).logits[:, :-1]  # (B, T, V): position P + t - 1 predicts token t
    logits = truncate_logits(logits.float() / temperature, top_k, top_p, keep=completion_ids)
    logp_all = logits.log_softmax(dim=-1)  # (B, T, V); -inf where the sampler drops a token
    logp = logp_all.gather(-1, completion_ids.unsqueeze(-1)).squeeze(-1)  # (B, T)
    mask = completion_mask.float()
    entropy = None
    if with_entropy:  # H = -sum_v p_v log p_v, a dropped token (p_v = 0) adding 0
        finite = logp_all.masked_fill(logp_all.isinf(), 0.0) if truncates(top_k, top_p) else logp_all
        entropy = -(logp_all.exp() * finite).sum(-1) * mask
        entropy = entropy if entropy_grad else entropy.detach()
    if with_sum_pi_squared:
        return logp * mask, entropy, logp_all.exp().square().sum(-1).detach() * mask
    return logp * mask, entropy


# ---------------------------------------------------------------------------------------------------------
# The same numbers, faster
# ---------------------------------------------------------------------------------------------------------
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
    block_tokens: int | None = None,
    entropy_grad: bool = False,
    share_prompts: bool = True,
    one_pass: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    with_sum_pi_squared: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Returns logp (B, T) and, if asked, the per-token entropy (B, T) of the policy (no gradient): the numbers of
    `plain_completion_logprobs` (within float rounding), computed as the module docstring says.

    prompt_ids/prompt_mask: (B, P) left-padded; completion_ids/completion_mask: (B, T) right-padded.
    trim_padding=False is the plain path. block_tokens: tokens per block of the head (default: BLOCK_ELEMENTS /
    vocabulary). entropy_grad: the entropy with its gradient (an entropy bonus, entropy_coef), which only the
    plain path has: full logits, so the memory the head saves is spent. share_prompts=False: each row runs its own
    prompt (the same numbers, G times the prompt's compute; see the module docstring, 3). one_pass: the whole batch
    in one call of the decoder, untrimmed (sharded training makes the same calls on every process: ddp_fsdp.py).
    top_k, top_p: the sampler's truncation; the log-probs and entropies are those of the distribution it drew from.
    with_sum_pi_squared: a third output, sum_v pi_v^2 at each position (B, T), computed in the head's blocks like the
    entropy (never a tokens x vocabulary tensor); without gradient only (the optimal token baseline's old policy).
    """
    decoder, head, adapter_off = _decoder_and_head(model)
    if not trim_padding or head is None or entropy_grad:
        return plain_completion_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask,
                                         temperature=temperature, with_entropy=with_entropy or entropy_grad,
                                         entropy_grad=entropy_grad, top_k=top_k, top_p=top_p,
                                         with_sum_pi_squared=with_sum_pi_squared)
    with adapter_off:
        hidden = completion_hidden_states(decoder, model.config, prompt_ids, prompt_mask, completion_ids,
                                          completion_mask, share_prompts=share_prompts, one_pass=one_pass)  # (B, T, H)
        on_token = completion_mask.bool()  # only real tokens go through the head
        if block_tokens is None:
            block_tokens = max(1, BLOCK_ELEMENTS // head.out_features)
        token_logp, token_entropy, *token_sum_pi_squared = head_logprobs(
            hidden[on_token], head.weight, completion_ids[on_token], temperature=temperature, with_entropy=with_entropy,
            block_tokens=block_tokens, top_k=top_k, top_p=top_p,
            with_sum_pi_squared=with_sum_pi_squared)  # (N,), N real tokens
    logp = token_logp.new_zeros(completion_ids.shape).masked_scatter(on_token, token_logp)  # (B, T)
    entropy = None
    if with_entropy:
        entropy = token_entropy.new_zeros(completion_ids.shape).masked_scatter(on_token, token_entropy)
    if not with_sum_pi_squared:
        return logp, entropy
    return logp, entropy, torch.zeros_like(logp).masked_scatter(on_token, token_sum_pi_squared[0])  # (B, T)


class LogprobForward(torch.nn.Module):
    """The policy as the loss sees it: `completion_logprobs(model, ...)` as a module's forward, the one object every
    log-prob of the trainer goes through. With one process the trainer calls it as it is:

        logp, entropy = policy(prompt_ids, prompt_mask, completion_ids, completion_mask, with_entropy=True)

    With W > 1 processes DDP wraps it, or FSDP2 shards it (parallel/ddp_fsdp.py): their gradient hooks and
    gathers run in a module's forward, and this is that forward. one_pass: see completion_logprobs."""

    def __init__(self, model, one_pass: bool = False):
        super().__init__()
        self.model, self.one_pass = model, one_pass

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask, **options):
        if self.one_pass:
            options["one_pass"] = True
        return completion_logprobs(self.model, prompt_ids, prompt_mask, completion_ids, completion_mask, **options)


def completion_hidden_states(decoder, config, prompt_ids, prompt_mask, completion_ids, completion_mask, *,
                             share_prompts: bool = True, one_pass: bool = False):
    """The final hidden state that predicts each completion token, (B, T, H): position P + t - 1 for token t (the
    prompt's last position for token 0). The decoder is the model without its head (the final norm included).
    Rows run in length groups, each trimmed to its own longest prompt and completion; pad positions are 0.
    share_prompts: each distinct prompt runs once, its completions on top of its keys and values."""
    if one_pass:  # one decoder call, whatever the lengths (parallel/ddp_fsdp.py: FSDP gathers a block at each call)
        hidden = _completion_hidden_one_pass(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask)
        return hidden * completion_mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, H), pad positions 0
    P, T = prompt_ids.shape[1], completion_ids.shape[1]
    share_prompts = share_prompts and can_share_prompts(decoder, config)
    with _cache_through_checkpoints(decoder) if share_prompts else contextlib.nullcontext():
        if share_prompts:
            prompt_hidden, prompt_cache, which = _prompt_forward(decoder, prompt_ids, prompt_mask)
        groups, inverse = trimmed_chunks(prompt_mask, completion_mask)
        parts = []
        for idx, p, t in groups:
            rows = (prompt_ids[idx, P - p:], prompt_mask[idx, P - p:], completion_ids[idx, :t], completion_mask[idx, :t])
            if share_prompts:
                hidden = _completion_hidden_on_prompts(decoder, prompt_hidden, prompt_cache, which[idx], *rows[1:])
            else:
                hidden = _completion_hidden_one_pass(decoder, *rows)
            parts.append(F.pad(hidden, (0, 0, 0, T - t)))  # (b, T, H)
    return torch.cat(parts)[inverse]  # (B, T, H), in the caller's row order


def can_share_prompts(decoder, config) -> bool:
    """Whether completions can run on their prompt's keys and values here: every layer attends to the whole
    sequence (a sliding window's cache keeps only its window), and, under gradient checkpointing while training,
    this transformers lets a checkpointed layer keep its cache argument (`_can_checkpoint_with_cache`)."""
    if not all(type(layer) is DynamicLayer for layer in DynamicCache(config=config).layers):
        return False
    checkpointing = decoder.training and any(getattr(m, "gradient_checkpointing", False) for m in decoder.modules())
    return not checkpointing or hasattr(GradientCheckpointingLayer, "_can_checkpoint_with_cache")


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


class _RecordedPrompt(DynamicLayer):
    """The prompt pass's cache layer: keeps the keys and values of its first call and returns the call's own
    states every time, so a checkpointed block's replay in backward does not write them a second time."""

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.keys, self.values = key_states, value_states  # (U, heads, P, d)
        return key_states, value_states


class _SharedPrompt(DynamicLayer):
    """A completion pass's cache layer: row b reads prompt which[b]'s keys and values (its last p columns) and
    returns them followed by the completion's own. It stores nothing, so a checkpointed replay reads the same.
    The indexing is differentiable: each completion's gradient flows into its prompt's keys and values."""

    def __init__(self, prompt_layer, which, p):
        super().__init__()
        self.prompt_keys, self.prompt_values = prompt_layer.keys, prompt_layer.values  # (U, heads, P, d)
        self.which, self.p = which, p

    def get_seq_length(self) -> int:
        return self.p

    def update(self, key_states, value_states, *args, **kwargs):  # (b, heads, t, d) each
        keys = torch.cat([self.prompt_keys[self.which, :, -self.p:], key_states], dim=-2)  # (b, heads, p + t, d)
        values = torch.cat([self.prompt_values[self.which, :, -self.p:], value_states], dim=-2)
        return keys, values


@contextlib.contextmanager
def _cache_through_checkpoints(decoder):
    """Let gradient-checkpointed layers keep their cache argument (transformers drops it, since a cache written in
    forward would be written again by backward's replay): the caches passed here write once or only read."""
    layers = [m for m in decoder.modules() if isinstance(m, GradientCheckpointingLayer) and m.gradient_checkpointing]
    for layer in layers:
        layer._can_checkpoint_with_cache = True
    try:
        yield
    finally:
        for layer in layers:
            del layer._can_checkpoint_with_cache  # the class's value again


def _prompt_forward(decoder, prompt_ids, prompt_mask):
    """The distinct prompts of a batch (B, P), run once. Rows that share a prompt (the G completions of a group)
    share its forward pass: returns the last position's hidden state (U, H) and the keys and values (a Cache,
    (U, heads, P, d) per layer) of the U distinct prompts, and which[b], the distinct prompt of row b."""
    prompts, which = torch.unique(prompt_ids, dim=0, return_inverse=True)  # (U, P), (B,)
    first = torch.zeros(len(prompts), dtype=torch.long, device=prompt_ids.device).scatter_(
        0, which.flip(0), torch.arange(len(which) - 1, -1, -1, device=prompt_ids.device))  # a row of each prompt
    cache = Cache(layers=[_RecordedPrompt() for _ in range(decoder.config.num_hidden_layers)])
    position_ids = (prompt_mask[first].cumsum(dim=1) - 1).clamp(min=0)  # real tokens only, as in generate()
    # use_cache=False: the model neither makes nor returns a cache of its own; it still writes into this one.
    hidden = decoder(input_ids=prompts, attention_mask=prompt_mask[first], position_ids=position_ids,
                     **cache_argument(decoder, cache), use_cache=False).last_hidden_state[:, -1]  # (U, H)
    return hidden, cache, which


def _completion_hidden_on_prompts(decoder, prompt_hidden, prompt_cache, which, prompt_mask, completion_ids,
                                  completion_mask):
    """One length group: completions (b, t) on top of their prompts' keys and values; returns (b, t, H). Row b
    reads prompt which[b], keeping its last p columns (prompt_mask is (b, p): the group's prompts, left padding
    trimmed)."""
    p = prompt_mask.shape[1]
    cache = Cache(layers=[_SharedPrompt(layer, which, p) for layer in prompt_cache.layers])
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)  # (b, p + t)
    position_ids = prompt_mask.sum(dim=1, keepdim=True) + torch.arange(completion_ids.shape[1],
                                                                       device=prompt_mask.device)  # (b, t)
    completion_hidden = decoder(input_ids=completion_ids, attention_mask=attention_mask, position_ids=position_ids,
                                **cache_argument(decoder, cache), use_cache=False).last_hidden_state  # (b, t, H)
    # The prompt's last position predicts completion token 0; completion position t predicts token t + 1.
    return torch.cat([prompt_hidden[which].unsqueeze(1), completion_hidden[:, :-1]], dim=1)  # (b, t, H)


def _completion_hidden_one_pass(decoder, prompt_ids, prompt_mask, completion_ids, completion_mask):
    """One length group, prompt + completion in one forward pass (b, p + t); returns (b, t, H)."""
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (b, p + t)
    attention_mask = torch.cat([prompt_mask, completion_mask.to(prompt_mask.dtype)], dim=1)
    position_ids = (attention_mask.cumsum(dim=1) - 1).clamp(min=0)  # real tokens only, as in generate()
    hidden = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                     use_cache=False).last_hidden_state  # (b, p + t, H)
    p, t = prompt_ids.shape[1], completion_ids.shape[1]
    return hidden[:, p - 1:p + t - 1]  # (b, t, H): position p + s - 1 predicts completion token s


def _decoder_and_head(model):
    """(decoder, head, adapter_off) of a causal LM: the model without its output head (ids -> final hidden
    states), the head as a plain nn.Linear with no bias (None if it is anything else, or if the architecture
    changes the logits after it: such models take the plain path), and the context to run them in (the adapter
    switched off for a LoRA run's reference, models.AdapterDisabled; nothing otherwise).

    With LoRA (peft) the adapter's layers sit inside the base model's modules, so its decoder runs them; a tied
    head's weight is the embedding matrix itself, so its gradient reaches the embedding as usual."""
    adapter_off = contextlib.nullcontext()
    if isinstance(model, AdapterDisabled):
        model, adapter_off = model.peft_model, model.peft_model.disable_adapter()
    if is_lora(model):
        model = model.get_base_model()
    head = model.get_output_embeddings()
    plain = type(head) is torch.nn.Linear and head.bias is None  # peft's lora.Linear, bnb's Linear4bit: not plain
    if not plain or any(getattr(model.config, name, None) for name in _LOGIT_TRANSFORMS):
        head = None
    return model.get_decoder(), head, adapter_off


# ---------------------------------------------------------------------------------------------------------
# The head in blocks of tokens
# ---------------------------------------------------------------------------------------------------------
def head_logprobs(hidden: torch.Tensor, weight: torch.Tensor, token_ids: torch.Tensor, *, temperature: float = 1.0,
                  with_entropy: bool = False, block_tokens: int = 128, top_k: int = 0,
                  top_p: float = 1.0, with_sum_pi_squared: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log pi(token) (N,) and, if asked, the entropy (N,; no gradient) from final hidden states (N, H) and the
    output head's weight (V, H): logits = hidden @ weight.T / temperature, computed `block_tokens` rows at a time,
    each softmax over what top_k / top_p keep (truncation.py).

    Differentiable in hidden and weight (ChunkedHeadLogprobs); without a gradient to compute, the blocks run once.
    Matrix products run in autocast's dtype when autocast is on (bfloat16 on a GPU), in the weight's otherwise;
    log-softmax in float32, as the plain path does. At most two (block_tokens x V) tensors exist at once, forward
    or backward (tests/test_logprobs.py measures it). with_sum_pi_squared (no gradient): a third output,
    sum_v p_v^2 (N,), from each block's softmax.
    """
    compute_dtype = torch.get_autocast_dtype(hidden.device.type) if torch.is_autocast_enabled(
        hidden.device.type) else weight.dtype
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if with_sum_pi_squared and needs_grad:
        raise ValueError("with_sum_pi_squared: without gradient only (torch.no_grad())")
    if not needs_grad:
        sum_pi_squared = hidden.new_empty(hidden.shape[0], dtype=torch.float32) if with_sum_pi_squared else None
        with torch.no_grad():
            logp, entropy, _ = _head_forward(hidden, weight, token_ids, temperature, with_entropy, block_tokens,
                                             compute_dtype, with_expected_weight=False, truncation=(top_k, top_p),
                                             sum_pi_squared_out=sum_pi_squared)
        return (logp, entropy) if sum_pi_squared is None else (logp, entropy, sum_pi_squared)
    logp, entropy = ChunkedHeadLogprobs.apply(hidden, weight, token_ids, temperature, with_entropy, block_tokens,
                                              compute_dtype, (top_k, top_p))
    return logp, entropy if with_entropy else None


def _block_logits(hidden_block, weight, temperature, token_ids, truncation):
    """(n, V) float32 logits / temperature of one block, -inf where the sampler drops a token (truncation: top_k,
    top_p; the block's own tokens token_ids (n,) always kept); hidden_block and weight in the compute dtype."""
    logits = (hidden_block @ weight.T).float()
    logits = logits / temperature if temperature != 1.0 else logits
    return truncate_logits(logits, *truncation, keep=token_ids)


def _head_forward(hidden, weight, token_ids, temperature, with_entropy, block_tokens, compute_dtype,
                  with_expected_weight, truncation=(0, 1.0), sum_pi_squared_out=None):
    """The head over `block_tokens` tokens at a time (_block_forward). Returns (logp, entropy or None,
    expected_weight or None), all (N, ...). sum_pi_squared_out: an (N,) tensor to fill with sum_v p_v^2, or None."""
    N = hidden.shape[0]
    weight_c = weight.to(compute_dtype)  # cast once, not per block (a no-op when the dtypes agree)
    logp = hidden.new_empty(N, dtype=torch.float32)
    entropy = torch.empty_like(logp) if with_entropy else None
    expected_weight = hidden.new_empty(N, weight.shape[1], dtype=torch.float32) if with_expected_weight else None
    for start in range(0, N, block_tokens):
        block = slice(start, start + block_tokens)
        _block_forward(hidden[block].to(compute_dtype), weight_c, token_ids[block], temperature, truncation,
                       logp[block], None if entropy is None else entropy[block],
                       None if expected_weight is None else expected_weight[block],
                       None if sum_pi_squared_out is None else sum_pi_squared_out[block])
    return logp, entropy, expected_weight


def _block_forward(hidden_block, weight, token_ids, temperature, truncation, logp, entropy, expected_weight,
                   sum_pi_squared=None):
    """One block: logits (n, V), log Z = logsumexp, log pi(o) = logit[o] - log Z; with the softmax
    p = exp(logits - log Z), the entropy H = log Z - sum_v p_v logit_v and the expected head row E_p[w] = p @ W
    (n, H), which backward needs for the hidden states' gradient, and sum_v p_v^2 (the optimal token baseline's).
    Results go into the given (n,) / (n, H) views.

    Memory: the block's (n, V) tensors are this function's locals, so none outlives the block, and there are two
    at most (the logits and the softmax; logsumexp's own temporary comes and goes before the softmax exists). The
    entropy's product overwrites the logits, which nothing needs by then."""
    logits = _block_logits(hidden_block, weight, temperature, token_ids, truncation)  # (n, V)
    log_z = logits.logsumexp(dim=-1)  # (n,)
    logp.copy_(logits.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1) - log_z)
    if entropy is None and expected_weight is None and sum_pi_squared is None:
        return
    probs = (logits - log_z.unsqueeze(-1)).exp_()  # (n, V), the softmax (0 where a token is dropped)
    if expected_weight is not None:
        expected_weight.copy_(probs.to(weight.dtype) @ weight)
    if sum_pi_squared is not None:  # each row's dot product with itself: no third (n, V) tensor
        sum_pi_squared.copy_(torch.bmm(probs[:, None], probs[:, :, None]).view(-1))
    if entropy is not None:
        if truncates(*truncation):  # a dropped token: logit -inf, p 0, and adds 0 to the sum
            logits.masked_fill_(logits.isinf(), 0.0)
        entropy.copy_(log_z - logits.mul_(probs).sum(-1))


def _block_weight_grad(grad_weight, hidden_block, weight, token_ids, scale, temperature, truncation):
    """Adds one block's dL/dW = (g / tau) (onehot(o) - p)^T h into grad_weight (V, H). The block's logits are
    recomputed (the forward's own product, hence the same kept set); at most two (n, V) tensors exist, the logits
    until their softmax is made, then the softmax, turned into dL/dlogits in place; both are freed on return."""
    logits = _block_logits(hidden_block, weight, temperature, token_ids, truncation)  # (n, V)
    probs = logits.softmax(dim=-1)
    del logits
    grad_logits = probs.mul_(-scale.unsqueeze(-1))  # -(g / tau) p
    grad_logits[torch.arange(len(grad_logits)), token_ids] += scale  # + (g / tau) onehot(o)
    grad_logits = grad_logits.to(weight.dtype)
    if grad_weight.dtype == weight.dtype:  # summed in place: no (V, H) temporary per block
        # (addmm_'s kernel, in the out= form that torch's FlopCounterMode counts; it does not count addmm_)
        torch.addmm(grad_weight, grad_logits.T, hidden_block, out=grad_weight)
    else:  # autocast: each block's product in its dtype, summed in the weight's
        grad_weight += (grad_logits.T @ hidden_block).to(grad_weight.dtype)


class ChunkedHeadLogprobs(torch.autograd.Function):
    """log pi(o) = logit_o - logsumexp(logits), logits = h W^T / tau, block by block, forward and backward.

    The gradient of log-softmax is d log pi(o) / d logit_v = (1[v = o] - p_v), so with g = dL/d log pi(o):

        dL/dh = (g / tau) (W_o - sum_v p_v W_v) = (g / tau) (W_o - E_p[W])       (H,) per token
        dL/dW = sum over tokens of (g / tau) (onehot(o) - p) h^T                  (V, H)

    E_p[W] (N, H) is computed in forward, where p already is, so the hidden states' gradient needs no logits in
    backward. The weight's gradient needs p with g, so backward recomputes each block's logits: one more
    (n x H x V) product per block, the price of never keeping a (tokens x vocabulary) tensor. With a frozen head
    (LoRA, QLoRA) that product is skipped too. With a truncated sampler (top_k / top_p) p is the softmax over the
    kept tokens, 0 elsewhere, and the same formulas hold: backward recomputes the same logits, hence the same set.
    """

    @staticmethod
    def forward(ctx, hidden, weight, token_ids, temperature, with_entropy, block_tokens, compute_dtype,
                truncation=(0, 1.0)):
        logp, entropy, expected_weight = _head_forward(hidden, weight, token_ids, temperature, with_entropy,
                                                       block_tokens, compute_dtype,
                                                       with_expected_weight=ctx.needs_input_grad[0],
                                                       truncation=truncation)
        ctx.save_for_backward(hidden, weight, token_ids, expected_weight)
        ctx.temperature, ctx.block_tokens, ctx.compute_dtype = temperature, block_tokens, compute_dtype
        ctx.truncation = truncation
        if entropy is None:
            entropy = logp.new_zeros(0)
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, _grad_entropy):
        hidden, weight, token_ids, expected_weight = ctx.saved_tensors
        scale = grad_logp.float() / ctx.temperature  # (N,), g / tau
        grad_hidden = grad_weight = None
        if ctx.needs_input_grad[0]:
            grad_hidden = (scale.unsqueeze(-1) * (weight[token_ids].float() - expected_weight)).to(hidden.dtype)
        if ctx.needs_input_grad[1]:
            grad_weight = torch.zeros_like(weight)
            weight_c = weight.to(ctx.compute_dtype)
            for start in range(0, hidden.shape[0], ctx.block_tokens):
                block = slice(start, start + ctx.block_tokens)
                _block_weight_grad(grad_weight, hidden[block].to(ctx.compute_dtype), weight_c, token_ids[block],
                                   scale[block], ctx.temperature, ctx.truncation)
        return grad_hidden, grad_weight, None, None, None, None, None, None
