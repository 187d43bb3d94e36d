"""Prompts in TRL's two dataset formats, turned into token ids the same way everywhere.

A row's ``prompt`` is either

    standard        "3471+586="                                              a string, tokenized as it is
    conversational  [{"role": "system", "content": "..."},                   messages, rendered by the
                     {"role": "user", "content": "What is 3471+586?"}]       tokenizer's chat template

A conversational prompt goes through ``tokenizer.apply_chat_template(messages, add_generation_prompt=True)``:
the template writes the roles' markers and ends with the assistant's header, so the model's next token is
the start of its answer. ``chat_template_kwargs`` pass through (Qwen3's ``enable_thinking=False``). The
rendered text already holds every special token the template wants (bos included), so it is tokenized with
``add_special_tokens=False``; a standard prompt gets the tokenizer's own special tokens, as it always has.

Every place that encodes a prompt of a run without tools calls ``encode_prompts``: the decode loop, HF
``generate``, the vLLM engine, evaluation and the context-length check (a run with tools encodes its prompts with
the tools' schemas, ``tools.prompt_ids_with_tools``). So the ids the policy is trained on are the ids it sampled
from, whichever engine sampled.

Reward functions see completions the way TRL hands them: text for a standard prompt, and for a
conversational one the assistant's message, ``[{"role": "assistant", "content": text}]``.
"""

import torch

from .errors import ConfigError

__all__ = ["is_conversational", "prompt_text", "completion_text", "encode_prompts", "left_pad", "right_pad",
           "completions_for_rewards"]


def is_conversational(prompt) -> bool:
    """True for a list of {"role", "content"} messages (TRL's conversational format)."""
    return isinstance(prompt, list) and all(isinstance(m, dict) and "role" in m and "content" in m for m in prompt)


def completion_text(completion) -> str:
    """Text of a completion, also in TRL's conversational form [{"role": "assistant", "content": ...}]."""
    if isinstance(completion, list):
        return completion[-1]["content"] if completion else ""
    return completion or ""


def prompt_text(tokenizer, prompt, chat_template_kwargs: dict | None = None) -> str:
    """The text the model is fed: the prompt itself, or the messages rendered by the chat template."""
    if isinstance(prompt, str):
        return prompt
    if not is_conversational(prompt) or not prompt:
        raise ConfigError(f"prompt: expected a string or a list of {{'role', 'content'}} messages, got {prompt!r:.80}")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ConfigError(
            f"prompt: the prompts are conversational (lists of messages) but the tokenizer of "
            f"{getattr(tokenizer, 'name_or_path', '?')!r} has no chat template; use a chat model (an -Instruct one), "
            f"set tokenizer.chat_template, or give plain-string prompts"
        )
    return tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                         **(chat_template_kwargs or {}))


def encode_prompts(tokenizer, prompts: list, chat_template_kwargs: dict | None = None) -> list[list[int]]:
    """Token ids of each prompt (B lists, unpadded); see the module docstring for the two formats."""
    ids: list = [None] * len(prompts)
    for conversational in (False, True):
        where = [i for i, p in enumerate(prompts) if isinstance(p, str) != conversational]
        if where:
            texts = [prompt_text(tokenizer, prompts[i], chat_template_kwargs) for i in where]
            encoded = tokenizer(texts, add_special_tokens=not conversational)["input_ids"]
            for i, row in zip(where, encoded):
                ids[i] = row
    return ids


def left_pad(ids: list[list[int]], pad_id: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """B lists of ids -> (input_ids, attention_mask), both (B, P), left-padded so every prompt ends at column P."""
    P = max(len(row) for row in ids)
    input_ids = torch.tensor([[pad_id] * (P - len(row)) + row for row in ids], dtype=torch.long)
    attention_mask = torch.tensor([[0] * (P - len(row)) + [1] * len(row) for row in ids], dtype=torch.long)
    return input_ids, attention_mask


def right_pad(ids: list[list[int]], pad_id: int) -> tuple[torch.LongTensor, torch.LongTensor]:
    """B lists of ids -> (input_ids, attention_mask), both (B, T), right-padded so every row starts at column 0."""
    T = max(len(row) for row in ids)
    input_ids = torch.tensor([row + [pad_id] * (T - len(row)) for row in ids], dtype=torch.long)
    attention_mask = torch.tensor([[1] * len(row) + [0] * (T - len(row)) for row in ids], dtype=torch.long)
    return input_ids, attention_mask


def completions_for_rewards(prompts: list, texts: list[str]) -> list:
    """What reward functions receive: the text, or ``[{"role": "assistant", "content": text}]`` after a
    conversational prompt (TRL's convention, so a reward function written for TRL works unchanged)."""
    return [[{"role": "assistant", "content": text}] if is_conversational(p) else text
            for p, text in zip(prompts, texts, strict=True)]
