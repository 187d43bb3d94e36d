"""`minigrpo bench-logprobs` runs each of its sides at toy sizes and prints its tables; no timing is asserted
(timings belong in BENCHMARKS.md). The memory bounds themselves are tests/test_logprobs.py's."""

import pytest

from minigrpo.lab import bench_logprobs
from minigrpo.lab.bench_logprobs import REPO, SIDES, format_tables, run_side

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.mark.parametrize("side", ["body", *SIDES])
def test_every_side_times_and_measures_one_pass(side):
    if side == "trl":
        pytest.importorskip("trl")
    timed = run_side(dict(measure="time", side=side, threads=1, repeats=2, quick=True, flops=True))
    assert len(timed["cpu"]) == len(timed["wall"]) == 2 and all(t > 0 for t in timed["wall"]) and timed["flops"] > 0
    measured = run_side(dict(measure="memory", side=side, threads=1, quick=True))
    assert measured["live"] > 0 and measured["rss"] >= 0 and measured["logits_copy"] == 4 * 16 * 4096 * 4


def test_a_side_runs_in_a_process_of_its_own_with_a_checkout_s_package():
    out = bench_logprobs._run_worker(dict(measure="memory", side="shared", threads=1, quick=True), REPO)
    assert out["live"] > 0 and out["tokens"] > 0


def test_the_tables_give_ratios_to_the_plain_path_and_the_head_s_share():
    mib = 2**20
    times = {"shared prefix": {"cpu": [3.0, 3.0], "wall": [3.5], "flops": 3e12},
             "plain": {"cpu": [4.0], "wall": [4.0], "flops": 4e12}}
    memory = {"body alone": dict(rss=100 * mib, live=80 * mib, logits_copy=1000 * mib),
              "shared prefix": dict(rss=300 * mib, live=280 * mib, logits_copy=1000 * mib)}
    table = format_tables(times, memory)
    assert "| shared prefix | 3.00 | 3.50 | 0.75 | 3.000 | 0.75 |" in table
    assert "| shared prefix | 300 | 280 | 0.20 | 0.20 |" in table
