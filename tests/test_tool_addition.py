"""The tool_addition world: its chat template keeps prefixes (the rollout's ids equal the whole conversation's), its
rows are well formed and train/test disjoint, its grader reads the final turn only, and the shipped model and
tokenizer are what the task says (digits one token each, ``<tool_call>`` one token, tool text never special)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minigrpo.tasks.base import check_row
from minigrpo.tasks.tool_addition import CHAT_TEMPLATE, ToolAdditionTask, add, tool_call_text
from minigrpo.tools import prompt_ids_with_tools, tool_schemas, tool_suffix_ids

TASK = ToolAdditionTask()


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(TASK.model_dir)


def row(a: int, b: int) -> dict:
    return TASK.prepare_row({"a": a, "b": b, "answer": str(a + b)})


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


# ---- the chat template ------------------------------------------------------------------------------
def test_the_tool_schema_comes_from_the_function_and_renders_as_one_line(tokenizer):
    (schema,) = tool_schemas(TASK.tools)
    assert schema["function"]["name"] == "add"
    assert schema["function"]["parameters"]["properties"] == {
        "a": {"type": "integer", "description": "The first number."},
        "b": {"type": "integer", "description": "The second number."}}
    text = tokenizer.apply_chat_template(row(12345, 678901)["prompt"], tools=[schema], tokenize=False,
                                         add_generation_prompt=True)
    assert text == ("<|im_start|>system\nAdd the two numbers.\nTools: add(a, b)<|im_end|>\n"
                    "<|im_start|>user\n12345+678901<|im_end|>\n<|im_start|>assistant\n")
    assert tokenizer.chat_template == CHAT_TEMPLATE


@pytest.mark.parametrize("a, b", [(12345, 67890), (987654, 3210987), (9999999, 9999999)])
def test_the_rollouts_ids_equal_the_whole_conversation_rendered(tokenizer, a, b):
    """Prompt ids + the call as sampled + the tool message's suffix ids + the answer as sampled, turn by turn as the
    rollout appends them, are the ids of the whole conversation rendered at once (less its final newline)."""
    schemas, problem = tool_schemas(TASK.tools), row(a, b)
    call, tool, answer = TASK.target_completion(problem, call_tool=True)
    eos = [tokenizer.eos_token_id]
    built = (prompt_ids_with_tools(tokenizer, problem["prompt"], schemas)
             + ids(tokenizer, tool_call_text("add", {"a": a, "b": b})) + eos
             + tool_suffix_ids(tokenizer, [tool])
             + ids(tokenizer, answer["content"]) + eos)
    whole = tokenizer.apply_chat_template(problem["prompt"] + [call, tool, answer], tools=schemas, tokenize=False)
    assert whole.endswith("<|im_end|>\n")
    assert built == ids(tokenizer, whole[:-1])
    assert len(prompt_ids_with_tools(tokenizer, problem["prompt"], schemas)) <= 40
    assert len(built) - len(prompt_ids_with_tools(tokenizer, problem["prompt"], schemas)) <= TASK.max_completion_length


def test_rendering_with_the_tool_message_extends_rendering_without_it(tokenizer):
    """Text level: [prompt] with the generation prompt, then the sampled call and eos, is a prefix of
    [prompt, call, tool] with the generation prompt; likewise the no-call answer."""
    schemas, problem = tool_schemas(TASK.tools), row(4718204, 93651)
    call, tool, answer = TASK.target_completion(problem, call_tool=True)
    start = tokenizer.apply_chat_template(problem["prompt"], tools=schemas, tokenize=False, add_generation_prompt=True)
    sampled = start + tool_call_text("add", {"a": 4718204, "b": 93651}) + "<|im_end|>"
    after_tool = tokenizer.apply_chat_template(problem["prompt"] + [call, tool], tools=schemas, tokenize=False,
                                               add_generation_prompt=True)
    assert after_tool.startswith(sampled)
    assert after_tool[len(sampled):] == ("\n<|im_start|>user\n<tool_response>\n4811855\n</tool_response><|im_end|>\n"
                                         "<|im_start|>assistant\n")
    assert ids(tokenizer, after_tool)[: len(ids(tokenizer, sampled))] == ids(tokenizer, sampled)
    direct = tokenizer.apply_chat_template(problem["prompt"] + [answer], tools=schemas, tokenize=False)
    assert direct == start + "4811855<|im_end|>\n"


# ---- the shipped tokenizer and model ----------------------------------------------------------------
def test_digits_are_single_tokens_and_tool_call_tags_one_token_each(tokenizer):
    for digit in "0123456789":
        assert len(ids(tokenizer, digit)) == 1
    assert ids(tokenizer, "4811855") == [ids(tokenizer, d)[0] for d in "4811855"]
    for tag in ("<tool_call>", "</tool_call>"):
        (tag_id,) = ids(tokenizer, tag)
        assert tokenizer.decode([tag_id], skip_special_tokens=True) == tag  # added, not special
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
    assert 300 <= len(tokenizer) <= 400


def test_tool_output_with_special_token_strings_stays_text(tokenizer):
    text = "<|im_end|>\n<|im_start|>assistant\n42<|endoftext|>"
    plain = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert not set(plain) & set(tokenizer.all_special_ids)
    assert tokenizer.decode(plain) == text
    assert tokenizer.eos_token_id in ids(tokenizer, text)  # what a naive encoding would do


def test_the_shipped_model_loads_small_and_ends_turns_with_im_end():
    model = AutoModelForCausalLM.from_pretrained(TASK.model_dir)
    assert model.config.model_type == "qwen2" and model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) < 2_000_000
    assert (TASK.model_dir / "model.safetensors").stat().st_size < 4_000_000
    im_end = AutoTokenizer.from_pretrained(TASK.model_dir).eos_token_id
    assert model.generation_config.eos_token_id[0] == im_end
    report = json.loads((TASK.model_dir / "warm_start.json").read_text())
    assert 0 < report["test_greedy"]["call_rate"] < 1


# ---- rows ---------------------------------------------------------------------------------------------
def test_rows_are_well_formed_and_train_and_test_are_disjoint():
    train, test = TASK.load("train"), TASK.load("test")
    assert (len(train), len(test)) == (4000, 500)
    for r in train + test:
        assert check_row(r, TASK.required_columns) is None
        assert r["prompt"][0] == {"role": "system", "content": "Add the two numbers."}
        assert r["prompt"][1] == {"role": "user", "content": f"{r['a']}+{r['b']}"}
        assert r["answer"] == str(r["a"] + r["b"])
        assert all(5 <= len(str(n)) <= 7 for n in (r["a"], r["b"]))
    pairs = lambda rows: {(r["a"], r["b"]) for r in rows}  # noqa: E731
    assert len(pairs(train)) == 4000 and len(pairs(test)) == 500
    assert not pairs(train) & pairs(test)


def test_make_rows_is_deterministic_and_excludes():
    first = TASK.make_rows(20, seed=3)
    assert first == TASK.make_rows(20, seed=3)
    pairs = {(r["a"], r["b"]) for r in first}
    assert not pairs & {(r["a"], r["b"]) for r in TASK.make_rows(20, seed=3, exclude=pairs)}


# ---- grading ------------------------------------------------------------------------------------------
CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "add", "arguments": {"a": 4718204, "b": 93651}}}]}
TOOL = {"role": "tool", "name": "add", "content": "4811855"}
FLAT_CALL = ('<tool_call>\n{"name": "add", "arguments": {"a": 4718204, "b": 93651}}\n</tool_call>'
             "\nuser\n<tool_response>\n4811855\n</tool_response>\nassistant\n")


@pytest.mark.parametrize("completion, correct, well_formed", [
    ([{"role": "assistant", "content": "4811855"}], True, True),  # in its head
    ([CALL, TOOL, {"role": "assistant", "content": "4811855"}], True, True),  # with the tool
    ([CALL, TOOL, {"role": "assistant", "content": "4811856"}], False, True),  # copied wrong
    ([CALL, TOOL], False, False),  # the tool's answer is not the model's
    ([CALL], False, False),  # a call left unrun (the iteration limit)
    ([CALL, TOOL, {"role": "assistant", "content": "The sum is 4811855"}], False, False),
    ("4811855", True, True),  # the decoded completion, special tokens skipped
    (FLAT_CALL + "4811855", True, True),
    (FLAT_CALL.replace("\nuser", "<|im_end|>\n<|im_start|>user")  # special tokens kept
     .replace("\nassistant", "<|im_end|>\n<|im_start|>assistant") + "4811855<|im_end|>", True, True),
    (FLAT_CALL + "4811856", False, True),
    (FLAT_CALL[: FLAT_CALL.index("\nuser")], False, False),  # ended on its call
    (FLAT_CALL.split("assistant\n")[0], False, False),  # the tool's turn, and no answer after it
    (FLAT_CALL.replace('"a": 4718204', '"a": "4718204"') + "4811855", True, False),  # a string argument
    ("", False, False),
])
def test_the_grader_reads_the_final_assistant_turn(completion, correct, well_formed):
    problem = row(4718204, 93651)
    assert TASK.grade(completion, problem) is correct
    assert TASK.is_well_formed(completion) is well_formed
    assert TASK.correctness_reward([problem["prompt"]], [completion], answer=[problem["answer"]]) == [float(correct)]
    assert TASK.format_reward([problem["prompt"]], [completion]) == [float(well_formed)]


def test_the_tool_adds():
    assert add(4718204, 93651) == 4811855
    assert TASK.tools == [add]
