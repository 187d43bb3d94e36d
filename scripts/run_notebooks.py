"""Execute the notebooks and save them with their outputs (what is committed, so GitHub shows the plots).

    python scripts/run_notebooks.py                       # every notebooks/*.ipynb, full lesson, in place
    python scripts/run_notebooks.py notebooks/03_train_grpo.ipynb
    python scripts/run_notebooks.py --fast --out /tmp/nb  # MINIGRPO_FAST=1 (what the tests run), copies elsewhere
    python scripts/run_notebooks.py --threads 1           # OMP_NUM_THREADS=1: how the committed outputs were made
    python scripts/run_notebooks.py --fast --exercise 3 notebooks/04_variants.ipynb   # "Try this" 3, edited in, run

Each notebook ends with exercises ("## Try this"). An exercise that asks for an edit states it as a ```diff block
(lines starting with "-" are replaced by the lines starting with "+", lines starting with a space are context), so
that `exercises()` can read it and tests/test_notebook_exercises.py can apply it and run the notebook as edited.

Each notebook runs in a fresh kernel whose working directory is notebooks/ and which imports minigrpo from this
checkout (PYTHONPATH is set to the repository root), whatever else is installed. (The exercise tests run a notebook's
exercises one after another in one kernel instead, each from a fresh start: `ExerciseKernel`.)

On a CPU shared with other jobs, use --threads 1: with more torch threads than free cores, OpenMP's busy-waiting
made generation 8x slower here (47 s instead of 6 s for a batch of 128 completions).
"""

import argparse
import ast
import builtins
import contextlib
import copy
import os
import re
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def execute_notebook(path: Path, *, fast: bool, timeout: int = 1800, threads: int | None = None,
                     workdir: Path | None = None, notebook: nbformat.NotebookNode | None = None,
                     run_plots: bool = True) -> nbformat.NotebookNode:
    """Run every cell of the notebook at `path` in a new python3 kernel; raises on the first failing cell.

    fast: MINIGRPO_FAST=1 for the kernel. timeout: seconds per cell. threads: OMP_NUM_THREADS for the kernel
    (None: inherit). workdir: the kernel's working directory, where live runs are written (default: the
    notebook's folder). notebook: run this (e.g. an exercise's edited copy) instead of the file at `path`.
    run_plots: False for the tests: the runs the notebook trains do not draw their plots/ (`_NO_RUN_PLOTS`).
    """
    notebook = nbformat.read(path, as_version=4) if notebook is None else notebook
    with kernel_environment(fast=fast, threads=threads):
        client = notebook_client(notebook, timeout=timeout, workdir=workdir or path.parent)
        if run_plots:
            client.execute()
            return notebook
        with client.setup_kernel():
            run_outside_the_notebook(client, _NO_RUN_PLOTS)
            execute_cells(client, notebook)
    return notebook


def execute_cells(client: NotebookClient, notebook: nbformat.NotebookNode) -> None:
    """Every cell of `notebook`, in place, in the client's started kernel, numbered from 1."""
    client.nb = notebook
    client.reset_execution_trackers()
    for index, cell in enumerate(notebook.cells):
        client.execute_cell(cell, index, execution_count=client.code_cells_executed + 1)


def run_outside_the_notebook(client: NotebookClient, source: str) -> None:
    """`source` in the client's started kernel as a cell of its own, outside any notebook and not stored in In/Out."""
    cell = nbformat.v4.new_code_cell(source)
    client.nb = nbformat.v4.new_notebook(cells=[cell])
    client.execute_cell(cell, 0, store_history=False)


def notebook_client(notebook: nbformat.NotebookNode, *, timeout: int, workdir: Path) -> NotebookClient:
    """A client for a python3 kernel that talks over IPC sockets in the temporary folder: nothing listens on a TCP port
    (ipykernel warns about unencrypted TCP otherwise), and the socket files are removed when the kernel shuts down."""
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(workdir)}})
    client.km = client.create_kernel_manager()
    client.km.transport = "ipc"
    client.km.ip = os.path.join(tempfile.gettempdir(), f"minigrpo-kernel-{uuid.uuid4().hex[:12]}")
    return client


@contextlib.contextmanager
def kernel_environment(*, fast: bool, threads: int | None):
    """While inside, this process's environment is what a kernel started now inherits: MINIGRPO_FAST, PYTHONPATH
    with this checkout first, and OMP_NUM_THREADS when `threads` is given. Restored on the way out."""
    env = {"MINIGRPO_FAST": "1" if fast else "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)  # the kernel inherits this process's environment
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# Run in an ExerciseKernel once, before any notebook cell: what a fresh kernel holds, for _FRESH_START to put back.
# Kept in a module of its own because resetting IPython's namespace would drop it from there.
_TAKE_FRESH_STATE = """
def _take_fresh_state():
    import sys, types, warnings
    import torch
    fresh = types.ModuleType("exercise_kernel_fresh_state")
    fresh.warning_filters = list(warnings.filters)
    fresh.torch_rng_state = torch.get_rng_state()
    fresh.torch_threads = torch.get_num_threads()
    fresh.torch_dtype = torch.get_default_dtype()
    fresh.torch_grad = torch.is_grad_enabled()
    sys.modules[fresh.__name__] = fresh
_take_fresh_state()
del _take_fresh_state
"""

# For the tests: a run the notebook trains ends without drawing its plots/ (six PNGs, about a second of CPU per run,
# a third of a short fast-mode run); the notebooks draw their own figures. tests/conftest.py does the same in-process.
_NO_RUN_PLOTS = """
def _no_run_plots():
    import minigrpo.lab.plots
    minigrpo.lab.plots.plot_runs = lambda *args, **kwargs: []
_no_run_plots()
del _no_run_plots
"""

# Run in an ExerciseKernel before each notebook: IPython's namespace emptied (%reset: names, In/Out and what they
# held), then a fresh kernel's working directory, warnings filters and torch settings (RNG state, threads, default
# dtype, grad mode).
_FRESH_START = """
def _fresh_start(workdir):
    import gc, os, sys, warnings
    import torch
    fresh = sys.modules["exercise_kernel_fresh_state"]
    get_ipython().reset(new_session=False)
    gc.collect()
    os.chdir(workdir)
    warnings.resetwarnings()  # public API that also invalidates the modules' "already warned" records
    warnings.filters.extend(fresh.warning_filters)
    torch.set_rng_state(fresh.torch_rng_state)
    torch.set_num_threads(fresh.torch_threads)
    torch.set_default_dtype(fresh.torch_dtype)
    torch.set_grad_enabled(fresh.torch_grad)
_fresh_start({workdir!r})
"""


class ExerciseKernel:
    """One started kernel that runs notebooks (an exercise's edited copy, say) one after another, each as it would
    run in a fresh kernel started in its own working directory, but without starting one.

    Starting a kernel, importing torch, transformers and minigrpo in it and paying for their first use (the modules
    they import lazily, say) takes seconds, often more than an exercise's own cells in fast mode; the exercise tests
    pay it once instead of once per exercise. Before each notebook the kernel's namespace is emptied
    (IPython's reset: a cell cannot read a name an earlier notebook defined, and what those names held is freed),
    its working directory is the one given (live runs are written there, so no notebook sees another's run
    folders), and warnings filters and torch's settings (RNG state, threads, default dtype, grad mode) are a fresh
    kernel's.

    What it does not undo: imported modules stay imported, with their state. That is the saving, and it is safe for
    what the notebooks do today: they import and call, the package's caches and kept-alive workers (a verifier's
    worker process) behave the same on a second use, and the library settings their set-up cells change (log
    levels, progress bars, print options) change what is printed, not whether a cell raises. A cell that adds to a
    module's tables (registering a loss type or an advantage estimator by name) would leak into the next notebook:
    run such a notebook in a kernel of its own (`shares_kernel_safely`). A cell that raises, or a kernel that dies,
    ends this kernel: `run` shuts it down before the error propagates, so a failure leaves nothing behind.

        kernel = ExerciseKernel(fast=True, threads=1, workdir=tmp_dir)
        kernel.run(edited, workdir=tmp_dir_of_this_exercise)   # raises CellExecutionError like execute_notebook
        kernel.close()

    run_plots=False (the tests): the runs the notebooks train do not draw their plots/, as in execute_notebook.
    """

    def __init__(self, *, fast: bool, timeout: int = 1800, threads: int | None = None, workdir: Path,
                 run_plots: bool = True):
        self.client = notebook_client(nbformat.v4.new_notebook(), timeout=timeout, workdir=workdir)
        self._kernel = contextlib.ExitStack()
        with kernel_environment(fast=fast, threads=threads):
            self._kernel.enter_context(self.client.setup_kernel())
        try:
            run_outside_the_notebook(self.client, _TAKE_FRESH_STATE if run_plots else _TAKE_FRESH_STATE + _NO_RUN_PLOTS)
        except BaseException:
            self.close()
            raise

    @property
    def alive(self) -> bool:
        """False once the kernel is shut down (close(), or a notebook that failed in it)."""
        return self.client.kc is not None

    def run(self, notebook: nbformat.NotebookNode, *, workdir: Path) -> nbformat.NotebookNode:
        """Run every cell of `notebook` (in place, as execute_notebook does) from a fresh start in `workdir`; the
        first failing cell raises (CellExecutionError), after the kernel is shut down."""
        if not self.alive:
            raise RuntimeError("this kernel was shut down (a notebook failed in it, or close() was called)")
        try:
            run_outside_the_notebook(self.client, _FRESH_START.format(workdir=str(workdir)))
            execute_cells(self.client, notebook)
        except BaseException:
            self.close()
            raise
        return notebook

    def close(self) -> None:
        """Shut the kernel down; a second call does nothing."""
        self._kernel.close()


# Code that changes a module's state for later cells, which an ExerciseKernel does not undo.
_MODULE_STATE = re.compile(r"\bregister_\w+\s*\(|@\s*register_\w+")


def shares_kernel_safely(notebook: nbformat.NotebookNode) -> bool:
    """Whether running `notebook` (an exercise's edited copy: an edit may add a registration) leaves nothing in the
    modules of an ExerciseKernel that the next notebook run in it could see: False when a code cell registers
    something by name (a loss type, an advantage estimator)."""
    return not any(c.cell_type == "code" and _MODULE_STATE.search(c.source) for c in notebook.cells)


@dataclass
class Exercise:
    """One numbered item of a notebook's "## Try this" cell: its text and the edits it asks for.

    edits: one list per ```diff block, of (op, line) with op "-" (a line to replace), "+" (its replacement) or " "
    (context, kept). An exercise without a diff block says why it is not run (e.g. it needs a GPU).
    through_section: where the student stops running, when the exercise (or the text above the exercises) says
    "up to the end of section N"; else the end of the edited cell's own section."""

    number: int
    text: str
    edits: list[list[tuple[str, str]]]
    through_section: int | None = None


TRY_THIS = "## Try this"
NOT_RUN = "not run by the tests"  # what an exercise without an edit says, and why, in its text


def exercises(notebook: nbformat.NotebookNode) -> list[Exercise]:
    """The exercises of the notebook's "## Try this" markdown cell, in order."""
    found = []
    for cell in notebook.cells:
        if cell.cell_type != "markdown" or not cell.source.lstrip().startswith(TRY_THIS):
            continue
        preamble, *items = re.split(r"(?m)^(?=\d+\. )", cell.source)  # numbered items start at column 0
        for item in items:
            blocks = []
            for indent, body in re.findall(r"(?ms)^( *)```diff\n(.*?)^\1```", item):
                lines = [line[len(indent):] if line.startswith(indent) else line.lstrip(" ")
                         for line in body.rstrip("\n").split("\n")]
                blocks.append([(line[:1] or " ", line[1:]) for line in lines])
            through = re.search(r"up to the end of section (\d+)", item) or re.search(
                r"up to the end of section (\d+)", preamble)
            found.append(Exercise(int(item.split(".", 1)[0]), item.strip(), blocks,
                                  int(through.group(1)) if through else None))
    return found


def apply_exercise(notebook: nbformat.NotebookNode, exercise: Exercise) -> tuple[nbformat.NotebookNode, list[int]]:
    """A copy of the notebook with the exercise's edits made, and the indices of the cells they changed.

    Each diff block's "-" and " " lines must appear, in order and adjacent, in exactly one code cell."""
    edited = copy.deepcopy(notebook)
    changed = []
    for block in exercise.edits:
        old = [line.rstrip() for op, line in block if op in " -"]
        new = [line for op, line in block if op in " +"]
        matches = []
        for index, cell in enumerate(edited.cells):
            if cell.cell_type != "code":
                continue
            lines = [line.rstrip() for line in cell.source.split("\n")]
            matches += [(index, start) for start in range(len(lines) - len(old) + 1)
                        if lines[start:start + len(old)] == old]
        if len(matches) != 1:
            raise ValueError(f"exercise {exercise.number}: the lines to change appear {len(matches)} times in the "
                             f"code cells, not once:\n" + "\n".join(old))
        index, start = matches[0]
        lines = edited.cells[index].source.split("\n")
        edited.cells[index].source = "\n".join(lines[:start] + new + lines[start + len(old):])
        changed.append(index)
    return edited, sorted(set(changed))


def section_end(notebook: nbformat.NotebookNode, index: int) -> int:
    """The index of the first markdown cell after `index` that opens a section ("## ..."), or the cell count."""
    for later in range(index + 1, len(notebook.cells)):
        cell = notebook.cells[later]
        if cell.cell_type == "markdown" and re.search(r"(?m)^## ", cell.source):
            return later
    return len(notebook.cells)


def cell_names(source: str) -> tuple[dict[str, bool], set[str]] | None:
    """What a code cell defines at the top level ({name: defined whatever the branch taken}) and the names it reads
    (anywhere, its functions included); None if it is not plain Python. A shell line (`!cmd {expr}`) reads the
    names in its braces."""
    lines, shell_names = [], set()
    for line in source.split("\n"):
        if line.lstrip().startswith(("!", "%")):
            shell_names |= set(re.findall(r"[A-Za-z_]\w*", " ".join(re.findall(r"\{([^}]*)\}", line))))
            line = ""
        lines.append(line)
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return None
    defined = {}

    def bind(target, always):
        for node in ast.walk(target):
            if isinstance(node, ast.Name):
                defined[node.id] = defined.get(node.id, False) or always

    def visit(statements, always):
        for node in statements:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined[node.name] = defined.get(node.name, False) or always
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    name = (alias.asname or alias.name).split(".")[0]
                    defined[name] = defined.get(name, False) or always
            elif isinstance(node, ast.Assign):
                for target in node.targets:
                    bind(target, always)
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                bind(node.target, always)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                bind(node.target, False)
                visit(node.body + node.orelse, False)
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        bind(item.optional_vars, always)
                visit(node.body, always)
            elif isinstance(node, (ast.If, ast.While)):
                visit(node.body + node.orelse, False)
            elif isinstance(node, ast.Try):
                visit(node.body + node.orelse + node.finalbody, False)
                for handler in node.handlers:
                    visit(handler.body, False)

    visit(tree.body, True)
    used = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
    return defined, (used | shell_names) - {name for name, always in defined.items() if always} - set(dir(builtins))


def needed_cells(notebook: nbformat.NotebookNode, first: int, end: int) -> set[int]:
    """The code cells to run so that cells first..end-1 run as they would after the whole notebook above them: those
    cells, and before them every cell that defines a name they read (back to a definition made whatever the branch
    taken), and so on. Cells that read no such name are left out: what an exercise's test need not wait for."""
    names = {i: cell_names(c.source) for i, c in enumerate(notebook.cells) if c.cell_type == "code"}
    todo = [i for i in names if first <= i < end]
    needed = set(todo)
    while todo:
        i = todo.pop()
        if names[i] is None:  # not plain Python: everything before it
            wanted = {j for j in names if j < i}
        else:
            wanted = set()
            for name in names[i][1]:
                for j in sorted((j for j in names if j < i), reverse=True):
                    if names[j] is None or name in names[j][0]:
                        wanted.add(j)
                        if names[j] is not None and names[j][0][name]:
                            break  # defined whatever the branch taken: earlier definitions do not matter
        for j in wanted - needed:
            needed.add(j)
            todo.append(j)
    return needed


def exercise_notebook(notebook: nbformat.NotebookNode, exercise: Exercise) -> nbformat.NotebookNode:
    """What a student runs for the exercise: the notebook with its edits, from the edited cell to the end of its
    section ("re-run that cell and the rest of its section"), and the section the exercise names if it names one
    ("up to the end of section N") — with, above them, the first code cell (the set-up) and the cells those read
    names from (`needed_cells`), as if the whole notebook had run before."""
    edited, changed = apply_exercise(notebook, exercise)
    ranges = [(changed[0], section_end(edited, changed[-1]))]
    if exercise.through_section is not None:
        heading = [i for i, c in enumerate(edited.cells)
                   if c.cell_type == "markdown" and re.search(rf"(?m)^## {exercise.through_section}\. ", c.source)]
        if len(heading) != 1:
            raise ValueError(f"exercise {exercise.number}: no single '## {exercise.through_section}. ' heading")
        ranges.append((heading[0], section_end(edited, heading[0])))
    keep = {next(i for i, c in enumerate(edited.cells) if c.cell_type == "code")}
    for first, end in ranges:
        keep |= needed_cells(edited, first, end)
    end = max(end for _, end in ranges)
    edited.cells = [c for i, c in enumerate(edited.cells[:end]) if c.cell_type != "code" or i in keep]
    return edited


def collapse_streams(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Merge each cell's consecutive stream outputs and keep what a terminal shows of a progress bar: the text after
    the last carriage return of each line. So a committed notebook holds a bar's last state, not its every update."""
    for cell in notebook.cells:
        merged = []
        for output in cell.get("outputs", []):
            if (output["output_type"] == "stream" and merged and merged[-1]["output_type"] == "stream"
                    and merged[-1]["name"] == output["name"]):
                merged[-1]["text"] += output["text"]
            else:
                merged.append(output)
        for output in merged:
            if output["output_type"] == "stream":
                output["text"] = "\n".join(line.rstrip("\r").rsplit("\r", 1)[-1]
                                           for line in output["text"].split("\n"))
        if "outputs" in cell:
            cell["outputs"] = merged
    return notebook


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="*", type=Path)
    parser.add_argument("--fast", action="store_true", help="MINIGRPO_FAST=1: a few steps instead of the lesson")
    parser.add_argument("--out", type=Path, help="write executed copies here instead of in place")
    parser.add_argument("--threads", type=int, help="OMP_NUM_THREADS for the kernels (1 on a shared CPU)")
    parser.add_argument("--exercise", type=int, help="run this 'Try this' exercise, edited in (up to the end of "
                                                     "the edited cell's section); needs --out")
    args = parser.parse_args()
    if args.exercise is not None and not args.out:
        parser.error("--exercise writes the edited notebook elsewhere: give --out")
    paths = args.notebooks or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:
        t0 = time.time()
        edited = None
        if args.exercise is not None:
            original = nbformat.read(path, as_version=4)
            chosen = [e for e in exercises(original) if e.number == args.exercise]
            if not chosen or not chosen[0].edits:
                print(f"{path.name}: no exercise {args.exercise} with an edit", flush=True)
                continue
            edited = exercise_notebook(original, chosen[0])
        notebook = execute_notebook(path.resolve(), fast=args.fast, threads=args.threads, notebook=edited)
        target = (args.out / path.name) if args.out else path
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(collapse_streams(notebook), target)
        print(f"{path.name}: executed in {time.time() - t0:.0f} s -> {target}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
