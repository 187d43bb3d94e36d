"""The train/inference mismatch of engine_mismatch.py made on a CPU, without vLLM: a sampler in another precision.

vLLM samples with its own kernels and its own copy of the weights, so the log-probability it gives a sampled token is
not exactly the one the trainer computes for it, and an update that believes itself on-policy is slightly off-policy.
The commonest cause needs no vLLM: precision, a sampler in bfloat16 beside a trainer in float32. `CastEngine` is
such a sampler. It holds a copy of the policy cast to `dtype`, samples with that copy (the policy's own decode loop,
rollout.py), returns the log-probs the copy gives the sampled tokens as `Rollout.sampling_logp` (what VLLMEngine
returns), and copies the policy's weights in after each batch (`sync_weights`, cast on the way). The trainer then
treats it as it treats vLLM: `sampling/*` in metrics.jsonl and TRL's importance-sampling correction
(`vllm_importance_sampling_correction`). With dtype=torch.float32 it is the control: the copy is the policy, and
every difference is exactly 0.

    train(cfg, engine_factory=lambda model, tokenizer: CastEngine(model, tokenizer, torch.bfloat16))
    # samples in bfloat16, trains in float32: train's engine_factory replaces the engine the Config asks for

The sampler's log-probs are the copy's teacher-forced forward over the sampled tokens, not the decode loop's own
logits (the same model and precision; the KV cache's rounding differs slightly).
"""

import copy

import torch

from ..generation.engines import GenerateEngine
from ..logprobs import completion_logprobs

__all__ = ["CastEngine"]


class CastEngine(GenerateEngine):
    """Samples with a copy of `policy` in `dtype` and returns the log-probs it sampled with (Rollout.sampling_logp)."""

    def __init__(self, policy, tokenizer, dtype: torch.dtype = torch.bfloat16,
                 chat_template_kwargs: dict | None = None):
        self.policy = policy
        super().__init__(copy.deepcopy(policy).to(dtype), tokenizer, chat_template_kwargs)  # self.model: the copy

    def generate(self, prompts, *, temperature=1.0, top_p=1.0, top_k=0, **options):
        rollout = super().generate(prompts, temperature=temperature, top_p=top_p, top_k=top_k, **options)
        with torch.no_grad():
            logp, _ = completion_logprobs(self.model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                          rollout.completion_mask, temperature=temperature, top_k=top_k, top_p=top_p)
        rollout.sampling_logp = logp.float() * rollout.completion_mask  # (B*G, T), 0 on padding
        return rollout

    def sync_weights(self) -> None:
        self.model.load_state_dict(self.policy.state_dict())  # each tensor cast to the copy's dtype
