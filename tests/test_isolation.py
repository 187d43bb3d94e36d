"""Running code minigrpo did not write: the isolated worker (call_isolated) and the python / calculator tools.

The worker's failure modes use standard-library functions as stand-in verifiers: ``time:sleep`` hangs,
``operator:truediv`` raises, ``operator:mul`` on a string allocates, ``os:abort`` crashes the process.
"""

import os
import tempfile
import time

import pytest

from minigrpo.sandbox.isolation import CallResult, IsolatedCaller, IsolationError, Limits, call_isolated, take_failed_count
from minigrpo.tools.builtin import calculator, evaluate_arithmetic, python


# ---- the worker ------------------------------------------------------------------------------------------------
def test_results_come_back_in_order_with_values():
    assert call_isolated("operator:add", [(1, 2), ("a", "b"), ([1], [2])]) == [
        CallResult(3), CallResult("ab"), CallResult([1, 2])]


def test_a_hanging_call_fails_alone_and_the_batch_goes_on():
    take_failed_count()
    start = time.monotonic()
    results = call_isolated("time:sleep", [(0,), (60,), (0,)], timeout=1.0)
    assert time.monotonic() - start < 15  # the 60 s call was cut at 1 s (plus a worker restart)
    assert [r.error for r in results] == [None, "timeout", None]
    assert take_failed_count() == 1 and take_failed_count() is None  # None: no call since the last take


def test_a_raising_call_fails_with_its_error_and_the_worker_lives_on():
    caller = IsolatedCaller("operator:truediv")
    try:
        first = caller.map([(1, 0), (1, 2)])
        pid = caller._proc.pid
        assert first[0].error.startswith("raised ZeroDivisionError") and first[1] == CallResult(0.5)
        assert caller.map([(3, 4)]) == [CallResult(0.75)] and caller._proc.pid == pid  # same worker, kept alive
        assert caller.failed == 1
    finally:
        caller.close()


def test_memory_beyond_the_limit_is_a_failed_call():
    results = call_isolated("operator:mul", [("x", 10**10), ("ab", 2)], memory_bytes=200 << 20)
    assert results[0].error == "raised MemoryError: " and results[1] == CallResult("abab")


def test_a_crash_kills_only_the_worker_which_is_restarted():
    caller = IsolatedCaller("os:abort")
    try:
        assert caller.map([(), ()]) == [CallResult(error="crashed (signal 6)")] * 2  # the second on a new worker
    finally:
        caller.close()


def test_prints_do_not_garble_replies_and_big_results_fail():
    assert call_isolated("builtins:print", [("{\"i\": 99}",)]) == [CallResult(None)]
    too_large = [CallResult(error="result too large")]
    assert call_isolated("operator:mul", [("x", 10**6)], max_result_chars=1000) == too_large


def test_a_target_that_does_not_import_is_a_setup_error():
    with pytest.raises(IsolationError, match="no_such_module"):
        IsolatedCaller("no_such_module:f").map([()])


def test_a_call_that_writes_files_leaves_nothing_behind(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = set(os.listdir(tempfile.gettempdir()))
    results = call_isolated("pathlib:Path.write_text", [(__import__("pathlib").Path("pwned.txt"), "x")])
    assert results == [CallResult(1)]  # it did write, in the worker's own directory ...
    assert not (tmp_path / "pwned.txt").exists()  # ... not in the trainer's
    assert not any(name == "pwned.txt" for name in set(os.listdir(tempfile.gettempdir())) - before)


def test_limits_are_per_call():
    assert Limits().timeout == 5.0 and Limits(timeout=1).memory_bytes == 1 << 30


# ---- calculator: an AST walk, never eval --------------------------------------------------------------------------
@pytest.mark.parametrize("expression, value", [
    ("(3 + 4) * 12 / 7", "12.0"), ("2**10", "1024"), ("-(2 - 5) * 4", "12"), ("7 // 2", "3"), ("7 % 3", "1"),
    ("0.1 + 0.2", "0.30000000000000004"), ("2 ** -2", "0.25"), ("+5", "5"),
])
def test_calculator_values(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize("expression, error", [
    ("9**9**9**9", "exponent larger than"),  # 9**9 = 387,420,489 is the exponent of the next power: refused
    ("10**2000", "digits"), ("1/0", "division by zero"), ("1e308 * 10", "too large"),
    ("__import__('os').system('echo pwned')", "Call is not allowed"), ("True + 1", "Constant is not allowed"),
    ("x + 1", "Name is not allowed"), ("(-8) ** 0.5", "not a real number"),
    ("(" * 100_000 + "1" + ")" * 100_000, "longer than"), ("(" * 300 + "1" + ")" * 300, "not a valid"),
    ("1" * 1_000_000, "longer than"),
])
def test_calculator_refuses_with_a_message(expression, error):
    answer = calculator(expression)
    assert answer.startswith("Error:") and error in answer
    with pytest.raises(ValueError):
        evaluate_arithmetic(expression)


# ---- python: a fresh interpreter with limits ------------------------------------------------------------------
def test_python_runs_code_and_returns_its_output():
    assert python("print(6 * 7)") == "42\n"
    assert python("x = 1") == "(the script printed nothing)"
    assert python("1/0").endswith("ZeroDivisionError: division by zero\n")


def test_python_runs_elsewhere_with_a_minimal_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SECRET_TOKEN", "hunter2")
    out = python("import os; open('pwned.txt', 'w').write('x'); print(os.getcwd()); print(sorted(os.environ))")
    assert "SECRET_TOKEN" not in out and str(tmp_path) not in out
    assert not (tmp_path / "pwned.txt").exists()


def test_python_limits_time_memory_and_output():
    start = time.monotonic()
    import minigrpo.tools.builtin as tools

    old = tools.PYTHON_TIMEOUT
    tools.PYTHON_TIMEOUT = 1.0
    try:
        assert "time limit" in python("while True: pass")
    finally:
        tools.PYTHON_TIMEOUT = old
    assert time.monotonic() - start < 10
    assert "MemoryError" in python("x = bytearray(2**31)")
    flood = python("while True: print('x' * 1000)")
    assert flood.endswith("[output cut at 4000 characters]") and len(flood) < 4100


def _alive(pid: int) -> bool:
    """Whether pid is a running process (a zombie, dead but not yet reaped, is not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_script_outlives_neither_its_tool_worker_nor_its_cpu_limit(tmp_path):
    """The python tool's script has a session of its own, so killing the tool worker's process group (its call
    ran past tool_timeout) does not reach it: it must die with its parent, and a busy loop by its CPU limit."""
    from minigrpo.tools.execute import ToolWorker

    pid_file = tmp_path / "pid"
    code = f"import os\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\nwhile True: pass\n"
    worker = ToolWorker({"python": python}, max_output_chars=4000)
    try:
        text, failed = worker.call("python", {"code": code}, timeout=2)  # the tool's own limit is longer
    finally:
        worker.close()
    assert failed
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(pid), "the script kept running after its tool worker was killed"
