"""`minigrpo show RUN [--step N] [--turns]`: a step's groups from RUN/completions.jsonl, as readable tables.

    step 40, group 0: 769+175=        answer 944
      #  reward  correctness_reward  advantage  len  cut  completion
      0   1.000               1.000     +0.935   29       <think>5+9=14,7+7+1=15,...</think>944
      1   0.000               0.000     -0.935    6       <think></think>755
      ...

What TRL users see as the completions table: a prompt's G completions side by side, with what each earned
from every reward function and the advantage it was trained with.

**With tools** (a record's completions carry ``messages``) the completion is shown turn by turn, and the tool's
text is set apart from the model's: a call the model wrote as ``call add(a=523745, b=24060)``, the answer the tool
wrote in brackets, ``[tool: 547805]``, and a ``calls`` column counts the calls. The tool's text is context, not
something the policy sampled: ``len`` counts the policy's tokens only, and the loss does not learn the bracketed part
(unless ``train_on_tool_output``).
``--turns`` prints every completion that called a tool in full below its row, one line per turn, ``model |`` or
``tool  |``. A call the parser could not read (bad JSON, no name, no closing tag) is shown as the model wrote it:
the messages keep its block and its ``error`` (tools/calls.py), the table writes it ``call ? (malformed: <tool_call>
{"name": "add", ...</tool_call>)``, and its error follows as the tool's answer. Where a record's malformed call has
no text (messages not written by the tool loop), the completion also gets a ``raw   |`` line, the whole completion
as decoded (special tokens dropped):

    step 2, group 0: 523745+24060    answer 547805
      #   reward  correctness_reward  advantage   len  calls  cut  ok  completion
      5    1.000               1.000     +2.474    41      1       ok  call add(a=523745, b=24060)  [tool: 547805]  547805
             model | <tool_call>{"name": "add", "arguments": {"a": 523745, "b": 24060}}</tool_call>
             tool  | 547805
             model | 547805
"""

import argparse
import json
from pathlib import Path

from ..errors import UsageError

__all__ = ["read_completions", "format_group", "format_turns", "turns", "main"]


def read_completions(run_dir: str | Path) -> list[dict]:
    """The records of RUN/completions.jsonl (run_log.completion_records), in the order they were written."""
    path = Path(run_dir) / "completions.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such file (runs write it unless log_completions is false)")
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


# Control characters a model (or a tool) wrote are shown escaped: "\n" as \n, an ESC as \x1b, a C1 control (0x9b
# starts an escape sequence on some terminals) as \x9b, a bidirectional override as \u202e, so that no completion can
# move the terminal's cursor, recolour it, or reorder the text around it.
_BIDI_AND_LINE_BREAKS = [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x2028, 0x2029]
_ESCAPED = ({c: f"\\x{c:02x}" for c in [*range(32), *range(127, 160)]}
            | {c: f"\\u{c:04x}" for c in _BIDI_AND_LINE_BREAKS}
            | {ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"})


def _text(value) -> str:
    """A string as it is; anything else (a record is JSON, so numbers, lists, objects) as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)


def _one_line(text, width: int) -> str:
    text = _text(text).translate(_ESCAPED)
    return text if len(text) <= width else text[: width - 3] + "..."


def _number(x) -> str:
    return "   n/a" if x is None else f"{x:6.3f}"


def _read_call(call) -> tuple[str, object, str | None]:
    """A ``tool_calls`` entry -> (name, arguments, malformed).

    malformed is None for a well-formed call (TRL's ``{"type": "function", "function": {"name", "arguments"}}``,
    or the bare function). For a malformed one (tools/calls.py: an entry with an ``error``) it is the block as the
    model wrote it (the entry's ``text``), or "" where the entry keeps none. An entry with no name, or one that is
    not an object, counts as malformed too. Nothing in a record is trusted to have the right type."""
    if not isinstance(call, dict):
        return "", {}, _text(call)
    function = call.get("function", call)
    function = function if isinstance(function, dict) else {}
    name = function.get("name")
    name = "" if name is None else _text(name)
    arguments = function.get("arguments")
    arguments = {} if arguments is None else arguments
    if "error" in call or not name:
        return name, arguments, call.get("text") if isinstance(call.get("text"), str) else ""
    return name, arguments, None


def _message(message) -> dict:
    return message if isinstance(message, dict) else {"role": "assistant", "content": _text(message)}


def _calls(message: dict) -> list:
    calls = message.get("tool_calls") or []
    return calls if isinstance(calls, list) else [calls]


def turns(messages: list[dict]) -> list[tuple[str, str]]:
    """A completion's messages (TRL's format) as (who, text) in order: who is "model" for what the policy wrote
    (its content, then each call as the chat template writes it, a malformed one as the model wrote it) and "tool"
    for each tool's answer."""
    out = []
    for message in map(_message, messages):
        if message.get("role") == "tool":
            out.append(("tool", _text(message.get("content", ""))))
            continue
        text = message.get("content") or ""
        if isinstance(text, list):  # content as a list of parts
            text = "".join(_text(part.get("text", "")) for part in text if isinstance(part, dict))
        text = _text(text)
        for call in _calls(message):
            name, arguments, malformed = _read_call(call)
            if malformed is None:
                block = "<tool_call>" + _text({"name": name, "arguments": arguments}) + "</tool_call>"
            else:
                block = malformed or "<tool_call>? (malformed)</tool_call>"
            text += ("\n" if text else "") + block
        out.append(("model", text))
    return out


def _call_text(call) -> str:
    """One call in a line: ``call add(a=1, b=2)``; arguments that are not an object as JSON, ``call add([1, 2])``
    (a string, OpenAI's JSON text, as it is); a malformed call as ``call ? (malformed: <the block as written>)``."""
    name, arguments, malformed = _read_call(call)
    if malformed is not None:
        return f"call ? (malformed: {malformed})" if malformed else "call ? (malformed)"
    if isinstance(arguments, dict):
        return f"call {name}(" + ", ".join(f"{_text(k)}={json.dumps(v, ensure_ascii=False, default=str)}"
                                           for k, v in arguments.items()) + ")"
    return f"call {name}({_text(arguments)})"


def _compact(messages: list[dict]) -> str:
    """One line: the model's text as it is (a call as ``call name(a=1, b=2)``), each tool answer as
    ``[tool: ...]``, turns two spaces apart."""
    parts = []
    for message in map(_message, messages):
        if message.get("role") == "tool":
            parts.append(f"[tool: {_text(message.get('content', ''))}]")
            continue
        if message.get("content"):
            parts.append(_text(message["content"]))
        parts += [_call_text(call) for call in _calls(message)]
    return "  ".join(parts)


def _has_call_without_text(messages: list[dict]) -> bool:
    """Whether a malformed call keeps no text of its own (then the completion as decoded is the only record of it)."""
    return any(_read_call(call)[2] == "" for m in map(_message, messages) for call in _calls(m))


def format_turns(messages: list[dict], indent: str = "       ") -> str:
    """A completion turn by turn, one line each: ``model | ...`` for the policy's text, ``tool  | ...`` for a
    tool's answer (newlines and other control characters escaped, as \\n)."""
    return "\n".join(f"{indent}{who:5s} | {text.translate(_ESCAPED)}" for who, text in turns(messages))


def format_group(record: dict, width: int = 100, show_turns: bool = False) -> str:
    """One group as a small table: reward, each reward function, advantage, length, (with tools) tool calls, cut
    off, correct, completion. show_turns: each completion's turns in full below its row (completions with tools)."""
    prompt = record["prompt"]
    if isinstance(prompt, list):  # chat messages: the last user turn says what was asked
        prompt = next((m["content"] for m in reversed(prompt) if m.get("role") == "user"), prompt)
    head = f"step {record['step']}, group {record['group']}: {_one_line(prompt, width)}"
    if "answer" in record:
        head += f"    answer {_one_line(record['answer'], 40)}"
    names = list(record["completions"][0]["rewards"]) if record["completions"] else []
    with_tools = any("messages" in c for c in record["completions"])
    columns = ["#", " reward", *names, "advantage", " len", *(["calls"] if with_tools else []), "cut", "ok",
               "completion"]
    lines = [head, "  " + "  ".join(columns)]
    for i, c in enumerate(record["completions"]):
        cells = [f"{i:>1}", f"{_number(c['reward']):>7}"]
        cells += [f"{_number(c['rewards'][n]):>{len(n)}}" for n in names]
        cells += [f"{c['advantage']:>+9.3f}", f"{c['length']:>4}"]
        if with_tools:
            cells.append(f"{c.get('tool_calls', 0):>5}")
        text = _compact(c["messages"]) if "messages" in c else c["text"]
        cells += ["cut" if c["truncated"] else "   ", "ok" if c["correct"] else "  ", _one_line(text, width)]
        lines.append("  " + "  ".join(cells))
        if show_turns and (c.get("tool_calls") or len(turns(c.get("messages", []))) > 1):  # turns to set apart
            lines.append(format_turns(c["messages"]))
            if _has_call_without_text(c["messages"]):  # the completion as decoded is the only record of its text
                lines.append(f"       raw   | {_one_line(c.get('text', ''), 10 * width)}")
    if with_tools:
        lines.append("  (completion: the model's text; [tool: ...] what the tool wrote back. len: the model's tokens)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="minigrpo show", description="A step's groups of completions, as tables.")
    p.add_argument("run", help="a run directory (with completions.jsonl)")
    p.add_argument("--step", type=int, default=None, help="which step (default: the last one logged)")
    p.add_argument("--width", type=int, default=100, help="cut prompts and completions to this many characters")
    p.add_argument("--turns", action="store_true",
                   help="with tools: every completion in full, one line per turn, the model's apart from the tool's")
    args = p.parse_args(argv)
    records = read_completions(args.run)
    if not records:
        print(f"{args.run}/completions.jsonl is empty")
        return 1
    steps = sorted({r["step"] for r in records})
    step = steps[-1] if args.step is None else args.step
    chosen = [r for r in records if r["step"] == step]
    if not chosen:
        raise UsageError(f"--step {step}: not logged (steps {steps[0]}..{steps[-1]})")
    print("\n\n".join(format_group(r, args.width, show_turns=args.turns) for r in chosen))
    return 0
