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
``tool  |``; a call the parser could not read (bad JSON, no closing tag) keeps no text in the messages, so a completion
with one also gets a ``raw   |`` line, the whole completion as decoded (special tokens dropped):

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


# Control characters a model (or a tool) wrote are shown escaped: "\n" as \n, an ESC as \x1b, so that no completion
# can move the terminal's cursor or recolour it.
_ESCAPED = {c: f"\\x{c:02x}" for c in [*range(32), 127]} | {ord("\n"): "\\n", ord("\t"): "\\t", ord("\r"): "\\r"}


def _one_line(text, width: int) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    text = text.translate(_ESCAPED)
    return text if len(text) <= width else text[: width - 3] + "..."


def _number(x) -> str:
    return "   n/a" if x is None else f"{x:6.3f}"


def _call_function(call: dict) -> tuple[str, dict]:
    function = call.get("function", call)  # TRL's {"type": "function", "function": {...}}, or the bare function
    return function.get("name") or "", function.get("arguments") or {}


def turns(messages: list[dict]) -> list[tuple[str, str]]:
    """A completion's messages (TRL's format) as (who, text) in order: who is "model" for what the policy wrote
    (its content, then each call as the chat template writes it) and "tool" for each tool's answer."""
    out = []
    for message in messages:
        if message.get("role") == "tool":
            out.append(("tool", str(message.get("content", ""))))
            continue
        text = message.get("content") or ""
        if not isinstance(text, str):  # content as a list of parts
            text = "".join(part.get("text", "") for part in text if isinstance(part, dict))
        for call in message.get("tool_calls") or []:
            name, arguments = _call_function(call)
            block = (json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) if name
                     else "? (malformed)")
            text += ("\n" if text else "") + f"<tool_call>{block}</tool_call>"
        out.append(("model", text))
    return out


def _compact(messages: list[dict]) -> str:
    """One line: the model's text as it is (a call as ``call name(a=1, b=2)``), each tool answer as
    ``[tool: ...]``, turns two spaces apart."""
    parts = []
    for message in messages:
        if message.get("role") == "tool":
            parts.append(f"[tool: {message.get('content', '')}]")
            continue
        if message.get("content"):
            parts.append(message["content"] if isinstance(message["content"], str) else json.dumps(message["content"]))
        for call in message.get("tool_calls") or []:
            name, arguments = _call_function(call)
            args = ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in arguments.items())
            parts.append(f"call {name}({args})" if name else "call ? (malformed)")
    return "  ".join(parts)


def _has_malformed_call(messages: list[dict]) -> bool:
    return any(not _call_function(call)[0] for m in messages for call in m.get("tool_calls") or [])


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
            if _has_malformed_call(c["messages"]):  # its text is not in the messages: show the completion as decoded
                lines.append(f"       raw   | {_one_line(c['text'], 10 * width)}")
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
