"""McNemar's paired test by hand, and evaluate's per-problem results (what the test is fed)."""

import pytest

from minigrpo.evaluate import evaluate, mcnemar
from minigrpo.loading.models import load_model_and_tokenizer
from minigrpo.tasks import get_task


def test_mcnemar_hand_computed():
    #            problem: 0  1  2  3  4  5  6  7
    a = [1, 1, 1, 1, 0, 0, 1, 0]  # A right on 5
    b = [1, 0, 0, 0, 1, 0, 1, 0]  # B right on 3
    result = mcnemar(a, b)
    # Discordant problems: 1, 2, 3 (A only) and 4 (B only): b = 3, c = 1, n = 4 coin flips.
    # P(at most 1 of 4 on one side) = (C(4,0) + C(4,1)) / 2^4 = 5/16; two-sided: 10/16 = 0.625.
    assert (result["only_a"], result["only_b"]) == (3, 1)
    assert result["p_value"] == pytest.approx(0.625)
    assert (result["accuracy_a"], result["accuracy_b"], result["n"]) == (5 / 8, 3 / 8, 8)


def test_mcnemar_one_sided_disagreement_and_agreement():
    # Six discordant problems, all for A: 2 * (1/2)^6 = 1/32.
    assert mcnemar([1] * 6 + [0] * 4, [0] * 6 + [0] * 4)["p_value"] == pytest.approx(1 / 32)
    # The concordant problems do not count: 100 problems both get right change nothing.
    assert mcnemar([1] * 106, [0] * 6 + [1] * 100)["p_value"] == pytest.approx(1 / 32)
    # No disagreement at all: nothing to tell them apart, p = 1; an equal split also gives 1.
    assert mcnemar([1, 0, 1], [1, 0, 1])["p_value"] == 1.0
    assert mcnemar([1, 0], [0, 1])["p_value"] == 1.0


def test_mcnemar_refuses_lists_of_different_length():
    with pytest.raises(ValueError):
        mcnemar([1, 0], [1])


def test_evaluate_per_problem_matches_its_accuracy():
    task = get_task("think_addition")
    model, tokenizer = load_model_and_tokenizer(task.model_dir)
    rows = task.load("test")[:12]
    result = evaluate(model, tokenizer, task, rows, per_problem=True)
    assert len(result["correct_greedy"]) == 12
    assert sum(result["correct_greedy"]) / 12 == result["accuracy_greedy"]
    assert "correct_greedy" not in evaluate(model, tokenizer, task, rows)  # off by default: summaries stay small
