"""environment_factory through train() (TRL's name): one stateful environment per completion, reset from its row,
its methods the tools the model calls, its get_reward() one more reward function."""

import json

import pytest

from minigrpo.config import ConfigError
from minigrpo.trainer import train

from test_tools_training import FirstTurnCalls, config

pytestmark = pytest.mark.usefixtures("one_thread")


class Adder:
    """An environment whose `add` counts its calls; the episode pays 1 when the model called it at least once."""

    resets = 0

    def reset(self, answer: str, **row):
        Adder.resets += 1
        self.calls, self.answer = 0, answer
        return None

    def add(self, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: The first number.
            b: The second number.
        """
        self.calls += 1
        return a + b

    def get_reward(self) -> float:
        return float(self.calls > 0)


def test_environments_give_tools_and_a_reward(tmp_path, chat_model_dir):
    seen = []

    def reads_environments(prompts, completions, environments, **row):
        seen.append([env.calls for env in environments])
        return [0.0] * len(completions)

    Adder.resets = 0
    train(config(tmp_path, chat_model_dir), tools=[], environment_factory=Adder, reward_funcs=[reads_environments],
          engine_factory=FirstTurnCalls, progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert Adder.resets >= 2 * 8  # a reset for each completion of each step (and for evaluation)
    for line, calls in zip(lines, seen):
        # FirstTurnCalls makes every even row call add once (a random stand-in writes no call of its own): those
        # environments pay 1, the others 0, and each completion's reward function saw its own environment
        assert calls == [1, 0] * 4
        assert line["rewards/Adder/mean"] == 0.5
        assert line["tools/call_frequency"] > 0


class Moody:
    """reset() gives a different observation every time: the G completions of one prompt would not share it."""

    count = 0

    def reset(self, **row):
        Moody.count += 1
        return f" (attempt {Moody.count})"

    def noop(self) -> int:
        """Do nothing.
        """
        return 0


def test_an_environment_that_changes_the_prompt_within_a_group_is_refused(tmp_path, chat_model_dir):
    with pytest.raises(ConfigError, match="environment_factory: reset.*different observations"):
        train(config(tmp_path, chat_model_dir), tools=[], environment_factory=Moody, progress=False)
