"""Countdown's checker, case by case: right, wrong, numbers reused or missing, division by zero, and completions
written to break it (code, huge powers, deep nesting). Nothing is ever evaluated as Python; nothing raises."""

import dataclasses
import json
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minigrpo.tasks import get_task
from minigrpo.tasks.base import DATA_DIR
from minigrpo.tasks.countdown import countdown_prompt, evaluate_expression, problem_key

COUNTDOWN = get_task("countdown")
ROW = {"nums": [44, 19, 35], "target": 98}


def answer(expression: str) -> str:
    return f"<think>\nlet me try\n</think>\n<answer>{expression}</answer>"


@pytest.mark.parametrize("expression, right", [
    ("44 + 19 + 35", True),
    ("(35 + 19) + 44", True),  # any order, any bracketing
    ("44 + 19 + 35 ", True),
    ("44 + 19 - 35", False),  # 28: wrong value
    ("44 + 19 + 35 + 0", False),  # 0 is not one of the numbers
    ("44 + 44 + 10", False),  # 44 reused, 19 and 35 missing
    ("44 + 54", False),  # 98, but 19 and 35 missing (every number exactly once)
    ("44 * 2 + 10", False),
    ("98", False),
    ("", False),
])
def test_the_checker_by_hand(expression, right):
    assert COUNTDOWN.grade(answer(expression), ROW) is right


def test_exact_fractions_on_the_way_count():
    # 7 / 3 * 3 = 7 exactly (in floating point 7/3*3 is 7.000000000000001)
    assert COUNTDOWN.grade(answer("7 / 3 * 3"), {"nums": [7, 3, 3], "target": 7})
    assert evaluate_expression("1 / 3 + 1 / 3", [1, 3, 1, 3]) == Fraction(2, 3)
    assert evaluate_expression("-(3 - 5) * 4", [3, 5, 4]) == 8  # unary minus allowed


def test_division_by_zero_is_wrong_not_an_error():
    assert COUNTDOWN.grade(answer("5 / (3 - 3)"), {"nums": [5, 3, 3], "target": 5}) is False
    assert evaluate_expression("5 / (3 - 3)", [5, 3, 3]) is None


@pytest.mark.parametrize("expression", [
    "__import__('os').system('echo pwned')",
    "().__class__.__bases__[0].__subclasses__()",
    "(lambda: 98)()",
    "44 ** 19 ** 35",  # a power: not an allowed operator, refused before anything is computed
    "9 ** 9 ** 9",
    "2 ** 99999",
    "44 // 19 + 35",  # floor division is not one of the four
    "44 % 19 + 35",
    "[44, 19, 35]",
    "f'{44 + 19 + 35}'",
    "'98'",
    "44.0 + 19 + 35",  # a float literal is not one of the numbers
    "True + 19 + 35",
    "x + 19 + 35",
    "44 + 19 + 35; import os",
    "[n for n in (44, 19, 35)]",  # a comprehension
    "sum([44, 19, 35])",
    "0x2C + 19 + 35",  # 44 in hex: 98, but only plain decimal digits pass the alphabet
    "4_4 + 19 + 35",
    "\u0664\u0664 + 19 + 35",  # Arabic-Indic digits 44
    "44 +",
    "(" * 10_000 + "44" + ")" * 10_000,  # deep nesting: refused before ast.parse recurses
    "+".join(["1"] * 150),  # too long: refused before parsing
    "9" * 5000,
])
def test_hostile_answers_are_wrong_and_nothing_runs(expression, capfd):
    assert COUNTDOWN.grade(answer(expression), ROW) is False
    assert "pwned" not in capfd.readouterr().out


def test_unary_minus_is_bounded_by_the_length_limit():
    assert evaluate_expression("-" * 180 + "44 + 19 + 35", [44, 19, 35]) == 98  # 180 minus signs cancel
    assert evaluate_expression("-" * 181 + "44 + 19 + 35", [44, 19, 35]) == -44 + 19 + 35
    assert evaluate_expression("-" * 189 + "44 + 19 + 35", [44, 19, 35]) is None  # 201 characters: refused


def test_the_last_answer_tag_is_the_answer_and_the_chat_form_is_read():
    two = "<answer>44 - 19</answer> wait, <answer>44 + 19 + 35</answer>"
    assert COUNTDOWN.grade(two, ROW) and not COUNTDOWN.grade("<answer>44 + 19 + 35", ROW)
    assert not COUNTDOWN.grade("<think>44 + 19 + 35</think> 44 + 19 + 35", ROW)  # no answer tag: wrong
    assert COUNTDOWN.extract_answer(two) == "44 + 19 + 35" and COUNTDOWN.extract_answer("98") is None
    assert COUNTDOWN.grade([{"role": "assistant", "content": answer("44 + 19 + 35")}], ROW)
    assert COUNTDOWN.correctness_reward(None, [answer("44 + 19 + 35"), answer("44 - 19 - 35")],
                                        nums=[ROW["nums"]] * 2, target=[98, 98], answer=["x", "x"]) == [1.0, 0.0]
    assert COUNTDOWN.is_well_formed(answer("1")) and not COUNTDOWN.is_well_formed("<answer>1</answer>")
    assert COUNTDOWN.is_well_formed("<think> x </think>  \n <answer> 1 </answer>")  # whitespace between is fine


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.lists(st.integers(1, 99), min_size=3, max_size=4))
def test_grading_any_text_never_raises(text, nums):
    row = {"nums": nums, "target": 24}
    assert COUNTDOWN.grade(text, row) in (True, False)
    assert COUNTDOWN.grade(f"<answer>{text}</answer>", row) in (True, False)


@settings(max_examples=200, deadline=None)
@given(st.recursive(st.sampled_from(["3", "5", "7", "(", ")", "-"]),
                    lambda inner: st.tuples(inner, st.sampled_from(" +-*/()"), inner).map("".join), max_leaves=12))
def test_expressions_of_the_right_alphabet_never_raise(expression):
    value = evaluate_expression(expression, [3, 5, 7])
    assert value is None or isinstance(value, Fraction)


def test_generated_problems_are_solvable_distinct_and_deterministic():
    rows = COUNTDOWN.make_rows(300, seed=3)
    assert rows == COUNTDOWN.make_rows(300, seed=3)
    assert len({problem_key(r) for r in rows}) == 300
    for row in rows:
        assert 3 <= len(row["nums"]) <= 4 and all(1 <= n <= 99 for n in row["nums"]) and 1 <= row["target"] <= 999
        assert COUNTDOWN.grade(answer(row["answer"]), row)
        assert COUNTDOWN.grade(COUNTDOWN.target_completion(row), row)  # its own solution uses every number once
        assert row["prompt"] == countdown_prompt(row["nums"], row["target"])


def test_the_shipped_splits_load_solvable_and_disjoint():
    train, test = COUNTDOWN.load("train"), COUNTDOWN.load("test")
    assert len(train) == 10_000 and len(test) == 500
    assert not {problem_key(r) for r in train} & {problem_key(r) for r in test}
    assert all(COUNTDOWN.grade(COUNTDOWN.target_completion(r), r) for r in test)
    first = json.loads((DATA_DIR / "tasks" / "countdown" / "test.jsonl").read_text().splitlines()[0])
    assert "prompt" not in first and test[0]["prompt"][1]["content"].startswith(f"Using the numbers {first['nums']}")


def test_the_shipped_splits_are_what_the_script_writes():
    # scripts/make_countdown.py: test = seed 1, train = seed 0 minus the test problems; make_rows is sequential,
    # so the first rows of a long run are a short run
    test = COUNTDOWN.make_rows(500, seed=1)
    assert COUNTDOWN.load("test") == test
    train = COUNTDOWN.make_rows(200, seed=0, exclude={problem_key(r) for r in test})
    assert COUNTDOWN.load("train")[:200] == train


def test_a_missing_split_names_the_script_that_writes_it():
    with pytest.raises(FileNotFoundError, match="make_countdown.py"):
        dataclasses.replace(COUNTDOWN, name="countdown_not_built").load("train")
