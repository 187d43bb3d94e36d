"""Third-party verifiers, as the isolated worker calls them (isolation.py). Never call these in the trainer.

Each function here takes a completion's answer text and hands it to a library minigrpo did not write:
reasoning-gym's own ``score_answer`` (some of which evaluate the text as Python, see isolation.py) and
math-verify's ``parse``/``verify`` (sympy underneath: a hostile expression can take unbounded time and memory).
They run in the worker, which is why this module imports nothing of minigrpo's (no torch): a worker starts in
about a second and restarts as fast after a call it had to kill.

    call_isolated("minigrpo.sandbox.verifiers:reasoning_gym_score", [(answer, entry, options), ...])
    call_isolated("minigrpo.sandbox.verifiers:math_verify_score", [(answer, reference), ...])
"""

import json

__all__ = ["reasoning_gym_score", "math_verify_score"]

_DATASETS: dict[str, object] = {}


def reasoning_gym_score(answer: str | None, entry: dict, options: dict | None = None) -> float:
    """The score reasoning-gym's dataset gives ``answer`` on ``entry`` (0.0 to 1.0; partial credit as the dataset
    defines it). The dataset is the entry's ``metadata.source_dataset``, built with ``options`` (its config
    fields, as the rows were generated: some scorers read their config) once per worker."""
    name = entry["metadata"]["source_dataset"]
    options = {k: v for k, v in (options or {}).items() if k not in ("size", "seed")}
    key = name + json.dumps(options, sort_keys=True)
    if key not in _DATASETS:
        import reasoning_gym

        _DATASETS[key] = reasoning_gym.create_dataset(name, **options)
    return float(_DATASETS[key].score_answer(answer, entry))


def math_verify_score(answer: str, reference: str, timeout_seconds: int = 2) -> float:
    """1.0 if math-verify finds ``answer`` equal to ``reference``, else 0.0.

    Both are parsed as math-verify reads them (LaTeX in ``$...$`` or ``\\boxed{}``, else a plain expression or
    number). A bare answer with no ``$`` (what sits in an ``<answer>`` tag) is also read inside ``$...$``: first,
    when it holds a LaTeX command (``2\\sqrt{2}``), else when the plain reading finds nothing. math-verify's own
    timeouts (SIGALRM, in this worker's main thread) stop a slow parse or comparison gracefully; the worker's time
    limit is the backstop."""
    from math_verify import parse, verify

    def read(text: str):
        readings = [text] if "$" in text else [text, f"${text}$"]
        if "\\" in text:
            readings.reverse()  # a LaTeX command outside $...$: read it as LaTeX first
        for reading in readings:
            found = parse(reading, parsing_timeout=timeout_seconds)
            if found:
                return found
        return []

    gold, predicted = read(str(reference)), read(answer)
    if not gold or not predicted:
        return 0.0
    return float(verify(gold, predicted, timeout_seconds=timeout_seconds))
