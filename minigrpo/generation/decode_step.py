"""One decode step: feed one token per row through the model and get the next token's logits.

``decode`` (rollout.py) calls a step object once per generated token. Two implementations, one interface
(``step(token, position) -> logits``, ``step.keep(rows)`` to drop finished rows):

* ``DecodeStep``: the model's own modules (embedding, norms, projections, MLP, head) called in the order
  ``LlamaDecoderLayer.forward`` calls them, with the keys and values kept as one plain tensor per layer.
  For a small model, what HF's ``model(...)`` does around its layers (mask building, cache objects, output
  classes, decorators) is a good share of each step: on the shipped 1.3M-parameter Llama one decode
  step takes 2.4 ms (HF) vs 1.9 ms (here) at 1-15 rows, 8.4 vs 7.2 ms at 64-128 rows, and a whole rollout
  0.89-0.92x the time (BENCHMARKS.md). The logits are HF's to the bit in every configuration tested on a CPU: same
  modules, same ops in the same order, attention through SDPA as HF's "sdpa" implementation calls it
  (tests/test_decode_step.py: Llama, Qwen2, Qwen3, grouped-query attention, LoRA), so rollouts under a seed are
  the same tokens either way.
* ``HFDecodeStep``: ``model(...)`` with HF's ``DynamicCache``, for everything ``has_decode_step`` turns away:
  other architectures, sliding-window attention, attention implementations other than "sdpa", peft prompt or
  prefix tuning.

Because the modules are called (not their weights read), LoRA / DoRA adapters (peft), 4-bit layers
(bitsandbytes) and ``disable_adapter()`` work unchanged. ``decode`` puts the model in eval mode first (no dropout).

One step for the n rows still decoding, per layer:

    x = RMSNorm(h)                        h: (n, 1, C) the hidden state of the token just sampled
    q, k, v = x Wq, x Wk, x Wv            split into heads: (n, heads, 1, D); Qwen3 normalises q and k here
    q, k = rope(q, pos), rope(k, pos)     rotate by the token's position
    K, V = [K, k], [V, v]                 append to the cache: (n, kv_heads, t + 1, D)
    o = softmax(q K^T / sqrt(D) + mask) V     the mask hides each row's left padding; a kv head serves its group
    h = h + o Wo
    h = h + MLP(RMSNorm(h))
logits = lm_head(RMSNorm(h))

(A cache preallocated for the whole completion and written in place was measured too, and was slower on a CPU:
0.96-1.02x of HF's rollout time against 0.89-0.92x. Its large buffers are fresh memory at each rollout and each
dropping of rows, ~10k page faults per rollout against ~1.9k; the tensors ``torch.cat`` makes reuse freed memory.)
"""

import torch
import torch.nn.functional as F

from .kv_cache import cache_argument

# Architectures whose decoder layer is exactly the computation above. Qwen2/Qwen3 differ from Llama only
# in biases on q, k, v (inside the modules) and Qwen3's per-head q/k norms; sliding-window layers are not
# supported (has_decode_step checks).
DECODE_STEP_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


def causal_lm(model):
    """The HF *ForCausalLM inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def has_decode_step(model) -> bool:
    """True where DecodeStep computes what the model's own forward computes; HFDecodeStep serves the rest."""
    peft_config = getattr(model, "active_peft_config", None)
    if peft_config is not None and peft_config.is_prompt_learning:  # prompt / prefix tuning add virtual tokens
        return False
    lm = causal_lm(model)
    if type(lm).__name__ not in DECODE_STEP_ARCHITECTURES or not type(lm).__module__.startswith("transformers.models."):
        return False  # a remote-code class of the same name may differ inside
    if lm.config._attn_implementation != "sdpa":  # eager / flash attention: same math, other rounding
        return False
    return all(getattr(layer.self_attn, "sliding_window", None) is None for layer in lm.model.layers)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class DecodeStep:
    """The decode step written out.

    cache: the prefill's ``DynamicCache`` (keys and values (n, kv_heads, P, D) per layer), already repeated to
    one row per sample. prompt_mask: (n, P) 1 on prompt tokens, 0 on left padding.
    """

    def __init__(self, model, cache, prompt_mask, max_new_tokens: int):
        self.lm = causal_lm(model)
        n, P = prompt_mask.shape
        self.keys = [layer.keys for layer in cache.layers]  # per layer (n, kv_heads, t, D)
        self.values = [layer.values for layer in cache.layers]
        self.mask = torch.ones(n, 1, 1, P + max_new_tokens, dtype=torch.bool, device=prompt_mask.device)
        self.mask[:, 0, 0, :P] = prompt_mask.bool()  # True = attend; generated tokens always are

    def keep(self, rows: torch.Tensor):
        """Keep only these batch rows (finished rows are dropped)."""
        self.keys = [k[rows] for k in self.keys]
        self.values = [v[rows] for v in self.values]
        self.mask = self.mask[rows]

    def __call__(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """token (n,), position (n, 1) -> next-token logits (n, V)."""
        body, n = self.lm.model, len(token)
        h = body.embed_tokens(token[:, None])  # (n, 1, C)
        cos, sin = body.rotary_emb(h, position)  # (n, 1, D) each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (n, 1, 1, D): broadcast over heads
        mask = self.mask[..., : self.keys[0].shape[2] + 1]  # (n, 1, 1, t + 1)
        for i, layer in enumerate(body.layers[: len(self.keys)]):  # the layers the config counts, as HF does
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            q = attn.q_proj(x).view(n, 1, -1, attn.head_dim)  # (n, 1, heads, D)
            k = attn.k_proj(x).view(n, 1, -1, attn.head_dim)  # (n, 1, kv_heads, D)
            v = attn.v_proj(x).view(n, 1, -1, attn.head_dim).transpose(1, 2)  # (n, kv_heads, 1, D)
            if hasattr(attn, "q_norm"):  # Qwen3
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = q.transpose(1, 2), k.transpose(1, 2)  # (n, heads, 1, D), (n, kv_heads, 1, D)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            self.keys[i] = torch.cat([self.keys[i], k], dim=2)  # (n, kv_heads, t + 1, D)
            self.values[i] = torch.cat([self.values[i], v], dim=2)
            # Grouped-query attention: head j reads kv head j // (heads / kv_heads), so the one query of each head
            # of a group becomes a row of that kv head's query: (n, kv_heads, heads / kv_heads, D). No copy of
            # the keys, as HF does for one query (pack_gqa); with heads == kv_heads it is the usual layout.
            q = q.reshape(n, k.shape[1], -1, attn.head_dim)
            o = F.scaled_dot_product_attention(q, self.keys[i], self.values[i], attn_mask=mask, scale=attn.scaling)
            h = h + attn.o_proj(o.reshape(n, 1, -1))  # heads back in order: (n, 1, heads * D)
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.lm.lm_head(body.norm(h))[:, -1]


class HFDecodeStep:
    """The same step through ``model(...)`` and HF's ``DynamicCache``: any causal LM."""

    def __init__(self, model, cache, prompt_mask, max_new_tokens: int):
        self.model, self.cache, self.attention_mask = model, cache, prompt_mask  # mask grows a column per step

    def keep(self, rows: torch.Tensor):
        self.cache.batch_select_indices(rows)
        self.attention_mask = self.attention_mask[rows]

    def __call__(self, token: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        self.attention_mask = torch.cat([self.attention_mask, self.attention_mask.new_ones(len(token), 1)], dim=1)
        return self.model(input_ids=token.unsqueeze(1), attention_mask=self.attention_mask, position_ids=position,
                          **cache_argument(self.model, self.cache), use_cache=True).logits[:, -1]  # (n, V)
