"""One decode step: feed one token per row through the model and get the next token's logits.

``decode`` (rollout.py) calls a step object once per generated token. Two implementations, one interface
(``step(token, position) -> logits``, ``step.keep(rows)`` to drop finished rows):

* ``DecodeStep``: the model's own modules (embedding, norms, projections, MLP, head) called in the order
  ``LlamaDecoderLayer.forward`` calls them, with the keys and values kept as one plain tensor per layer.
  For a small model, what HF's ``model(...)`` does around its layers (mask building, cache objects, output
  classes, decorators) is a good share of each step: on the shipped 1.3M-parameter Llama one decode
  step takes 2.4 ms (HF) vs 1.9 ms (here) at 1-15 rows, 8.4 vs 7.2 ms at 64-128 rows, and a whole rollout
  0.89-0.91x the time (BENCHMARKS.md). The logits are the same numbers: same modules, same ops in the same order,
  bit for bit on the shipped model; with grouped-query attention within ~2e-7, as SDPA's ``enable_gqa`` stands
  in for HF's copy of the shared keys (tests/test_decode_step.py: Llama, Qwen2, Qwen3, GQA, LoRA).
* ``HFDecodeStep``: ``model(...)`` with HF's ``DynamicCache``, for every architecture ``DecodeStep``
  does not know (``has_decode_step``).

Because the modules are called (not their weights read), LoRA adapters (peft), 4-bit layers
(bitsandbytes) and ``disable_adapter()`` work unchanged.

One step for the n rows still decoding, per layer:

    x = RMSNorm(h)                        h: (n, 1, C) the hidden state of the token just sampled
    q, k, v = x Wq, x Wk, x Wv            split into heads: (n, heads, 1, D); Qwen3 normalises q and k here
    q, k = rope(q, pos), rope(k, pos)     rotate by the token's position
    K, V = [K, k], [V, v]                 append to the cache: (n, kv_heads, t + 1, D)
    o = softmax(q K^T / sqrt(D) + mask) V     the mask hides each row's left padding
    h = h + o Wo
    h = h + MLP(RMSNorm(h))
logits = lm_head(RMSNorm(h))

(A cache preallocated for the whole completion and written in place was measured too, and was slower on a CPU:
0.96-1.02x of HF's rollout time against 0.89-0.91x. Its large buffers are fresh memory at each rollout and each
dropping of rows, ~10k page faults per rollout against ~1.9k; the tensors ``torch.cat`` makes reuse freed memory.)
"""

import torch
import torch.nn.functional as F

# Architectures whose decoder layer is exactly the computation above. Qwen2/Qwen3 differ from Llama only
# in biases on q, k, v (inside the modules) and Qwen3's per-head q/k norms; sliding-window layers are not
# supported (has_decode_step checks).
DECODE_STEP_ARCHITECTURES = {"LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


def causal_lm(model):
    """The HF *ForCausalLM inside a peft wrapper (or the model itself)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def has_decode_step(model) -> bool:
    lm = causal_lm(model)
    if type(lm).__name__ not in DECODE_STEP_ARCHITECTURES:
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
        for i, layer in enumerate(body.layers):
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
            o = F.scaled_dot_product_attention(q, self.keys[i], self.values[i], attn_mask=mask, scale=attn.scaling,
                                               enable_gqa=q.shape[1] != k.shape[1])  # (n, heads, 1, D)
            h = h + attn.o_proj(o.transpose(1, 2).reshape(n, 1, -1))
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
                          past_key_values=self.cache, use_cache=True).logits[:, -1]  # (n, V)
