"""Every "Try this" exercise runs as written: its edit, read from the notebook itself, applied and run (fast mode).

Each notebook's "## Try this" cell states every edit it asks for as a ```diff block (scripts/run_notebooks.py,
`exercises`): lines starting with "-" are replaced by the lines starting with "+", lines starting with a space are
context. The test reads those blocks, makes the edit in a copy of the notebook, and runs it in a fresh kernel with
MINIGRPO_FAST=1: the edited cell to the end of its section (or up to the end of the section the exercise names) —
what a student does when told to "re-run that cell and the rest of its section" — after the set-up cell and the
cells above that those read names from (scripts/run_notebooks.py, `exercise_notebook`). So the prose and the test
cannot drift apart: an exercise whose lines no longer exist in the notebook, or whose edit raises, fails here. An
exercise without an edit must say that it is not run by the tests, and why (it needs a GPU, say).

This checks that the exercises run, not the numbers they predict (fast mode trains a few steps only). One kernel
per exercise: a few minutes on 2 CPU cores.
"""

import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from run_notebooks import NOT_RUN, apply_exercise, execute_notebook, exercise_notebook, exercises  # noqa: E402

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CASES = [(path, exercise) for path in NOTEBOOKS for exercise in exercises(nbformat.read(path, as_version=4))
         if exercise.edits]


def test_every_exercise_has_an_edit_or_says_why_not():
    for path in NOTEBOOKS:
        found = exercises(nbformat.read(path, as_version=4))
        assert found, f"{path.name}: no '## Try this' cell with numbered exercises"
        assert [e.number for e in found] == list(range(1, len(found) + 1)), f"{path.name}: exercises out of order"
        for exercise in found:
            assert exercise.edits or NOT_RUN in exercise.text, (
                f"{path.name}, exercise {exercise.number}: give the edit as a ```diff block, or say it is "
                f"'{NOT_RUN}' and why:\n{exercise.text}")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_edit_changes_one_place(path):
    # Cheap: the lines an exercise replaces exist, once; the edit changes the source.
    notebook = nbformat.read(path, as_version=4)
    for exercise in exercises(notebook):
        if exercise.edits:
            edited, changed = apply_exercise(notebook, exercise)
            assert any(edited.cells[i].source != notebook.cells[i].source for i in changed), exercise.text


@pytest.mark.parametrize("path, exercise", CASES, ids=[f"{p.stem[:2]}-{e.number}" for p, e in CASES])
def test_exercise_runs_as_written(path, exercise, tmp_path):
    edited = exercise_notebook(nbformat.read(path, as_version=4), exercise)
    executed = execute_notebook(path, fast=True, timeout=600, threads=1, workdir=tmp_path, notebook=edited)
    code_cells = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code_cells), "a code cell did not run"
    assert not any(o["output_type"] == "error" for c in code_cells for o in c.get("outputs", []))
