"""Every notebook runs top to bottom in fast mode (MINIGRPO_FAST=1), in a fresh kernel, without an error.

The kernel imports minigrpo from this checkout (scripts/run_notebooks.py sets PYTHONPATH), which the first cell's
version printout (the checkout's commit, not its path) lets us check. Fast mode trains for a few steps only; the
whole file takes about a minute and a half on 2 CPU cores. A second test checks that the committed notebooks carry
the outputs of a full run.
"""

import subprocess
import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from run_notebooks import execute_notebook  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _head() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _text_outputs(cell) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append(output["text"])
        elif "text/plain" in output.get("data", {}):
            parts.append(output["data"]["text/plain"])
    return "".join(parts)


def test_there_are_notebooks():
    names = [p.name for p in NOTEBOOKS]
    assert {"01_group_advantages.ipynb", "02_objectives.ipynb", "03_train_grpo.ipynb", "04_variants.ipynb",
            "05_one_gpu.ipynb", "06_grpo_vs_ppo.ipynb", "07_real_model.ipynb"} <= set(names), names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_in_fast_mode(path, tmp_path):
    # Raises CellExecutionError on a failing cell. Live runs go to tmp_path, not into the checkout.
    notebook = execute_notebook(path, fast=True, timeout=600, threads=1, workdir=tmp_path)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code_cells), "a code cell did not run"
    versions = _text_outputs(code_cells[0])
    for name in ("python", "torch", "transformers", "peft", "minigrpo", "device"):
        assert name in versions, f"first cell should print the {name} version:\n{versions}"
    # The first cell names the commit of the checkout it imported (not its path, which is the machine's).
    assert f"git checkout, commit {_head()}" in versions, f"the kernel imported another minigrpo:\n{versions}"
    assert str(ROOT) not in versions, f"the first cell prints this machine's path:\n{versions}"
    assert not any(o["output_type"] == "error" for c in code_cells for o in c.get("outputs", []))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_notebook_has_full_mode_outputs(path):
    """The committed copy was executed in full mode (scripts/run_notebooks.py), so GitHub shows its plots."""
    notebook = nbformat.read(path, as_version=4)
    code_cells = [c for c in notebook.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code_cells), f"{path.name}: commit it executed (scripts/run_notebooks.py)"
    images = sum("image/png" in o.get("data", {}) for c in code_cells for o in c.get("outputs", []))
    assert images >= 1, f"{path.name}: no plot in the committed outputs"
    text = "".join(_text_outputs(c) for c in code_cells)
    assert "fast mode: True" not in text, f"{path.name}: committed outputs come from fast mode"
    assert "/minigrpo)" not in _text_outputs(code_cells[0]), f"{path.name}: the first cell shows a machine's path"
