"""The reasoning_gym task: rows, the held-out split, rewards that agree with reasoning-gym's own scores, and
hostile answers that score nothing and do nothing. reasoning-gym's scorers only ever run in the isolated worker."""

import os
import tempfile
import time

import pytest

pytest.importorskip("reasoning_gym")

import minigrpo.tasks.reasoning_gym as rg_task  # noqa: E402
from minigrpo.config import ConfigError  # noqa: E402
from minigrpo.sandbox.isolation import call_isolated, take_failed_count  # noqa: E402
from minigrpo.tasks import get_task  # noqa: E402
from minigrpo.tasks.answers import R1_SYSTEM_PROMPT  # noqa: E402
from minigrpo.tasks.reasoning_gym import countdown_score  # noqa: E402

TASK = get_task("reasoning_gym")
MIX = "gsm_symbolic:2,countdown:1,chain_sum:1"
MIX_CONFIG = '{"size": 200, "test_size": 40, "seed": 3, "countdown": {"min_numbers": 3, "max_numbers": 4}}'
HOSTILE = {
    "code": "__import__('pathlib').Path('pwned.txt').write_text('x')",
    "huge power": "9**9**9**9",
    "deep nesting": "(" * 100_000 + "1" + ")" * 100_000,
    "long string": "7" * 1_000_000,
}


def tagged(answer: str) -> str:
    return f"<think>\nworking\n</think>\n<answer>\n{answer}\n</answer>"


def reference_scores(answers, rows) -> list:
    """reasoning-gym's own scorer, in the worker, on every row (countdown included)."""
    calls = [(a, r["entry"], r["dataset_options"]) for a, r in zip(answers, rows)]
    return [r.value for r in call_isolated(rg_task.SCORER, calls)]


@pytest.fixture(scope="module")
def mix():
    return TASK.load("train", MIX, MIX_CONFIG), TASK.load("test", MIX, MIX_CONFIG)


# ---- rows ------------------------------------------------------------------------------------------------------
def test_rows_are_conversational_with_r1s_prompt_and_the_entry(mix):
    train, test = mix
    assert len(train) == 200 and len(test) == 40
    row = train[0]
    assert row["prompt"][0] == {"role": "system", "content": R1_SYSTEM_PROMPT}
    assert row["prompt"][1] == {"role": "user", "content": row["entry"]["question"]}
    assert row["answer"] == str(row["entry"]["answer"])
    counts = {name: sum(r["entry"]["metadata"]["source_dataset"] == name for r in train)
              for name in ("gsm_symbolic", "countdown", "chain_sum")}
    assert sum(counts.values()) == 200 and counts["gsm_symbolic"] > max(counts["countdown"], counts["chain_sum"])
    assert all(len(r["entry"]["metadata"]["numbers"]) <= 4 for r in train
               if r["entry"]["metadata"]["source_dataset"] == "countdown")  # the per-dataset option took effect
    assert TASK.load("train", MIX, MIX_CONFIG) == train  # deterministic


def test_the_held_out_split_never_repeats_a_training_question():
    # basic_arithmetic with one-digit, two-term sums has few distinct problems: the seeds alone would collide
    config = {"size": 300, "test_size": 20, "basic_arithmetic": {"min_terms": 2, "max_terms": 2,
                                                                 "min_digits": 1, "max_digits": 1}}
    train, test = TASK.load("train", "basic_arithmetic", config), TASK.load("test", "basic_arithmetic", config)
    train_questions = {r["entry"]["question"] for r in train}
    assert test and not train_questions & {r["entry"]["question"] for r in test}
    assert len({r["entry"]["question"] for r in test}) == len(test)


@pytest.mark.parametrize("name, config, message", [
    ("gsm_symbolicc", None, "did you mean gsm_symbolic"), ("chain_sum:x", None, "is not a number"),
    ("chain_sum", '{"sise": 3}', "unknown key"), ("chain_sum", "[1]", "JSON object"),
    ("chain_sum", '{"chain_sum": {"no_such_option": 1}}', "refused the options"),
])
def test_bad_specs_are_one_line_config_errors(name, config, message):
    with pytest.raises(ConfigError, match=message):
        TASK.load("train", name, config)


def test_without_reasoning_gym_one_line_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_reasoning_gym(name, *args, **kwargs):
        if name == "reasoning_gym":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_reasoning_gym)
    with pytest.raises(ConfigError, match=r"pip install 'minigrpo\[reasoning-gym\]'"):
        TASK.load("train", "chain_sum", None)


# ---- rewards -----------------------------------------------------------------------------------------------------
def test_rewards_agree_with_reasoning_gyms_scores_and_keep_partial_credit(mix):
    rows = mix[0][:60]
    answers = [r["answer"] for r in rows] + ["1"] * len(rows) + [r["answer"] + " apples" for r in rows]
    rows3 = rows * 3
    rewards = TASK.correctness_reward(None, [[{"role": "assistant", "content": tagged(a)}] for a in answers],
                                      entry=[r["entry"] for r in rows3],
                                      dataset_options=[r["dataset_options"] for r in rows3])
    assert rewards == reference_scores(answers, rows3)
    assert rewards[:60] == [1.0] * 60
    assert any(0 < r < 1 for r in rewards[120:])  # partial credit: len(reference) / len(answer) for gsm_symbolic
    assert [TASK.grade(tagged(a), r) for a, r in zip(answers[120:], rows)] == [r_ == 1.0 for r_ in rewards[120:]]


def test_no_answer_tag_scores_zero_without_a_call(mix):
    row = mix[0][0]
    assert TASK.correctness_reward(None, ["the answer is " + row["answer"]], entry=[row["entry"]]) == [0.0]


def test_minigrpos_countdown_checker_agrees_with_reasoning_gyms_on_benign_answers(mix):
    rows = [r for r in mix[0] if r["entry"]["metadata"]["source_dataset"] == "countdown"][:25]
    answers, answer_rows = [], []
    for row in rows:
        nums, solution = row["entry"]["metadata"]["numbers"], row["answer"]
        for answer in (solution, f"({solution})", solution.replace(" ", ""), f"-(-({solution}))",
                       " + ".join(map(str, nums)), " * ".join(map(str, nums)),  # all numbers, (usually) wrong value
                       f"{solution} + 1", f"{nums[0]} + {nums[1]}",  # an extra number, numbers missing
                       f"{solution} = {row['entry']['metadata']['target']}", "I don't know", "",
                       f"{nums[0]} / (1 - 1)", f"{solution} +"):
            answers.append(answer)
            answer_rows.append(row)
    ours = [countdown_score(a, r["entry"]["metadata"]["numbers"], r["entry"]["metadata"]["target"])
            for a, r in zip(answers, answer_rows)]
    assert ours == reference_scores(answers, answer_rows)
    assert ours.count(1.0) >= 4 * 25 and {0.01, 0.05} <= set(ours)


# ---- hostile answers ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("family", ["gsm_symbolic", "countdown", "chain_sum"])
def test_hostile_answers_score_nothing_and_do_nothing(mix, family, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir(tempfile.gettempdir()))
    row = next(r for r in mix[0] if r["entry"]["metadata"]["source_dataset"] == family)
    start = time.monotonic()
    rewards = TASK.correctness_reward(None, [tagged(a) for a in HOSTILE.values()], entry=[row["entry"]] * 4,
                                      dataset_options=[row["dataset_options"]] * 4)
    assert time.monotonic() - start < 20
    assert all(r <= 0.01 for r in rewards), rewards  # 0.01 is countdown's floor for any non-expression
    assert not os.listdir(tmp_path)
    assert "pwned.txt" not in set(os.listdir(tempfile.gettempdir())) - before


def test_reasoning_gyms_countdown_scorer_runs_code_but_only_in_the_worker(mix, tmp_path, monkeypatch):
    """The file-writing answer through reasoning-gym's own countdown scorer: it *is* evaluated (the scorer pays
    0.05, the `write_text` call returned 1), in the worker's directory, which is emptied: no file anywhere here."""
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir(tempfile.gettempdir()))
    row = next(r for r in mix[0] if r["entry"]["metadata"]["source_dataset"] == "countdown")
    assert reference_scores([HOSTILE["code"]], [row]) == [0.05]
    assert not (tmp_path / "pwned.txt").exists()
    assert "pwned.txt" not in set(os.listdir(tempfile.gettempdir())) - before


def test_a_hanging_or_crashing_third_party_scorer_is_a_counted_failure(mix):
    """reasoning-gym's countdown scorer on 9**9**9**9 and 10^5 nested parentheses (sympy), in the worker. (4 s a
    call: a restarted worker's first call timed out at 2 s once, with every core busy running the suite.)"""
    row = next(r for r in mix[0] if r["entry"]["metadata"]["source_dataset"] == "countdown")
    take_failed_count()
    start = time.monotonic()
    results = call_isolated(rg_task.SCORER, [(HOSTILE["huge power"], row["entry"], {}),
                                             (HOSTILE["deep nesting"], row["entry"], {}),
                                             (row["answer"], row["entry"], {})], timeout=4.0)
    assert time.monotonic() - start < 20
    assert results[2].value == 1.0  # the worker was restarted, and the batch went on
    failed = sum(not r.ok for r in results)
    assert all(not r.ok or r.value <= 0.01 for r in results[:2]) and take_failed_count() == failed


def test_a_scorer_that_raises_scores_zero_and_is_counted(mix, monkeypatch):
    row = next(r for r in mix[0] if r["entry"]["metadata"]["source_dataset"] == "gsm_symbolic")
    monkeypatch.setattr(rg_task, "SCORER", "operator:truediv")  # three arguments: TypeError in the worker
    TASK._scores.clear()
    take_failed_count()
    assert TASK.correctness_reward(None, [tagged(row["answer"])], entry=[row["entry"]]) == [0.0]
    assert take_failed_count() == 1
    assert TASK.grade(tagged(row["answer"]), row) is False  # remembered: no second call
    assert take_failed_count() is None  # no call since the last take
    TASK._scores.clear()


def right_answer_half(prompts, completions, entry, **row):
    """The right answer (from the row) for every other completion, through the task's own reward: the verifier runs."""
    answers = [tagged(e["answer"]) if i % 2 == 0 else c[0]["content"] for i, (e, c) in enumerate(zip(entry, completions))]
    return TASK.correctness_reward(prompts, answers, entry=entry, **row)


@pytest.mark.parametrize("dataset", ["gsm_symbolic", "chain_sum", "countdown"])
def test_train_runs_on_the_stand_in(dataset, tmp_path, chat_model_dir, one_thread):
    import json

    from minigrpo.config import Config
    from minigrpo.trainer import train

    cfg = Config(model_name_or_path=str(chat_model_dir), task="reasoning_gym", dataset_name=dataset,
                 dataset_config='{"size": 40, "test_size": 8}', output_dir=str(tmp_path / "run"), max_steps=2,
                 num_generations=4, generation_batch_size=8, max_completion_length=16, eval_steps=0,
                 eval_num_samples=0, save_model=False)
    train(cfg, reward_funcs=[right_answer_half], progress=False)
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    assert all(line["reward"] >= 0.5 and line["loss"] is not None for line in lines)  # half are right answers
    if dataset != "countdown":  # countdown is scored by minigrpo's own checker, in-process
        assert all(line["rewards/verifier_failed"] == 0 for line in lines)
