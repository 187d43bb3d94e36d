"""top_k / top_p: the sampler draws from a truncated, renormalised softmax, and every log-prob the loss uses is taken
under that distribution (truncation.py). Oracles: HF's TopKLogitsWarper / TopPLogitsWarper and HF generate's
processed scores."""

import pytest
import torch
from transformers import GenerationConfig, TopKLogitsWarper, TopPLogitsWarper

from minigrpo.config import Config, ConfigError
from minigrpo.logprobs import completion_logprobs, plain_completion_logprobs
from minigrpo.run import load_policy
from minigrpo.rollout import eos_token_ids, next_token, sample_completions
from minigrpo.truncation import drop_mask, truncate_logits

SETTINGS = [(0, 0.8), (5, 1.0), (5, 0.9), (1, 1.0), (0, 0.3)]  # (top_k, top_p)


def hf_truncated(logits, top_k, top_p):
    """HF's warpers, in generate's order (top-k, then top-p): -inf where a token is dropped."""
    scores = logits.clone()
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores


def test_drop_mask_by_hand():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).log_softmax(-1)  # p = 0.64, 0.24, 0.09, 0.03
    assert drop_mask(logits, top_k=2).tolist() == [[False, False, True, True]]
    assert drop_mask(logits, top_p=0.8).tolist() == [[False, False, True, True]]  # 0.64 < 0.8 <= 0.64 + 0.24
    assert drop_mask(logits, top_p=0.5).tolist() == [[False, True, True, True]]  # the most likely alone suffices
    assert drop_mask(logits, top_k=3, top_p=0.95).tolist() == [[False, False, False, True]]
    assert not drop_mask(logits).any()  # no truncation asked


@pytest.mark.parametrize("top_k, top_p", SETTINGS)
def test_the_kept_set_is_hfs(top_k, top_p):
    logits = torch.randn(64, 40, generator=torch.Generator().manual_seed(0)) * 2
    expected = hf_truncated(logits, top_k, top_p).isinf()
    assert torch.equal(drop_mask(logits, top_k, top_p), expected)


def test_the_sampled_token_always_stays():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    kept = truncate_logits(logits, top_k=1, keep=torch.tensor([3]))
    assert kept.isfinite().tolist() == [[True, False, False, True]]


def test_next_token_draws_from_the_truncated_distribution():
    torch.manual_seed(0)
    logits = torch.randn(1, 12) * 1.5
    draws = next_token(logits.expand(40_000, -1), temperature=0.7, top_p=0.8, top_k=6, do_sample=True)
    frequency = torch.bincount(draws, minlength=12) / len(draws)
    expected = hf_truncated(logits / 0.7, 6, 0.8).softmax(-1)[0]
    assert (frequency[expected == 0] == 0).all()  # never a dropped token
    torch.testing.assert_close(frequency, expected, atol=0.01, rtol=0)


def truncated_independent(model, ids, temperature, top_k, top_p):
    """Each row alone, no padding: model(prompt + completion).logits / T, HF's warpers (the sampled token kept),
    log_softmax, gather. (B, T)."""
    prompt_ids, prompt_mask, completion_ids, completion_mask = ids
    rows = []
    for i in range(len(prompt_ids)):
        prompt, completion = prompt_ids[i][prompt_mask[i].bool()], completion_ids[i][completion_mask[i].bool()]
        logits = model(input_ids=torch.cat([prompt, completion])[None]).logits[0, len(prompt) - 1:-1] / temperature
        scores = hf_truncated(logits, top_k, top_p)
        scores = torch.where(torch.nn.functional.one_hot(completion, logits.shape[-1]).bool(), logits, scores)
        logp = scores.log_softmax(-1).gather(1, completion[:, None])[:, 0]
        rows.append(torch.nn.functional.pad(logp, (0, completion_ids.shape[1] - len(completion))))
    return torch.stack(rows)


@pytest.fixture(scope="module")
def policy(chat_model_dir):
    model, tokenizer = load_policy(Config(model_name_or_path=str(chat_model_dir)), chat_model_dir, torch.device("cpu"))
    return model, tokenizer


@pytest.mark.parametrize("path", ["blocks", "plain", "entropy_grad"])
@pytest.mark.parametrize("top_k, top_p", [(0, 0.8), (20, 1.0), (20, 0.9)])
def test_log_probs_are_the_truncated_samplers_with_gradients(policy, path, top_k, top_p):
    from test_logprobs import relative_difference, sampled_batch, trainable_grads

    model, _ = policy
    ids = sampled_batch(model.config.vocab_size, G=3, prompts=2, seed=2)
    grad_logp = torch.randn(ids[3].shape, generator=torch.Generator().manual_seed(1)) * ids[3]
    model.zero_grad(set_to_none=True)
    expected = truncated_independent(model, ids, 0.9, top_k, top_p)
    (expected * grad_logp).sum().backward()
    expected_grads = trainable_grads(model)
    model.zero_grad(set_to_none=True)
    if path == "plain":
        logp, entropy = plain_completion_logprobs(model, *ids, temperature=0.9, top_k=top_k, top_p=top_p,
                                                  with_entropy=True)
    else:
        logp, entropy = completion_logprobs(model, *ids, temperature=0.9, top_k=top_k, top_p=top_p, with_entropy=True,
                                            block_tokens=4, entropy_grad=path == "entropy_grad")
    (logp * grad_logp).sum().backward()
    torch.testing.assert_close(logp.detach(), expected.detach(), rtol=0, atol=2e-5)
    assert relative_difference(trainable_grads(model), expected_grads) < 1e-5
    assert torch.isfinite(entropy).all() and (entropy >= -1e-6).all()
    full, _ = completion_logprobs(model, *ids, temperature=0.9)
    assert (logp.detach() >= full - 1e-6).all()  # renormalised over fewer tokens: never less likely


@pytest.mark.parametrize("top_k, top_p", [(0, 0.8), (20, 0.95)])
def test_hf_generates_processed_log_probs_are_the_trainers_and_the_full_softmax_is_biased(policy, top_k, top_p):
    """Sample with HF generate under top-k / top-p and read back the distribution each token was drawn from
    (generate's processed scores): the trainer's truncated log-probs equal it; the full softmax's are lower by
    log p(kept set) — the bias a ratio would carry without the truncation."""
    model, tokenizer = policy
    eos = eos_token_ids(model, tokenizer)
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "3+4="}], add_generation_prompt=True,
                                           return_tensors="pt", return_dict=True)
    ids, mask = prompt["input_ids"].repeat(4, 1), prompt["attention_mask"].repeat(4, 1)
    config = GenerationConfig(do_sample=True, temperature=0.9, top_k=top_k, top_p=top_p, max_new_tokens=12,
                              eos_token_id=eos, pad_token_id=tokenizer.pad_token_id, repetition_penalty=1.0)
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config, output_scores=True,
                             return_dict_in_generate=True)
    completion = out.sequences[:, ids.shape[1]:]  # (4, T)
    processed = torch.stack(out.scores, dim=1).log_softmax(-1)  # (4, T, V): what each token was drawn from
    sampler_logp = processed.gather(-1, completion.unsqueeze(-1)).squeeze(-1)
    is_eos = torch.isin(completion, torch.tensor(eos))
    completion_mask = ((is_eos.cumsum(1) - is_eos.long()) == 0).float()  # up to and including the first eos
    with torch.no_grad():
        truncated, _ = completion_logprobs(model, ids, mask, completion, completion_mask, temperature=0.9,
                                           top_k=top_k, top_p=top_p)
        full, _ = completion_logprobs(model, ids, mask, completion, completion_mask, temperature=0.9)
    on = completion_mask.bool()
    torch.testing.assert_close(truncated[on], sampler_logp[on], rtol=0, atol=1e-4)
    assert (sampler_logp[on] - full[on]).mean() > 0.05  # the full softmax: biased low, token by token


def test_top_k_is_a_config_field_with_a_one_line_error():
    assert Config(top_k=20).top_k == 20
    with pytest.raises(ConfigError, match="top_k: must be >= 0"):
        Config(top_k=-1)


def test_the_decode_loop_samples_only_kept_tokens(policy):
    """Every token the decode loop samples under top_k = 3 is among the 3 most likely at its position."""
    model, tokenizer = policy
    torch.manual_seed(0)
    rollout = sample_completions(model, tokenizer, [[{"role": "user", "content": "3+4="}]], num_generations=6,
                                 max_completion_length=10, temperature=1.0, top_k=3)
    with torch.no_grad():
        truncated, _ = completion_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.completion_ids,
                                           rollout.completion_mask, top_k=3)
        logits = model(input_ids=torch.cat([rollout.prompt_ids, rollout.completion_ids], 1),
                       attention_mask=torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)).logits
    P = rollout.prompt_ids.shape[1]
    ranks = (logits[:, P - 1:-1] > logits[:, P - 1:-1].gather(-1, rollout.completion_ids.unsqueeze(-1))).sum(-1)
    assert (ranks[rollout.completion_mask.bool()] < 3).all()
    assert torch.isfinite(truncated).all()


def test_a_run_with_top_k_and_top_p_trains(tmp_path):
    from minigrpo.trainer import train

    cfg = Config(max_steps=2, num_generations=4, generation_batch_size=8, eval_limit=4, eval_num_samples=0,
                 save_model=False, top_k=8, top_p=0.9, num_iterations=2, output_dir=str(tmp_path / "run"))
    summary = train(cfg, progress=False)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2 and summary
