"""A run's tools made ready, once, before any step: which tools, a worker process to run them, their limits.

    tool_setup(tools, task, model, tokenizer)    -> ToolSetup, or None for single-turn completions
    ToolSetup.sample(engine, rows, ...)          the multi-turn rollout of those rows with these tools (loop.py)

Tools come as plain typed functions, or by name (load_tools: python, calculator, "module:function"); a function
without a usable schema (type hints, a docstring) is a one-line error here, not in the middle of a run.
"""

from dataclasses import dataclass

from ..errors import ConfigError
from ..rollout import eos_token_ids
from ..sandbox.user_code import load_callable
from .builtin import calculator, python
from .calls import tool_schemas
from .environment import EnvironmentPool, environment_tools
from .execute import ToolWorker
from .loop import sample_with_tools

__all__ = ["ToolSetup", "tool_setup", "load_tools", "BUILTIN_TOOLS"]

BUILTIN_TOOLS = {"python": python, "calculator": calculator}


def load_tools(specs: list) -> list:
    """Tools by name (python, calculator) or as "module:function" / "path/file.py:function" (config's `tools`); a
    function given is kept as it is."""
    return [spec if callable(spec) else BUILTIN_TOOLS[spec] if spec in BUILTIN_TOOLS
            else load_callable(spec, "tools", ConfigError) for spec in specs]


@dataclass
class ToolSetup:
    """What the multi-turn rollout needs for a run with tools (loop.py), made once by the trainer (tool_setup)."""

    tools: list  # plain typed functions
    worker: object  # ToolWorker running them, kept for the run
    eos_ids: list[int]
    max_tool_calling_iterations: int | None = None
    tool_timeout: float = 10.0
    max_tool_output_chars: int = 4000
    environments: object = None  # EnvironmentPool (environment_factory): one environment per completion

    def sample(self, engine, rows: list[dict], *, num_generations: int, max_completion_length: int, **sampling):
        """The multi-turn rollout of these dataset rows' prompts with these tools (loop.py), each completion
        with its own environment reset from its row when there is an environment_factory; sampling: temperature,
        top_p, top_k, do_sample, chat_template_kwargs."""
        prompts, environments = [row["prompt"] for row in rows], None
        if self.environments is not None:
            environments, prompts = self.environments.reset_groups(rows, num_generations)
        return sample_with_tools(engine, engine.tokenizer, prompts, tools=self.tools, environments=environments,
                                 num_generations=num_generations,
                                 max_completion_length=max_completion_length,
                                 max_tool_calling_iterations=self.max_tool_calling_iterations, eos_ids=self.eos_ids,
                                 tool_timeout=self.tool_timeout, max_tool_output_chars=self.max_tool_output_chars,
                                 worker=self.worker, **sampling)


def tool_setup(tools: list | None, task, model, tokenizer, environment_factory=None, *,
               max_tool_calling_iterations: int | None = None, tool_timeout: float = 10.0,
               max_tool_output_chars: int = 4000) -> ToolSetup | None:
    """The run's tools with a worker to run them, and the environments environment_factory makes (one per
    completion, environment.py), or None for neither.

    tools: functions or names (load_tools); None = the task's own tools, if it has any.
    max_tool_calling_iterations: tool turns per completion; None = the task's own limit, else as many as the
    completion budget allows."""
    if tools is None:
        tools = getattr(task, "tools", None) or []
    tools = load_tools(tools)
    if not tools and environment_factory is None:
        return None
    environments = EnvironmentPool(environment_factory) if environment_factory is not None else None
    tool_schemas(tools + ([] if environments is None else list(environment_tools(environments.example).values())))
    worker = ToolWorker({tool.__name__: tool for tool in tools}, max_output_chars=max_tool_output_chars)
    if max_tool_calling_iterations is None:  # the task's own limit, if it has one
        max_tool_calling_iterations = getattr(task, "max_tool_calling_iterations", None)
    return ToolSetup(tools, worker, eos_token_ids(model, tokenizer), max_tool_calling_iterations, tool_timeout,
                     max_tool_output_chars, environments)
