"""Tools for GRPO: a model that calls functions during its rollout, and the loss that learns only its own tokens.

    calls.py        parse <tool_call>{"name": ..., "arguments": {...}}</tool_call> blocks; schemas from functions
    execute.py      run one call safely: errors, timeouts, floods of output all come back as text
    template.py     the tool message's own token ids, from the chat template; tool text kept as plain text
    environment.py  stateful tools: one environment per completion (TRL's environment_factory)
    loop.py         the multi-turn rollout: sample, call, append, sample again; the tool mask
    builtin.py      two tools to compute with: python (a subprocess with limits) and calculator (no eval)
    setup.py        a run's tools made ready once: by name or as functions, a worker, limits (tool_setup, ToolSetup)

The entry point is ``sample_with_tools`` (loop.py), which returns a ``ToolRollout``: a Rollout with ``tool_mask``
(1 = the policy's token, 0 = the tool's) and per-row counts of calls, failures and tool turns.
"""

from .builtin import calculator, python
from .calls import ToolCall, parse_assistant_turn, parse_tool_calls, tool_schema, tool_schemas
from .environment import EnvironmentPool, environment_rewards, environment_tools, prompt_with_observation
from .execute import ToolWorker, cut_output, execute_tool_call, tool_output_text
from .loop import ToolRollout, Turn, sample_with_tools, tool_call_loop
from .setup import BUILTIN_TOOLS, ToolSetup, load_tools, tool_setup
from .template import encode_as_text, prompt_ids_with_tools, tool_suffix_ids

__all__ = [
    "ToolCall", "parse_assistant_turn", "parse_tool_calls", "tool_schema", "tool_schemas",
    "EnvironmentPool", "environment_rewards", "environment_tools", "prompt_with_observation",
    "ToolWorker", "cut_output", "execute_tool_call", "tool_output_text",
    "ToolRollout", "Turn", "sample_with_tools", "tool_call_loop",
    "encode_as_text", "prompt_ids_with_tools", "tool_suffix_ids", "BUILTIN_TOOLS", "load_tools", "ToolSetup", "tool_setup",
]
