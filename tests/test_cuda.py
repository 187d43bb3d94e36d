"""On a CUDA GPU: the decode loop, the log-probs, a few GRPO steps, resuming, and peak memory (`pytest -m cuda`).

Each test runs once per device: on "cuda" (skipped, with the reason, where CUDA is absent, so the suite stays green
on a CPU machine) and on "cpu" at a toy shape, so that their code runs in CI and cannot rot between the times a GPU
is at hand. MINIGRPO_TEST_DEVICE=cuda (the GPU check, minigrpo/lab/gpu_check.py) or =cpu (its dry run) keeps one.
On CUDA the model is the stand-in (lab/standin.py) at Qwen2.5-0.5B's shape: 24 blocks, hidden 896, a 151,936-row
embedding, random weights; MINIGRPO_STANDIN_DIR names one already built (the GPU check builds it once for these
tests and its benchmarks).

What each test holds the code to:
  * greedy decoding: the decode loop's completions are HF generate's, in bfloat16 and float16 (16-bit weights, and
    float32 weights under autocast, as the trainer samples). Two computations of the same logits in 16 bits can
    round a near-tie differently, after which the rest of the row differs: a row may part from HF's only where
    16-bit rounding is large enough to swap the two tokens (`rounding_explains`), never at a clear margin.
  * the log-probs: the shared-prefix, head-in-blocks path equals the plain one within the dtype's error, both
    measured against float32 (values and the gradient).
  * 3 GRPO steps, full / LoRA / QLoRA (QLoRA where bitsandbytes imports), in bf16 and fp16: finite, and learning.
  * a run stopped after a checkpoint and resumed equals the uninterrupted run (on the CPU exactly; on CUDA the
    same completions and the numbers within 1e-3: attention's backward kernels may add in another order).
  * peak memory within 15% of `minigrpo memory`'s prediction for the same shape and batch (CUDA only: a CPU's peak
    resident set also holds the allocator's and the libraries' memory; there the test checks that both exist).
"""

import json
import os

import pytest
import torch

pytestmark = pytest.mark.cuda

DEVICES = [os.environ["MINIGRPO_TEST_DEVICE"]] if os.environ.get("MINIGRPO_TEST_DEVICE") else ["cuda", "cpu"]
TIMING = {"step_seconds", "generate_seconds", "tokens_per_second"}


def bitsandbytes_imports() -> bool:
    try:
        import bitsandbytes  # noqa: F401
    except Exception:  # noqa: BLE001 - a wheel without its native library raises more than ImportError
        return False
    return True


@pytest.fixture(scope="module", params=DEVICES)
def device(request):
    if request.param == "cuda" and not torch.cuda.is_available():
        pytest.skip("CUDA is absent: torch sees no GPU (the [cpu] variant runs the same test at a toy shape)")
    return torch.device(request.param)


def completion_tokens(device) -> int:
    return 128 if device.type == "cuda" else 16


@pytest.fixture(scope="module")
def standin(device, tmp_path_factory):
    """The stand-in's directory: Qwen2.5-0.5B's shape on CUDA, a toy one on the CPU (MINIGRPO_STANDIN_DIR: built)."""
    if os.environ.get("MINIGRPO_STANDIN_DIR"):  # the GPU check's (or its dry run's), of this device's shape
        return os.environ["MINIGRPO_STANDIN_DIR"]
    from minigrpo.lab.standin import QWEN25_05B_SHAPE, TOY_SHAPE, make_standin_chat_model

    shape = QWEN25_05B_SHAPE if device.type == "cuda" else TOY_SHAPE
    return str(make_standin_chat_model(tmp_path_factory.mktemp("standin"), **shape, device=str(device)))


@pytest.fixture(scope="module")
def rows_file(tmp_path_factory):
    """A small `answer` dataset: conversational prompts, numeric answers."""
    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    rows = [{"prompt": [{"role": "user", "content": f"What is {a} + {b}?"}], "answer": str(a + b)}
            for a, b in zip(range(3, 43, 2), range(40, 0, -2))]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


PROMPTS = [[{"role": "user", "content": text}] for text in
           ("What is 17 + 25?", "Natalia sold 48 clips in April and half as many in May. How many in all?",
            "Name a prime number larger than 90.", "Write the word seven in digits.")]


# ---- greedy decoding ------------------------------------------------------------------------------------------
def rounding_explains(model, dtype, autocast, prompt_ids, prompt_mask, prefix, ours: int, theirs: int) -> bool:
    """Whether 16-bit rounding can swap tokens `ours` and `theirs` after prompt + prefix: their logits' gap in float32
    (the same weights, upcast) is within 4x the larger 16-bit error of the two."""
    ids = torch.cat([prompt_ids[prompt_mask.bool()], prefix]).unsqueeze(0)
    with torch.no_grad():
        with autocast():
            low = model(input_ids=ids).logits[0, -1].float()
        reference = model.float()(input_ids=ids).logits[0, -1]
        model.to(dtype)
    error = max((low[t] - reference[t]).abs().item() for t in (ours, theirs))
    return (reference[ours] - reference[theirs]).abs().item() <= 4 * error


@pytest.mark.parametrize("weights, compute", [("bfloat16", None), ("float16", None), ("float32", "bfloat16"),
                                              ("float32", "float16")],
                         ids=["bf16-weights", "fp16-weights", "fp32-autocast-bf16", "fp32-autocast-fp16"])
def test_greedy_decode_loop_equals_hf_generate(device, standin, weights, compute):
    from minigrpo.loading.models import load_model_and_tokenizer
    from minigrpo.rollout import sample_completions, sample_completions_hf

    model, tokenizer = load_model_and_tokenizer(standin, device, dtype=weights)
    autocast = lambda: torch.autocast(device.type, dtype=getattr(torch, compute or "bfloat16"),  # noqa: E731
                                      enabled=compute is not None)
    with autocast():
        ours, theirs = (sample(model, tokenizer, PROMPTS, num_generations=2, do_sample=False,
                               max_completion_length=completion_tokens(device))
                        for sample in (sample_completions, sample_completions_hf))
    width = min(ours.completion_ids.shape[1], theirs.completion_ids.shape[1])
    parted = []
    for i in range(len(ours.completion_ids)):
        a, b = ours.completion_ids[i, :width], theirs.completion_ids[i, :width]
        differ = (a != b).nonzero()
        if len(differ):
            t = differ[0].item()
            assert rounding_explains(model, getattr(torch, weights), autocast, ours.prompt_ids[i], ours.prompt_mask[i],
                                     a[:t], a[t].item(), b[t].item()), f"row {i} parts from HF generate at token {t} " \
                                                                        "at a margin 16-bit rounding does not explain"
            parted.append(t)
    rows = len(ours.completion_ids)
    print(f"figure: greedy, {weights} weights, autocast {compute}: {rows - len(parted)} of {rows} rows equal "
          f"over {width} tokens" + (f"; the others part at a near-tie, at tokens {parted}" if parted else ""))
    assert len(parted) < rows, "no row equals HF generate's"


# ---- log-probs ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("compute", ["bfloat16", "float16"])
def test_shared_prefix_and_blocked_head_equal_the_plain_path_within_the_dtype(device, standin, compute):
    from minigrpo.logprobs import completion_logprobs, plain_completion_logprobs
    from minigrpo.loading.models import load_model

    model = load_model(standin, device)  # float32 weights, 16-bit autocast: as the trainer computes them
    g = torch.Generator().manual_seed(0)
    V, G, P, T = model.config.vocab_size, 4, 24, completion_tokens(device)
    prompt_ids = torch.randint(3, 1000, (2, P), generator=g).repeat_interleave(G, dim=0)
    prompt_mask = torch.ones_like(prompt_ids)
    prompt_mask[:G, :5] = 0  # the first prompt left-padded
    completion_ids = torch.randint(3, V, (2 * G, T), generator=g)
    completion_mask = (torch.arange(T) < torch.randint(1, T + 1, (2 * G, 1), generator=g)).float()
    ids = [x.to(device) for x in (prompt_ids, prompt_mask, completion_ids, completion_mask)]
    results = {}
    paths = (("float32", plain_completion_logprobs, None), ("plain", plain_completion_logprobs, compute),
             ("fast", completion_logprobs, compute))
    for name, logprobs, dtype in paths:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=getattr(torch, dtype or "float32"), enabled=dtype is not None):
            logp, _ = logprobs(model, *ids)
        (logp * ids[3]).sum().backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results[name] = (logp.detach(), grad)
    reference, reference_grad = results["float32"]
    errors = {name: (results[name][0] - reference).abs().max().item() for name in ("plain", "fast")}
    cosine = {name: torch.nn.functional.cosine_similarity(results[name][1], reference_grad, dim=0).item()
              for name in ("plain", "fast")}
    print(f"figure: log-probs under {compute} autocast: max |logp - float32| plain {errors['plain']:.4f}, fast "
          f"{errors['fast']:.4f}; gradient cosine to float32 plain {cosine['plain']:.5f}, fast {cosine['fast']:.5f}")
    assert results["fast"][0].dtype == torch.float32
    assert errors["fast"] <= 2 * errors["plain"] + 1e-3  # the fast path is no worse than the plain one in 16 bits
    assert 1 - cosine["fast"] <= 2 * (1 - cosine["plain"]) + 1e-4 and cosine["fast"] > 0.99  # the gradient too


# ---- GRPO steps -----------------------------------------------------------------------------------------------
def alternating(prompts, completions, **row):
    """1 for every other completion: every group has a spread, so every step has a gradient."""
    return [float(i % 2) for i in range(len(completions))]


def run_config(device, standin, rows_file, out, **settings):
    from minigrpo.config import Config

    values = dict(model_name_or_path=standin, task="answer", dataset_name=rows_file, output_dir=str(out),
                  device=device.type, max_steps=3, num_generations=4, generation_batch_size=8,
                  max_completion_length=completion_tokens(device) // 2, learning_rate=1e-4, eval_steps=0, eval_limit=2,
                  eval_num_samples=0, save_model=False, lora_dropout=0.0)
    return Config(**{**values, **settings})


def metric_lines(out) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


SETUPS = {"full": dict(dtype="float32"), "lora": dict(use_peft=True), "qlora": dict(use_peft=True, load_in_4bit=True)}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
@pytest.mark.parametrize("setup", list(SETUPS))
def test_three_grpo_steps(device, standin, rows_file, tmp_path, setup, precision):
    from minigrpo.trainer import train

    if setup == "qlora" and not bitsandbytes_imports():
        pytest.skip("QLoRA needs bitsandbytes, which does not import here")
    dtype = "float32" if setup == "full" else {"bf16": "bfloat16", "fp16": "float16"}[precision]
    cfg = run_config(device, standin, rows_file, tmp_path / "run", **{**SETUPS[setup], "dtype": dtype, precision: True})
    summary = train(cfg, reward_funcs=[alternating], progress=False)
    lines = metric_lines(tmp_path / "run")
    assert summary["steps"] == 3 and summary["quantized"] == (setup == "qlora") and len(lines) == 3
    assert all(line["loss"] is not None and line["entropy"] > 0 for line in lines)
    taken = [line["grad_norm"] for line in lines if line["grad_norm"] is not None]  # fp16: a step may be skipped
    assert taken and all(norm > 0 for norm in taken), "no optimizer step had a gradient"
    if precision == "fp16":
        assert sum(line["grad_scaler/skipped_steps"] for line in lines) < 3


# ---- resuming -------------------------------------------------------------------------------------------------
def test_a_run_resumed_from_its_checkpoint_equals_the_uninterrupted_run(device, standin, rows_file, tmp_path,
                                                                        monkeypatch):
    import minigrpo.trainer as trainer_module
    from minigrpo.trainer import train

    settings = dict(use_peft=True, dtype="bfloat16", bf16=True, max_steps=4, save_steps=2)
    train(run_config(device, standin, rows_file, tmp_path / "whole", **settings), reward_funcs=[alternating],
          progress=False)
    real_policy_loss, calls = trainer_module.policy_loss, []

    def stopping_at_step_3(*args, **kwargs):  # a run killed during step 3, after the checkpoint of step 2
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt("stopped, as a killed run stops")
        return real_policy_loss(*args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", stopping_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        train(run_config(device, standin, rows_file, tmp_path / "stopped", **settings), reward_funcs=[alternating],
              progress=False)
    monkeypatch.setattr(trainer_module, "policy_loss", real_policy_loss)
    train(run_config(device, standin, rows_file, tmp_path / "resumed", **settings,
                     resume_from_checkpoint=str(tmp_path / "stopped")), reward_funcs=[alternating], progress=False)
    whole, resumed = metric_lines(tmp_path / "whole"), metric_lines(tmp_path / "resumed")
    assert [line["step"] for line in resumed] == [1, 2, 3, 4]
    if device.type == "cpu":
        assert resumed == whole
        return
    for a, b in zip(whole, resumed):  # the same completions; the numbers to attention's order of additions
        assert a["advantages"] == b["advantages"] and a["completions/mean_length"] == b["completions/mean_length"]
        for key in ("loss", "grad_norm", "entropy", "reward"):
            assert b[key] == pytest.approx(a[key], rel=1e-3, abs=1e-6), key


# ---- memory ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("setup", ["full", "lora"])
def test_peak_memory_is_within_15_percent_of_the_prediction(device, standin, setup):
    from minigrpo.config import Config
    from minigrpo.lab.memory import measure_recipe_step

    lora = dict(use_peft=True, dtype="bfloat16") if setup == "lora" else dict(dtype="float32")
    on_cuda = device.type == "cuda"
    cfg = Config(model_name_or_path=standin, task="gsm8k", bf16=True, num_generations=8, generation_batch_size=8,
                 gradient_accumulation_steps=1, max_completion_length=256 if on_cuda else 32, loss_type="dapo",
                 **lora)
    measured = measure_recipe_step(cfg, device.type, prompt_length=200 if on_cuda else 16)
    predicted = measured["predicted"]["floor"]
    print(f"figure: peak memory, {setup}, bf16: measured {measured['peak_bytes'] / 2**30:.3f} GiB, predicted "
          f"{predicted / 2**30:.3f} GiB, ratio {measured['peak_bytes'] / predicted:.3f}")
    assert measured["peak_bytes"] > 0 and predicted > 0
    if on_cuda:
        assert abs(measured["peak_bytes"] / predicted - 1) <= 0.15
