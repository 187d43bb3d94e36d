"""`minigrpo bench --against trl` runs end to end on a very small random model and prints its ratios.

No timing is asserted: timings belong in BENCHMARKS.md, not in a test. Skipped when trl is not installed.
"""

import re

import pytest

pytest.importorskip("trl")

from minigrpo.cli import main  # noqa: E402


def test_bench_against_trl_prints_ratios_and_a_matching_loss(capsys):
    code = main(["bench", "--against", "trl", "--shape", "test", "--prompts", "2", "--num-generations", "4",
                 "--max-completion-length", "6", "--steps", "1", "--warmup", "1"])
    out = capsys.readouterr().out
    assert code == 0
    ratio_lines = [line for line in out.splitlines() if re.search(r"\bratio\b", line)]
    assert ratio_lines[0].startswith("step time ratio minigrpo/trl: ")
    assert any(line.startswith("peak memory ratio") for line in ratio_lines)
    assert any(line.startswith("decode tokens/s ratio") for line in ratio_lines)
    # Same completions, same weights: the two losses agree (the line prints their difference).
    difference = next(line for line in out.splitlines() if line.startswith("loss difference"))
    assert abs(float(difference.split(":")[1])) < 1e-5


def test_bench_against_trl_on_a_recipes_prompts(capsys):
    """Countdown's conversational prompts (R1's system prompt and a question) through the stand-in's chat template:
    TRL applies the template, minigrpo too, and on TRL's own batch the losses agree (the shared prefix included)."""
    code = main(["bench", "--against", "trl", "--task", "countdown", "--shape", "test", "--prompts", "2",
                 "--num-generations", "2", "--max-completion-length", "4", "--steps", "1", "--no-rollout"])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"prompts: countdown's, through the stand-in's tokenizer \(and chat template\), 2\d\d-2\d\d tokens",
                     out)
    difference = next(line for line in out.splitlines() if line.startswith("loss difference"))
    assert abs(float(difference.split(":")[1])) < 1e-5


def test_a_task_without_a_model_needs_a_shape():
    with pytest.raises(SystemExit, match="ships no model; give --shape"):
        main(["bench", "--against", "trl", "--task", "countdown"])


def test_bench_scores_a_batch_with_a_reward_model_beside_trl(capsys):
    """`--reward-model`: the same batch scored by minigrpo's RewardModel and TRL's _calculate_rewards, same scores."""
    code = main(["bench", "--against", "trl", "--reward-model", "--shape", "test", "--prompts", "2",
                 "--num-generations", "2", "--max-completion-length", "6", "--steps", "1", "--warmup", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert re.search(r"^reward model scoring ratio minigrpo/trl: \d+\.\d\d \(wall\), \d+\.\d\d \(CPU\)$", out, re.M)
    assert re.search(r"^reward model scoring share of a minigrpo step: \d\.\d{3} \(wall\)", out, re.M)
    difference = re.search(r"scores max \|minigrpo - TRL\|: (\S+)", out).group(1)
    assert float(difference) < 1e-5
