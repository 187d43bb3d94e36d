"""Completion log-probs: the plain path (one forward, log_softmax, gather) is the definition; the fast path (the head in
blocks of tokens with recomputation in backward, padding trimmed, each prompt's forward shared by its group, and
under gradient checkpointing one pass per length group) changes the compute, not the numbers or the gradients."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from torch.utils._python_dispatch import TorchDispatchMode

from minigrpo.config import Config
from minigrpo.lab.live_tensors import LiveTensorBytes
from minigrpo.logprobs import (completion_hidden_states, completion_logprobs, head_logprobs,
                               length_chunks, plain_completion_logprobs)
from minigrpo.loading.models import load_model, reference_policy
from minigrpo.run import load_policy
from minigrpo.tasks import get_task


# ---------------------------------------------------------------------------------------------------------
# The head alone: log pi(o) = logit_o - logsumexp(logits), logits = h W^T / tau, block by block
# ---------------------------------------------------------------------------------------------------------
def test_head_logprobs_hand_case():
    # Two tokens, vocabulary 3, hidden 1, W = [[0], [1], [2]], temperature 1: h = 1 gives logits [0, 1, 2],
    # log Z = log(1 + e + e^2) = 2.4076; log pi(2) = 2 - 2.4076 = -0.4076; h = 0 gives [0, 0, 0], log pi = -log 3.
    weight = torch.tensor([[0.0], [1.0], [2.0]])
    logp, entropy = head_logprobs(torch.tensor([[1.0], [0.0]]), weight, torch.tensor([2, 0]), with_entropy=True,
                                  block_tokens=1)
    torch.testing.assert_close(logp, torch.tensor([-0.4076, -1.0986]), atol=1e-4, rtol=0)
    # Uniform over 3 tokens: entropy log 3 = 1.0986.
    assert entropy[1].item() == pytest.approx(1.0986, abs=1e-4)


@pytest.mark.parametrize("frozen_head", [False, True], ids=["trained-head", "frozen-head"])
@pytest.mark.parametrize("block_tokens", [1, 5, 64])
def test_head_logprobs_equal_log_softmax_gather_with_gradients(block_tokens, frozen_head):
    g = torch.Generator().manual_seed(0)
    N, H, V, tau = 23, 8, 50, 0.7
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    weight = torch.randn(V, H, generator=g).requires_grad_(not frozen_head)
    token_ids = torch.randint(0, V, (N,), generator=g)
    grad_logp = torch.randn(N, generator=g)

    logp_all = (hidden @ weight.T / tau).log_softmax(-1)  # (N, V), the plain way
    expected = logp_all.gather(-1, token_ids[:, None])[:, 0]
    expected_entropy = -(logp_all.exp() * logp_all).sum(-1)
    expected_grads = torch.autograd.grad((expected * grad_logp).sum(), [hidden] + [weight] * (not frozen_head))

    logp, entropy = head_logprobs(hidden, weight, token_ids, temperature=tau, with_entropy=True,
                                  block_tokens=block_tokens)
    grads = torch.autograd.grad((logp * grad_logp).sum(), [hidden] + [weight] * (not frozen_head))
    torch.testing.assert_close(logp, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(entropy, expected_entropy.detach(), rtol=1e-5, atol=1e-5)
    assert not entropy.requires_grad
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-5, atol=1e-5)


class LargestVocabularyTensor(TorchDispatchMode):
    """Records the largest tensor an op returns that has a vocabulary-sized dimension, the head's weight and its
    gradient (V, H) aside: how many positions of logits exist at once."""

    def __init__(self, vocab_size, hidden_size):
        super().__init__()
        self.vocab_size, self.hidden_size, self.positions = vocab_size, hidden_size, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and self.vocab_size in t.shape and sorted(t.shape) != sorted(
                    (self.vocab_size, self.hidden_size)):
                self.positions = max(self.positions, t.numel() // self.vocab_size)
        return out


def test_no_logits_larger_than_one_block_exist_forward_or_backward():
    torch.manual_seed(0)
    V = 997  # a vocabulary size no other dimension has
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True))
    B, P, T = 4, 3, 12
    ids = (torch.randint(3, V, (B, P)), torch.ones(B, P, dtype=torch.long), torch.randint(3, V, (B, T)),
           torch.ones(B, T))
    sizes = {}
    for name, fn in [("plain", plain_completion_logprobs), ("blocks", completion_logprobs)]:
        with LargestVocabularyTensor(V, 16) as largest:
            logp, _ = fn(model, *ids, **({"block_tokens": 5} if name == "blocks" else {}))
            logp.sum().backward()
        sizes[name] = largest.positions
    assert sizes["plain"] >= B * T  # the plain path holds every position's logits
    assert sizes["blocks"] <= 5  # the fast path: one block of 5 positions at most


@pytest.mark.parametrize("truncation", [{}, {"top_k": 7}, {"top_p": 0.8}], ids=["full", "top_k", "top_p"])
def test_sum_pi_squared_in_the_head_equals_the_softmax_squared(truncation):
    # The optimal token baseline's sum_v pi_v^2, from each block's softmax: the plain path's, and a direct
    # computation from full logits (over what the sampler's truncation keeps), at every completion token.
    torch.manual_seed(0)
    V = 50
    model = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=True))
    ids = sampled_batch(V)
    with torch.no_grad():
        logp, _, sum_pi_squared = completion_logprobs(model, *ids, temperature=0.7, block_tokens=4,
                                                      with_sum_pi_squared=True, **truncation)
        plain_logp, _, plain_sum = plain_completion_logprobs(model, *ids, temperature=0.7, with_sum_pi_squared=True,
                                                             **truncation)
        head_only, _ = completion_logprobs(model, *ids, temperature=0.7, block_tokens=4, **truncation)
    torch.testing.assert_close(sum_pi_squared, plain_sum, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(logp, head_only)  # asking for it changes nothing else
    mask = ids[3].bool()
    assert (sum_pi_squared[~mask] == 0).all() and (sum_pi_squared[mask] >= logp[mask].exp() ** 2 - 1e-6).all()
    assert (sum_pi_squared[mask] <= 1 + 1e-6).all()
    # the gradient path does not compute it: asked with a gradient, a clear error
    with pytest.raises(ValueError, match="without gradient"):
        head_logprobs(torch.randn(3, 4, requires_grad=True), torch.randn(V, 4), torch.tensor([1, 2, 3]),
                      with_sum_pi_squared=True)


# ---------------------------------------------------------------------------------------------------------
# Memory at Qwen2.5's 151,936-token vocabulary, counted tensor by tensor (live_tensors.LiveTensorBytes: the same
# figure on every run).
# ---------------------------------------------------------------------------------------------------------
QWEN_VOCABULARY = 151936


@pytest.mark.parametrize("frozen_head", [True, False], ids=["frozen-head", "trained-head"])
def test_the_head_holds_two_blocks_of_logits_at_most(frozen_head):
    # Blocks of 20 tokens, 3 and a bit of them: a block's (n, V) tensors must be gone before the next block's
    # exist. Forward holds the logits and the softmax (2 blocks); backward recomputes the logits and turns them
    # into dL/dlogits in place (1 block) beside the head's gradient (V, H). The rest is (N,) or (N, H): small.
    g = torch.Generator().manual_seed(0)
    V, H, N, n = QWEN_VOCABULARY, 16, 67, 20
    hidden = torch.randn(N, H, generator=g, requires_grad=True)
    weight = (torch.randn(V, H, generator=g) * 0.1).requires_grad_(not frozen_head)
    token_ids = torch.randint(0, V, (N,), generator=g)
    with LiveTensorBytes() as live:
        logp, _ = head_logprobs(hidden, weight, token_ids, with_entropy=True, block_tokens=n)
        logp.sum().backward()
    head_gradient = 0 if frozen_head else V * H * 4
    assert live.peak <= 2 * n * V * 4 + head_gradient + 16 * N * (H + 1) * 4


def test_sum_pi_squared_keeps_the_head_at_two_blocks():
    # The optimal token baseline's old-policy pass (no gradient, sum_v pi_v^2 asked for): 3 and a bit blocks of 20
    # tokens at Qwen's vocabulary, and still the logits and the softmax of one block at most, never a (tokens x V)
    # tensor for the batch (67 x V x 4 bytes = 41 MB here; 2 blocks: 24 MB).
    g = torch.Generator().manual_seed(0)
    V, H, N, n = QWEN_VOCABULARY, 16, 67, 20
    hidden, weight = torch.randn(N, H, generator=g), torch.randn(V, H, generator=g) * 0.1
    token_ids = torch.randint(0, V, (N,), generator=g)
    with torch.no_grad(), LiveTensorBytes() as live:
        _, _, sum_pi_squared = head_logprobs(hidden, weight, token_ids, block_tokens=n, with_sum_pi_squared=True)
    assert live.peak <= 2 * n * V * 4 + 16 * N * (H + 1) * 4 < N * V * 4
    probs = (hidden @ weight.T).softmax(-1)
    torch.testing.assert_close(sum_pi_squared, (probs**2).sum(-1))


def test_the_log_prob_pass_adds_under_a_quarter_of_a_logits_copy_to_its_body():
    # The memory measurement (minigrpo bench-logprobs --only memory) at a narrow width: tied head frozen
    # (as under LoRA), 2 prompts x G = 4 completions of 64-256 tokens, with entropy, forward + backward. What the
    # log-prob pass adds to its body alone is at most 0.25 of one float32 copy of the logits (rows x 256 x V).
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(vocab_size=QWEN_VOCABULARY, hidden_size=32, intermediate_size=64,
                                         num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                         tie_word_embeddings=True))
    model.get_output_embeddings().weight.requires_grad_(False)
    g = torch.Generator().manual_seed(1)
    G, U, P, T = 4, 2, 32, 256
    prompt_ids = torch.randint(3, QWEN_VOCABULARY, (U, P), generator=g).repeat_interleave(G, dim=0)
    lengths = torch.randint(64, T + 1, (U * G,), generator=g)
    completion_mask = (torch.arange(T) < lengths.unsqueeze(1)).long()
    ids = (prompt_ids, torch.ones_like(prompt_ids), torch.randint(3, QWEN_VOCABULARY, (U * G, T), generator=g)
           * completion_mask, completion_mask)
    peaks = {}
    for what in ("body", "pass"):
        with LiveTensorBytes() as live:
            if what == "body":
                out = completion_hidden_states(model.get_decoder(), model.config, *ids).sum(-1)
            else:
                out = completion_logprobs(model, *ids, with_entropy=True)[0]
            (out * completion_mask).sum().backward()
        peaks[what] = live.peak
    logits_copy = U * G * T * QWEN_VOCABULARY * 4
    assert (peaks["pass"] - peaks["body"]) / logits_copy <= 0.25


# ---------------------------------------------------------------------------------------------------------
# The pass's matrix-multiply FLOPs (torch's FlopCounterMode, exact): what keeps it fast, asserted where a
# timing cannot be. minigrpo bench-logprobs prints the same counts beside its timings.
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("frozen_head", [True, False], ids=["frozen-head", "trained-head"])
@pytest.mark.parametrize("options", [{}, dict(with_entropy=True), dict(top_k=5)], ids=["logp", "entropy", "top_k"])
def test_the_head_does_two_vocabulary_products_per_token_frozen_and_four_trained(frozen_head, options):
    # Each is (n x H) @ (H x V) = 2 n H V FLOPs. Forward: the logits, and E_p[w] = softmax @ W for the hidden
    # states' gradient. Backward, only when the head is trained: the logits again (nothing block-sized is kept)
    # and the head's gradient. The plain path does 2 / 3 (it keeps every logit instead).
    from torch.utils.flop_counter import FlopCounterMode

    N, H, V = 40, 16, 300
    hidden = torch.randn(N, H, requires_grad=True)
    weight = torch.randn(V, H).requires_grad_(not frozen_head)
    with FlopCounterMode(display=False) as counter:
        logp, _ = head_logprobs(hidden, weight, torch.randint(0, V, (N,)), block_tokens=7, **options)
        logp.sum().backward()
    assert counter.get_total_flops() == (2 if frozen_head else 4) * 2 * N * H * V


def test_the_shared_prefix_runs_each_prompt_through_the_body_once():
    # The decoder's linear layers cost 2 x their weights per token: U prompts + B completions with the shared
    # prefix, B x (prompt + completion) without. (Attention's own products are not among torch's counted ops.)
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    decoder_config = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                 num_attention_heads=2, num_key_value_heads=1)
    decoder = LlamaForCausalLM(decoder_config).get_decoder()
    U, G, P, T = 2, 3, 10, 6
    prompt_ids = torch.randint(3, 97, (U, P)).repeat_interleave(G, dim=0)  # (B, P), B = U x G
    completion_ids = torch.randint(3, 97, (U * G, T))  # (B, T), no padding
    linear_weights = sum(m.weight.numel() for m in decoder.modules() if isinstance(m, torch.nn.Linear))
    for share_prompts, tokens in ((True, U * P + U * G * T), (False, U * G * (P + T))):
        with FlopCounterMode(display=False) as counter:
            completion_hidden_states(decoder, decoder_config, prompt_ids, torch.ones_like(prompt_ids),
                                     completion_ids, torch.ones_like(completion_ids), share_prompts=share_prompts)
        assert counter.get_total_flops() == 2 * linear_weights * tokens


# ---------------------------------------------------------------------------------------------------------
# completion_logprobs against an independent plain forward, with gradients, on real model classes
# ---------------------------------------------------------------------------------------------------------
def sampled_batch(vocab_size, G=3, prompts=2, P=6, T=9, seed=0):
    """Groups of G rows sharing a left-padded prompt, right-padded completions of mixed lengths, rows shuffled."""
    g = torch.Generator().manual_seed(seed)
    B = G * prompts
    prompt_len = torch.randint(2, P + 1, (prompts,), generator=g).repeat_interleave(G)
    completion_len = torch.randint(1, T + 1, (B,), generator=g)
    prompt_mask = (torch.arange(P) >= P - prompt_len.unsqueeze(1)).long()
    completion_mask = (torch.arange(T) < completion_len.unsqueeze(1)).float()
    prompt_ids = torch.randint(3, vocab_size, (prompts, P), generator=g).repeat_interleave(G, dim=0) * prompt_mask
    completion_ids = torch.randint(3, vocab_size, (B, T), generator=g) * completion_mask.long()
    shuffle = torch.randperm(B, generator=g)
    return prompt_ids[shuffle], prompt_mask[shuffle], completion_ids[shuffle], completion_mask[shuffle]


def independent_logprobs(model, prompt_ids, prompt_mask, completion_ids, completion_mask, temperature):
    """Each row alone, no padding at all: model(prompt + completion).logits, log_softmax, gather. (B, T)."""
    rows = []
    for i in range(len(prompt_ids)):
        prompt = prompt_ids[i][prompt_mask[i].bool()]
        completion = completion_ids[i][completion_mask[i].bool()]
        logits = model(input_ids=torch.cat([prompt, completion])[None]).logits[0]  # (p + t, V)
        logp = (logits[len(prompt) - 1:-1] / temperature).log_softmax(-1).gather(1, completion[:, None])[:, 0]
        rows.append(torch.nn.functional.pad(logp, (0, completion_ids.shape[1] - len(completion))))
    return torch.stack(rows)  # (B, T)


def perturb_adapter(model):
    """LoRA starts with B = 0 (the adapter changes nothing); give B values so that the adapter matters."""
    torch.manual_seed(2)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.3)


def make_model(which, chat_model_dir):
    if which == "tiny":  # the shipped think_addition Llama (tied embeddings)
        return load_model(get_task("think_addition").model_dir)
    if which == "untied":
        torch.manual_seed(0)
        return LlamaForCausalLM(LlamaConfig(vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                            num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=False))
    adapter = {"standin": {}, "standin-lora": dict(use_peft=True), "standin-qlora": dict(use_peft=True,
                                                                                         load_in_4bit=True)}[which]
    if adapter.get("load_in_4bit"):
        pytest.importorskip("bitsandbytes")
    cfg = Config(model_name_or_path=str(chat_model_dir), lora_r=4, lora_alpha=8, lora_dropout=0.0, **adapter)
    model, _ = load_policy(cfg, chat_model_dir, torch.device("cpu"))  # the Qwen2 stand-in (tied embeddings)
    if adapter:
        perturb_adapter(model)
    return model


def relative_difference(a, b):
    return ((a - b).norm() / b.norm()).item()


def trainable_grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.requires_grad])


MODELS = ["tiny", "untied", "standin", "standin-lora", "standin-qlora"]


@pytest.mark.parametrize("which", MODELS)
def test_completion_logprobs_equal_an_independent_plain_forward_with_gradients(which, chat_model_dir):
    model = make_model(which, chat_model_dir)
    ids = sampled_batch(model.config.vocab_size)
    mask, tau = ids[3], 0.7
    grad_logp = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask  # any dL/dlogp

    model.zero_grad(set_to_none=True)
    expected = independent_logprobs(model, *ids, tau)
    (expected * grad_logp).sum().backward()
    expected_grads = trainable_grads(model)

    model.zero_grad(set_to_none=True)
    logp, _ = completion_logprobs(model, *ids, temperature=tau, block_tokens=4)  # several blocks
    (logp * grad_logp).sum().backward()
    torch.testing.assert_close(logp.detach(), expected.detach(), rtol=0, atol=2e-5)
    # Float rounding: gradients up to ~40 differ by ~1e-6 of their norm (the padded plain path by ~3e-7).
    assert relative_difference(trainable_grads(model), expected_grads) < 1e-5


@pytest.mark.parametrize("which", ["standin", "standin-lora"])
def test_entropy_and_the_lora_reference_equal_the_plain_path(which, chat_model_dir):
    model = make_model(which, chat_model_dir)
    ids = sampled_batch(model.config.vocab_size, seed=3)
    with torch.no_grad():
        plain = plain_completion_logprobs(model, *ids, temperature=0.9, with_entropy=True)
        fast = completion_logprobs(model, *ids, temperature=0.9, with_entropy=True, block_tokens=3)
        torch.testing.assert_close(fast, plain, rtol=0, atol=2e-5)
        # The reference policy: LoRA's adapter switched off for the call (models.AdapterDisabled), else a copy.
        reference = reference_policy(model)
        ref_fast, _ = completion_logprobs(reference, *ids)
        ref_plain, _ = plain_completion_logprobs(reference, *ids)
        torch.testing.assert_close(ref_fast, ref_plain, rtol=0, atol=2e-5)
        if which == "standin-lora":
            assert not torch.allclose(ref_fast, fast[0], atol=1e-3)  # the adapter was really off


def test_length_chunks_hand_case():
    # Three short rows and two long ones: padding the short ones to 40 would cost 3 * 39 tokens, more than
    # one extra call (chunk_cost 16), so they get a chunk of their own.
    chunks = length_chunks([2, 2, 2, 2, 2], [40, 1, 40, 1, 1], chunk_cost=16)
    assert chunks == [[1, 3, 4], [0, 2]]
    # A call costing more than any padding it saves: one chunk.
    assert len(length_chunks([2, 2, 2, 2, 2], [40, 1, 40, 1, 1], chunk_cost=10_000)) == 1


def test_length_chunks_cover_every_row_once():
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        B = int(torch.randint(1, 40, (1,), generator=g))
        prompts = torch.randint(1, 12, (B,), generator=g).tolist()
        completions = torch.randint(0, 50, (B,), generator=g).tolist()
        chunks = length_chunks(prompts, completions)
        assert sorted(i for c in chunks for i in c) == list(range(B))


def test_trimmed_chunks_and_shared_prompts_equal_one_padded_batch():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=18, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128)
    model = LlamaForCausalLM(config)
    B, P, T, G = 24, 7, 30, 4
    prompt_len = torch.randint(2, P + 1, (B // G,)).repeat_interleave(G)  # groups of G rows share a prompt
    completion_len = torch.where(torch.rand(B) < 0.5, torch.randint(1, 6, (B,)), torch.randint(20, T + 1, (B,)))
    prompt_mask = (torch.arange(P) >= P - prompt_len.unsqueeze(1)).long()  # left-padded
    completion_mask = (torch.arange(T) < completion_len.unsqueeze(1)).float()  # right-padded
    prompt_ids = torch.randint(3, 18, (B // G, P)).repeat_interleave(G, dim=0) * prompt_mask
    shuffle = torch.randperm(B)  # as in a mini-batch: group members anywhere in the batch
    prompt_ids, prompt_mask, completion_mask = prompt_ids[shuffle], prompt_mask[shuffle], completion_mask[shuffle]
    completion_ids = torch.randint(3, 18, (B, T)) * completion_mask.long()
    args = (model, prompt_ids, prompt_mask, completion_ids, completion_mask)

    results = []
    for trim in (False, True):
        model.zero_grad()
        logp, entropy = completion_logprobs(*args, temperature=0.7, with_entropy=True, trim_padding=trim)
        (logp * completion_mask * torch.linspace(-1, 1, T)).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters()])
        results.append((logp.detach() * completion_mask, entropy * completion_mask, grad))
    (lp_full, ent_full, g_full), (lp_trim, ent_trim, g_trim) = results
    torch.testing.assert_close(lp_trim, lp_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_trim, ent_full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g_trim, g_full, rtol=1e-4, atol=1e-6)


# ---------------------------------------------------------------------------------------------------------
# Gradient checkpointing (Config.gradient_checkpointing): the same gradients, activations recomputed
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("adapter", [{}, dict(use_peft=True), dict(use_peft=True, load_in_4bit=True)],
                         ids=["full", "lora", "qlora"])
def test_gradient_checkpointing_gives_the_same_gradients(adapter, chat_model_dir):
    if adapter.get("load_in_4bit"):
        pytest.importorskip("bitsandbytes")
    ids = None
    results = {}
    for checkpointing in (False, True):
        # No dropout: with checkpointing the prompts are not shared, so dropout would draw different masks.
        cfg = Config(model_name_or_path=str(chat_model_dir), lora_r=4, lora_alpha=8, lora_dropout=0.0,
                     gradient_checkpointing=checkpointing, **adapter)
        torch.manual_seed(0)  # the same LoRA initialisation both times
        model, _ = load_policy(cfg, chat_model_dir, torch.device("cpu"))
        if adapter:
            perturb_adapter(model)
        ids = ids or sampled_batch(model.config.vocab_size, seed=4)
        mlp_calls = []
        mlp = [m for name, m in model.named_modules() if name.endswith("layers.0.mlp")][0]
        mlp_forward = mlp.forward  # counted by wrapping: module hooks do not fire in checkpoint's recomputation
        mlp.forward = lambda *args, **kwargs: mlp_calls.append(1) or mlp_forward(*args, **kwargs)
        model.train()
        logp, _ = completion_logprobs(model, *ids, temperature=0.8)
        forward_calls = len(mlp_calls)
        (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()
        results[checkpointing] = (logp.detach(), trainable_grads(model), forward_calls, len(mlp_calls) - forward_calls)
    (logp, grads, _, recomputed), (logp_gc, grads_gc, _, recomputed_gc) = results[False], results[True]
    assert recomputed == 0 and recomputed_gc > 0  # backward ran the block again only with checkpointing
    torch.testing.assert_close(logp_gc, logp, rtol=0, atol=2e-5)
    assert relative_difference(grads_gc, grads) < 1e-5


def test_gradient_checkpointing_refuses_a_model_without_it(monkeypatch, random_model_dir):
    from minigrpo.config import ConfigError
    from minigrpo.loading.models import enable_gradient_checkpointing

    model = load_model(random_model_dir)
    monkeypatch.setattr(type(model), "supports_gradient_checkpointing", False)
    with pytest.raises(ConfigError, match="gradient_checkpointing: LlamaForCausalLM does not support it"):
        enable_gradient_checkpointing(model)
