"""Tool calls as a model writes them, and tool schemas as a chat template shows them.

A Qwen2.5 / Qwen3 model (the Hermes format) calls a tool by writing, inside its turn,

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "48 + 24"}}
    </tool_call>

once per call; several blocks in one turn are several calls, run in order. ``parse_assistant_turn`` finds them in
the turn's text. A block that is not a call (bad JSON, no ``name``, ``arguments`` that are not an object, no closing
tag) is still a call, a failed one: its ``error`` goes back to the model as the tool's answer, so a model learns the
format from its mistakes instead of the run stopping on them.

The model learns what tools exist from their JSON schemas, written by the chat template into the system message
(``apply_chat_template(messages, tools=...)``). ``tool_schema`` builds one from a plain typed Python function with a
Google-style docstring, with transformers' ``get_json_schema``, as TRL's ``tools=[fn, ...]`` does.
"""

import json
import re
from dataclasses import dataclass, field

from ..config import ConfigError

__all__ = ["ToolCall", "parse_assistant_turn", "parse_tool_calls", "tool_schema", "tool_schemas"]

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)(?:" + re.escape(TOOL_CALL_END) + r"|\Z)", re.DOTALL)


@dataclass
class ToolCall:
    name: str | None  # None when the block names no tool
    arguments: dict = field(default_factory=dict)
    error: str | None = None  # why the block is not a call; sent back to the model as the tool's answer
    text: str = ""  # the block's text between the tags, as written

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_message_call(self) -> dict:
        """The call as an assistant message's ``tool_calls`` entry (the OpenAI / TRL format)."""
        return {"type": "function", "function": {"name": self.name or "", "arguments": self.arguments}}


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block in a turn's text, in order; malformed ones carry an ``error``."""
    calls = []
    for match in _BLOCK.finditer(text):
        body = match.group(1)
        closed = match.group(0).endswith(TOOL_CALL_END)
        calls.append(_parse_block(body.strip(), closed))
    return calls


def parse_assistant_turn(text: str) -> tuple[str, list[ToolCall]]:
    """A turn's text -> (content, calls): the content is the text before the first call (Qwen's template writes
    the content, then a newline, then the blocks), the calls as ``parse_tool_calls``."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return text, []
    content = text[:start]
    return (content[:-1] if content.endswith("\n") else content), parse_tool_calls(text[start:])


def _parse_block(body: str, closed: bool) -> ToolCall:
    if not closed:
        return ToolCall(None, error=f"Error: {TOOL_CALL_START} without a closing {TOOL_CALL_END}.", text=body)
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return ToolCall(None, error=f"Error: the tool call is not valid JSON ({e.msg} at character {e.pos}).",
                        text=body)
    if not isinstance(call, dict):
        return ToolCall(None, error='Error: the tool call must be a JSON object {"name": ..., "arguments": {...}}.',
                        text=body)
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, error='Error: the tool call has no "name".', text=body)
    arguments = call.get("arguments", {})  # a tool without parameters may be called without them
    if not isinstance(arguments, dict):
        return ToolCall(name, error=f'Error: the "arguments" of {name} must be a JSON object, not '
                                    f"{type(arguments).__name__}.", text=body)
    return ToolCall(name, arguments, text=body)


def tool_schema(tool) -> dict:
    """A function's JSON schema for the chat template (``transformers.utils.get_json_schema``): its name, the
    docstring's first paragraph as the description, one parameter per argument with its type hint and the
    docstring's ``Args:`` line. A function without type hints or such a docstring is a one-line ConfigError."""
    from transformers.utils import get_json_schema

    name = getattr(tool, "__name__", repr(tool))
    try:
        return get_json_schema(tool)
    except Exception as e:  # TypeHintParsingException, DocstringParsingException
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"tools: {name!r} has no JSON schema ({message}); a tool needs type hints on every "
                          f"argument and a Google-style docstring with an Args: line for each") from None


def tool_schemas(tools) -> list[dict]:
    """``tool_schema`` of each tool (callables), in order."""
    return [tool_schema(tool) for tool in tools]
