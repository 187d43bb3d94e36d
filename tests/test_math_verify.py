"""math-verify as a reward and a grader, against minigrpo's numeric grader on a table of answer forms.

The table is the lesson: where the two agree (plain numbers, "$72", "1,234", fractions written 3/4) and where
only math-verify reads the answer (LaTeX: \\frac, \\sqrt, percentages, \\boxed expressions).
"""

from dataclasses import replace

import pytest

pytest.importorskip("math_verify")

from minigrpo.sandbox.isolation import take_failed_count  # noqa: E402
from minigrpo.tasks import get_task  # noqa: E402
from minigrpo.tasks.answers import final_answer, number_value, same_answer  # noqa: E402
from minigrpo.rewards import math_verify_reward  # noqa: E402

# completion, reference, numeric grader, math-verify
TABLE = [
    ("<answer>72</answer>", "72", True, True),
    ("<answer> 72.0 </answer>", "72", True, True),
    ("<answer>$72</answer>", "72", True, True),
    ("<answer>1,234</answer>", "1234", True, True),
    ("<answer>72 apples</answer>", "72", True, True),
    ("<answer>x = 5</answer>", "5", True, True),
    ("<answer>71</answer>", "72", False, False),
    ("She sold 48 + 24 = 72 clips.", "72", True, True),
    ("The answer is 3/4.", "0.75", True, True),  # a fraction outside a tag: 3/4, not 4
    ("<answer>6/8</answer>", "3/4", True, True),
    ("<answer>Paris</answer>", "paris", True, True),
    # only math-verify reads LaTeX:
    ("<answer>3/4</answer>", "\\frac{3}{4}", False, True),
    ("<answer>\\frac{3}{4}</answer>", "0.75", False, True),
    ("so \\boxed{\\frac{3}{4}}", "3/4", False, True),
    ("<answer>2\\sqrt{2}</answer>", "\\sqrt{8}", False, True),
    ("<answer>50%</answer>", "0.5", False, True),
    ("<answer>\\dfrac{1}{2}</answer>", "1/2", False, True),
]


def test_the_two_graders_on_a_table_of_answer_forms():
    completions, references = [c for c, *_ in TABLE], [r for _, r, *_ in TABLE]
    numeric = [same_answer(final_answer(c), r) for c, r in zip(completions, references)]
    assert numeric == [n for *_, n, _ in TABLE]
    assert math_verify_reward(None, completions, answer=references) == [float(m) for *_, m in TABLE]


def test_the_answer_task_grades_with_either():
    numeric, latex = get_task("answer"), replace(get_task("answer"), grader="math_verify")
    assert numeric.grader == "numeric"
    assert numeric.grade("<answer>\\frac{3}{4}</answer>", {"answer": "0.75"}) is False
    assert latex.grade("<answer>\\frac{3}{4}</answer>", {"answer": "0.75"}) is True
    assert latex.grade("<answer>0.7</answer>", {"answer": "0.75"}) is False
    with pytest.raises(ValueError, match="grader"):
        replace(numeric, grader="sympy")


def test_fractions_are_numbers_in_the_numeric_grader():
    assert number_value("3/4") == number_value("0.75") == number_value("6 / 8")
    assert number_value("7/0") is None and number_value("3/4/5") is None
    assert final_answer("48/2 = 24, so 24") == "24" and final_answer("The answer is 3/4.") == "3/4"


def test_hostile_answers_score_zero_without_a_hang():
    take_failed_count()
    hostile = ["<answer>__import__('pathlib').Path('pwned.txt').write_text('x')</answer>",
               "<answer>9^{9^{9^{9}}}</answer>", "<answer>" + "(" * 100_000 + "1" + ")" * 100_000 + "</answer>",
               "<answer>" + "7" * 1_000_000 + "</answer>", ""]
    assert math_verify_reward(None, hostile, answer=["3"] * len(hostile)) == [0.0] * len(hostile)
    take_failed_count()


def test_math_verify_is_a_reward_name(tmp_path):
    from minigrpo.rewards import build_reward_funcs
    from minigrpo.tasks import get_task

    (func,) = build_reward_funcs(["math_verify"], get_task("answer"), 64)
    rewards = func(["q", "q"], ["<answer>\\frac{3}{4}</answer>", "<answer>0.7</answer>"], answer=["0.75", "0.75"])
    assert rewards == [1.0, 0.0]


def test_answer_grader_is_a_config_field_for_the_final_answer_tasks():
    from minigrpo.config import Config, ConfigError

    assert get_task("gsm8k", answer_grader="math_verify").grader == "math_verify"
    assert get_task("answer").grader == "numeric"  # the registry's task is left as it was
    with pytest.raises(ConfigError, match="answer_grader: 'math_verify' grades the answer and gsm8k tasks"):
        get_task("countdown", answer_grader="math_verify")
    with pytest.raises(ConfigError, match="answer_grader"):
        Config(answer_grader="sympy")


def test_a_math500_style_evaluation_offline(tmp_path, chat_model_dir, capsys):
    """The README's MATH-500 / AIME recipe on a local folder in the hub's test-split layout, with the stand-in:
    `minigrpo eval --task answer --dataset DIR --answer-grader math_verify` reads LaTeX references and grades."""
    import json

    from minigrpo.cli import main
    from minigrpo.tasks.answers import R1_SYSTEM_PROMPT

    problems = [("Compute $\\frac{6}{8}$ in lowest terms.", "\\frac{3}{4}"), ("What is $\\sqrt{8}$?", "2\\sqrt{2}")]
    (tmp_path / "math").mkdir()
    with open(tmp_path / "math" / "test.jsonl", "w") as f:
        for problem, answer in problems:
            prompt = [{"role": "system", "content": R1_SYSTEM_PROMPT}, {"role": "user", "content": problem}]
            f.write(json.dumps({"prompt": prompt, "answer": answer}) + "\n")
    assert main(["eval", "--task", "answer", "--dataset", str(tmp_path / "math"), "--model", str(chat_model_dir),
                 "--answer-grader", "math_verify", "--num-samples", "2", "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    result = json.loads(printed[printed.index("{"):])
    assert result["num_problems"] == 2 and 0 <= result["accuracy_greedy"] <= 1  # random weights: graded, not right
