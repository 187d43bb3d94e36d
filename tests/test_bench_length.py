"""`minigrpo bench-length`: the forced eos probability, the ratios of the table, and a run end to end on a tiny shape
(no timings asserted)."""

import json
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from minigrpo.lab.bench_length import force_eos, format_table, main, parse_args, summarize


def tiny_model():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=30, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=2))


def test_force_eos_makes_eos_exactly_p_while_sampling_and_leaves_training_alone():
    model, ids = tiny_model(), torch.randint(0, 30, (3, 7))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    handle = force_eos(model, eos_token_id=2, probability=0.25)
    with torch.no_grad():
        probs = model(input_ids=ids).logits.softmax(-1)  # (3, 7, 30)
    torch.testing.assert_close(probs[..., 2], torch.full((3, 7), 0.25))
    # The other tokens keep their relative odds: p_v / p_w as before.
    ratio_before = before.softmax(-1)[..., 5] / before.softmax(-1)[..., 7]
    torch.testing.assert_close(probs[..., 5] / probs[..., 7], ratio_before)
    torch.testing.assert_close(model(input_ids=ids).logits.detach(), before)  # grad enabled: unchanged
    handle.remove()
    with pytest.raises(ValueError, match="eos_probability"):
        force_eos(model, 2, 1.0)


def test_summarize_takes_medians_and_ratios():
    # Peaks 100 and 300 MiB (median 200) against TRL's 400 and 400: ratio 0.5; CPU times 1, 3 (median 2) vs 4.
    mib = 2**20
    results = {"minigrpo": [{"step": (1.0, 1.0), "peak": 100 * mib, "tokens": 10},
                            {"step": (3.0, 3.0), "peak": 300 * mib, "tokens": 12}],
               "trl": [{"step": (4.0, 4.0), "peak": 400 * mib, "tokens": 11}] * 2}
    row = summarize(64, None, 8, results)
    assert row["peak_bytes_ratio"] == 0.5 and row["step_cpu_ratio"] == 0.5 and row["minigrpo"]["tokens"] == 11
    line = format_table([row]).splitlines()[-1]
    assert line == "| 64 tokens | 11 / 11 | 2 / 4 | 0.50, 0.50 | 200 / 400 | **0.50** |"


@pytest.mark.parametrize("argv, match", [(["--lengths", "a,b"], "--lengths"), (["--lengths", "0"], "--lengths"),
                                         (["--eos-probability", "1"], "--eos-probability")])
def test_bad_arguments_are_refused_in_one_line(argv, match, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert match in capsys.readouterr().err


def test_bench_length_runs_end_to_end_on_a_tiny_shape(tmp_path, capsys, one_thread):
    pytest.importorskip("trl")
    out = tmp_path / "bench.json"
    assert main(["--shape", "test", "--lengths", "3,5", "--eos-probability", "0.3", "--num-generations", "4",
                 "--json", str(out), "--plot", str(tmp_path / "bench.png")]) == 0
    table = capsys.readouterr().out
    assert "| 3 tokens |" in table and "| 5 tokens |" in table and "| up to 5, eos p = 1/3 |" in table
    rows = json.loads(out.read_text())["rows"]
    assert [(r["length"], r["eos_probability"]) for r in rows] == [(3, None), (5, None), (5, 0.3)]
    for r in rows:
        assert r["minigrpo"]["tokens"] <= 4 * r["length"] and r["trl"]["tokens"] <= 4 * r["length"]
        assert all(math.isfinite(r[k]) and r[k] > 0 for k in ("peak_bytes_ratio", "step_cpu_ratio"))
    assert (tmp_path / "bench.png").stat().st_size > 10_000


def test_bench_length_compares_the_shared_prefix_and_counts_flops(tmp_path, capsys, one_thread):
    """Countdown's prompts (R1's system prompt and a question, ~224 tokens through the stand-in's chat template) with
    completions of 4 tokens: with the prompt run once per group, the training pass does far fewer FLOPs."""
    pytest.importorskip("trl")
    out = tmp_path / "bench.json"
    assert main(["--shape", "test", "--lengths", "4", "--eos-probability", "0", "--num-generations", "4",
                 "--compare-shared-prefix", "--flops", "--json", str(out), "--plot", str(tmp_path / "bench.png")]) == 0
    printed = capsys.readouterr().out
    assert "prompts: countdown's, through the stand-in's chat template" in printed
    assert "no shared prefix" in printed and "GFLOP/s" in printed
    result = json.loads(out.read_text())
    assert 200 < result["settings"]["prompt_tokens"] < 250 and result["settings"]["matmul_peak_flops"] > 0
    (row,) = result["rows"]
    shared, unshared = row["minigrpo"], row["minigrpo, no shared prefix"]
    # 4 completions x (224 + 4) tokens, against 224 + 4 x 4: about a quarter of the FLOPs.
    assert shared["train_flops"] < 0.5 * unshared["train_flops"]
    assert all(math.isfinite(row[k]) and row[k] > 0 for k in ("unshared_step_cpu_ratio", "unshared_peak_bytes_ratio"))
    assert (tmp_path / "bench.png").stat().st_size > 10_000  # three sides drawn
