"""fp16: float16 autocast with loss scaling (mixed_precision.py), on the CPU, where torch runs both.

The lesson: float16 needs its gradients scaled into range, and an overflow is an event the run survives, not an
error. A step whose scaled gradients overflow is skipped (the weights do not move), the scale halves, the count
goes into metrics.jsonl, and a run resumed from a checkpoint continues with the same scale: the same run. The
log-probs, the entropy and the loss stay float32 whatever autocast does.
"""

import copy
import json
import math

import pytest
import torch

from minigrpo.batch import Batch
from minigrpo.config import Config, ConfigError
from minigrpo.logprobs import completion_logprobs, plain_completion_logprobs
from minigrpo.mixed_precision import autocast_dtype, grad_scaler
from minigrpo.loading.models import load_model
from minigrpo.objectives import policy_loss
from minigrpo.logprobs import LogprobForward
from minigrpo.trainer import grpo_update, train

N, P, T = 8, 5, 7
TIMING = {"step_seconds", "generate_seconds", "tokens_per_second"}


def fp16_autocast():
    return torch.autocast("cpu", dtype=torch.float16)


def batch(vocab: int) -> Batch:
    g = torch.Generator().manual_seed(0)
    completion_mask = (torch.arange(T) < torch.tensor([7, 2, 5, 7, 1, 3, 6, 4])[:, None]).float()
    return Batch.of_completions(torch.randint(3, vocab, (N, P), generator=g), torch.ones(N, P, dtype=torch.long),
                                torch.randint(3, vocab, (N, T), generator=g), completion_mask,
                                adv=torch.randn(N, generator=g))


def plant_inf_gradient(monkeypatch, calls: set[int], stop_at: int | None = None):
    """From now on the trainer's policy_loss sends an inf gradient to the log-probs on the given calls (1-based):
    every weight's gradient overflows, as a float16 backward that leaves its range does. stop_at: that call raises,
    as a killed run stops."""
    import minigrpo.trainer as trainer_module

    real_policy_loss, count = trainer_module.policy_loss, [0]

    def planted(logp, *args, **kwargs):
        count[0] += 1
        if count[0] == stop_at:
            raise KeyboardInterrupt("stopped, as a killed run stops")
        if count[0] in calls:
            logp.register_hook(lambda grad: torch.full_like(grad, float("inf")))
        return real_policy_loss(logp, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "policy_loss", planted)


# ---- the settings ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("settings, message", [
    (dict(bf16=True, fp16=True), "fp16: not with bf16"),
    (dict(fp16=True, dtype="float16"), "fp16: trains float32 weights under float16 autocast"),
    (dict(fp16=True, dtype="bfloat16"), "set dtype float32, not bfloat16, or train a LoRA adapter"),
])
def test_fp16_is_refused_where_it_cannot_work(settings, message):
    with pytest.raises(ConfigError, match=message):
        Config(**settings)


def test_fp16_takes_a_16_bit_base_under_lora():
    # peft keeps the adapter (what the optimizer and the scaler see) in float32 whatever the base's dtype
    assert Config(fp16=True, dtype="float16", use_peft=True).fp16
    assert autocast_dtype(False, True) == torch.float16 and autocast_dtype(True, False) == torch.bfloat16
    assert autocast_dtype(False, False) is None and grad_scaler(torch.device("cpu"), enabled=False) is None


def test_ppo_refuses_fp16_in_one_line(tmp_path, random_model_dir):
    from minigrpo.ppo_trainer import train_ppo

    with pytest.raises(ConfigError, match="fp16: not supported by train_ppo"):
        train_ppo(Config(model_name_or_path=str(random_model_dir), fp16=True, output_dir=str(tmp_path)))


# ---- float32 where it matters ---------------------------------------------------------------------------------
@pytest.mark.parametrize("chunked", [True, False], ids=["head-in-blocks", "plain"])
def test_log_probs_entropy_and_loss_stay_float32_under_fp16_autocast(random_model_dir, chunked):
    model = load_model(random_model_dir)
    inputs = batch(model.config.vocab_size)
    ids = (inputs.prompt_ids, inputs.prompt_mask, inputs.completion_ids, inputs.completion_mask)
    logprobs = completion_logprobs if chunked else plain_completion_logprobs
    reference, _ = logprobs(model, *ids)  # float32 throughout
    with fp16_autocast():
        logp, entropy = logprobs(model, *ids, with_entropy=True)
    loss, _ = policy_loss(logp, logp.detach(), inputs.adv, inputs.completion_mask, loss_type="grpo")
    assert logp.dtype == entropy.dtype == loss.dtype == torch.float32
    # float16 products, float32 log-softmax: within float16's ~1e-3 relative of the float32 log-probs
    torch.testing.assert_close(logp, reference, rtol=0, atol=2e-2)
    assert not torch.equal(logp, reference)  # autocast did run the products in float16


# ---- the scaler in the update ---------------------------------------------------------------------------------
def test_an_overflowing_step_is_skipped_counted_and_the_next_one_taken(random_model_dir, monkeypatch):
    model = load_model(random_model_dir)
    model.train()
    inputs = batch(model.config.vocab_size)
    inputs.loss_mask = inputs.completion_mask
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scaler = grad_scaler(torch.device("cpu"), enabled=True)
    cfg = Config(num_generations=4, generation_batch_size=N, fp16=True)
    update = dict(max_completion_length=T, autocast=fp16_autocast, scaler=scaler)
    before = copy.deepcopy(model.state_dict())

    plant_inf_gradient(monkeypatch, calls={1})
    (skipped,) = grpo_update(LogprobForward(model), optimizer, inputs, cfg, **update)
    assert skipped["skipped"] == 1.0 and not math.isfinite(skipped["grad_norm"])
    assert skipped["loss_scale"] == 2.0**15  # 65,536 halved
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # no weight moved
    assert optimizer.state == {} or all(s["step"] == 0 for s in optimizer.state.values())  # AdamW never stepped

    (taken,) = grpo_update(LogprobForward(model), optimizer, inputs, cfg, **update)  # call 2: nothing planted
    assert taken["skipped"] == 0.0 and 0 < taken["grad_norm"] < float("inf") and taken["loss_scale"] == 2.0**15
    assert not all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_gradient_accumulation_takes_the_same_step_under_fp16(random_model_dir):
    # Every micro-batch's backward is of S * its share of the loss; the sum is unscaled once: the same gradient as
    # one pass, up to float16's rounding of different matrix shapes
    model = load_model(random_model_dir)
    inputs = batch(model.config.vocab_size)
    inputs.loss_mask = inputs.completion_mask
    norms, weights = {}, {}
    for ga in (1, 2):
        m = copy.deepcopy(model).train()
        optimizer = torch.optim.SGD(m.parameters(), lr=1.0)
        cfg = Config(num_generations=4, generation_batch_size=N, gradient_accumulation_steps=ga, max_grad_norm=1e9,
                     fp16=True)
        torch.manual_seed(1)
        (stats,) = grpo_update(LogprobForward(m), optimizer, inputs, cfg, max_completion_length=T, autocast=fp16_autocast,
                               scaler=grad_scaler(torch.device("cpu"), enabled=True))
        assert stats["skipped"] == 0.0
        norms[ga], weights[ga] = stats["grad_norm"], [p.detach().clone() for p in m.parameters()]
    assert norms[2] == pytest.approx(norms[1], rel=2e-3)
    for p1, p2 in zip(weights[1], weights[2]):
        torch.testing.assert_close(p2, p1, rtol=0, atol=2e-3 * norms[1])


# ---- a whole run: the overflow counted, the scale in the checkpoint -------------------------------------------
def run_config(model_dir, out, **extra) -> Config:
    return Config(model_name_or_path=str(model_dir), task="addition", output_dir=str(out), fp16=True, max_steps=4,
                  save_steps=2, num_generations=4, generation_batch_size=8, learning_rate=1e-3, eval_steps=0,
                  eval_limit=4, eval_num_samples=0, save_model=False, **extra)


def alternating(prompts, completions, **row):
    """1 for every other completion: every group has a spread, so every step has a gradient."""
    return [float(i % 2) for i in range(len(completions))]


def metric_lines(out) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_run_skips_a_planted_overflow_and_resumes_exactly(tmp_path, random_model_dir, monkeypatch, one_thread):
    # The uninterrupted run: step 2's gradients overflow
    plant_inf_gradient(monkeypatch, calls={2})
    train(run_config(random_model_dir, tmp_path / "whole"), reward_funcs=[alternating], progress=False)
    whole = metric_lines(tmp_path / "whole")
    assert [line["grad_scaler/skipped_steps"] for line in whole] == [0, 1, 0, 0]
    assert [line["grad_scaler/scale"] for line in whole] == [2.0**16, 2.0**15, 2.0**15, 2.0**15]
    assert whole[1]["grad_norm"] is None and all(line["grad_norm"] > 0 for line in whole[2:])  # null: no step taken

    # The same run stopped during step 3, after the checkpoint of step 2 (which holds the halved scale) ...
    plant_inf_gradient(monkeypatch, calls={2}, stop_at=3)
    with pytest.raises(KeyboardInterrupt):
        train(run_config(random_model_dir, tmp_path / "stopped"), reward_funcs=[alternating], progress=False)
    # ... and resumed: steps 3 and 4 are the uninterrupted run's, scale included
    plant_inf_gradient(monkeypatch, calls=set())
    train(run_config(random_model_dir, tmp_path / "resumed", resume_from_checkpoint=str(tmp_path / "stopped")),
          reward_funcs=[alternating], progress=False)
    assert metric_lines(tmp_path / "resumed") == whole

    state = torch.load(tmp_path / "stopped" / "checkpoints" / "step-000002.pt", weights_only=True)
    assert state["scaler"]["scale"] == 2.0**15 and state["config"]["fp16"] is True


def test_sft_trains_in_fp16_and_counts_its_skipped_steps(tmp_path):
    from minigrpo.sft import train_sft

    cfg = Config(task="addition", fp16=True, max_steps=2, eval_steps=0, eval_limit=4, save_model=False,
                 output_dir=str(tmp_path / "sft"))
    summary = train_sft(cfg, batch_size=8, progress=False)
    lines = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert summary["steps"] == 2 and all(line["grad_scaler/scale"] > 0 for line in lines)
    assert sum(line["grad_scaler/skipped_steps"] for line in lines) <= 2 and lines[-1]["loss"] > 0
