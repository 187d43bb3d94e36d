"""The CLI's line between input and bugs: minigrpo's own errors are one line and exit 2, anything else a traceback.

A bad flag, a reward function that raises or a missing file is the user's to fix, and the one line says what. A
KeyError or a ValueError from inside the package (or a module a student edited) is a bug: the traceback is
what finds it, so the CLI must not turn it into a line.
"""

import subprocess
import sys

import pytest

import minigrpo.trainer
from minigrpo.persistence.checkpoint import CheckpointError
from minigrpo.cli import main
from minigrpo.errors import MinigrpoError, UsageError
from minigrpo.sandbox.isolation import IsolationError
from minigrpo.rewards import RewardError
from minigrpo.tasks import DataError


def error_lines(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


def test_a_config_error_is_one_line_and_exit_2(capsys):
    assert main(["train", "--num-generations", "1"]) == 2
    assert error_lines(capsys) == ["minigrpo train: error: num_generations: must be >= 2 (a group of one has no baseline)"]


def test_a_missing_config_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["train", "--config", str(tmp_path / "nowhere.yaml")]) == 2
    (line,) = error_lines(capsys)
    assert line.startswith("minigrpo train: error: ") and "nowhere.yaml" in line


def test_a_nan_loss_stop_is_one_line_and_exit_2(monkeypatch, capsys):
    """The trainer raises FloatingPointError before a NaN loss reaches the weights; its message says which step."""
    def stops(cfg):
        raise FloatingPointError("step 3: the loss is nan — stopping before the weights are changed")

    monkeypatch.setattr(minigrpo.trainer, "train", stops)
    assert main(["train"]) == 2
    assert error_lines(capsys) == ["minigrpo train: error: step 3: the loss is nan — stopping before the weights "
                                   "are changed"]


def test_a_reward_function_that_raises_is_named_in_one_line(tmp_path, random_model_dir, capsys):
    """The user's reward function is input: the line names it, the completion and the exception."""
    (tmp_path / "my_rewards.py").write_text("def ratio(prompts, completions, **kw):\n"
                                            "    return [1 / 0 for c in completions]\n")
    argv = ["train", "--task", "addition", "--model", str(random_model_dir), "--reward-funcs",
            f"{tmp_path}/my_rewards.py:ratio", "--max-steps", "1", "--num-generations", "2",
            "--generation-batch-size", "2", "--eval-steps", "0", "--eval-limit", "1", "--eval-num-samples", "0",
            "--save-model", "false", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    line = error_lines(capsys)[-1]  # a model load may draw a progress bar above it
    assert line.startswith("minigrpo train: error: reward function 'ratio' raised on completion 0")
    assert "ZeroDivisionError" in line


@pytest.mark.parametrize("bug", [KeyError("loss"), ValueError("shapes (4,) and (8,) differ"),
                                 ZeroDivisionError("division by zero"), PermissionError("a bug's own file")],
                         ids=lambda e: type(e).__name__)
def test_a_bug_is_not_swallowed(monkeypatch, capsys, bug):
    """What is not a minigrpo error comes out of main() unchanged, so Python prints its traceback."""
    def buggy(cfg):
        raise bug

    monkeypatch.setattr(minigrpo.trainer, "train", buggy)
    with pytest.raises(type(bug)) as raised:
        main(["train"])
    assert raised.value is bug and "error:" not in capsys.readouterr().err


def test_a_bug_prints_its_traceback_and_exits_1(tmp_path):
    """The whole path a user sees: the CLI run by Python with a trainer that fails on a KeyError."""
    (tmp_path / "buggy_run.py").write_text("import sys\n"
                                           "import minigrpo.trainer\n"
                                           "from minigrpo.cli import main\n"
                                           "def train(cfg):\n"
                                           "    return {}['accuracy']\n"
                                           "minigrpo.trainer.train = train\n"
                                           "sys.exit(main(['train']))\n")
    proc = subprocess.run([sys.executable, str(tmp_path / "buggy_run.py")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "return {}['accuracy']" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "KeyError: 'accuracy'"


@pytest.mark.parametrize("error", [CheckpointError, DataError, IsolationError, RewardError, UsageError])
def test_minigrpo_errors_keep_their_builtin_bases(error):
    """Code that catches ValueError or RuntimeError, as before there was a MinigrpoError, still catches them."""
    assert issubclass(error, MinigrpoError)
    assert issubclass(error, ValueError) or issubclass(error, RuntimeError)


def test_a_reward_function_that_hangs_is_stopped_and_named_in_one_line(tmp_path, random_model_dir, capsys):
    (tmp_path / "my_rewards.py").write_text("import time\n\ndef judge(prompts, completions, **kw):\n"
                                            "    time.sleep(600)\n")
    argv = ["train", "--task", "addition", "--model", str(random_model_dir), "--reward-funcs",
            f"{tmp_path}/my_rewards.py:judge", "--reward-timeout", "0.5", "--max-steps", "1", "--num-generations", "2",
            "--generation-batch-size", "2", "--eval-steps", "0", "--eval-limit", "1", "--eval-num-samples", "0",
            "--save-model", "false", "--out", str(tmp_path / "run")]
    assert main(argv) == 2
    assert error_lines(capsys)[-1] == ("minigrpo train: error: reward function 'judge' did not return within 0.5 s "
                                       "(reward_timeout); give a slower one more time with reward_timeout, or 0 for "
                                       "no limit")
