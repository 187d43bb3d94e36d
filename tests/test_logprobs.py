"""Completion log-probs: trimming padding (length-sorted chunks) and sharing each prompt's forward pass among the
completions of its group change the compute, not the numbers."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from minigrpo.logprobs import completion_logprobs, length_chunks


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
