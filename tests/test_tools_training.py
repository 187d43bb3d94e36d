"""GRPO with tools, through train(): the multi-turn rollout feeds the batch, the loss learns only the policy's tokens,
the metrics and completions.jsonl show the tool, and bad configurations are refused in one line.

A random stand-in never writes a tool call, so the engine here writes a canned call as the first turn of every
other completion and lets the stand-in sample everything after the tool's answer."""

import json

import pytest
import torch

import minigrpo.trainer as trainer
from minigrpo.config import Config, ConfigError
from minigrpo.generation.engines import GenerateEngine
from minigrpo.objectives import policy_loss
from minigrpo.tasks.tool_addition import add  # a typed, documented tool

pytestmark = pytest.mark.usefixtures("one_thread")


CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'


class FirstTurnCalls(GenerateEngine):
    """The decode loop, except that a first turn (no tool answer yet) of an even row is a call to add."""

    def continue_from_ids(self, input_ids, *, max_new_tokens, **sampling):
        ids, logp = super().continue_from_ids(input_ids, max_new_tokens=max_new_tokens, **sampling)
        call = self.tokenizer(CALL, add_special_tokens=False)["input_ids"]
        for i, row in enumerate(input_ids):
            if i % 2 == 0 and "<tool_response>" not in self.tokenizer.decode(row):
                ids[i] = call[: max_new_tokens[i]]
        return ids, logp


def conversational_rows(path, n=8):
    rows = [{"prompt": [{"role": "user", "content": f"What is {i} + {i + 1}?"}], "answer": str(2 * i + 1)}
            for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def config(tmp_path, chat_model_dir, **overrides):
    settings = dict(max_steps=2, num_generations=4, generation_batch_size=8, max_completion_length=48, eval_steps=0,
                    eval_limit=2, eval_num_samples=0, save_model=False, output_dir=str(tmp_path / "run"))
    return Config(model_name_or_path=str(chat_model_dir), task="answer",
                  dataset_name=str(conversational_rows(tmp_path / "rows.jsonl", 20)), **{**settings, **overrides})


def constant_reward(prompts, completions, **row):
    return [float(i % 3 == 0) for i in range(len(completions))]


@pytest.fixture
def scripted_engine(monkeypatch):
    monkeypatch.setattr(trainer, "make_engine", lambda cfg, model, tokenizer, *a, **k: FirstTurnCalls(model, tokenizer))


def test_train_with_tools_logs_calls_and_masks_the_tool_out_of_the_loss(tmp_path, chat_model_dir, scripted_engine,
                                                                         monkeypatch):
    masks = []

    def recording_policy_loss(logp, old_logp, adv, mask, **kw):
        masks.append(mask.clone())
        return policy_loss(logp, old_logp, adv, mask, **kw)

    monkeypatch.setattr(trainer, "policy_loss", recording_policy_loss)
    trainer.train(config(tmp_path, chat_model_dir, log_completions_groups=2), reward_funcs=[constant_reward],
                  tools=[add], progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for line in lines:
        assert line["tools/call_frequency"] == 0.5  # every other completion called add once
        assert line["tools/failure_frequency"] == 0.0 and line["tools/turns_mean"] == 0.5
        assert line["tools/tool_tokens_mean"] > 0
    # The loss's mask: no token of a tool message (the response holds "5") is an action of the policy.
    assert masks and all(m.shape[0] == 8 for m in masks)
    record = json.loads((tmp_path / "run" / "completions.jsonl").read_text().splitlines()[0])
    called = record["completions"][0]
    assert called["tool_calls"] == 1 and any(m["role"] == "tool" and m["content"] == "5" for m in called["messages"])
    assert record["completions"][1]["tool_calls"] == 0


def test_the_loss_mask_is_the_policys_tokens_unless_deliberately_not(tmp_path, chat_model_dir, scripted_engine,
                                                                     monkeypatch):
    seen = {}

    def recording_update(model, optimizer, inputs, cfg, **kw):
        seen[cfg.train_on_tool_output] = inputs
        optimizer.step()  # no gradients: changes nothing, but the scheduler's step that follows is in order
        return [{"loss": 0.0, "grad_norm": 0.0, "tokens": 1.0, "entropy": 0.0, "ratio_mean": 1.0, "approx_kl": 0.0,
                 "clip_ratio/low_mean": 0.0, "clip_ratio/high_mean": 0.0, "clip_ratio/region_mean": 0.0}]

    monkeypatch.setattr(trainer, "grpo_update", recording_update)
    for bug in (False, True):
        trainer.train(config(tmp_path, chat_model_dir, max_steps=1, train_on_tool_output=bug,
                             output_dir=str(tmp_path / f"run_{bug}")),
                      reward_funcs=[constant_reward], tools=[add], progress=False)
    masked, unmasked = seen[False], seen[True]
    tool_tokens = masked.completion_mask * (1 - masked.tool_mask)
    assert tool_tokens.sum() > 0
    assert (masked.loss_mask * (1 - masked.tool_mask)).sum() == 0  # not one tool token in the loss
    assert torch.equal(masked.loss_mask, masked.completion_mask * masked.tool_mask)
    assert torch.equal(unmasked.loss_mask, unmasked.completion_mask)  # the bug: the tool's tokens learn too


def test_gradient_is_exactly_zero_at_tool_positions():
    logp = torch.tensor([[-1.0, -2.0, -0.5, -1.5]], requires_grad=True)
    completion_mask = torch.ones(1, 4)
    tool_mask = torch.tensor([[1.0, 0.0, 0.0, 1.0]])  # positions 1 and 2 were written by a tool
    for loss_type in ("grpo", "dapo", "cispo", "sapo"):
        loss, _ = policy_loss(logp, logp.detach() + 0.1, torch.tensor([1.0]), completion_mask * tool_mask,
                              loss_type=loss_type, beta=0.1, ref_logp=logp.detach() - 0.2)
        (grad,) = torch.autograd.grad(loss, logp)
        assert grad[0, 1] == 0 and grad[0, 2] == 0 and grad[0, 0] != 0 and grad[0, 3] != 0
        loss, _ = policy_loss(logp, logp.detach() + 0.1, torch.tensor([1.0]), completion_mask, loss_type=loss_type)
        (grad,) = torch.autograd.grad(loss, logp)
        assert grad[0, 1] != 0  # without the tool mask the tool's tokens would learn


def test_bad_tool_settings_are_one_line_errors(tmp_path, chat_model_dir):
    with pytest.raises(ConfigError, match="tools: cannot load 'no_such_module_q:f'"):
        trainer.train(config(tmp_path, chat_model_dir, tools=["no_such_module_q:f"]), progress=False)
    with pytest.raises(ConfigError, match="tool_timeout"):
        Config(tool_timeout=0)

    def undocumented(x):
        return x

    with pytest.raises(ValueError, match="undocumented"):
        trainer.train(config(tmp_path, chat_model_dir), tools=[undocumented], progress=False)


class CrashAt:
    """constant_reward, except that its call number `at` raises (a crash in the middle of a run)."""

    __name__ = "constant_reward"

    def __init__(self, at: int):
        self.calls, self.at = 0, at

    def __call__(self, prompts, completions, **row):
        self.calls += 1
        if self.calls == self.at:
            raise RuntimeError("crash")
        return constant_reward(prompts, completions, **row)


def test_a_tools_run_resumed_after_a_crash_equals_an_uninterrupted_one(tmp_path, chat_model_dir, scripted_engine):
    from minigrpo.rewards import RewardError

    def run(out, reward, **extra):
        cfg = config(tmp_path, chat_model_dir, output_dir=str(tmp_path / out), max_steps=4, save_steps=2, **extra)
        return trainer.train(cfg, reward_funcs=[reward], tools=[add], progress=False)

    run("whole", CrashAt(at=0))
    with pytest.raises(RewardError):
        run("crashed", CrashAt(at=3))  # step 3 fails after the checkpoint of step 2
    run("crashed", CrashAt(at=0), resume_from_checkpoint=str(tmp_path / "crashed"))

    def lines(out):
        rows = [json.loads(x) for x in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if not k.endswith("_seconds") and k != "tokens_per_second"}
                for row in rows]

    assert [row["step"] for row in lines("crashed")] == [1, 2, 3, 4]
    assert lines("crashed") == lines("whole")
    assert (tmp_path / "crashed" / "completions.jsonl").read_text() == \
        (tmp_path / "whole" / "completions.jsonl").read_text()
