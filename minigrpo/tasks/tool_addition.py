"""``tool_addition``: long sums and a calculator tool; GRPO teaches the tiny model to call it.

A conversation, rendered by this world's chat template (``CHAT_TEMPLATE``) the way Qwen2.5-Instruct renders one:

    <|im_start|>system
    Add the two numbers.
    Tools: add(a, b)<|im_end|>
    <|im_start|>user
    4718204+93651<|im_end|>
    <|im_start|>assistant
    <tool_call>                                                   the model's first turn: a call ...
    {"name": "add", "arguments": {"a": 4718204, "b": 93651}}
    </tool_call><|im_end|>
    <|im_start|>user                                              ... the tool's answer (written by the tool, not
    <tool_response>                                               the model: no loss on these tokens) ...
    4811855
    </tool_response><|im_end|>
    <|im_start|>assistant
    4811855<|im_end|>                                             ... and the final answer, copied

or, without the tool, the first turn is the answer itself (``4811855<|im_end|>``): the first token the model writes,
a digit or ``<tool_call>``, is its choice. Operands have 5 to 7 digits each, drawn independently: too long for a
1.3M-parameter model to add reliably in its head, easy to copy from the tool's answer.

Rows (TRL's conversational format; the files in data/tasks/tool_addition/ store only ``a``, ``b`` and the answer,
and ``prepare_row`` writes the prompt when they load):

    {"prompt": [{"role": "system", "content": "Add the two numbers."},
                {"role": "user", "content": "4718204+93651"}],
     "a": 4718204, "b": 93651, "answer": "4811855"}

The tool is ``add``, a plain typed function with a Google-style docstring: its JSON schema comes from
``transformers.utils.get_json_schema`` (``tool_schemas`` in minigrpo.tools), and the chat template shows it as
``add(a, b)``. ``ToolAdditionTask().tools`` is the list to pass to the multi-turn rollout.

Grading (``grade``, ``correctness_reward``) reads the *final* assistant turn only: the completion as TRL's messages
(the last message must be the assistant's, without tool calls) or as the decoded text of the whole completion (the
text after the last ``</tool_response>``, the next turn's ``assistant`` header dropped). That turn must be the
answer's digits and nothing else. The tool's answer never counts: a completion that calls the tool and stops before
answering is wrong, though the right number sits in its tool message. ``format_reward`` pays for the shape (calls
whose arguments are two integers, then digits; or digits alone), right or wrong.
"""

import json
import random
import re
from dataclasses import dataclass

from ..loading.chat_templates import QWEN25_MESSAGES
from ..rewards import completion_text
from .base import Task

__all__ = ["ToolAdditionTask", "add", "CHAT_TEMPLATE", "SYSTEM_PROMPT", "final_answer_text"]

SYSTEM_PROMPT = "Add the two numbers."
TOOL_CALL_START, TOOL_CALL_END = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_END = "</tool_response>"
_SPECIAL = re.compile(r"<\|im_start\|>|<\|im_end\|>|<\|endoftext\|>")
_DIGITS = re.compile(r"[0-9]+")  # ASCII only (re's \d also matches other scripts' digits)
_CALL = re.compile(re.escape(TOOL_CALL_START) + r"\s*(.*?)\s*" + re.escape(TOOL_CALL_END), re.DOTALL)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


# Qwen2.5-Instruct's chat template (TRL's trl/chat_templates/qwen2_5.jinja; the stand-in's CHATML_TEMPLATE) with one
# change: with tools, the system message gets one short line, "Tools: add(a, b)" (each tool's name and parameter
# names, read from its JSON schema), where Qwen2.5 writes a "# Tools" section of ~90 words of instructions and the
# schemas as JSON, about 700 bytes: with a byte-level vocabulary of ~330 tokens that alone would be ~300 tokens of
# prompt, ten times the rest of the conversation, for a model that learns the calling format from its warm start
# anyway. Everything the rollout and the loss depend on is Qwen2.5's, character for character: the ChatML turns,
# the default system message when none is given, an assistant's tool calls as
# "\n<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>" blocks after its content, consecutive tool
# messages as <tool_response> blocks inside one user turn, and the generation prompt.
CHAT_TEMPLATE = r"""{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] }}
{%- else %}
    {{- '<|im_start|>system\nYou are a helpful assistant.' }}
{%- endif %}
{%- if tools %}
    {{- '\nTools: ' }}
    {%- for tool in tools %}
        {%- set fn = tool.function if tool.function is defined else tool %}
        {{- fn.name + '(' + (fn.parameters.properties | list | join(', ')) + ')' }}
        {%- if not loop.last %}{{- ', ' }}{%- endif %}
    {%- endfor %}
{%- endif %}
{{- '<|im_end|>\n' }}
""" + QWEN25_MESSAGES + r"""{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""


def tool_call_text(name: str, arguments: dict) -> str:
    """A call as the model writes it (and the template renders it): ``<tool_call>\\n{json}\\n</tool_call>``."""
    return f'{TOOL_CALL_START}\n{{"name": "{name}", "arguments": {json.dumps(arguments)}}}\n{TOOL_CALL_END}'


def final_answer_text(completion) -> str | None:
    """The text of a completion's final assistant turn, or None when it has none (it ended on a tool call).

    completion: TRL's messages (the last must be the assistant's, without ``tool_calls``), or the decoded text of the
    whole completion, with or without special tokens: the text after the last ``</tool_response>``, less the
    ``assistant`` header of the turn that follows it.
    """
    if isinstance(completion, list):
        last = completion[-1] if completion else {}
        if not isinstance(last, dict) or last.get("role") != "assistant" or last.get("tool_calls"):
            return None
        text = completion_text(completion)
    else:
        text = completion or ""
        if TOOL_RESPONSE_END in text:
            text = _SPECIAL.sub("", text.rsplit(TOOL_RESPONSE_END, 1)[1]).lstrip("\n")
            if not text.startswith("assistant\n"):
                return None  # the tool's turn was not followed by an assistant turn
            text = text[len("assistant\n"):]
        text = _SPECIAL.sub("", text)
    return None if TOOL_CALL_START in text else text


def tool_calls_well_formed(text: str) -> bool:
    """Whether every <tool_call> block in ``text`` is ``{"name": "add", "arguments": {"a": int, "b": int}}``."""
    blocks = _CALL.findall(text)
    if len(blocks) != text.count(TOOL_CALL_START):
        return False
    for block in blocks:
        try:
            call = json.loads(block)
        except json.JSONDecodeError:
            return False
        arguments = call.get("arguments") if isinstance(call, dict) else None
        if not (call.get("name") == "add" and isinstance(arguments, dict) and set(arguments) == {"a", "b"}
                and all(type(v) is int for v in arguments.values())):
            return False
    return True


@dataclass(frozen=True)
class ToolAdditionTask(Task):
    name: str = "tool_addition"
    # The longest correct completion, 71 tokens: a call with two 7-digit numbers (37 with eos), the tool's turn (25),
    # an 8-digit answer and eos (9). The prompt is 37-40 tokens.
    max_completion_length: int = 72
    max_tool_calling_iterations: int = 1  # one call is all a sum needs; a second call is left unrun (and wrong)
    min_digits: int = 5
    max_digits: int = 7
    required_columns: tuple[str, ...] = ("answer",)
    data_script: str = "scripts/make_tool_world.py"

    @property
    def tools(self) -> list:
        """The functions a rollout may run: ``[add]`` (TRL's ``tools=``)."""
        return [add]

    # ---- problem generation ---------------------------------------------------------------------
    def make_problem(self, rng: random.Random) -> dict:
        a, b = (rng.randint(10 ** (d - 1), 10**d - 1)
                for d in (rng.randint(self.min_digits, self.max_digits) for _ in range(2)))
        return self.prepare_row({"a": a, "b": b, "answer": str(a + b)})

    def prepare_row(self, row: dict) -> dict:
        """{"a", "b", "answer"} -> the same row with its chat prompt first. A row with a "prompt" is kept as it is."""
        if "prompt" in row or "a" not in row or "b" not in row:
            return row
        prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": f"{row['a']}+{row['b']}"}]
        return {"prompt": prompt, **row}

    def make_rows(self, n: int, seed: int, exclude: set = frozenset()) -> list[dict]:
        """``n`` distinct problems, deterministic in ``seed``; ``exclude`` holds (a, b) pairs never to draw."""
        rng, rows, seen = random.Random(seed), [], set(exclude)
        while len(rows) < n:
            row = self.make_problem(rng)
            if (row["a"], row["b"]) not in seen:
                seen.add((row["a"], row["b"]))
                rows.append(row)
        return rows

    def target_completion(self, row: dict, rng: random.Random | None = None, call_tool: bool = False) -> list[dict]:
        """A correct completion as TRL's messages: the answer straight away, or (``call_tool``) a call to ``add``,
        the tool's answer and the answer copied from it."""
        a, b = (int(s) for s in row["prompt"][-1]["content"].split("+"))
        answer = {"role": "assistant", "content": str(a + b)}
        if not call_tool:
            return [answer]
        call = {"type": "function", "function": {"name": "add", "arguments": {"a": a, "b": b}}}
        return [{"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "add", "content": str(add(a, b))}, answer]

    # ---- grading --------------------------------------------------------------------------------
    def extract_answer(self, completion) -> str | None:
        text = final_answer_text(completion)
        text = text.strip() if text is not None else None
        return text if text and _DIGITS.fullmatch(text) else None

    def is_correct(self, completion, answer: str) -> bool:
        predicted = self.extract_answer(completion)
        return predicted is not None and predicted == str(answer).strip()

    def grade(self, completion, row: dict) -> bool:
        return self.is_correct(completion, row["answer"])

    def is_well_formed(self, completion) -> bool:
        """Digits as the final turn, and every tool call before it well formed (``add`` with two integers)."""
        if self.extract_answer(completion) is None:
            return False
        if isinstance(completion, list):
            return all(_message_calls_ok(m) for m in completion if m.get("role") == "assistant")
        return tool_calls_well_formed(completion)

    def format_reward(self, prompts, completions, **row) -> list[float]:
        return [float(self.is_well_formed(c)) for c in completions]


def _message_calls_ok(message: dict) -> bool:
    calls = message.get("tool_calls") or []
    return all(tool_calls_well_formed(tool_call_text(c.get("function", c).get("name"),
                                                     c.get("function", c).get("arguments")))
               for c in calls)

