"""``reasoning_gym``: about a hundred procedurally generated tasks with their own verifiers, offline
(reasoning-gym, Open-Thought 2025; ``pip install 'minigrpo[reasoning-gym]'``).

    minigrpo train --task reasoning_gym --dataset gsm_symbolic --model Qwen/Qwen2.5-0.5B-Instruct
    minigrpo train --task reasoning_gym --dataset "gsm_symbolic:3,countdown:1,chain_sum:1" \\
        --dataset-config '{"size": 2000, "test_size": 200, "seed": 0, "countdown": {"max_numbers": 4}}'

``dataset_name`` names one dataset or several, comma-separated, each with an optional ``:weight`` (a weighted
mix: reasoning-gym's composite dataset draws each row's dataset by weight). ``dataset_config`` is a JSON object
(or a dict from YAML): ``size`` (training rows, default 1000), ``test_size`` (held-out rows, default 100),
``seed`` (default 0), and per dataset, under its name, that dataset's own config fields.

Rows are TRL's conversational format with DeepSeek-R1's system prompt; the completion's answer is read from its
last ``<answer>`` tag:

    {"prompt": [{"role": "system", "content": R1_SYSTEM_PROMPT}, {"role": "user", "content": question}],
     "answer": "288", "entry": {question, answer, metadata}, "dataset_options": {...}}

The held-out split is generated with other seeds than the training rows (``seed + 1_000_003`` for the test
split) and then every row whose question text is also a training question is dropped, so the two never overlap.

**The reward is the dataset's own verifier** on the extracted answer, with its partial credit (countdown pays
0.05 for a wrong expression, most text datasets ``len(reference) / len(answer)`` for an answer that contains the
reference); ``correctness``/``grade`` count only full marks (a score of 1.0). No answer tag scores 0.0 without a
call. Third-party verifiers never see the completion in the trainer's process: they run through
``isolation.call_isolated`` (a worker with time and memory limits; reasoning-gym's countdown scorer evaluates the
answer as Python). A call that hangs, crashes or raises scores 0.0 and counts in ``rewards/verifier_failed``.
Where minigrpo has its own checker for the task, countdown, that one is used in-process (``countdown_score``:
the same scores as reasoning-gym's on answers made of numbers, + - * / and parentheses, without evaluating text).
An answer longer than ``MAX_ANSWER_CHARS`` scores 0.0 without a call.
"""

import difflib
import json
import re
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache

from ..errors import ConfigError
from ..rewards import completion_text, has_r1_blocks
from ..sandbox.isolation import call_isolated
from .answers import R1_SYSTEM_PROMPT, answer_tag
from .base import Task
from .countdown import evaluate_expression

__all__ = ["ReasoningGymTask", "parse_dataset_spec", "generate_rows", "countdown_score", "MAX_ANSWER_CHARS"]

INSTALL_HINT = "the reasoning_gym task needs reasoning-gym: pip install 'minigrpo[reasoning-gym]'"
MAX_ANSWER_CHARS = 20_000  # reasoning-gym's longest reference answers are ~5,000 characters (arc grids)
VERIFIER_TIMEOUT = 5.0  # seconds per call; a scorer takes microseconds (gsm_symbolic) to milliseconds (sympy)
VERIFIER_MEMORY_BYTES = 1 << 30
TEST_SEED_OFFSET = 1_000_003
SCORER = "minigrpo.sandbox.verifiers:reasoning_gym_score"
SPLIT_KEYS = ("size", "test_size", "seed")


def _reasoning_gym():
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(INSTALL_HINT) from None
    return reasoning_gym


def parse_dataset_spec(dataset_name: str | None, dataset_config) -> tuple[dict[str, float], dict[str, dict], dict]:
    """``"gsm_symbolic:3,countdown"`` and ``'{"size": 500, "countdown": {...}}'`` -> (weights by dataset, options
    by dataset, split settings {"size", "test_size", "seed"}). ConfigError naming the field for anything unknown."""
    names = _reasoning_gym().factory.DATASETS
    weights = {}
    for part in (dataset_name or "gsm_symbolic").split(","):
        name, _, weight = part.strip().partition(":")
        if name not in names or name == "composite":
            close = difflib.get_close_matches(name, names, n=3)
            raise ConfigError(f"dataset_name: reasoning-gym has no dataset {name!r}"
                              + (f"; did you mean {', '.join(close)}?" if close else ""))
        try:
            weights[name] = float(weight) if weight else 1.0
        except ValueError:
            raise ConfigError(f"dataset_name: weight {weight!r} of {name!r} is not a number") from None
        if weights[name] <= 0:
            raise ConfigError(f"dataset_name: weight of {name!r} must be positive")
    settings = _as_dict(dataset_config)
    options = {name: settings.pop(name) for name in weights if name in settings}
    unknown = [key for key in settings if key not in SPLIT_KEYS]
    if unknown:
        raise ConfigError(f"dataset_config: unknown key(s) {', '.join(map(repr, unknown))}; expected {SPLIT_KEYS} "
                          f"or the name of a dataset in dataset_name ({', '.join(weights)})")
    split = {"size": 1000, "test_size": 100, "seed": 0, **settings}
    return weights, options, split


def _as_dict(dataset_config) -> dict:
    if dataset_config is None or dataset_config == "":
        return {}
    if isinstance(dataset_config, dict):
        return dict(dataset_config)
    try:
        parsed = json.loads(dataset_config)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"dataset_config: not a JSON object ({exc.msg}): {dataset_config!r:.80}") from None
    if not isinstance(parsed, dict):
        raise ConfigError(f"dataset_config: expected a JSON object, got {dataset_config!r:.80}")
    return parsed


def _make_dataset(weights: dict[str, float], options: dict[str, dict], size: int, seed: int):
    """One reasoning-gym dataset, or its composite of several with weights (each gets its own derived seed)."""
    rg = _reasoning_gym()
    try:
        if len(weights) == 1:
            (name,) = weights
            return rg.create_dataset(name, **{**options.get(name, {}), "size": size, "seed": seed})
        from reasoning_gym.composite import DatasetSpec

        specs = [DatasetSpec(name, weight, dict(options.get(name, {}))) for name, weight in weights.items()]
        return rg.create_dataset("composite", size=size, seed=seed, datasets=specs)
    except (TypeError, ValueError, AssertionError) as exc:
        raise ConfigError(f"dataset_config: reasoning-gym refused the options: {type(exc).__name__}: {exc}") from None


@lru_cache(maxsize=8)
def _generate(spec_json: str, split: str) -> tuple[dict, ...]:
    """The entries of one split (cached: loading "test" needs the training questions)."""
    weights, options, settings = json.loads(spec_json)
    if split == "train":
        dataset = _make_dataset(weights, options, settings["size"], settings["seed"])
        return tuple(dataset[i] for i in range(settings["size"]))
    train_questions = {entry["question"] for entry in _generate(spec_json, "train")}
    wanted, pool = settings["test_size"], 10 * settings["test_size"]
    dataset = _make_dataset(weights, options, pool, settings["seed"] + TEST_SEED_OFFSET)
    entries, seen = [], set(train_questions)
    for i in range(pool):
        entry = dataset[i]
        if entry["question"] not in seen:
            seen.add(entry["question"])
            entries.append(entry)
            if len(entries) == wanted:
                break
    return tuple(entries)


def generate_rows(dataset_name: str | None, dataset_config, split: str) -> list[dict]:
    """The rows of ``split`` ("train" or "test") for the datasets and options named (see the module docstring)."""
    if split not in ("train", "test"):
        raise ConfigError(f"dataset_train_split / dataset_test_split: reasoning_gym has 'train' and 'test', "
                          f"not {split!r}")
    weights, options, settings = parse_dataset_spec(dataset_name, dataset_config)
    entries = _generate(json.dumps([weights, options, settings], sort_keys=True), split)
    return [{"prompt": [{"role": "system", "content": R1_SYSTEM_PROMPT}, {"role": "user", "content": e["question"]}],
             "answer": "" if e.get("answer") is None else str(e["answer"]), "entry": e,
             "dataset_options": options.get(e["metadata"]["source_dataset"], {})} for e in entries]


# ---- countdown, scored by minigrpo's own checker ----------------------------------------------------------------
def countdown_score(answer: str, numbers: list[int], target: int) -> float:
    """reasoning-gym's countdown scores, without evaluating text: 1.0 for an expression of exactly ``numbers``
    equal to ``target``; 0.05 for another arithmetic expression (numbers or value wrong); 0.01 for anything that
    is not one, or divides by zero (reasoning-gym pays 0.01 for what sympy cannot turn into a number).

    "Arithmetic" is countdown.evaluate_expression's: integers, + - * /, unary minus, parentheses, at most 200
    characters and 20 parentheses. Where the two differ: reasoning-gym also reads decimals, ``**``, leading zeros
    and longer expressions (0.05 or 1.0 there, 0.01 here); no countdown problem needs any of them."""
    if not answer.strip():
        return 0.01
    own_numbers = [int(digits) for digits in re.findall(r"[0-9]+", answer[:MAX_ANSWER_CHARS])]
    if evaluate_expression(answer, own_numbers) is None:  # read with the answer's own numbers: is it arithmetic?
        return 0.01
    value = evaluate_expression(answer, numbers)
    return 1.0 if value is not None and value == target else 0.05


@dataclass(frozen=True)
class ReasoningGymTask(Task):
    name: str = "reasoning_gym"
    max_completion_length: int = 512
    required_columns: tuple[str, ...] = ("entry",)
    _scores: OrderedDict = field(default_factory=OrderedDict, compare=False, repr=False)  # recent scores

    def load(self, split: str, dataset: str | None = None, dataset_config=None) -> list[dict]:
        """Rows generated by reasoning-gym (nothing is read from disk): see the module docstring."""
        return generate_rows(dataset, dataset_config, split)

    def extract_answer(self, completion: str) -> str | None:
        return answer_tag(completion)

    def is_well_formed(self, completion: str) -> bool:
        return has_r1_blocks(completion)

    def scores(self, completions: list, rows: list[dict]) -> list[float]:
        """The dataset's own score of each completion's answer (see the module docstring), in [0, 1].

        Scores of recent (answer, problem) pairs are kept, so ``grade`` after the reward calls nothing again."""
        answers = [answer_tag(completion_text(c)) for c in completions]
        keys = [(a, r["entry"]["question"], r["entry"]["metadata"]["source_dataset"]) for a, r in zip(answers, rows)]
        todo = [i for i, (a, key) in enumerate(zip(answers, keys)) if key not in self._scores]
        third_party = []
        for i in todo:
            entry, answer = rows[i]["entry"], answers[i]
            if answer is None or len(answer) > MAX_ANSWER_CHARS:
                self._remember(keys[i], 0.0)
            elif entry["metadata"]["source_dataset"] == "countdown":
                self._remember(keys[i], countdown_score(answer, entry["metadata"]["numbers"],
                                                        entry["metadata"]["target"]))
            else:
                third_party.append(i)
        calls = [(answers[i], rows[i]["entry"], rows[i].get("dataset_options") or {}) for i in third_party]
        for i, result in zip(third_party, call_isolated(SCORER, calls, timeout=VERIFIER_TIMEOUT,
                                                        memory_bytes=VERIFIER_MEMORY_BYTES)):
            ok = result.ok and isinstance(result.value, (int, float)) and 0 <= result.value <= 1
            self._remember(keys[i], float(result.value) if ok else 0.0)
        return [self._scores[key] for key in keys]

    def _remember(self, key, score: float) -> None:
        self._scores[key] = score
        while len(self._scores) > 8192:
            self._scores.popitem(last=False)

    def grade(self, completion, row: dict) -> bool:
        """Full marks only: the dataset's score is 1.0."""
        return self.scores([completion], [row])[0] >= 1.0

    def is_correct(self, completion: str, answer) -> bool:
        raise TypeError("reasoning_gym grades with the whole row (its entry): use grade(completion, row)")

    def correctness_reward(self, prompts, completions, **kwargs) -> list[float]:
        """The dataset's score with its partial credit (TRL's reward signature; the rows' ``entry`` and
        ``dataset_options`` columns arrive as lists)."""
        n = len(completions)
        rows = [{"entry": kwargs["entry"][i], "dataset_options": (kwargs.get("dataset_options") or [{}] * n)[i]}
                for i in range(n)]
        return self.scores(completions, rows)
