"""math-verify as a grader: LaTeX answers (``\\frac{3}{4}``, ``\\boxed{2\\sqrt{2}}``, ``x \\in [0, 1]``) that a numeric
checker cannot read (Hugging Face's math-verify 0.9, as open-r1 and TRL's examples grade math;
``pip install 'minigrpo[math]'``).

    math_verify_scores(predicted, references)     1.0 / 0.0 per pair of texts
    rewards.math_verify_reward                    the reward function (TRL's signature) that calls it
    AnswerTask(grader="math_verify")              a task graded by it (tasks/answers.py)

What is compared: the completion's last ``<answer>`` tag's content when it has one (math-verify finds nothing in
``<answer>72</answer>`` itself: a number glued to a tag is not extracted), else the whole completion, where
math-verify looks for ``\\boxed{}``, ``$...$`` and the last number; the reference is read the same way.

It runs in the isolated worker (isolation.py), not in the trainer: math-verify hands matched text to sympy's
``parse_expr`` (which evaluates Python; its extraction patterns did not let code through in our probes, but
nothing promises that) and sympy may take unbounded time and memory on ``9^{9^{9^{9}}}``, and its own timeout uses
SIGALRM, which works only in a main thread. A call that fails scores 0.0 and counts in ``rewards/verifier_failed``.
"""

from ..errors import ConfigError
from .isolation import call_isolated

__all__ = ["math_verify_scores"]

INSTALL_HINT = "math-verify is not installed: pip install 'minigrpo[math]'"
SCORER = "minigrpo.sandbox.verifiers:math_verify_score"
MAX_ANSWER_CHARS = 10_000  # a longer answer is not compared (0.0); a final answer is a few hundred characters
VERIFIER_TIMEOUT = 10.0  # seconds per call; math-verify's own parse and verify timeouts (2 s each) come first


def _require_math_verify() -> None:
    try:
        import math_verify  # noqa: F401 - the worker imports it; here we only check that it is there
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None


def math_verify_scores(predicted: list[str | None], references: list) -> list[float]:
    """1.0 where math-verify finds ``predicted[i]`` equal to ``references[i]``, else 0.0 (None, too long, or a
    failed call: 0.0)."""
    _require_math_verify()
    todo = [i for i, p in enumerate(predicted) if p is not None and p.strip() and len(p) <= MAX_ANSWER_CHARS]
    results = call_isolated(SCORER, [(predicted[i], str(references[i])) for i in todo], timeout=VERIFIER_TIMEOUT)
    scores = [0.0] * len(predicted)
    for i, result in zip(todo, results):
        scores[i] = 1.0 if result.ok and result.value == 1.0 else 0.0
    return scores
