"""`minigrpo show` with tools: the tool's text is set apart from the model's, turn by turn.

A completion of the tool_addition world as TRL's messages: the model calls add, the tool answers, the model copies
the answer. The tool's answer must appear only inside the tool's marks ([tool: ...] in the table, a "tool  |" line
with --turns), the model's text as it wrote it; a run without tools prints as before."""

import json

import pytest

from minigrpo.lab.show import format_group, main, turns
from minigrpo.tasks.tool_addition import ToolAdditionTask

TASK = ToolAdditionTask()
ROW = TASK.prepare_row({"a": 523745, "b": 24060, "answer": "547805"})


def completion(messages, *, length, calls, reward=1.0, correct=True):
    text = "".join(m.get("content") or "" for m in messages)  # what the record's "text" holds does not matter here
    return {"text": text, "reward": reward, "rewards": {"correctness_reward": reward}, "advantage": 0.5,
            "length": length, "truncated": False, "correct": correct, "messages": messages, "tool_calls": calls}


def tool_record():
    called = TASK.target_completion(ROW, call_tool=True)  # call add, the tool's "547805", the answer "547805"
    wrong = [{"role": "assistant", "content": "",
              "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 523745, "b": 24060}}}]},
             {"role": "tool", "name": "add", "content": "547805"}, {"role": "assistant", "content": "547705"}]
    straight = [{"role": "assistant", "content": "561805"}]
    return {"step": 3, "group": 0, "prompt": ROW["prompt"], "answer": "547805", "completions": [
        completion(called, length=41, calls=1), completion(wrong, length=41, calls=1, reward=0.0, correct=False),
        completion(straight, length=7, calls=0, reward=0.0, correct=False)]}


def test_turns_label_the_models_text_and_the_tools():
    called = TASK.target_completion(ROW, call_tool=True)
    assert turns(called) == [
        ("model", '<tool_call>{"name": "add", "arguments": {"a": 523745, "b": 24060}}</tool_call>'),
        ("tool", "547805"),
        ("model", "547805"),
    ]
    malformed = [{"role": "assistant", "content": "let me add",
                  "tool_calls": [{"type": "function", "function": {"name": "", "arguments": {}}}]},
                 {"role": "tool", "name": "unknown", "content": "Error: the tool call is not valid JSON."}]
    assert turns(malformed) == [("model", "let me add\n<tool_call>? (malformed)</tool_call>"),
                                ("tool", "Error: the tool call is not valid JSON.")]


def test_the_table_sets_the_tools_answer_apart_and_counts_calls():
    lines = format_group(tool_record()).splitlines()
    assert lines[1].split() == ["#", "reward", "correctness_reward", "advantage", "len", "calls", "cut", "ok",
                                "completion"]
    assert lines[2].endswith("call add(a=523745, b=24060)  [tool: 547805]  547805")
    assert lines[3].endswith("call add(a=523745, b=24060)  [tool: 547805]  547705")
    assert lines[4].endswith("561805") and "[tool:" not in lines[4]
    assert [line.split()[5] for line in lines[2:5]] == ["1", "1", "0"]  # the calls column
    assert "what the tool wrote back" in lines[-1]


def test_turns_print_each_turn_of_a_completion_that_called_a_tool():
    lines = format_group(tool_record(), show_turns=True).splitlines()
    assert [line.strip() for line in lines[3:6]] == [
        'model | <tool_call>{"name": "add", "arguments": {"a": 523745, "b": 24060}}</tool_call>',
        "tool  | 547805",
        "model | 547805",
    ]
    assert lines[8].strip() == "tool  | 547805" and lines[9].strip() == "model | 547705"
    assert lines[10].lstrip().startswith("2 ") and lines[11].startswith("  (completion:")  # one turn: nothing below


def test_a_malformed_call_is_shown_as_the_model_wrote_it():
    """The tool loop's entry for a call it could not read (tools/calls.py) keeps the block and the error: the table
    marks it malformed with the block, --turns prints the block as written, and no raw line is needed."""
    block = '<tool_call>\n{"name": "add", "arguments": {"a": 523745,, "b": 24060}}\n</tool_call>'
    error = "Error: the tool call is not valid JSON (Expecting property name enclosed in double quotes at character 42)."
    messages = [{"role": "assistant", "content": "let me add", "tool_calls": [
                    {"type": "function", "function": {"name": "", "arguments": {}}, "error": error, "text": block}]},
                {"role": "tool", "name": "unknown", "content": error}, {"role": "assistant", "content": "547805"}]
    assert turns(messages) == [("model", "let me add\n" + block), ("tool", error), ("model", "547805")]
    record = {**tool_record(), "completions": [completion(messages, length=30, calls=1, reward=0.0, correct=False)]}
    lines = format_group(record, width=300, show_turns=True).splitlines()
    assert lines[2].endswith('let me add  call ? (malformed: <tool_call>\\n{"name": "add", "arguments": '
                             '{"a": 523745,, "b": 24060}}\\n</tool_call>)  [tool: Error: the tool call is not valid '
                             "JSON (Expecting property name enclosed in double quotes at character 42).]  547805")
    assert [line.strip() for line in lines[3:6]] == [
        'model | let me add\\n<tool_call>\\n{"name": "add", "arguments": {"a": 523745,, "b": 24060}}\\n</tool_call>',
        f"tool  | {error}", "model | 547805"]
    assert lines[6].startswith("  (completion:")  # no raw line: the messages hold the text


def test_hostile_entries_never_crash_the_table_and_reach_the_terminal_escaped():
    """Records are JSON from anywhere: arguments that are not an object (OpenAI's JSON string, a list), entries that
    are not objects, a name that is a number, tool_calls that is not a list, a message that is a string, and text with
    ESC, C1 (0x9b opens an escape sequence on some terminals) and bidirectional-override characters."""
    evil = "\x1b[2J\x9b31m\u202eevil"
    messages = [
        {"role": "assistant", "content": evil, "tool_calls": [
            {"type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}},
            {"type": "function", "function": {"name": "add", "arguments": [1, 2]}},
            {"type": "function", "function": {"name": evil, "arguments": {evil: evil}}},
            {"type": "function", "function": {"name": 7, "arguments": None}},
            {"type": "function", "function": "add"},
            "add(1, 2)",
            {"type": "function", "function": {"name": "", "arguments": {}}, "error": evil, "text": evil}]},
        {"role": "assistant", "content": "", "tool_calls": {"name": "add"}},
        {"role": "tool", "name": "add", "content": ["part", {"type": "text", "text": evil}]},
        "a message that is a string",
    ]
    hostile = {**completion([], length=9, calls=7, reward=0.0, correct=False), "messages": messages, "text": evil}
    table = format_group({**tool_record(), "completions": [hostile]}, width=2000, show_turns=True)
    assert "\x1b" not in table and "\x9b" not in table and "\u202e" not in table
    row = table.splitlines()[2]
    assert 'call add({"a": 1, "b": 2})  call add([1, 2])' in row  # OpenAI's JSON text as it is; a list as JSON
    assert "call \\x1b[2J\\x9b31m\\u202eevil(\\x1b[2J\\x9b31m\\u202eevil=" in row and "call 7()" in row
    assert row.count("call ? (malformed") == 3  # the function that is a string, the entry that is one, the loop's
    assert row.count("call add()") == 1  # tool_calls as one object: read as that one (bare) call
    assert "a message that is a string" in row and "raw   |" in table  # entries without text: the decoded completion


def test_a_record_whose_malformed_call_has_no_text_gets_the_completion_as_decoded():
    # Messages not written by the tool loop may keep no text of a call; the record's text (the completion as decoded)
    # says what it was.
    raw = '<tool_call>\n{"name": "add", "arguments": {"a": 52\x1b[2J'
    messages = [{"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": {"name": "", "arguments": {}}}]}]
    record = {**tool_record(), "completions": [{**completion(messages, length=20, calls=1, reward=0.0, correct=False),
                                                "text": raw, "truncated": True}]}
    lines = format_group(record, show_turns=True).splitlines()
    assert lines[2].endswith("call ? (malformed)")
    assert lines[3].strip() == "model | <tool_call>? (malformed)</tool_call>"
    assert lines[4].strip() == 'raw   | <tool_call>\\n{"name": "add", "arguments": {"a": 52\\x1b[2J'
    assert "\x1b" not in format_group(record, show_turns=True)  # an escape sequence never reaches the terminal


def test_a_run_without_tools_prints_as_before():
    record = {"step": 1, "group": 0, "prompt": "769+175=", "answer": "944", "completions": [
        {"text": "<think>5+9=14</think>944", "reward": 1.0, "rewards": {"correctness_reward": 1.0},
         "advantage": 0.935, "length": 29, "truncated": False, "correct": True}]}
    table = format_group(record, show_turns=True)
    assert table.splitlines()[1].split() == ["#", "reward", "correctness_reward", "advantage", "len", "cut", "ok",
                                             "completion"]
    assert table.splitlines()[2].endswith("<think>5+9=14</think>944") and len(table.splitlines()) == 3


def test_the_command_shows_turns(tmp_path, capsys):
    (tmp_path / "completions.jsonl").write_text(json.dumps(tool_record()) + "\n")
    assert main([str(tmp_path), "--turns"]) == 0
    out = capsys.readouterr().out
    assert "step 3, group 0: 523745+24060    answer 547805" in out
    assert out.count("tool  | 547805") == 2


@pytest.mark.usefixtures("one_thread")
def test_a_tool_addition_runs_completions_show_the_tool_apart(tmp_path, capsys):
    """Through train(): the shipped warm start calls add in some of its samples; completions.jsonl keeps their
    messages, and show prints each tool answer inside the tool's marks, never as the model's text."""
    from minigrpo.config import Config
    from minigrpo.trainer import train

    cfg = Config(task="tool_addition", max_steps=1, num_generations=8, generation_batch_size=16, eval_steps=0,
                 eval_limit=4, eval_num_samples=0, save_model=False, output_dir=str(tmp_path / "run"))
    train(cfg, progress=False)
    assert main([str(tmp_path / "run"), "--turns"]) == 0
    out = capsys.readouterr().out
    records = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    answers = [m["content"] for r in records for c in r["completions"] for m in c["messages"] if m["role"] == "tool"]
    assert answers, "no sample called the tool: pick another seed"
    for answer in answers:
        assert f"[tool: {answer}]" in out and f"tool  | {answer}" in out
