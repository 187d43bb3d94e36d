"""Stateful tools: an environment per completion, as TRL 1.16's ``environment_factory``.

An environment is a class. ``reset(**row)`` starts an episode from a dataset row (all its fields as keywords) and may
return an observation, a string appended to the prompt's last message; its public methods are the tools the model
can call in that episode (typed, with docstrings, as any tool); an optional ``get_reward()`` scores the episode
when the rollout is over. Methods whose names start with ``_`` are not tools.

    class Counter:
        def reset(self, start: int = 0, **row):
            self.value = start
            return f"The counter starts at {start}."

        def increment(self, by: int) -> int:
            '''Add to the counter and return its new value.

            Args:
                by: How much to add.
            '''
            self.value += by
            return self.value

        def get_reward(self) -> float:
            return float(self.value == 10)

Each completion gets its own instance (G completions of one prompt do not share a counter), so a batch of N
completions needs N instances. ``EnvironmentPool`` builds them with the factory once and resets them batch after
batch ("construct once, reset often", as TRL does). Environment methods run in the trainer's process (execute.py
says why), so ``get_reward`` reads the state the episode's calls left.
"""

import inspect
from collections.abc import Callable

from ..errors import ConfigError

__all__ = ["EnvironmentPool", "environment_tools", "environment_rewards", "prompt_with_observation"]

NOT_TOOLS = ("reset", "get_reward")


def _tool_names(cls) -> list[str]:
    # Listed on the class: inspecting an instance would evaluate its properties.
    return [name for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
            if name not in NOT_TOOLS and not name.startswith("_")]


def environment_tools(environment) -> dict[str, Callable]:
    """An environment's tools: its public methods but reset and get_reward, bound to it, by name."""
    return {name: getattr(environment, name) for name in _tool_names(type(environment))}


def environment_rewards(environments: list) -> list[float | None] | None:
    """``get_reward()`` of each environment (None for one whose class has none); None when no class has one."""
    if not any(callable(getattr(type(env), "get_reward", None)) for env in environments):
        return None
    return [float(env.get_reward()) if callable(getattr(type(env), "get_reward", None)) else None
            for env in environments]


def prompt_with_observation(prompt, observation):
    """The prompt with ``reset``'s observation appended to its last message (TRL's rule); unchanged for None.
    A new list and message: the dataset's row is left as it was."""
    if observation is None:
        return prompt
    if isinstance(prompt, str):
        return prompt + observation
    return prompt[:-1] + [{**prompt[-1], "content": prompt[-1]["content"] + observation}]


class EnvironmentPool:
    """Environments made by ``factory()``, one per completion, reused from batch to batch.

    pool = EnvironmentPool(factory)      # builds one instance to check it has reset() and to list its tools
    environments, prompts = pool.reset(rows)   # one per row (repeat a row G times for G completions)
    """

    def __init__(self, factory: Callable):
        probe = factory()
        cls = type(probe)
        if not callable(getattr(cls, "reset", None)):
            raise ConfigError(f"environment_factory: {cls.__name__} has no reset(**row) method")
        self.factory, self.tool_names = factory, _tool_names(cls)
        self.has_reward = callable(getattr(cls, "get_reward", None))
        self.example = probe  # the first instance: its tools' schemas are checked before any step
        self._instances = [probe]

    def reward_func(self) -> Callable:
        """get_reward as a reward function (TRL's rule: weight 1, logged under the environment's class name): it
        reads the ``environments`` column, one instance per completion."""
        def reward(prompts, completions, environments, **row):
            return environment_rewards(environments)

        reward.__name__ = type(self.example).__name__
        return reward

    def reset_groups(self, rows: list[dict], group_size: int) -> tuple[list, list]:
        """reset() for G completions of each row: (environments (B*G), prompts (B)). The G environments of a row
        must show the same prompt (a group shares its prompt): a reset that differs within a group is an error."""
        environments, prompts = self.reset([row for row in rows for _ in range(group_size)])
        for i in range(len(rows)):
            if any(p != prompts[i * group_size] for p in prompts[i * group_size:(i + 1) * group_size]):
                raise ConfigError("environment_factory: reset(**row) gave the completions of one row different "
                                  "observations; GRPO compares completions of one prompt, so reset must be deterministic "
                                  "in the row")
        return environments, prompts[::group_size]

    def reset(self, rows: list[dict]) -> tuple[list, list]:
        """Reset one environment per row with ``reset(**row)``; returns (environments, prompts): each row's
        prompt (its "prompt" field, or an empty user message) with the observation appended."""
        while len(self._instances) < len(rows):
            self._instances.append(self.factory())
        environments = self._instances[: len(rows)]
        prompts = []
        for environment, row in zip(environments, rows):
            observation = environment.reset(**row)
            prompts.append(prompt_with_observation(row.get("prompt", [{"role": "user", "content": ""}]), observation))
        return environments, prompts
