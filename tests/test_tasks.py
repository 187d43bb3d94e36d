"""Tasks and tokenizer: generators are deterministic, graders agree with hand cases, data splits are disjoint."""

import random

import pytest

from minigrpo.tasks import DATA_DIR, get_task
from minigrpo.tasks.think_addition import scratchpad, thinking_length
from minigrpo.loading.tokenizer import build_tokenizer

ADDITION = get_task("addition")
THINK = get_task("think_addition")


# ---- registry ---------------------------------------------------------------------------------------
def test_get_task_unknown_name_lists_known_tasks():
    with pytest.raises(ValueError, match="addition.*think_addition"):
        get_task("subtraction")


def test_model_and_data_dirs_live_under_data():
    assert ADDITION.model_dir == DATA_DIR / "models" / "addition"
    assert THINK.data_dir == DATA_DIR / "tasks" / "think_addition"


# ---- generators -------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", [ADDITION, THINK], ids=lambda t: t.name)
def test_generators_are_deterministic_and_correct(task):
    rows = task.make_rows(200, seed=7)
    assert rows == task.make_rows(200, seed=7)
    assert rows != task.make_rows(200, seed=8)
    assert len({r["prompt"] for r in rows}) == 200
    for row in rows:
        a, b = map(int, row["prompt"].rstrip("=").split("+"))
        assert row["answer"] == str(a + b)
        assert task.is_correct(task.target_completion(row, random.Random(0)), row["answer"])


def test_addition_operands_are_three_digits():
    for row in ADDITION.make_rows(300, seed=0):
        assert len(row["prompt"]) == 8


def test_think_operands_have_two_to_four_digits():
    lengths = {len(part) for row in THINK.make_rows(300, seed=0) for part in row["prompt"].rstrip("=").split("+")}
    assert lengths == {2, 3, 4}


def test_make_rows_respects_exclude():
    test = ADDITION.make_rows(50, seed=0)
    train = ADDITION.make_rows(50, seed=0, exclude={r["prompt"] for r in test})
    assert not {r["prompt"] for r in test} & {r["prompt"] for r in train}


# ---- think format -----------------------------------------------------------------------------------
def test_scratchpad_hand_cases():
    assert scratchpad(3471, 586) == "1+6=7,7+8=15,4+5+1=10,3+0+1=4"
    assert scratchpad(999, 999) == "9+9=18,9+9+1=19,9+9+1=19"
    assert scratchpad(12, 30) == "2+0=2,1+3=4"


def test_think_target_completions_long_and_short():
    row = {"prompt": "3471+586=", "answer": "4057"}
    assert THINK.target_completion(row, think=True) == "<think>1+6=7,7+8=15,4+5+1=10,3+0+1=4</think>4057"
    assert THINK.target_completion(row, think=False) == "<think></think>4057"
    rng = random.Random(0)
    kinds = [thinking_length(THINK.target_completion(row, rng)) > 0 for _ in range(200)]
    assert 70 < sum(kinds) < 130  # about half long, half short


def test_thinking_length():
    assert thinking_length("<think>1+2=3</think>3") == 5
    assert thinking_length("<think></think>3") == 0
    assert thinking_length("3") == 0


# ---- graders ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "completion, correct, well_formed",
    [
        ("933", True, True),
        (" 933 ", True, True),
        ("934", False, True),
        ("9330", False, True),  # no eos after the answer: it kept writing
        ("0933", False, True),
        ("", False, False),
        ("93+3", False, False),
        ("<think></think>933", False, False),
    ],
)
def test_addition_grader(completion, correct, well_formed):
    assert ADDITION.is_correct(completion, "933") is correct
    assert ADDITION.is_well_formed(completion) is well_formed


@pytest.mark.parametrize(
    "completion, correct, well_formed",
    [
        ("<think>1+6=7,7+8=15,4+5+1=10,3+0+1=4</think>4057", True, True),
        ("<think></think>4057", True, True),
        ("<think>garbage 1+1=3</think>4057", True, True),  # the scratchpad is not graded
        ("<think>1+6=7</think>4058", False, True),
        ("4057", False, False),  # the answer must come after </think>
        ("<think>4057", False, False),
        ("</think>4057", True, False),  # correct answer, broken format: the two rewards disagree
        ("<think></think>", False, False),
        ("<think></think>40 57", False, False),
        ("<think></think>4057<think>", False, False),
        ("<think>a</think>1</think>4057", True, False),  # the last </think> decides
        ("", False, False),
        ("+=,,==</think", False, False),
    ],
)
def test_think_grader(completion, correct, well_formed):
    assert THINK.is_correct(completion, "4057") is correct
    assert THINK.is_well_formed(completion) is well_formed


def test_rewards_use_trl_signature():
    prompts = ["1+2=", "1+2=", "5+5="]
    completions = ["<think></think>3", "<think>x</think>4", ""]
    answers = ["3", "3", "10"]
    assert THINK.correctness_reward(prompts, completions, answer=answers, extra_column=[1, 2, 3]) == [1.0, 0.0, 0.0]
    assert THINK.format_reward(prompts, completions, answer=answers) == [1.0, 1.0, 0.0]
    conversational = [[{"role": "assistant", "content": "3"}], []]
    assert ADDITION.correctness_reward(prompts[:2], conversational, answer=["3", "3"]) == [1.0, 0.0]


# ---- committed data ---------------------------------------------------------------------------------
@pytest.mark.parametrize("task", [ADDITION, THINK], ids=lambda t: t.name)
def test_committed_splits(task):
    train, test = task.load("train"), task.load("test")
    assert len(test) == 500
    assert len({r["prompt"] for r in test}) == 500
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    for row in test[:50] + train[:50]:
        a, b = map(int, row["prompt"].rstrip("=").split("+"))
        assert row["answer"] == str(a + b)


def test_load_missing_split_says_how_to_rebuild():
    with pytest.raises(FileNotFoundError, match="make_tiny_world"):
        ADDITION.load("validation")


# ---- tokenizer --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.mark.parametrize(
    "text",
    ["347+586=", "933", "<think>1+6=7,7+8=15,4+5+1=10,3+0+1=4</think>4057", "<think></think>4057", "<think>"],
)
def test_tokenizer_round_trip_has_no_spaces(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.decode(ids + [tokenizer.eos_token_id, tokenizer.pad_token_id], skip_special_tokens=True) == text


def test_tokenizer_one_token_per_character_and_tag(tokenizer):
    assert len(tokenizer) == 18
    assert len(tokenizer("<think>", add_special_tokens=False)["input_ids"]) == 1
    assert len(tokenizer("</think>", add_special_tokens=False)["input_ids"]) == 1
    assert len(tokenizer("<think>12</think>3", add_special_tokens=False)["input_ids"]) == 5


def test_tokenizer_special_tokens_and_bos(tokenizer):
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id) == (0, 1, 2)
    assert tokenizer.padding_side == "left"
    ids = tokenizer("12+3=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 6
    batch = tokenizer(["1+2=", "100+200="], padding=True)
    assert batch["input_ids"][0][:4] == [0, 0, 0, 0]  # left padding
    assert batch["attention_mask"][0] == [0] * 4 + [1] * 5


@pytest.mark.parametrize("task", [ADDITION, THINK], ids=lambda t: t.name)
def test_saved_tokenizer_loads_with_auto_tokenizer(task):
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(task.model_dir)
    text = "<think>1+6=7</think>7"
    assert loaded.decode(loaded(text)["input_ids"], skip_special_tokens=True) == text
    assert loaded.padding_side == "left"
