"""What a run writes as it goes: completions.jsonl (and `minigrpo show`), and the optional TensorBoard / W&B mirrors."""

import json

import pytest

from minigrpo.cli import main
from minigrpo.config import Config, ConfigError
from minigrpo.lab.plots import load_metrics
from minigrpo.trainer import train

SMALL = dict(max_steps=2, num_generations=4, generation_batch_size=16, eval_steps=0, eval_limit=8, eval_num_samples=0,
             save_model=False, learning_rate=1e-3, reward_funcs=["correctness", "format"])


def half_right(prompts, completions, **row):
    return [float(i % 2) for i in range(len(completions))]


def run(tmp_path, model_dir, **overrides) -> tuple:
    cfg = Config(model_name_or_path=str(model_dir), output_dir=str(tmp_path / "run"), **{**SMALL, **overrides})
    train(cfg, progress=False)
    records = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    return load_metrics(tmp_path / "run"), records


def test_completions_jsonl_holds_whole_groups_that_agree_with_the_metrics(tmp_path, random_model_dir):
    metrics, records = run(tmp_path, random_model_dir, log_completions_groups=3)
    assert [(r["step"], r["group"]) for r in records] == [(s, g) for s in (1, 2) for g in range(3)]
    for record in records:
        assert len(record["completions"]) == 4 and {"prompt", "answer"} <= record.keys()
        row = metrics[record["step"] - 1]
        first = 4 * record["group"]
        # the advantage written beside each completion is the one the step trained with (metrics' list, same order)
        assert [c["advantage"] for c in record["completions"]] == pytest.approx(row["advantages"][first:first + 4],
                                                                               abs=1e-4)
        for c in record["completions"]:
            assert set(c["rewards"]) == {"correctness_reward", "format_reward"}
            assert c["reward"] == pytest.approx(sum(c["rewards"].values()))  # weights 1, 1
            assert c["length"] >= 1 and isinstance(c["truncated"], bool) and isinstance(c["text"], str)
        # GRPO's advantage is (r - mean) / (std + eps) within the group: recompute it from the logged rewards
        rewards = [c["reward"] for c in record["completions"]]
        mean = sum(rewards) / 4
        std = (sum((r - mean) ** 2 for r in rewards) / 3) ** 0.5
        expected = [0.0] * 4 if std == 0 else [(r - mean) / (std + 1e-4) for r in rewards]
        assert [c["advantage"] for c in record["completions"]] == pytest.approx(expected, abs=1e-5)


def test_log_completions_false_writes_no_file(tmp_path, random_model_dir):
    cfg = Config(model_name_or_path=str(random_model_dir), output_dir=str(tmp_path / "run"), **SMALL,
                 log_completions=False)
    train(cfg, progress=False)
    assert not (tmp_path / "run" / "completions.jsonl").exists()


def test_minigrpo_show_prints_a_steps_groups(tmp_path, random_model_dir, capsys):
    _, records = run(tmp_path, random_model_dir)
    assert main(["show", str(tmp_path / "run"), "--step", "1", "--width", "40"]) == 0
    out = capsys.readouterr().out
    assert out.count("step 1, group") == 2 and "step 2" not in out
    assert "correctness_reward" in out and "advantage" in out
    first = records[0]["completions"][0]
    assert f"{first['advantage']:+.3f}" in out
    assert main(["show", str(tmp_path / "run")]) == 0  # default: the last step
    assert "step 2, group 0" in capsys.readouterr().out
    assert main(["show", str(tmp_path / "run"), "--step", "7"]) == 2
    assert "--step 7: not logged (steps 1..2)" in capsys.readouterr().err
    assert main(["show", str(tmp_path / "nothing")]) == 2
    assert "completions.jsonl: no such file" in capsys.readouterr().err


def test_show_formats_chat_prompts_and_missing_rewards():
    from minigrpo.lab.show import format_group

    record = {"step": 3, "group": 0, "prompt": [{"role": "system", "content": "Be brief."},
                                                {"role": "user", "content": "What is 2 + 3?\nThink."}],
              "completions": [{"text": "5\nyes", "reward": None, "rewards": {"r": None}, "advantage": 0.0, "length": 3,
                               "truncated": True, "correct": False}]}
    table = format_group(record)
    assert "What is 2 + 3?\\nThink." in table and "Be brief" not in table  # the user's question, on one line
    assert "n/a" in table and "cut" in table and "5\\nyes" in table


def test_report_to_tensorboard_mirrors_the_metrics(tmp_path, random_model_dir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics, _ = run(tmp_path, random_model_dir, report_to=["tensorboard"])
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"), size_guidance={"tensors": 0}).Reload()
    rewards = [e.value for e in events.Scalars("reward")]
    assert rewards == pytest.approx([m["reward"] for m in metrics])
    assert [e.step for e in events.Scalars("completions/mean_length")] == [1, 2]
    assert "completions/text_summary" in events.Tags()["tensors"]  # the completions table, as text


def test_report_to_wandb_offline_writes_a_run(tmp_path, random_model_dir, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run(tmp_path, random_model_dir, report_to=["wandb"])
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))


def test_report_to_names_are_checked():
    with pytest.raises(ConfigError, match="report_to: 'mlflow' is not one of tensorboard, wandb, none"):
        Config(report_to=["mlflow"])
    assert Config(report_to=["none"]).report_to is None
