"""Tool calls as a model writes them, and tool schemas as a chat template shows them.

A Qwen2.5 / Qwen3 model (the Hermes format) calls a tool by writing, inside its turn,

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "48 + 24"}}
    </tool_call>

once per call; several blocks in one turn are several calls, run in order. ``parse_assistant_turn`` finds them in
the turn's text. A block that is not a call (bad JSON, no ``name``, ``arguments`` that are not an object, no closing
tag) is still a call, a failed one: its ``error`` goes back to the model as the tool's answer, so a model learns the
format from its mistakes instead of the run stopping on them.

**A call as a message.** The loop records each turn as TRL's assistant message, one ``tool_calls`` entry per call
(``ToolCall.as_message_call``); reward functions, completions.jsonl and ``minigrpo show`` all read these. A
well-formed call is the OpenAI / TRL entry and nothing more:

    {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}

A malformed call keeps that shape, so that code reading TRL's format and a chat template re-rendering the messages
still work, and adds two keys that chat templates ignore: ``error``, the parser's message (what the model was told),
and ``text``, the block exactly as the model wrote it, tags included. ``name`` is "" when the block names no tool, and
``arguments`` is {} unless the block had ``"arguments"`` that were not an object, which are kept as written:

    {"type": "function", "function": {"name": "", "arguments": {}},
     "error": "Error: the tool call is not valid JSON (...)", "text": "<tool_call>\\n{bad json\\n</tool_call>"}
    {"type": "function", "function": {"name": "add", "arguments": [1, 2]},
     "error": "Error: the \\"arguments\\" of add must be ...", "text": "<tool_call>{...}</tool_call>"}

What TRL 1.16 does (``parse_response`` in trl/chat_template_utils.py, then ``GRPOTrainer._tool_call_loop``): a
block it cannot parse (bad JSON, no name, no closing tag) makes the whole turn ``{"role": "assistant", "content":
<the turn decoded>}`` with no ``tool_calls``, so nothing is run and the row's loop ends; ``"arguments"`` that are
not an object stay in the entry as written, and calling the tool with them fails with ``{"error": ...}`` as the
tool's answer. The second case is followed: TRL's entry, plus the two keys. The first is not: here a malformed
block is still a call, whose error goes back to the model, so it keeps an entry that its tool message answers, in
order, and a reward function that checks the calls sees a failed call rather than plain text.

The model learns what tools exist from their JSON schemas, written by the chat template into the system message
(``apply_chat_template(messages, tools=...)``). ``tool_schema`` builds one from a plain typed Python function with a
Google-style docstring, with transformers' ``get_json_schema``, as TRL's ``tools=[fn, ...]`` does.
"""

import json
import re
from dataclasses import dataclass, field

from ..errors import ConfigError

__all__ = ["ToolCall", "parse_assistant_turn", "parse_tool_calls", "tool_schema", "tool_schemas"]

TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
_BLOCK = re.compile(re.escape(TOOL_CALL_START) + r"(.*?)(?:" + re.escape(TOOL_CALL_END) + r"|\Z)", re.DOTALL)


@dataclass
class ToolCall:
    name: str | None  # None when the block names no tool
    arguments: dict = field(default_factory=dict)  # in a failed call whose "arguments" were not an object: as written
    error: str | None = None  # why the block is not a call; sent back to the model as the tool's answer
    text: str = ""  # the block as written, from <tool_call> through </tool_call> (or the turn's end if unclosed)

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_message_call(self) -> dict:
        """The call as an assistant message's ``tool_calls`` entry: the OpenAI / TRL format, plus ``error`` and
        ``text`` (the block as written) when the call is malformed (see the module docstring)."""
        entry = {"type": "function", "function": {"name": self.name or "", "arguments": self.arguments}}
        if not self.ok:
            entry |= {"error": self.error, "text": self.text}
        return entry


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>...</tool_call>`` block in a turn's text, in order; malformed ones carry an ``error``."""
    return [_parse_block(match.group(0), match.group(1).strip()) for match in _BLOCK.finditer(text)]


def parse_assistant_turn(text: str) -> tuple[str, list[ToolCall]]:
    """A turn's text -> (content, calls): the content is the text before the first call (Qwen's template writes
    the content, then a newline, then the blocks), the calls as ``parse_tool_calls``."""
    start = text.find(TOOL_CALL_START)
    if start < 0:
        return text, []
    content = text[:start]
    return (content[:-1] if content.endswith("\n") else content), parse_tool_calls(text[start:])


def _parse_block(block: str, body: str) -> ToolCall:
    """One block (tags included, as written) and its body (between the tags, stripped) -> a call, or a failed one."""
    def failed(error: str) -> ToolCall:
        return ToolCall(None, error=error, text=block)

    if not block.endswith(TOOL_CALL_END):
        return failed(f"Error: {TOOL_CALL_START} without a closing {TOOL_CALL_END}.")
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return failed(f"Error: the tool call is not valid JSON ({e.msg} at character {e.pos}).")
    if not isinstance(call, dict):
        return failed('Error: the tool call must be a JSON object {"name": ..., "arguments": {...}}.')
    name = call.get("name")
    if not isinstance(name, str) or not name:
        return failed('Error: the tool call has no "name".')
    arguments = call.get("arguments", {})  # a tool without parameters may be called without them
    if not isinstance(arguments, dict):
        return ToolCall(name, arguments, error=f'Error: the "arguments" of {name} must be a JSON object, not '
                                               f"{type(arguments).__name__}.", text=block)
    return ToolCall(name, arguments, text=block)


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
