"""The GPU check's dry run: the same code as on a GPU (minigrpo/lab/gpu_check.py), on the CPU at toy sizes, so that
the one command a GPU session runs cannot rot between the times a GPU is at hand. The CUDA tests it runs there are
collected here, not run: the main suite runs their CPU variants itself (tests/test_cuda.py)."""

import json

import pytest

from minigrpo.lab.gpu_check import format_table, main


def test_the_dry_run_measures_every_part(tmp_path, one_thread, capsys):
    assert main(["--dry-run", "--tests", "collect", "--json", str(tmp_path / "report.json"),
                 "--workdir", str(tmp_path / "work")]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["settings"]["dry_run"] and report["settings"]["device"] == "cpu" and report["settings"]["torch"]
    assert report["tests"]["returncode"] == 0 and report["tests"]["collected"] >= 15  # every CUDA test, [cpu] variant
    for setup in ("full", "lora"):  # minigrpo's step beside TRL's, both sides measured
        row = report["step"][setup]
        assert row["minigrpo"]["step_wall"] > 0 and row["trl"]["step_wall"] > 0 and row["step_wall_ratio"] > 0
        assert 0 < row["minigrpo"]["tokens"] <= 8 * 16 and 0 < row["trl"]["tokens"] <= 8 * 16  # G x 16 at most
    assert report["decode"]["minigrpo"] > 0 and report["decode"]["hf"] > 0
    recipes = {row["recipe"]: row for row in report["memory"]}
    assert "qwen2.5-0.5b-instruct_gsm8k_qlora_fp16_t4" in recipes and len(recipes) >= 8
    assert all(row["measured_bytes"] > 0 and row["predicted_bytes"] > 0 for row in recipes.values()), recipes
    table = capsys.readouterr().out
    assert table.count("| memory: ") == len(recipes) and "| GRPO step, lora, bf16: wall s |" in table


def test_a_part_that_cannot_run_says_why_in_the_table():
    report = {"tests": {"not_measured": "tests/test_cuda.py is not here"},
              "step": {"not_measured": "TRL does not import here (ModuleNotFoundError: No module named 'trl')"},
              "memory": [{"recipe": "r", "not_measured": "QLoRA: bitsandbytes does not import here"}]}
    table = format_table(report)
    assert "not run: tests/test_cuda.py is not here" in table and "not measured: TRL does not import" in table
    assert "| memory: r | not measured: QLoRA: bitsandbytes does not import here |" in table


def test_without_cuda_the_check_says_so_in_one_line(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main([]) == 2
    assert capsys.readouterr().err.strip() == ("gpu_check: torch sees no CUDA GPU; --dry-run runs the same code on the "
                                               "CPU at toy sizes")
