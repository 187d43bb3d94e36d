"""Sampling completions: the "sample" step of every GRPO iteration.

``sample_completions`` turns B prompts into B*G completions with HF ``model.generate`` and
returns them as tensors the loss can use directly:

    prompt_ids       (B*G, P)  left-padded, so every prompt ends at the same column
    completion_ids   (B*G, T)  right-padded with pad; T <= max_completion_length
    completion_mask  (B*G, T)  1.0 on generated tokens up to and including the first eos

Rows are grouped: prompt i owns rows i*G .. i*G+G-1. Group-relative advantages rely on it.

Sampling is *pure* temperature / top-p sampling. HF's defaults are not: ``generate``
fills every unset option from the model's ``generation_config.json`` and then from global
defaults, which include ``top_k=50`` (and chat models often ship ``top_k=20`` or a
``repetition_penalty``). The policy-gradient ratio assumes the samples came from the
policy's own softmax, so those filters are switched off explicitly here.

Randomness comes from torch's global RNG; seed it (``torch.manual_seed``) for repeatable rollouts.
"""

from dataclasses import dataclass

import torch
from transformers import GenerationConfig


@dataclass
class Rollout:
    prompt_ids: torch.LongTensor  # (B*G, P) left-padded
    prompt_mask: torch.LongTensor  # (B*G, P) 1 on prompt tokens, 0 on padding
    completion_ids: torch.LongTensor  # (B*G, T) right-padded with pad id
    completion_mask: torch.Tensor  # (B*G, T) float: 1 up to and including the first eos
    completions: list[str]  # decoded text, special tokens skipped (<think> tags are not special)
    is_truncated: torch.BoolTensor  # (B*G,) no eos within max_completion_length

    @property
    def completion_lengths(self) -> torch.Tensor:
        """Tokens per completion, eos included (B*G,)."""
        return self.completion_mask.sum(dim=1)


def eos_token_ids(model, tokenizer) -> list[int]:
    """All ids that end a completion: the model's generation config may list several (chat models do)."""
    eos = model.generation_config.eos_token_id if model.generation_config is not None else None
    if eos is None:
        eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError("neither the model's generation_config nor the tokenizer defines an eos token")
    return [eos] if isinstance(eos, int) else list(eos)


def generation_config(model, tokenizer, *, max_completion_length, temperature, top_p, do_sample) -> GenerationConfig:
    """A config that says everything, so nothing is inherited from the model's defaults."""
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    # Sampling filters only exist when sampling; setting them for greedy decoding makes HF warn.
    # top_k=0 matters: HF's default is 50, a truncated distribution rather than the policy's.
    sampling = dict(temperature=temperature, top_p=top_p, top_k=0, typical_p=1.0) if do_sample else {}
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
) -> Rollout:
    """Generate ``num_generations`` completions per prompt (greedy when ``do_sample=False``).

    Prompts are tokenized as given (with the tokenizer's own special tokens, e.g. bos);
    chat templates, if any, are the caller's business.
    """
    device = next(model.parameters()).device
    encoded = tokenizer(prompts, padding=True, padding_side="left", return_tensors="pt")
    prompt_ids = encoded["input_ids"].repeat_interleave(num_generations, dim=0).to(device)  # (B*G, P)
    prompt_mask = encoded["attention_mask"].repeat_interleave(num_generations, dim=0).to(device)

    config = generation_config(
        model, tokenizer, max_completion_length=max_completion_length,
        temperature=temperature, top_p=top_p, do_sample=do_sample,
    )
    was_training = model.training
    model.eval()
    sequences = model.generate(input_ids=prompt_ids, attention_mask=prompt_mask, generation_config=config)
    model.train(was_training)

    completion_ids = sequences[:, prompt_ids.shape[1]:]  # (B*G, T)
    is_eos = torch.isin(completion_ids, torch.tensor(config.eos_token_id, device=device))
    # Position of the first eos; T (one past the end) when there is none.
    T = completion_ids.shape[1]
    first_eos = torch.where(is_eos.any(dim=1), is_eos.int().argmax(dim=1), torch.full_like(is_eos[:, 0], T, dtype=torch.long))
    positions = torch.arange(T, device=device).unsqueeze(0)  # (1, T)
    completion_mask = (positions <= first_eos.unsqueeze(1)).float()  # (B*G, T)
    completion_ids = completion_ids.masked_fill(completion_mask == 0, config.pad_token_id)
    is_truncated = ~is_eos.any(dim=1)

    completions = tokenizer.batch_decode(completion_ids, skip_special_tokens=True)
    return Rollout(prompt_ids, prompt_mask, completion_ids, completion_mask, completions, is_truncated)
