"""Rollouts and evaluation: shapes, grouping, masks, decoding, pass@k, and the shipped warm-start models."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

from minigrpo.evaluate import evaluate, pass_at_k
from minigrpo.rollout import sample_completions, sample_completions_hf
from minigrpo.tasks import get_task
from minigrpo.loading.tokenizer import build_tokenizer

PROMPTS = ["12+34=", "1234+5678=", "7+8="]
G, MAX_LEN = 4, 10


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def tiny_model(tokenizer, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )
    return LlamaForCausalLM(config)


@pytest.fixture(scope="module")
def model(tokenizer):
    model = tiny_model(tokenizer)
    with torch.no_grad():  # make eos likely enough that some rows end early and some are truncated
        model.lm_head.weight[tokenizer.eos_token_id] *= 6
    return model


@pytest.fixture(scope="module")
def rollout(model, tokenizer):
    torch.manual_seed(0)
    return sample_completions(model, tokenizer, PROMPTS, num_generations=G, max_completion_length=MAX_LEN)


# ---- shapes and grouping ----------------------------------------------------------------------------
def test_shapes(rollout):
    B = len(PROMPTS) * G
    P = rollout.prompt_ids.shape[1]
    T = rollout.completion_ids.shape[1]
    assert rollout.prompt_ids.shape == rollout.prompt_mask.shape == (B, P)
    assert rollout.completion_ids.shape == rollout.completion_mask.shape == (B, T)
    assert T <= MAX_LEN
    assert rollout.is_truncated.shape == (B,) and rollout.is_truncated.dtype == torch.bool
    assert rollout.completion_mask.dtype == torch.float32
    assert len(rollout.completions) == B


def test_rows_are_grouped_consecutively_and_left_padded(rollout, tokenizer):
    for i, prompt in enumerate(PROMPTS):
        ids = tokenizer(prompt)["input_ids"]
        for row in range(i * G, (i + 1) * G):
            mask = rollout.prompt_mask[row]
            assert rollout.prompt_ids[row][mask.bool()].tolist() == ids
            assert mask[-len(ids):].all() and not mask[: -len(ids)].any()  # prompt ends at the last column


# ---- masks ------------------------------------------------------------------------------------------
def test_mask_ends_at_first_eos_and_truncation_flag(rollout, tokenizer):
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    seen = set()
    for ids, mask, truncated in zip(rollout.completion_ids, rollout.completion_mask, rollout.is_truncated):
        n = int(mask.sum())
        assert mask[:n].eq(1).all() and mask[n:].eq(0).all()  # a prefix of ones
        assert ids[n:].eq(pad).all()  # pad after the end
        eos_positions = (ids == eos).nonzero().flatten().tolist()
        if truncated:
            assert eos_positions == [] and n == MAX_LEN
        else:
            assert eos_positions == [n - 1]  # exactly one eos, the last masked token
        seen.add(bool(truncated))
    assert seen == {True, False}, "the fixture should produce both finished and truncated rows"


def test_immediate_eos_gives_empty_completion(tokenizer):
    model = tiny_model(tokenizer)
    model.lm_head = torch.nn.Linear(32, len(tokenizer), bias=True)  # logits = bias: eos always wins
    with torch.no_grad():
        model.lm_head.weight.zero_()
        model.lm_head.bias.zero_()
        model.lm_head.bias[tokenizer.eos_token_id] = 10.0
    out = sample_completions(model, tokenizer, PROMPTS, num_generations=2, max_completion_length=MAX_LEN, do_sample=False)
    assert out.completions == [""] * 6
    assert out.completion_mask.sum(dim=1).tolist() == [1.0] * 6
    assert not out.is_truncated.any()


# ---- decoding ---------------------------------------------------------------------------------------
def test_completions_decode_the_ids(rollout, tokenizer):
    special = set(tokenizer.all_special_ids)
    for text, ids, mask in zip(rollout.completions, rollout.completion_ids, rollout.completion_mask):
        kept = [t for t in ids[mask.bool()].tolist() if t not in special]
        assert text == tokenizer.decode(kept)
        assert " " not in text
        assert tokenizer(text, add_special_tokens=False)["input_ids"] == kept  # <think> survives, one token each


# ---- sampling behaviour -----------------------------------------------------------------------------
def test_greedy_is_deterministic_and_padding_invariant(model, tokenizer):
    alone = sample_completions(model, tokenizer, PROMPTS[:1], max_completion_length=MAX_LEN, do_sample=False)
    batch = sample_completions(model, tokenizer, PROMPTS, max_completion_length=MAX_LEN, do_sample=False)
    # PROMPTS[0] is left-padded in the batch: the padding must not change what it generates
    assert batch.completions[0] == alone.completions[0]


def test_sampling_follows_torch_seed(model, tokenizer):
    runs = []
    for _ in range(2):
        torch.manual_seed(123)
        runs.append(sample_completions(model, tokenizer, PROMPTS, num_generations=G, max_completion_length=MAX_LEN))
    assert runs[0].completions == runs[1].completions


def test_model_generation_defaults_do_not_leak_into_sampling(tokenizer):
    model = tiny_model(tokenizer, seed=1)
    model.generation_config.top_k = 1  # if honoured, every sample would be the greedy one
    model.generation_config.repetition_penalty = 5.0
    greedy = sample_completions(model, tokenizer, ["1+1="], max_completion_length=MAX_LEN, do_sample=False)
    torch.manual_seed(0)
    samples = sample_completions(model, tokenizer, ["1+1="], num_generations=16, max_completion_length=MAX_LEN)
    assert len(set(samples.completions)) > 1
    assert set(samples.completions) != set(greedy.completions)


def test_training_mode_is_restored(tokenizer):
    model = tiny_model(tokenizer)
    model.train()
    sample_completions(model, tokenizer, PROMPTS, max_completion_length=3)
    assert model.training


# ---- pass@k -----------------------------------------------------------------------------------------
def test_pass_at_k_hand_cases():
    # n=5 samples, c=2 correct: pass@1 = 2/5; pass@2 = 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)  # C(3,3)/C(5,3) = 1/10
    assert pass_at_k(5, 2, 4) == 1.0  # n - c < k: any 4 of 5 include a correct one
    assert pass_at_k(8, 0, 8) == 0.0
    assert pass_at_k(8, 8, 1) == 1.0
    # agrees with the definition "probability that j draws without replacement contain a correct one"
    n, c = 10, 3
    for k in range(1, n + 1):
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))
    with pytest.raises(ValueError):
        pass_at_k(4, 5, 1)


# ---- evaluate and the shipped models ----------------------------------------------------------------
@pytest.mark.parametrize("task_name", ["addition", "think_addition"])
def test_shipped_model_matches_warm_start_record(task_name):
    task = get_task(task_name)
    model = AutoModelForCausalLM.from_pretrained(task.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
    assert model.dtype == torch.float32  # stored as float16, loaded for training in float32
    record = json.loads((task.model_dir / "warm_start.json").read_text())
    low, high = record["band"]

    result = evaluate(model, tokenizer, task, task.load("test"), batch_size=500)
    assert result["accuracy_greedy"] == pytest.approx(record["test_results"]["accuracy_greedy"], abs=0.01)
    assert low <= result["accuracy_greedy"] <= high


def test_evaluate_pass_at_k_is_consistent():
    task = get_task("addition")
    model = AutoModelForCausalLM.from_pretrained(task.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
    torch.manual_seed(0)
    result = evaluate(model, tokenizer, task, task.load("test")[:100], num_samples=4)
    assert result["pass@1"] == pytest.approx(result["accuracy_sampled"])  # same n for every problem
    assert result["pass@1"] <= result["pass@2"] <= result["pass@3"] <= result["pass@4"]
    assert 2 <= result["mean_length_greedy"] <= task.max_completion_length


# ---- the decode loop against HF generate -------------------------------------------------------------
def test_decode_greedy_equals_hf_generate():
    """Greedy decoding is deterministic, so the hand-written loop (shared prefill, dropping finished rows)
    must give exactly HF generate's tokens: short and long scratchpads, early-ending and truncated rows."""
    task = get_task("think_addition")
    model = AutoModelForCausalLM.from_pretrained(task.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(task.model_dir)
    prompts = [r["prompt"] for r in task.load("test")[:48]]
    kw = dict(num_generations=2, max_completion_length=30, do_sample=False)
    ours = sample_completions(model, tokenizer, prompts, **kw)
    hf = sample_completions_hf(model, tokenizer, prompts, **kw)
    assert torch.equal(ours.completion_ids, hf.completion_ids)
    assert torch.equal(ours.completion_mask, hf.completion_mask)
    assert ours.completions == hf.completions
    lengths = ours.completion_lengths
    assert ours.is_truncated.any() and lengths.min() < 0.5 * lengths.max()  # rows did end at different steps


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_decode_samples_like_hf_generate(tokenizer, temperature, top_p):
    """Same seed, same draws: while no row has finished (eos made impossible), the loop consumes torch's RNG
    exactly as HF generate does, so pure temperature / top-p sampling gives the very same tokens."""
    model = tiny_model(tokenizer, seed=2)
    model.lm_head.register_forward_hook(lambda m, i, out: out.index_fill(-1, torch.tensor([tokenizer.eos_token_id]), -1e9))
    runs = []
    for fn in (sample_completions, sample_completions_hf):
        torch.manual_seed(7)
        runs.append(fn(model, tokenizer, PROMPTS, num_generations=G, max_completion_length=MAX_LEN,
                       temperature=temperature, top_p=top_p))
    assert torch.equal(runs[0].completion_ids, runs[1].completion_ids)
    assert runs[0].is_truncated.all()


def test_next_token_top_p_matches_hf_warpers():
    """next_token's distribution is HF's temperature + top-p warpers with nothing else (no top-k)."""
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

    from minigrpo.rollout import next_token

    torch.manual_seed(0)
    logits = torch.randn(64, 18) * 3
    for temperature, top_p in [(1.0, 0.9), (0.5, 0.5), (2.0, 0.99)]:
        hf = TopPLogitsWarper(top_p)(None, TemperatureLogitsWarper(temperature)(None, logits.clone()))
        allowed = torch.isfinite(hf)
        draws = torch.stack([next_token(logits, temperature=temperature, top_p=top_p, do_sample=True) for _ in range(200)], 1)
        assert allowed.gather(1, draws).all()  # never a token HF's top-p removed
        assert torch.equal(allowed.sum(1) > 1, torch.tensor([len(set(r)) > 1 for r in draws.tolist()]))  # and the rest occur
    assert torch.equal(next_token(logits, temperature=1.0, top_p=1.0, do_sample=False), logits.argmax(-1))
