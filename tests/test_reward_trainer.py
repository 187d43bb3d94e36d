"""The reward-model trainer on the shipped tiny model: rows in TRL's format or made from a policy and a checker,
Bradley–Terry or BCE, full / LoRA / QLoRA, judged on held-out rows, saved so that transformers loads it unchanged."""

import json

import pytest
import torch

from minigrpo.cli import main
from minigrpo.config import Config, ConfigError, load_config
from minigrpo.reward_models.outcome import load_reward_model
from minigrpo.reward_trainer import (CONFIG_KEYS, RewardConfig, evaluate_reward_model, labelled_pairs,
                                     sample_labelled, train_reward_model)
from minigrpo.run import SINGLE_PASS_UNSUPPORTED
from minigrpo.tasks import get_task

pytestmark = pytest.mark.usefixtures("single_torch_thread")  # conftest.py: one torch thread for this module

TASK = get_task("think_addition")


@pytest.fixture(scope="module")
def labelled():
    """The warm start's samples of 12 train and 6 test prompts (4 each), labelled by the task's checker."""
    from minigrpo.loading.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(TASK.model_dir)
    torch.manual_seed(0)
    sample = lambda rows: sample_labelled(model, tokenizer, TASK, rows, num_generations=4,  # noqa: E731
                                          max_completion_length=TASK.max_completion_length)
    return sample(TASK.load("train")[:12]), sample(TASK.load("test")[:6])


def test_samples_are_labelled_by_the_checker_and_paired_right_with_wrong(labelled):
    train, _ = labelled
    assert len(train) == 48 and {tuple(sorted(r)) for r in train} == {("completion", "label", "prompt")}
    rows = {r["prompt"]: r for r in TASK.load("train")[:12]}
    assert all(r["label"] == TASK.grade(r["completion"], rows[r["prompt"]]) for r in train)
    pairs = labelled_pairs(train)
    assert pairs and all(TASK.grade(p["chosen"], rows[p["prompt"]]) and not TASK.grade(p["rejected"], rows[p["prompt"]])
                         for p in pairs)


def test_evaluation_by_hand():
    score_by_text = {"a": 3.0, "b": 1.0, "c": 2.0, "d": -1.0}
    fake = lambda prompts, completions: [score_by_text[c] for c in completions]  # noqa: E731
    rows = [{"prompt": "p", "completion": "a", "label": True}, {"prompt": "p", "completion": "b", "label": False},
            {"prompt": "q", "completion": "c", "label": False}, {"prompt": "q", "completion": "d", "label": True}]
    result = evaluate_reward_model(fake, rows)
    # right 3, -1 against wrong 1, 2: 3 > 1, 3 > 2, -1 < 1, -1 < 2 -> AUC 2/4; same prompt: p (3 > 1), q (-1 < 2);
    # sigmoid(r) > 1/2 (r > 0) agrees with the label for a only
    assert result == pytest.approx({"auc": 0.5, "accuracy": 0.25, "pairwise_accuracy": 0.5, "num_pairs": 2,
                                    "num_completions": 4})
    pairs = [{"prompt": "p", "chosen": "a", "rejected": "b"}, {"prompt": "q", "chosen": "d", "rejected": "c"}]
    assert evaluate_reward_model(fake, pairs) == pytest.approx({"pairwise_accuracy": 0.5, "num_pairs": 2, "auc": 0.5})


@pytest.mark.parametrize("loss, peft", [("bradley_terry", {}), ("bce", {"use_peft": True}),
                                        ("bradley_terry", {"use_peft": True, "load_in_4bit": True})])
def test_trains_judges_and_saves_a_model_transformers_loads(loss, peft, labelled, tmp_path, config_reads):
    train, held_out = labelled
    rows = labelled_pairs(train) if loss == "bradley_terry" else train
    if loss == "bradley_terry":  # TRL's margin column, on half the pairs: a clearer preference asks for a larger gap
        rows = [{**r, "margin": float(i % 2)} for i, r in enumerate(rows)]
    recording, read = config_reads  # the Config keys the run reads (LoRA's and 4-bit's among them): the CLI's to let by
    cfg = recording(Config(output_dir=str(tmp_path / "rm"), learning_rate=1e-3, eval_steps=1, lora_r=4, **peft))
    reward_cfg = RewardConfig(loss=loss, per_device_train_batch_size=16, num_train_epochs=1,
                              center_rewards_coefficient=0.01 if loss == "bradley_terry" else None)
    summary = train_reward_model(cfg, reward_cfg, train_rows=rows, eval_rows=held_out, progress=False)
    assert read - set(SINGLE_PASS_UNSUPPORTED) <= CONFIG_KEYS and bool(peft) == ("lora_r" in read)
    metrics = [json.loads(line) for line in (tmp_path / "rm" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == summary["steps"] == -(-len(rows) // 16)
    assert all(0 <= m["eval/auc"] <= 1 and m["loss"] > 0 for m in metrics)
    # Saved: AutoModelForSequenceClassification loads it as it is (LoRA merged into the weights), and it scores
    # the held-out rows as the model did at the end of training.
    from transformers import AutoModelForSequenceClassification

    saved = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm")
    assert saved.config.num_labels == 1 and saved.config.pad_token_id is not None
    reloaded = evaluate_reward_model(load_reward_model(tmp_path / "rm"), held_out)
    tolerance = 0.05 if peft.get("load_in_4bit") else 1e-6  # QLoRA: merged into the float base, not the 4-bit one
    assert reloaded["auc"] == pytest.approx(summary["eval"]["auc"], abs=tolerance)
    assert (tmp_path / "rm" / "adapter").is_dir() == bool(peft)


def test_learning_separates_right_from_wrong(labelled, tmp_path):
    """Two epochs of BCE on 48 labelled samples: the held-out AUC rises above chance (a seed-fixed run)."""
    train, held_out = labelled
    cfg = Config(output_dir=str(tmp_path / "rm"), learning_rate=1e-3, eval_steps=0, seed=0)
    summary = train_reward_model(cfg, RewardConfig(loss="bce", per_device_train_batch_size=16, num_train_epochs=2),
                                 train_rows=train, eval_rows=held_out, progress=False)
    assert summary["eval"]["auc"] > 0.6


def test_the_cli_samples_trains_and_says_where_it_saved(tmp_path, capsys, monkeypatch, config_reads):
    from minigrpo import cli

    recording, read = config_reads  # the Config keys the run reads: each one the CLI lets through (CONFIG_KEYS)
    monkeypatch.setattr(cli, "load_config", lambda *a, **k: recording(load_config(*a, **k)))
    out = tmp_path / "rm"
    assert main(["reward-model", "--out", str(out), "--loss", "bce", "--num-prompts", "8", "--eval-num-prompts", "4",
                 "--num-generations", "4", "--per-device-train-batch-size", "16", "--learning-rate", "1e-3"]) == 0
    printed = capsys.readouterr().out.strip().splitlines()[-1]
    assert printed.startswith("reward model (bce, 32 rows, 2 steps): held-out AUC ")
    assert printed.endswith(f"Saved to {out}: --reward-funcs {out}")
    assert json.loads((out / "summary.json").read_text())["eval"]["num_completions"] == 16
    assert read - set(SINGLE_PASS_UNSUPPORTED) <= CONFIG_KEYS and {"num_generations", "learning_rate", "seed"} <= read
    assert main(["reward-model", "--out", str(out)]) == 2  # a second run into it is refused before any work
    assert "holds another run's results" in capsys.readouterr().err


@pytest.mark.parametrize("flags, message", [
    (["--loss", "pointwise"], "loss: 'pointwise' is not one of bradley_terry, bce"),
    (["--loss", "bce", "--center-rewards-coefficient", "0.01"], "center_rewards_coefficient: a Bradley–Terry term"),
    (["--num-train-epochs", "0"], "num_train_epochs: must be > 0"),
])
def test_bad_settings_are_one_line_errors(flags, message, capsys):
    assert main(["reward-model", *flags]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"minigrpo reward-model: error: {message}")


def test_rows_of_the_wrong_kind_are_one_line_errors(tmp_path):
    with pytest.raises(ConfigError, match="bce trains on labelled rows"):
        train_reward_model(Config(output_dir=str(tmp_path)), RewardConfig(loss="bce"),
                           train_rows=[{"prompt": "1+1=", "chosen": "2", "rejected": "3"}], progress=False)


# ---- DPO on the same pairs ------------------------------------------------------------------------------------
def test_dpo_trains_on_the_pairs_starting_from_log_2(labelled, tmp_path):
    from minigrpo.dpo_trainer import DPOConfig, train_dpo

    pairs = labelled_pairs(labelled[0])
    cfg = Config(output_dir=str(tmp_path / "dpo"), learning_rate=1e-4, eval_steps=0, eval_limit=8, save_model=False)
    summary = train_dpo(cfg, pairs, DPOConfig(beta=0.1, per_device_train_batch_size=4, num_train_epochs=2),
                        progress=False)
    metrics = [json.loads(line) for line in (tmp_path / "dpo" / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == summary["steps"] == 2 * -(-len(pairs) // 4) >= 2
    # Step 1: the policy is its own reference, every implicit reward 0, so the loss is -log sigmoid(0) = log 2.
    assert metrics[0]["loss"] == pytest.approx(0.693147, abs=1e-5) and metrics[0]["rewards/margins"] == 0.0
    assert metrics[-1]["rewards/margins"] > 0  # then the chosen pull away from the rejected
    assert summary["algorithm"] == "dpo" and 0 <= summary["accuracy_after"] <= 1


def test_dpo_reads_a_completion_as_the_ids_the_policy_sampled():
    """Text + eos, after the prompt as GRPO encodes it: the ids a rollout holds, so DPO and GRPO train the same ids."""
    from minigrpo.dpo_trainer import encode_pairs
    from minigrpo.loading.models import load_model_and_tokenizer
    from minigrpo.rollout import sample_completions

    model, tokenizer = load_model_and_tokenizer(TASK.model_dir)
    torch.manual_seed(1)
    roll = sample_completions(model, tokenizer, ["38+85=", "3471+586="], num_generations=2, max_completion_length=48)
    ended = [i for i in range(4) if not roll.is_truncated[i]]
    sampled = [roll.completion_ids[i][roll.completion_mask[i].bool()].tolist() for i in ended]
    encoded = encode_pairs(tokenizer, [{"prompt": "38+85=", "chosen": roll.completions[i], "rejected": "1"}
                                       for i in ended])
    assert [e["chosen_ids"] for e in encoded] == sampled
    assert encoded[0]["prompt_ids"] == roll.prompt_ids[0][roll.prompt_mask[0].bool()].tolist()


@pytest.mark.parametrize("trainer", ["reward", "dpo"])
def test_settings_the_loops_would_ignore_are_refused(trainer, tmp_path):
    from minigrpo.dpo_trainer import train_dpo

    cfg = Config(output_dir=str(tmp_path), save_steps=5)
    name = "train_reward_model" if trainer == "reward" else "train_dpo"
    with pytest.raises(ConfigError, match=f"save_steps: not supported by {name}"):
        if trainer == "reward":
            train_reward_model(cfg, train_rows=[], progress=False)
        else:
            train_dpo(cfg, [], progress=False)
