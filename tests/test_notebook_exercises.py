"""Every "Try this" exercise runs as written: its edit, read from the notebook itself, applied and run (fast mode).

Each notebook's "## Try this" cell states every edit it asks for as a ```diff block (scripts/run_notebooks.py,
`exercises`): lines starting with "-" are replaced by the lines starting with "+", lines starting with a space are
context. The test reads those blocks, makes the edit in a copy of the notebook, and runs it with MINIGRPO_FAST=1:
the edited cell to the end of its section (or up to the end of the section the exercise names) — what a student
does when told to "re-run that cell and the rest of its section" — after the set-up cell and the cells above that
those read names from (scripts/run_notebooks.py, `exercise_notebook`). So the prose and the test cannot drift
apart: an exercise whose lines no longer exist in the notebook, or whose edit raises, fails here. An exercise
without an edit must say that it is not run by the tests, and why (it needs a GPU, say).

This checks that the exercises run, not the numbers they predict (fast mode trains a few steps only). The exercises
share one kernel (scripts/run_notebooks.py, `ExerciseKernel`), which saves starting a kernel and importing torch,
transformers and minigrpo for each (about 5 CPU seconds each time); each exercise still starts from an empty
namespace, in a working directory of its own, with a fresh kernel's warnings filters and torch settings, as the last
test here checks. An exercise whose cells register something by name gets a kernel of its own. The runs an exercise
trains do not draw their plots/ (`run_plots=False`; nothing reads them). About 7 minutes on one worker of a 2-core
machine (the suite's longest file).
"""

import sys
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from run_notebooks import (NOT_RUN, ExerciseKernel, apply_exercise, execute_notebook, exercise_notebook,  # noqa: E402
                           exercises, shares_kernel_safely)

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


@pytest.fixture(scope="module")
def exercise_kernel(tmp_path_factory):
    """kernel(): the ExerciseKernel that runs the exercises, every notebook's, started on first use. A kernel that a
    failing exercise shut down is replaced by a new one for the next exercise."""
    started: list[ExerciseKernel] = []

    def kernel() -> ExerciseKernel:
        if not started or not started[-1].alive:
            started.append(ExerciseKernel(fast=True, timeout=600, threads=1, workdir=tmp_path_factory.mktemp("kernel"),
                                          run_plots=False))
        return started[-1]

    yield kernel
    for each in started:
        each.close()


@pytest.mark.parametrize("path, exercise", CASES, ids=[f"{p.stem[:2]}-{e.number}" for p, e in CASES])
def test_exercise_runs_as_written(path, exercise, tmp_path, exercise_kernel):
    # Raises CellExecutionError, with the failing cell and its traceback, on the first cell that raises. Live runs go
    # to tmp_path.
    edited = exercise_notebook(nbformat.read(path, as_version=4), exercise)
    if shares_kernel_safely(edited):
        executed = exercise_kernel().run(edited, workdir=tmp_path)
    else:  # its registrations would outlive it in a shared kernel: one of its own
        executed = execute_notebook(path, fast=True, timeout=600, threads=1, workdir=tmp_path, notebook=edited,
                                    run_plots=False)
    code_cells = [c for c in executed.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code_cells), "a code cell did not run"
    assert not any(o["output_type"] == "error" for c in code_cells for o in c.get("outputs", []))


def test_an_exercise_that_registers_by_name_gets_a_kernel_of_its_own():
    def notebook(source):
        return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])

    assert shares_kernel_safely(notebook("loss, stats = policy_loss(logp, old_logp, adv, mask)"))
    assert not shares_kernel_safely(notebook('@register_loss("mine", aggregation="token_sum")\ndef mine(x): ...'))
    assert not shares_kernel_safely(notebook('register_advantage("mine")(my_estimator)'))


def _printed(notebook) -> list[str]:
    return [o["text"] for c in notebook.cells for o in c.get("outputs", []) if o.get("name") == "stdout"]


def test_exercises_sharing_a_kernel_see_nothing_of_each_other(tmp_path):
    # The first notebook leaves behind what an exercise could: a name, a run folder, a warnings filter that turns
    # warnings into errors, and torch's RNG, thread count, default dtype and grad mode changed. The second must see
    # none of it: what the first printed in the fresh kernel, no name, an empty directory.
    fresh = ("import os, torch, warnings\nprint(torch.rand(3).tolist(), torch.get_num_threads(), "
             "torch.get_default_dtype(), torch.is_grad_enabled(), os.listdir('.'))\n")
    first = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        fresh + "left_behind = 1\nos.mkdir('runs')\nwarnings.simplefilter('error')\ntorch.manual_seed(0)\n"
                "torch.set_num_threads(2)\ntorch.set_default_dtype(torch.float64)\ntorch.set_grad_enabled(False)")])
    second = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        fresh + "assert 'left_behind' not in dir(), 'a name from the last notebook'\n"
                "warnings.warn('a warning, not an error')")])
    failing = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("1 / 0")])
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    kernel = ExerciseKernel(fast=True, timeout=600, threads=1, workdir=tmp_path, run_plots=False)  # as above
    try:
        seen_first = _printed(kernel.run(first, workdir=tmp_path / "first"))
        assert _printed(kernel.run(second, workdir=tmp_path / "second")) == seen_first
        assert (tmp_path / "first" / "runs").is_dir() and not (tmp_path / "second" / "runs").exists()
        with pytest.raises(Exception, match="ZeroDivisionError"):
            kernel.run(failing, workdir=tmp_path)
        assert not kernel.alive, "a failure shuts the kernel down, so it leaves nothing for the next exercise"
    finally:
        kernel.close()
