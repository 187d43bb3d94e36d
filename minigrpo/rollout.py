"""Sampling completions: the "sample" step of every GRPO iteration.

``sample_completions`` turns B prompts into B*G completions with ``decode``, a sampling loop
written out in this file (``sample_completions_hf`` does the same with HF ``model.generate``), and
returns them as tensors the loss can use directly:

    prompt_ids       (B*G, P)  left-padded, so every prompt ends at the same column
    completion_ids   (B*G, T)  right-padded with pad; T <= max_completion_length
    completion_mask  (B*G, T)  1.0 on generated tokens up to and including the first eos

Rows are grouped: prompt i owns rows i*G .. i*G+G-1. Group-relative advantages rely on it.

Sampling is temperature sampling, truncated only by the top-k / top-p asked for (``next_token``, truncation.py). HF's defaults are not: ``generate``
fills every unset option from the model's ``generation_config.json`` and then from global
defaults, which include ``top_k=50`` (and chat models often ship ``top_k=20`` or a
``repetition_penalty``). The policy-gradient ratio assumes the samples came from the
policy's own softmax, so ``decode`` applies none of them, and ``generation_config`` switches
them off explicitly for ``generate``.

Why a loop of our own: it computes each prompt once per group instead of G times, and drops
finished rows from the batch, where ``generate`` keeps decoding them until the longest row ends.
When completion lengths vary (a short answer vs a long scratchpad), that is much of the work. And each step
calls the model's layers directly (decode_step.py), skipping what HF's forward does around them.

Randomness comes from torch's global RNG; seed it (``torch.manual_seed``) for repeatable rollouts.
"""

from dataclasses import dataclass

import torch
from transformers import DynamicCache, GenerationConfig

from .errors import ConfigError
from .generation.decode_step import DecodeStep, HFDecodeStep, has_decode_step
from .generation.kv_cache import cache_argument
from .prompts import encode_prompts, left_pad
from .truncation import truncate_logits


@dataclass
class Rollout:
    prompt_ids: torch.LongTensor  # (B*G, P) left-padded
    prompt_mask: torch.LongTensor  # (B*G, P) 1 on prompt tokens, 0 on padding
    completion_ids: torch.LongTensor  # (B*G, T) right-padded with pad id
    completion_mask: torch.Tensor  # (B*G, T) float: 1 up to and including the first eos
    completions: list[str]  # decoded text, special tokens skipped (<think> tags are not special)
    is_truncated: torch.BoolTensor  # (B*G,) no eos within max_completion_length
    sampling_logp: torch.Tensor | None = None  # (B*G, T) log-probs the engine sampled with (vLLM); None = the policy's

    @property
    def completion_lengths(self) -> torch.Tensor:
        """Tokens per completion, eos included (B*G,)."""
        return self.completion_mask.sum(dim=1)

    def select(self, rows: torch.Tensor) -> "Rollout":
        """The completions at rows (indices), in that order."""
        pick = lambda x: None if x is None else x[rows.to(x.device)]  # noqa: E731
        return Rollout(pick(self.prompt_ids), pick(self.prompt_mask), pick(self.completion_ids),
                       pick(self.completion_mask), [self.completions[i] for i in rows.tolist()],
                       pick(self.is_truncated), pick(self.sampling_logp))


def eos_token_ids(model, tokenizer) -> list[int]:
    """All ids that end a completion: the model's generation config may list several (chat models do)."""
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ConfigError("model_name_or_path: neither the model's generation_config nor the tokenizer defines an eos token")
    return [eos] if isinstance(eos, int) else list(eos)


def generation_config(model, tokenizer, *, max_completion_length, temperature, top_p, do_sample,
                      top_k: int = 0) -> GenerationConfig:
    """A config that says everything, so nothing is inherited from the model's defaults."""
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    # Sampling filters only exist when sampling; setting them for greedy decoding makes HF warn.
    # top_k=0 unless asked matters: HF's default is 50, a truncated distribution rather than the policy's.
    sampling = dict(temperature=temperature, top_p=top_p, top_k=top_k, typical_p=1.0) if do_sample else {}
    return GenerationConfig(
        max_new_tokens=max_completion_length,
        min_new_tokens=0,
        do_sample=do_sample,
        **sampling,
        repetition_penalty=1.0,
        no_repeat_ngram_size=0,
        num_beams=1,
        pad_token_id=pad_id,
        eos_token_id=eos_ids,
        bos_token_id=tokenizer.bos_token_id,
        use_cache=True,
    )


@torch.no_grad()
def sample_completions(
    model,
    tokenizer,
    prompts: list[str],
    *,
    num_generations: int = 1,
    max_completion_length: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    do_sample: bool = True,
    chat_template_kwargs: dict | None = None,
    top_k: int = 0,
    with_greedy: bool = False,
) -> Rollout:
    """Generate ``num_generations`` completions per prompt (greedy when ``do_sample=False``) with ``decode``.

    Prompts are strings (tokenized with the tokenizer's own special tokens, e.g. bos) or lists of chat
    messages (rendered by the chat template with ``chat_template_kwargs``): see prompts.py.
    with_greedy: each prompt gets one more row, its greedy completion, decoded with its G samples (the same prompt
    pass and decode steps): rows i*(G+1) .. i*(G+1)+G-1 sampled, row i*(G+1)+G greedy (ReMax's baseline).
    """
    device = next(model.parameters()).device
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    encoded = _encode(tokenizer, prompts, chat_template_kwargs, pad_id)
    rows_per_prompt = num_generations + with_greedy
    greedy_rows = (torch.arange(len(prompts) * rows_per_prompt, device=device) % rows_per_prompt == num_generations
                   if with_greedy else None)  # (B*(G+1),)
    was_training = model.training
    model.eval()
    completion_ids = decode(
        model, encoded["input_ids"].to(device), encoded["attention_mask"].to(device),
        num_generations=rows_per_prompt, max_new_tokens=max_completion_length, temperature=temperature,
        top_p=top_p, top_k=top_k, do_sample=do_sample, eos_ids=eos_ids, pad_id=pad_id, greedy_rows=greedy_rows,
    ).clone()  # decode runs in inference mode; the loss needs an ordinary tensor (see decode)
    model.train(was_training)
    prompt_ids = encoded["input_ids"].repeat_interleave(rows_per_prompt, dim=0).to(device)  # (B*G, P)
    prompt_mask = encoded["attention_mask"].repeat_interleave(rows_per_prompt, dim=0).to(device)
    return _rollout(tokenizer, prompt_ids, prompt_mask, completion_ids, eos_ids, pad_id)


@torch.no_grad()
def sample_completions_hf(
    model,
    tokenizer,
    prompts: list[str],
    *,
    num_generations: int = 1,
    max_completion_length: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    do_sample: bool = True,
    chat_template_kwargs: dict | None = None,
    top_k: int = 0,
) -> Rollout:
    """The same as ``sample_completions``, with HF ``model.generate`` doing the decoding: the reference
    ``decode`` is tested and benchmarked against (``minigrpo bench``)."""
    device = next(model.parameters()).device
    config = generation_config(
        model, tokenizer, max_completion_length=max_completion_length,
        temperature=temperature, top_p=top_p, top_k=top_k, do_sample=do_sample,
    )
    encoded = _encode(tokenizer, prompts, chat_template_kwargs, config.pad_token_id)
    prompt_ids = encoded["input_ids"].repeat_interleave(num_generations, dim=0).to(device)  # (B*G, P)
    prompt_mask = encoded["attention_mask"].repeat_interleave(num_generations, dim=0).to(device)
    was_training = model.training
    model.eval()
    sequences = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config)
    model.train(was_training)
    completion_ids = sequences[:, prompt_ids.shape[1]:]  # (B*G, T)
    return _rollout(tokenizer, prompt_ids, prompt_mask, completion_ids, config.eos_token_id, config.pad_token_id)


# Finished rows are dropped from the decode batch once they are this fraction of it (dropping copies the cache).
DROP_FINISHED_FRACTION = 0.25


# Inference mode, not just no_grad: it also skips autograd's version counters and view tracking, which is a
# few percent of each small decode step on a CPU. Its tensors cannot be used by autograd later, so the caller
# clones what decode returns.
@torch.inference_mode()
def decode(model, prompt_ids, prompt_mask, *, num_generations, max_new_tokens, temperature, top_p, do_sample,
           eos_ids, pad_id, decode_step: str = "auto", top_k: int = 0,
           greedy_rows: torch.Tensor | None = None) -> torch.LongTensor:
    """The sampling loop, written out. Returns completion ids (B*G, T), pad after each row's first eos.

    prompt_ids, prompt_mask: (B, P) distinct prompts, left-padded. Row i*G + g is prompt i's g-th sample.
    greedy_rows: (B*G,) bool, rows that take the most likely token instead of a sample (ReMax's greedy baseline).

    1. Prefill: one forward pass over the B prompts fills the KV cache. The G samples of a prompt share it,
       so the prompt is computed once and its cache (and last logits) repeated G times.
    2. Decode: each step samples one token per row (``next_token``) and feeds it back through the model,
       which attends to the cache and appends its own keys and values. The step is ``DecodeStep``
       (decode_step.py: the model's layers called directly) where ``has_decode_step`` allows, else
       ``HFDecodeStep`` (``model(...)`` with HF's cache); ``decode_step="hf"`` forces the latter.
    3. A row that samples eos is finished. HF ``generate`` keeps computing finished rows until the last one
       ends; here they are dropped from the batch and the cache once they are a quarter of it, so later steps
       spend their compute on the rows still running.
    """
    if decode_step not in ("auto", "hf"):
        raise ValueError(f"decode_step must be 'auto' or 'hf', not {decode_step!r}")
    device, G = prompt_ids.device, num_generations
    eos = torch.tensor(eos_ids, device=device)
    logits, cache, prompt_mask = prefill(model, prompt_ids, prompt_mask, G)
    position = prompt_mask.sum(1, keepdim=True)  # (n, 1): the position of the token being fed in
    step_class = DecodeStep if (decode_step == "auto" and has_decode_step(model)) else HFDecodeStep
    step = step_class(model, cache, prompt_mask, max_new_tokens)
    del cache  # the step holds what it needs; the prompt cache must not outlive the rows it drops

    out = torch.full((len(logits), max_new_tokens), pad_id, dtype=torch.long, device=device)  # (B*G, T)
    rows = torch.arange(len(logits), device=device)  # which output row each batch row writes to
    finished = torch.zeros(len(logits), dtype=torch.bool, device=device)
    for t in range(max_new_tokens):
        token = next_token(logits, temperature=temperature, top_p=top_p, top_k=top_k, do_sample=do_sample)
        if greedy_rows is not None:
            token = torch.where(greedy_rows[rows], logits.argmax(dim=-1), token)
        token = token.masked_fill(finished, pad_id)
        out[rows, t] = token
        finished |= torch.isin(token, eos)
        if t == max_new_tokens - 1 or finished.all():
            return out[:, : t + 1]
        if finished.sum() >= DROP_FINISHED_FRACTION * len(rows):
            keep = (~finished).nonzero().squeeze(1)
            step.keep(keep)
            rows, token, position, finished = (x[keep] for x in (rows, token, position, finished))
        logits = step(token, position)  # (n, V)
        position = position + 1
    return out


def prefill(model, prompt_ids, prompt_mask, num_generations: int):
    """One forward pass over the B distinct prompts (B, P), its KV cache and last logits repeated G times.

    Returns logits (B*G, V) for each row's first token, the cache (B*G rows) and the repeated prompt mask (B*G, P).
    """
    cache = DynamicCache(config=model.config)
    position_ids = (prompt_mask.cumsum(1) - 1).clamp(min=0)  # left padding does not shift positions
    logits = model(input_ids=prompt_ids, attention_mask=prompt_mask, position_ids=position_ids,
                   **cache_argument(model, cache), use_cache=True, logits_to_keep=1).logits[:, -1]  # (B, V)
    G = num_generations
    cache.batch_repeat_interleave(G)
    return logits.repeat_interleave(G, dim=0), cache, prompt_mask.repeat_interleave(G, dim=0)


def next_token(logits: torch.Tensor, *, temperature: float, top_p: float, do_sample: bool,
               top_k: int = 0) -> torch.LongTensor:
    """One token per row from logits (n, V): temperature sampling, truncated by top-k then top-p exactly as HF's
    warpers do (truncation.py), or greedy."""
    if not do_sample:
        return logits.argmax(dim=-1)
    logits = truncate_logits(logits.float() / temperature, top_k, top_p)
    return torch.multinomial(logits.softmax(dim=-1), num_samples=1).squeeze(1)


def _encode(tokenizer, prompts, chat_template_kwargs, pad_id) -> dict:
    """Prompts (strings or chat messages) -> left-padded {"input_ids", "attention_mask"}, both (B, P)."""
    input_ids, attention_mask = left_pad(encode_prompts(tokenizer, prompts, chat_template_kwargs), pad_id)
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def _rollout(tokenizer, prompt_ids, prompt_mask, completion_ids, eos_ids, pad_id) -> Rollout:
    """Masks, truncation flags and text for completion ids (B*G, T) that may run on past their first eos."""
    device = completion_ids.device
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=device))
    # Position of the first eos; T (one past the end) when there is none.
    T = completion_ids.shape[1]
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), torch.full_like(is_eos[:, 0], T, dtype=torch.long))
    positions = torch.arange(T, device=device).unsqueeze(0)  # (1, T)
    completion_mask = (positions <= first_eos.unsqueeze(1)).float()  # (B*G, T)
    return _masked_rollout(tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask, ~is_eos.any(dim=1), pad_id)


def _masked_rollout(tokenizer, prompt_ids, prompt_mask, completion_ids, completion_mask, is_truncated, pad_id,
                    sampling_logp=None) -> Rollout:
    """The Rollout of completions whose mask is known: pad id and log-prob 0 outside the mask, text decoded."""
    completion_ids = completion_ids.masked_fill(completion_mask == 0, pad_id)
    if sampling_logp is not None:
        sampling_logp = sampling_logp * completion_mask
    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, completions, is_truncated, sampling_logp)


def rollout_from_ids(prompt_ids: list[list[int]], completion_ids: list[list[int]], tokenizer, eos_ids: list[int],
                     num_generations: int, max_completion_length: int,
                     sampling_logp: list[list[float]] | None = None) -> Rollout:
    """A Rollout from plain lists of token ids, for engines like vLLM that return lists rather than padded tensors.

    prompt_ids: one list per prompt (B); completion_ids: one list per completion (B*G), grouped by prompt.
    Anything after a completion's first eos is cut (the mask would hide it anyway), and the eos itself is kept.
    sampling_logp: the engine's log-prob of each completion token, cut the same way; 0 on padding.
    """
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    prompt_rows, prompt_mask = left_pad([list(ids) for ids in prompt_ids], pad)  # (B, P) each
    cut, truncated = [], []
    for ids in completion_ids:
        ids = list(ids)[:max_completion_length]
        first_eos = next((t for t, tok in enumerate(ids) if tok in eos_ids), None)
        cut.append(ids if first_eos is None else ids[: first_eos + 1])
        truncated.append(first_eos is None)
    T = max(1, max(len(ids) for ids in cut))
    completion = torch.tensor([ids + [pad] * (T - len(ids)) for ids in cut], dtype=torch.long)  # (B*G, T)
    mask = torch.tensor([[1.0] * len(ids) + [0.0] * (T - len(ids)) for ids in cut])  # (B*G, T)
    if sampling_logp is not None:
        sampling_logp = torch.tensor([list(lp[:len(ids)]) + [0.0] * (T - len(ids))
                                      for lp, ids in zip(sampling_logp, cut, strict=True)])  # (B*G, T)
    return _masked_rollout(tokenizer, prompt_rows.repeat_interleave(num_generations, dim=0),  # row i*G + g: prompt i
                           prompt_mask.repeat_interleave(num_generations, dim=0), completion, mask,
                           torch.tensor(truncated), pad, sampling_logp)


@torch.no_grad()
def continue_from_ids(model, tokenizer, input_ids: list[list[int]], *, max_new_tokens: list[int],
                      temperature: float = 1.0, top_p: float = 1.0, do_sample: bool = True,
                      use_hf_generate: bool = False, top_k: int = 0) -> list[list[int]]:
    """One continuation per row of token ids, each row with its own budget: the next turn of a multi-turn rollout.

    input_ids: N rows of ids (a prompt, earlier turns, a tool message: never re-tokenized here).
    Returns N lists: the ids sampled, up to and including the first eos, at most max_new_tokens[i].

    The rows are left-padded and decoded together (``decode`` with num_generations=1, or HF ``generate`` with
    ``use_hf_generate``) for the largest budget; each row is then cut at its own. Cutting is exact, not an
    approximation: a token is sampled from the tokens before it only, so what a row samples past its budget has no
    say in what it sampled before. Rows with a budget of 0 get [] and are not decoded.
    """
    if len(max_new_tokens) != len(input_ids):
        raise ValueError(f"max_new_tokens has {len(max_new_tokens)} budgets for {len(input_ids)} rows")
    out: list[list[int]] = [[] for _ in input_ids]
    rows = [i for i, budget in enumerate(max_new_tokens) if budget > 0]
    if not rows:
        return out
    device = next(model.parameters()).device
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    ids, mask = left_pad([list(input_ids[i]) for i in rows], pad_id)  # (n, P) each
    ids, mask, longest = ids.to(device), mask.to(device), max(max_new_tokens[i] for i in rows)
    was_training = model.training
    model.eval()
    if use_hf_generate:
        config = generation_config(model, tokenizer, max_completion_length=longest, temperature=temperature,
                                   top_p=top_p, top_k=top_k, do_sample=do_sample)
        sampled = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)[:, ids.shape[1]:]
    else:
        sampled = decode(model, ids, mask, num_generations=1, max_new_tokens=longest, temperature=temperature,
                         top_p=top_p, top_k=top_k, do_sample=do_sample, eos_ids=eos_ids,
                         pad_id=pad_id)  # (n, <= longest)
    model.train(was_training)
    for row, tokens in zip(rows, sampled.tolist(), strict=True):
        tokens = tokens[: max_new_tokens[row]]
        first_eos = next((t for t, tok in enumerate(tokens) if tok in eos_ids), None)
        out[row] = tokens if first_eos is None else tokens[: first_eos + 1]
    return out
