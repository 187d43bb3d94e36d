"""Bad input: one line naming the culprit, and nothing already written is lost.

One test per kind of bad input. Each is stopped where it is first seen: config keys and values when the
config is read, data files when they are loaded, the model when it is loaded, prompts against the context before
the first step, reward functions when they are called. Errors raised mid-run leave the metrics lines and the
checkpoints already written intact, so the run can be fixed and resumed.
"""

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minigrpo.persistence.checkpoint import latest_checkpoint
from minigrpo.cli import main
from minigrpo.config import Config, ConfigError, load_config
from minigrpo.loading.models import load_model_and_tokenizer
from minigrpo.rewards import RewardError, score_completions
from minigrpo.tasks import TASKS, AdditionTask, DataError
from minigrpo.tasks.base import read_rows
from minigrpo.trainer import train

SMALL = dict(task="addition", max_steps=3, num_generations=4, generation_batch_size=8, eval_steps=0,
             eval_num_samples=0, eval_limit=4, save_model=False, learning_rate=1e-3)


def config(tmp_path, model_dir, **overrides) -> Config:
    return Config(**{"model_name_or_path": str(model_dir), "output_dir": str(tmp_path / "run"), **SMALL, **overrides})


def steps_written(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def last_error_line(capsys) -> str:
    """The CLI's error, the last line of stderr (a model that was loaded first may have drawn a progress bar)."""
    return capsys.readouterr().err.strip().splitlines()[-1]


# ---------------------------------------------------------------------------------------------------------
# Reward functions
# ---------------------------------------------------------------------------------------------------------
def test_a_reward_function_that_raises_mid_run_is_named_and_loses_nothing(tmp_path, random_model_dir, one_thread):
    """It worked on step 1 and breaks on step 2: the error names it and the completion, step 1's metrics line
    and checkpoint stay, and after fixing the function the run resumes from step 1."""
    calls = []

    def flaky(prompts, completions, **row):
        calls.append(len(completions))
        if len(calls) > 1:
            raise ValueError("scorer lost its connection")
        return [float(i % 2) for i in range(len(completions))]

    cfg = config(tmp_path, random_model_dir, save_steps=1)
    with pytest.raises(RewardError, match=r"reward function 'flaky' raised on completion 0 \(.*scorer lost"):
        train(cfg, reward_funcs=[flaky], progress=False)
    run = tmp_path / "run"
    assert steps_written(run) == [1] and latest_checkpoint(run).name == "step-000001.pt"

    def flaky(prompts, completions, **row):  # fixed in place: the checkpoint knows the run's reward functions by name
        return [float(i % 2) for i in range(len(completions))]

    summary = train(config(tmp_path, random_model_dir, save_steps=1, resume_from_checkpoint=str(run)),
                    reward_funcs=[flaky], progress=False)
    assert summary["resumed_from_step"] == 1 and steps_written(run) == [1, 2, 3]


@pytest.mark.parametrize(
    "returned, match",
    [
        ([1.0, 0.0, 1.0], r"'bad' returned 3 values for 2 completions"),
        ([1.0, "high"], r"'bad' returned a non-number for completion 1: 'high'"),
        ([1.0, [0.5]], r"'bad' returned a non-number for completion 1: \[0.5\]"),
        (None, r"'bad' returned NoneType, expected a list of 2 numbers"),
        (0.5, r"'bad' returned float, expected a list of 2 numbers"),
        ("10", r"'bad' returned str, expected a list of 2 numbers"),
    ],
    ids=["wrong-count", "string", "nested-list", "none", "scalar", "string-of-digits"],
)
def test_a_reward_function_returning_the_wrong_thing_is_named(returned, match):
    def bad(prompts, completions, **row):
        return returned

    with pytest.raises(RewardError, match=match):
        score_completions([bad], ["p", "p"], ["a", "b"], {})


def test_nan_and_inf_rewards_are_excluded_counted_and_given_advantage_zero(tmp_path, random_model_dir, one_thread):
    """The documented policy, end to end: an unscorable completion is no error. It is left out of its group's
    baseline, gets advantage exactly 0, and `frac_reward_nan` counts it. A batch with nothing scorable at all
    trains a zero loss rather than NaN weights."""

    def half_unscorable(prompts, completions, **row):
        return [[math.nan, math.inf, 1.0, 0.0][i % 4] for i in range(len(completions))]

    def nothing_scorable(prompts, completions, **row):
        return [-math.inf] * len(completions)

    train(config(tmp_path, random_model_dir, max_steps=1, eval_steps=0), reward_funcs=[half_unscorable],
          progress=False)
    line = json.loads((tmp_path / "run" / "metrics.jsonl").read_text())
    assert line["frac_reward_nan"] == 0.5
    assert [a for i, a in enumerate(line["advantages"]) if i % 4 < 2] == [0.0] * 4  # the unscorable ones
    assert line["reward"] == 0.5 and math.isfinite(line["loss"])

    train(config(tmp_path, random_model_dir, max_steps=1, output_dir=str(tmp_path / "none")),
          reward_funcs=[nothing_scorable], progress=False)
    line = json.loads((tmp_path / "none" / "metrics.jsonl").read_text())
    assert line["frac_reward_nan"] == 1.0 and line["loss"] == 0.0 and line["reward"] is None


def strict_json(line: str) -> dict:
    """json.loads as jq, JavaScript and pandas' strict readers: NaN, Infinity and -Infinity are not JSON."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(line, parse_constant=refuse)


def test_a_step_with_no_reward_at_all_logs_null_and_says_it_had_nothing_to_learn(tmp_path, random_model_dir,
                                                                               one_thread):
    """A reward function that does not apply (None for every completion): the run goes on, metrics.jsonl stays
    strict JSON with the missing mean reward as null, and the run says once that the step taught nothing."""

    def does_not_apply(prompts, completions, **row):
        return [None] * len(completions)

    with pytest.warns(UserWarning, match="a step had nothing to learn from"):
        train(config(tmp_path, random_model_dir, max_steps=2), reward_funcs=[does_not_apply], progress=False)
    lines = [strict_json(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(line["reward"] is None and line["frac_reward_nan"] == 1.0 for line in lines)
    assert lines[0]["rewards/does_not_apply/mean"] is None and lines[0]["loss"] == 0.0


# ---------------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskInFolder(AdditionTask):
    """The addition task reading its JSONL files from another folder (tests register it under a new name)."""

    folder: str = ""

    @property
    def data_dir(self) -> Path:
        return Path(self.folder)


@pytest.fixture
def task_in(tmp_path, monkeypatch):
    """task_in(train_text, test_text) -> the name of a registered task whose splits hold those texts."""

    def make(train_text: str, test_text: str = ROW) -> str:
        folder = tmp_path / "task"
        folder.mkdir(exist_ok=True)
        (folder / "train.jsonl").write_text(train_text)
        (folder / "test.jsonl").write_text(test_text)
        monkeypatch.setitem(TASKS, "in_folder", TaskInFolder(name="in_folder", folder=str(folder)))
        return "in_folder"

    return make


ROW = '{"prompt": "100+100=", "answer": "200"}\n'


@pytest.mark.parametrize("train_text, test_text, split", [("\n", ROW, "train"), (ROW, "", "test")],
                         ids=["train", "test"])
def test_an_empty_dataset_is_named(tmp_path, random_model_dir, task_in, train_text, test_text, split):
    name = task_in(train_text, test_text)
    with pytest.raises(ConfigError, match=f"task: the {split} split of 'in_folder' is empty"):
        train(config(tmp_path, random_model_dir, task=name), progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    "line, match",
    [
        ('{"prompt": "1+1=", "answer": "2"', r"train.jsonl:2: not valid JSON"),
        ('{"question": "1+1=", "answer": "2"}', r'train.jsonl:2: no "prompt" column \(columns: \'question\', \'answer\'\)'),
        ('["1+1=", "2"]', r'train.jsonl:2: expected an object'),
    ],
    ids=["cut-short", "no-prompt", "not-an-object"],
)
def test_a_bad_data_line_is_named_by_file_and_line(task_in, random_model_dir, capsys, line, match):
    name = task_in(ROW + line + "\n")
    assert main(["train", "--task", name, "--model", str(random_model_dir), "--max-steps", "1"]) == 2
    err = last_error_line(capsys)
    assert err.startswith("minigrpo train: error: ") and re.search(match, err)


def test_prompts_longer_than_the_context_are_refused_before_training(tmp_path, random_model_dir):
    """The random model has a 64-token context; an 8-token prompt plus 60 completion tokens does not fit."""
    with pytest.raises(ConfigError, match=r"max_completion_length: prompt \(9 tokens\) \+ completion \(60\) exceeds "
                                          r"the model's context of 64 tokens"):
        train(config(tmp_path, random_model_dir, max_completion_length=60), progress=False)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


# ---------------------------------------------------------------------------------------------------------
# Config, task and model names
# ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--num-generations", "1"], "num_generations: must be >= 2 (a group of one has no baseline)"),
        (["--num-generatons", "4"], "num_generatons: unknown config key; did you mean num_generations?"),
        (["--loss-type", "gspo"], "loss_type: 'gspo' is not one of grpo, bnpo, dapo, dr_grpo, luspo, cispo, clip_cov, "
                                  "kimi, dppo_tv, dppo_kl, gpg, dro, gmpo, kl_cov, sapo, vespo; GSPO is a ratio, not a loss type: "
                                  "importance_sampling_level sequence (--importance-sampling-level sequence), with "
                                  "loss_type grpo or another token loss"),
        (["--task", "subtraction"], "task: unknown task 'subtraction'; known tasks: addition, answer, countdown, gsm8k, long_addition, prompts, reasoning_gym, think_addition, tool_addition"),
        (["--eval-limit", "0"], "eval_limit: must be >= 1, got 0"),
        (["--save-steps", "-5"], "save_steps: must be >= 0, got -5"),
        (["--reward-weights", "nan"], "reward_weights: every weight must be a finite number, got [nan]"),
        (["--reward-funcs", ""], "reward_funcs: an empty name in [''] (a stray comma?)"),
    ],
)
def test_bad_flags_are_one_line_naming_the_key(capsys, argv, expected):
    assert main(["train", *argv]) == 2
    assert capsys.readouterr().err.strip() == f"minigrpo train: error: {expected}"


@pytest.mark.parametrize("argv, expected", [
    (["ppo", "--lamm", "1"], "minigrpo ppo: error: lamm: unknown config key; did you mean lam?"),
    (["reward-model", "--num-promts", "5"], "minigrpo reward-model: error: num_promts: unknown config key; did you mean "
                                            "num_prompts?"),
    (["reward-model", "--max-steps", "1"], "minigrpo reward-model: error: max_steps: the reward-model trainer runs "
                                           "--num-train-epochs over its rows (a fraction such as 0.5 for a shorter "
                                           "run); it has no step budget"),
    (["reward-model", "--beta", "0.1"], "minigrpo reward-model: error: beta: a `minigrpo train` setting that "
                                        "`minigrpo reward-model` does not read (`minigrpo reward-model --help` says "
                                        "which it reads)"),
    (["reward-model", "--bf16"], "minigrpo reward-model: error: bf16: a `minigrpo train` setting that `minigrpo "
                                 "reward-model` does not read (`minigrpo reward-model --help` says which it reads)"),
    (["ppo", "--epsilon-high", "0.28"], "minigrpo ppo: error: epsilon_high: a `minigrpo train` setting that `minigrpo "
                                        "ppo` does not read (`minigrpo ppo --help` says which it reads)"),
    (["ppo", "--tools", "calculator"], "minigrpo ppo: error: tools: a `minigrpo train` setting that `minigrpo ppo` "
                                       "does not read (`minigrpo ppo --help` says which it reads)"),
])
def test_a_commands_own_keys_are_offered_and_settings_it_ignores_are_named(capsys, argv, expected):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == expected


def test_python_values_are_read_as_flags_are_or_named():
    cfg = Config(learning_rate="1e-4", max_steps="2", bf16="false", reward_weights=["1"])  # as env vars give them
    assert (cfg.learning_rate, cfg.max_steps, cfg.bf16, cfg.reward_weights) == (1e-4, 2, False, [1.0])
    for overrides, said in ((dict(learning_rate="abc"), "learning_rate: cannot read 'abc' as float"),
                            (dict(reward_funcs=[]), "reward_funcs: empty; a run needs at least one reward function"),
                            (dict(reward_weights=[math.inf]), "reward_weights: every weight must be a finite number")):
        with pytest.raises(ConfigError, match=re.escape(said)):
            Config(**overrides)
    from minigrpo.rewards import build_reward_funcs

    with pytest.raises(RewardError, match=r"reward_funcs: 3 \(int\) is neither a reward's name nor callable"):
        build_reward_funcs([3], TASKS["addition"], 8)


def test_an_unknown_key_in_a_yaml_file_is_named(tmp_path, capsys):
    (tmp_path / "run.yaml").write_text("num_generations: 4\nlearning_rat: 0.001\n")
    assert main(["train", "--config", str(tmp_path / "run.yaml")]) == 2
    assert capsys.readouterr().err.strip() == ("minigrpo train: error: learning_rat: unknown config key; did you "
                                               "mean learning_rate?")


def test_a_missing_model_directory_is_named(tmp_path, capsys):
    assert main(["train", "--model", str(tmp_path / "nowhere"), "--max-steps", "1"]) == 2
    assert capsys.readouterr().err.strip() == f"minigrpo train: error: model_name_or_path: {tmp_path / 'nowhere'} is not a directory"


def test_a_directory_holding_no_model_is_named(tmp_path, capsys):
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "README.md").write_text("not a model")
    assert main(["train", "--model", str(tmp_path / "notes"), "--max-steps", "1"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"minigrpo train: error: model_name_or_path: {tmp_path / 'notes'} holds no config.json (nor "
        f"adapter_config.json), so it is not a model directory; pass a directory saved with save_pretrained")


def test_a_directory_holding_only_a_lora_adapter_loads_onto_its_base(tmp_path, random_model_dir):
    """An adapter directory has no config.json of its own; its adapter_config.json names the base."""
    from minigrpo.loading.models import add_lora, load_model, load_tokenizer, save_policy

    lora = add_lora(load_model(random_model_dir), r=4)
    save_policy(lora, load_tokenizer(random_model_dir), tmp_path / "adapter", base_name_or_path=random_model_dir)
    assert not (tmp_path / "adapter" / "config.json").exists()
    model, tokenizer = load_model_and_tokenizer(tmp_path / "adapter")
    assert hasattr(model, "peft_config") and tokenizer.padding_side == "left"


def test_a_hub_name_when_offline_says_so_without_asking_the_hub(monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OSError, match=r"could not load 'nobody/no-such-model' .*\(HF_HUB_OFFLINE is set, so the hub "
                                      r"was not asked\)") as info:
        load_model_and_tokenizer("nobody/no-such-model")
    assert "\n" not in str(info.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="only meaningful without a GPU")
def test_asking_for_cuda_without_a_gpu_is_named(capsys):
    assert main(["train", "--device", "cuda", "--max-steps", "1"]) == 2
    assert "device: 'cuda' was asked for but torch sees no CUDA GPU" in last_error_line(capsys)


# ---------------------------------------------------------------------------------------------------------
# Property tests: whatever users pass in, the answer is a result or a one-line error of the documented kind
# ---------------------------------------------------------------------------------------------------------
SETTINGS = dict(deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
any_reward = st.one_of(
    st.none(), st.booleans(), st.integers(-10**400, 10**400), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=5), st.lists(st.floats(), max_size=2), st.builds(torch.tensor, st.floats(width=32)),
)


@settings(max_examples=200, **SETTINGS)
@given(values=st.lists(any_reward, min_size=1, max_size=6))
def test_any_reward_values_score_or_raise_a_named_reward_error(values):
    def user_reward(prompts, completions, **row):
        return values

    n = len(values)
    try:
        per_func, unscorable = score_completions([user_reward], ["p"] * n, ["c"] * n, {})
    except RewardError as exc:
        assert "'user_reward'" in str(exc) and "\n" not in str(exc)
        assert any(isinstance(v, (str, list)) for v in values)  # only a non-number is an error
        return
    for value, score, bad in zip(values, per_func[:, 0].tolist(), unscorable.tolist()):
        if value is None:
            assert math.isnan(score) and not bad  # "does not apply"
            continue
        assert not isinstance(value, (str, list))  # those are errors
        as_float32 = torch.tensor(float(value) if not isinstance(value, int) or abs(value) < 10**308 else math.inf).item()
        if math.isfinite(as_float32):
            assert score == as_float32 and not bad
        else:
            assert bad  # NaN, inf, or beyond float32's range: unscorable


config_key = st.one_of(st.sampled_from(sorted(Config.__dataclass_fields__)),
                        st.text(st.characters(exclude_categories=("Cc",)), min_size=1, max_size=12))
config_value = st.one_of(st.text(max_size=8), st.integers(-5, 300), st.floats(), st.booleans(), st.none(),
                         st.lists(st.text(max_size=4), max_size=3))


@settings(max_examples=300, **SETTINGS)
@given(overrides=st.dictionaries(config_key, config_value, max_size=4))
def test_any_config_values_load_or_raise_a_config_error(overrides):
    try:
        cfg = load_config(None, overrides)
    except ConfigError as exc:
        assert "\n" not in str(exc)
        return
    assert cfg.num_generations >= 2 and cfg.generation_batch_size % cfg.num_generations == 0


@settings(max_examples=200, **SETTINGS)
@given(lines=st.lists(st.one_of(
    st.text(max_size=20),
    st.fixed_dictionaries({"prompt": st.text(max_size=5), "answer": st.text(max_size=3)}).map(json.dumps),
    st.dictionaries(st.text(max_size=6), st.one_of(st.text(max_size=3), st.integers())).map(json.dumps),
), max_size=5))
def test_any_data_file_reads_as_rows_or_raises_a_data_error_naming_the_line(tmp_path_factory, lines):
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    path.write_text("\n".join(line.replace("\n", " ").replace("\r", " ") for line in lines))
    try:
        rows = read_rows(path)
    except DataError as exc:
        assert str(exc).startswith(f"{path}:") and "\n" not in str(exc)
        return
    assert all(isinstance(row["prompt"], str) and "answer" in row for row in rows)
