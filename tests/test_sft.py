"""SFT: the collated batch puts loss on completion tokens only, batches are deterministic and avoid excluded
prompts, and train_sft lowers the loss, stops on its time budget and writes a run directory plots can read."""

import json
import random

import pytest
import torch
import yaml

from minigrpo.config import Config, ConfigError
from minigrpo.sft import IGNORE_INDEX, collate_sft, sft_batch, train_sft
from minigrpo.tasks import get_task
from minigrpo.loading.tokenizer import build_tokenizer


def test_collate_labels_only_the_completion_and_eos():
    tok = build_tokenizer()
    input_ids, attention_mask, labels = collate_sft(tok, ["12+34=", "5+6="], ["46", "11"])
    # "<bos>12+34=" is 7 tokens, "46<eos>" 3; the second pair is 2 shorter and right-padded.
    assert input_ids.shape == attention_mask.shape == labels.shape == (2, 10)
    assert labels[0, :7].eq(IGNORE_INDEX).all()
    assert labels[0, 7:].tolist() == tok("46", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert attention_mask[1].tolist() == [1] * 8 + [0] * 2
    assert labels[1, 8:].eq(IGNORE_INDEX).all() and input_ids[1, 8:].eq(tok.pad_token_id).all()
    assert labels[1, :5].eq(IGNORE_INDEX).all() and labels[1, 5:8].ne(IGNORE_INDEX).all()


def _prompts(batch, tok) -> list[str]:
    input_ids, attention_mask, labels = batch
    is_prompt = (labels == IGNORE_INDEX) & attention_mask.bool()  # (B, L)
    return [tok.decode(ids[keep], skip_special_tokens=True) for ids, keep in zip(input_ids, is_prompt)]


def test_sft_batch_is_deterministic_and_skips_excluded_prompts():
    task, tok = get_task("think_addition"), build_tokenizer()
    first = _prompts(sft_batch(task, tok, random.Random(0), 8), tok)[0]  # the generator's first prompt for seed 0
    a = sft_batch(task, tok, random.Random(0), 8, exclude={first})
    b = sft_batch(task, tok, random.Random(0), 8, exclude={first})
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    prompts = _prompts(a, tok)
    assert first not in prompts and len(set(prompts)) == 8, prompts


def test_sft_batch_uses_the_given_target_completion():
    task, tok = get_task("think_addition"), build_tokenizer()
    think = lambda row, rng: task.target_completion(row, rng, think=True)  # noqa: E731
    input_ids, _, labels = sft_batch(task, tok, random.Random(1), 16, target_completion=think)
    texts = [tok.decode(ids[lab != IGNORE_INDEX], skip_special_tokens=True) for ids, lab in zip(input_ids, labels)]
    assert all(t.startswith("<think>") and not t.startswith("<think></think>") for t in texts), texts


@pytest.mark.run_plots  # reads plots/
def test_train_sft_lowers_the_loss_and_writes_a_run(tmp_path, random_model_dir):
    cfg = Config(task="addition", output_dir=str(tmp_path / "sft"), model_name_or_path=str(random_model_dir),
                 max_steps=30, learning_rate=3e-3, eval_steps=15, eval_num_problems=5, eval_limit=5)
    summary = train_sft(cfg, batch_size=32, progress=False)
    lines = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == list(range(1, 31))
    assert lines[-1]["loss"] < 0.8 * lines[0]["loss"], (lines[0]["loss"], lines[-1]["loss"])
    assert [m["step"] for m in lines if "eval/accuracy_greedy" in m] == [15, 30]
    assert summary["steps"] == 30 and summary["num_test_problems"] == 5
    assert json.loads((tmp_path / "sft" / "summary.json").read_text())["accuracy_after"] == summary["accuracy_after"]
    assert summary["algorithm"] == "sft" and (tmp_path / "sft" / "model").is_dir()  # a run directory like GRPO's
    assert yaml.safe_load((tmp_path / "sft" / "config.yaml").read_text())["sft"]["batch_size"] == 32
    assert (tmp_path / "sft" / "plots").is_dir()


def test_train_sft_stops_on_its_time_budget(tmp_path, random_model_dir):
    cfg = Config(task="addition", output_dir=str(tmp_path / "sft"), model_name_or_path=str(random_model_dir),
                 max_steps=1000, eval_steps=0, eval_limit=2, save_model=False)
    summary = train_sft(cfg, max_seconds=1e-6, batch_size=4, progress=False)
    assert summary["steps"] == 1  # the first step already spends the budget


def test_train_sft_refuses_a_task_without_a_generator(tmp_path):
    with pytest.raises(ConfigError, match="task: train_sft draws problems from a task's generator"):
        train_sft(Config(task="gsm8k", output_dir=str(tmp_path / "sft")), progress=False)


@pytest.mark.parametrize("setting", [dict(use_vllm=True), dict(fsdp="full_shard"), dict(save_steps=5),
                                     dict(resume_from_checkpoint="runs/x"), dict(report_to=["tensorboard"])])
def test_train_sft_refuses_what_it_would_ignore(tmp_path, setting):
    (key,) = setting
    with pytest.raises(ConfigError, match=f"{key}: not supported by train_sft"):
        train_sft(Config(task="addition", output_dir=str(tmp_path / "sft"), **setting), progress=False)
