"""The shape of the package, checked: short functions a reader can hold in mind, and the library apart from the lab.

Lengths count a function's code lines, from its first statement after the docstring to its last (comments and blank
lines inside included): the docstring is the equation and the contract, which we do not want shortened.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "minigrpo"
LAB = PACKAGE / "lab"
LIBRARY = sorted(p for p in PACKAGE.rglob("*.py") if LAB not in p.parents and p.name != "cli.py")

MAX_LINES = 80  # any function of the library
LONGER_ALLOWED = {"train": 75}  # the one loop a newcomer reads top to bottom
SHORTER_REQUIRED = {"policy_loss": 60}  # a pipeline: ratio -> surrogate -> token selection -> KL -> aggregation


def code_lines(node: ast.FunctionDef) -> int:
    body = node.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    return 0 if not body else body[-1].end_lineno - body[0].lineno + 1


def functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node


def test_code_lines_counts_the_body_without_its_docstring():
    (f,) = ast.parse('def f(x):\n    """Doc.\n\n    More."""\n    y = x\n\n    return y\n').body
    assert code_lines(f) == 3


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_library_functions_are_short(path):
    too_long = []
    for f in functions(path):
        limit = SHORTER_REQUIRED.get(f.name) or LONGER_ALLOWED.get(f.name, MAX_LINES)
        if code_lines(f) > limit:
            too_long.append(f"{f.name} (line {f.lineno}): {code_lines(f)} lines, at most {limit}")
    assert not too_long, f"{path.name}: " + "; ".join(too_long)


def test_the_named_functions_exist():  # so that a rename cannot silently lift their limits
    names = {f.name for path in LIBRARY for f in functions(path)}
    assert set(LONGER_ALLOWED) | set(SHORTER_REQUIRED) <= names


@pytest.mark.parametrize("path", LIBRARY, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_library_does_not_import_the_lab_at_import_time(path):
    # The lab (benchmarks, memory measurement, plots, the stand-in) may import the library, not the reverse; the
    # one exception is the plots a finished run draws, imported inside the function that draws them.
    for node in ast.parse(path.read_text()).body:  # module level only
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            assert "lab" not in module.split("."), f"{path.name}: {module} imported at module level"


# The loops, their set-up, the Config itself, and TRL's front door to them (GRPOConfig is a Config; GRPOTrainer makes
# the Config that train() runs).
LOOP_FLOOR = {"trainer.py", "ppo_trainer.py", "sft.py", "reward_trainer.py", "dpo_trainer.py", "run.py", "collect.py",
              "config.py", "grpo_config.py", "grpo_trainer.py"}


@pytest.mark.parametrize("path", [p for p in LIBRARY if p.name not in LOOP_FLOOR or p.parent != PACKAGE],
                         ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_loop_floor_reads_the_config(path):
    # Below the trainers (and run.py / collect.py, their set-up and steps 1-3), functions take values: a student
    # lifts a module with torch alone, without building a validated Config.
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[-1] == "config":
            assert all(a.name != "Config" for a in node.names), f"{path.name} imports Config"
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = [a.arg for a in node.args.args + node.args.kwonlyargs]
            assert "cfg" not in args, f"{path.name}: {node.name}(cfg, ...) reads the Config"


def imported_modules(path: Path) -> set[str]:
    """The package's modules that path imports, at module level or inside a function (a lazy import is still a tie
    a reader follows). `from . import x` names module x where x is one; the package a module sits in is not counted
    (Python imports it first, but a reader does not follow it)."""
    name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = (package[: len(package) - node.level + 1] if node.level else []) + (node.module or "").split(".")
            base = ".".join(part for part in base if part)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found |= {target for target in targets if target in MODULES and target != name}
    return found


MODULES = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
           for p in PACKAGE.rglob("*.py")}


def import_circles() -> list[list[str]]:
    """Every group of the package's modules that import each other in a loop (Tarjan's strongly connected
    components of the import graph, lazy imports included)."""
    graph = {".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__"):
             imported_modules(p) for p in PACKAGE.rglob("*.py")}
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return circles


def test_import_circles_are_found():  # the finder itself, on the package's own ties
    assert "minigrpo.objectives.registry" in imported_modules(PACKAGE / "objectives" / "grpo.py")
    assert "minigrpo.errors" in imported_modules(PACKAGE / "config.py")


def test_no_import_circles():
    # Each module imports only modules that do not import it back, lazily or not: the package reads in one
    # direction, floor by floor, and any file can be lifted with what it imports.
    assert import_circles() == []


def test_one_process_never_imports_the_scale_out_engines(tmp_path):
    # A student reading one GRPO step in one process never enters the DDP / FSDP2 file: the trainer's one seam
    # (parallel/processes.py) hands it LogprobForward(model), and imports ddp_fsdp.py only when W > 1.
    import os
    import subprocess
    import sys

    script = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('minigrpo.parallel.ddp_fsdp')\n"
        "from minigrpo.config import Config\n"
        "from minigrpo.trainer import train\n"
        f"train(Config(output_dir={str(tmp_path / 'run')!r}, max_steps=1, num_generations=4, generation_batch_size=8,"
        " num_iterations=2, beta=0.04, eval_limit=4, eval_num_samples=0, save_model=False, log_completions=False),"
        " progress=False)\n"
        "engines = sorted(m for m in sys.modules if m.startswith('minigrpo.parallel.ddp_fsdp'))\n"
        "assert 'minigrpo.trainer' in sys.modules and not engines, engines\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
