"""Running code minigrpo did not write, outside the trainer's process: third-party verifiers and the python tool.

A verifier from a library can do anything with the text it is given. reasoning-gym's countdown scorer hands the
answer to sympy's ``parse_expr``, which evaluates Python: an answer ``__import__('pathlib').Path('pwned.txt')
.write_text('x')`` writes that file; ``9**9**9**9`` never returns; ten thousand nested parentheses can overflow
the C stack. A model in RL tries everything, so minigrpo never hands a completion's text to such code in the
trainer's process. It runs in a worker process with

    a time limit        per call; a call past it has its worker killed (process group and all) and restarted
    a memory limit      RLIMIT_AS: the worker's address space after its imports, plus ``memory_bytes``
    an output limit     a result longer than ``max_result_chars`` is a failure; the worker's own stdout and
                        stderr go to /dev/null, so a chatty verifier cannot garble the replies
    its own place       a fresh temporary working directory (emptied after every call, removed with the worker),
                        a minimal environment, no file descriptors but its two pipes, its own session, and
                        RLIMIT_FSIZE (16 MB) on any file it writes; it dies with the trainer (PR_SET_DEATHSIG)

These are **resource limits, not a security sandbox**: code that runs in the worker can still read and write
any file the user can (by absolute path), open sockets, and even forge its own call's reply. What it cannot do
is hang or crash the trainer, exhaust its memory, write into its working directory, or hand it a pickle: replies
come back as JSON lines, never unpickled.

One mechanism, two uses:

    call_isolated("minigrpo.sandbox.verifiers:reasoning_gym_score", [(answer, entry, options), ...], timeout=5)
        -> [CallResult(value=1.0), CallResult(value=None, error="timeout"), ...]     a kept-alive worker
    run_python(code, timeout=10)  ->  ScriptResult(output, status, timed_out, output_cut)  a fresh interpreter

A batch of calls goes to one long-lived worker as one message; the worker answers call by call, and the clock
for each call starts when the previous answer arrives. A call that times out or kills its worker is marked
failed, the worker is restarted, and the rest of the batch is sent again. Failed calls are counted
(``take_failed_count``): the trainer logs them per step as ``rewards/verifier_failed``.

Measured on 2 CPU cores shared with other work (batches of reasoning-gym entries, their reference answers):
``gsm_symbolic``'s scorer (string compare) runs ~40,000-55,000 calls/s through the worker, ~12 ms for a batch of
512 and ~0.15 ms for a batch of one (the round trip: the per-batch overhead); ``countdown``'s (sympy) ~700
calls/s, its own cost. Starting a worker that imports reasoning-gym takes ~0.7-0.9 s, so a timeout costs its
time limit plus about a second.
"""

import atexit
import ctypes
import importlib
import json
import math
import os
import pickle
import resource
import select
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass

from ..errors import MinigrpoError

__all__ = ["CallResult", "IsolatedCaller", "IsolationError", "call_isolated", "take_failed_count", "run_python",
           "ScriptResult", "Limits"]

FILE_SIZE_LIMIT = 16 << 20  # bytes any file written by isolated code may grow to
_HEADER = struct.Struct("<Q")  # length prefix of a request (trainer -> worker; a pickle, trusted direction)


class IsolationError(MinigrpoError, RuntimeError):
    """The worker could not start at all (its target does not import): a set-up problem, not a failed call."""


@dataclass(frozen=True)
class Limits:
    """What one isolated call may use: wall-clock seconds, memory beyond the worker's imports, result characters."""

    timeout: float = 5.0
    memory_bytes: int = 1 << 30
    max_result_chars: int = 100_000


@dataclass(frozen=True)
class CallResult:
    """One call's outcome: ``value`` (what the function returned, through JSON) or ``error`` ("timeout",
    "crashed (signal 11)", "raised ValueError: ...", "result too large")."""

    value: object = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def minimal_env(home: str) -> dict:
    """The environment isolated code sees: no tokens, no proxies, no PYTHON* variables; UTF-8; one thread."""
    return {"PATH": os.defpath, "HOME": home, "TMPDIR": home, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8",
            "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _die_with_parent():
    """Linux: the kernel sends SIGKILL to this process when its parent (the trainer) exits."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _address_space() -> int:
    """This process's current virtual memory size in bytes (Linux /proc), 0 where unknown."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


def resolve(target: str):
    """"package.module:function" (or "module:Class.method") -> the callable."""
    module, _, name = target.partition(":")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


# ---- the worker (runs in the child process) ----------------------------------------------------------------
def worker_main(setup_json: str) -> None:
    """The child's loop: import the target, set the limits, then answer batches of calls as JSON lines.

    Requests are length-prefixed pickles of ``[(index, args), ...]`` on fd 0; every reply is one line
    ``{"i": index, "value": ...}`` or ``{"i": index, "error": "..."}`` on a private copy of fd 1. The first line
    says whether the target imported: ``{"ready": true}`` or ``{"ready": false, "error": ...}``."""
    setup = json.loads(setup_json)
    sys.path[:0] = setup["sys_path"]
    requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)  # the verifier's own prints go nowhere
    _die_with_parent()
    try:
        func = resolve(setup["target"])
    except Exception as exc:  # noqa: BLE001 - reported to the parent as a set-up error
        replies.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"[:500]}) + "\n")
        return
    limit = _address_space() + setup["memory_bytes"]
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    replies.write(json.dumps({"ready": True}) + "\n")
    workdir = os.getcwd()
    while header := requests.read(_HEADER.size):
        for index, args in pickle.loads(requests.read(_HEADER.unpack(header)[0])):
            replies.write(_answer(func, index, args, setup["max_result_chars"]) + "\n")
            _empty_dir(workdir)


def _answer(func, index: int, args: tuple, max_chars: int) -> str:
    """One call's reply line; an exception (MemoryError included) becomes an error, the worker lives on."""
    try:
        reply = json.dumps({"i": index, "value": func(*args)})
    except BaseException as exc:  # noqa: BLE001 - SystemExit and RecursionError too: the call failed, not the worker
        reply = json.dumps({"i": index, "error": f"raised {type(exc).__name__}: {str(exc)[:200]}"})
    if len(reply) > max_chars:
        reply = json.dumps({"i": index, "error": "result too large"})
    return reply


def _empty_dir(workdir: str) -> None:
    """Go back to the worker's own directory (a call may have changed it) and remove whatever the last call left
    there, so no call sees another's files. By absolute path: never whatever directory the call moved to."""
    os.chdir(workdir)
    for entry in os.scandir(workdir):
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass


# ---- the trainer's side --------------------------------------------------------------------------------------
class IsolatedCaller:
    """Calls ``target`` ("module:function") in a kept-alive worker process, one batch at a time.

        caller = IsolatedCaller("minigrpo.sandbox.verifiers:reasoning_gym_score", Limits(timeout=5))
        results = caller.map([(answer, entry, options), ...])     # one CallResult per call, in order
        caller.failed                                             # calls that failed so far

    Never raises for a call (a hang, a crash, an exception or an oversized result is a failed CallResult);
    raises IsolationError only if the worker cannot import its target. Not thread-safe: one caller per thread.
    """

    def __init__(self, target: str, limits: Limits = Limits(), start_timeout: float = 120.0):
        self.target, self.limits, self.start_timeout = target, limits, start_timeout
        self.failed = 0
        self._proc = self._dir = None
        self._buffer = b""

    def map(self, calls: list[tuple]) -> list[CallResult]:
        """Run ``target(*args)`` for every args tuple of ``calls``; the results in the same order."""
        results: list[CallResult | None] = [None] * len(calls)
        pending = list(range(len(calls)))
        while pending:
            self._start()
            writer = threading.Thread(target=self._send, args=([(i, calls[i]) for i in pending],), daemon=True)
            writer.start()
            pending = self._collect(pending, results)
            writer.join(timeout=1.0)
        self.failed += sum(not r.ok for r in results)
        return results

    def _collect(self, pending: list[int], results: list) -> list[int]:
        """Read the replies to ``pending`` in order; on a timeout or a dead worker, fail that call, kill the
        worker and return the calls still unanswered (empty when all came back)."""
        for position, index in enumerate(pending):
            reply, problem = self._read_line(time.monotonic() + self.limits.timeout)
            if reply is not None:
                try:
                    message = json.loads(reply)
                    problem = None if message.get("i") == index else "reply out of order"
                except (ValueError, AttributeError):
                    problem = "reply not JSON"
            if problem is not None:
                results[index] = CallResult(error=problem)
                self.close()
                return pending[position + 1:]
            results[index] = CallResult(value=message.get("value"), error=message.get("error"))
        return []

    def _read_line(self, deadline: float) -> tuple[bytes | None, str | None]:
        """The worker's next reply line, or (None, why): "timeout", "crashed (...)", "result too large"."""
        cap = self.limits.max_result_chars + 100
        while b"\n" not in self._buffer:
            if len(self._buffer) > cap:
                return None, "result too large"
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._proc.stdout], [], [], left)[0]:
                return None, "timeout"
            chunk = os.read(self._proc.stdout.fileno(), 1 << 16)
            if not chunk:
                code = self._proc.wait()
                return None, f"crashed (signal {-code})" if code < 0 else f"crashed (exit {code})"
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return (line, None) if len(line) <= cap else (None, "result too large")

    def _start(self) -> None:
        """Start the worker if none is running, and wait for it to say that its target imported."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self.close()
        self._dir = tempfile.mkdtemp(prefix="minigrpo-worker-")
        setup = {"target": self.target, "memory_bytes": self.limits.memory_bytes,
                 "max_result_chars": self.limits.max_result_chars,
                 "sys_path": [os.path.abspath(p or os.getcwd()) for p in sys.path]}
        boot = (f"import sys; sys.path.insert(0, {_package_root()!r}); "
                "from minigrpo.sandbox.isolation import worker_main; worker_main(sys.argv[1])")
        self._proc = subprocess.Popen([sys.executable, "-I", "-c", boot, json.dumps(setup)], cwd=self._dir,
                                      env=minimal_env(self._dir),
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                      close_fds=True, start_new_session=True)
        reply, problem = self._read_line(time.monotonic() + self.start_timeout)
        ready = json.loads(reply) if reply is not None else {"error": problem}
        if not ready.get("ready"):
            self.close()
            raise IsolationError(f"isolated worker for {self.target!r} did not start: {ready.get('error')}")

    def _send(self, batch: list) -> None:
        """Write one batch (from a thread: a big batch must not block the reader). A dead worker is fine here:
        the reader notices."""
        payload = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            self._proc.stdin.write(_HEADER.pack(len(payload)) + payload)
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError, AttributeError):
            pass

    def close(self) -> None:
        """Kill the worker (its whole process group) and remove its directory."""
        if self._proc is not None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._buffer = b""


def _package_root() -> str:
    """The folder that holds the minigrpo package, so the worker imports this very copy (``-I`` ignores
    PYTHONPATH, and a clone need not be installed)."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_CALLERS: dict[tuple, IsolatedCaller] = {}
_failed_not_taken = 0
_calls_not_taken = 0
_lock = threading.Lock()


def call_isolated(target: str, calls: list[tuple], *, timeout: float = 5.0, memory_bytes: int = 1 << 30,
                  max_result_chars: int = 100_000) -> list[CallResult]:
    """``target(*args)`` for each args tuple in ``calls``, in a kept-alive worker process (one per target and
    limits, started on first use, closed at exit). See the module docstring for the limits and the figures.
    Failed calls add to ``take_failed_count()``."""
    global _failed_not_taken, _calls_not_taken
    limits = Limits(timeout, memory_bytes, max_result_chars)
    with _lock:
        caller = _CALLERS.get((target, limits))
        if caller is None:
            caller = _CALLERS[(target, limits)] = IsolatedCaller(target, limits)
        results = caller.map(list(calls))
        _failed_not_taken += sum(not r.ok for r in results)
        _calls_not_taken += len(results)
    return results


def take_failed_count() -> int | None:
    """Calls through ``call_isolated`` that failed (timeout, crash, exception, oversized result) since the last
    take, or None when there was no call since then; the trainer logs it as ``rewards/verifier_failed`` on each
    step whose rewards called a verifier."""
    global _failed_not_taken, _calls_not_taken
    with _lock:
        count, calls, _failed_not_taken, _calls_not_taken = _failed_not_taken, _calls_not_taken, 0, 0
    return count if calls else None


@atexit.register
def _close_all() -> None:
    for caller in _CALLERS.values():
        caller.close()


# ---- a fresh interpreter per call: the python tool ----------------------------------------------------------
# The script dies with whoever started it (PR_SET_PDEATHSIG: a tool worker killed for its own time limit takes
# the script along, though the script has a session of its own) and after `cpu` seconds of CPU (RLIMIT_CPU),
# whatever happens to its parent.
_PYTHON_BOOT = """\
import ctypes, resource, signal, sys, traceback
try:
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)
except (OSError, AttributeError):
    pass
limit, cpu = int(sys.argv[1]), int(sys.argv[2]); resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
resource.setrlimit(resource.RLIMIT_FSIZE, ({fsize}, {fsize})); resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
sys.argv = ["main.py"]
try:
    source = open("main.py", encoding="utf-8").read()
    exec(compile(source, "main.py", "exec"), {{"__name__": "__main__", "__builtins__": __builtins__}})
except SystemExit:
    raise
except BaseException as exc:
    traceback.print_exception(type(exc), exc, exc.__traceback__.tb_next)
    sys.exit(1)
""".format(fsize=FILE_SIZE_LIMIT)


@dataclass(frozen=True)
class ScriptResult:
    """What a script run by ``run_python`` left: its output (stdout and stderr interleaved, cut to the budget),
    its exit status (negative: killed by that signal; None: killed for time), and what stopped it early."""

    output: str
    status: int | None
    timed_out: bool = False
    output_cut: bool = False


def run_python(code: str, *, timeout: float = 10.0, memory_bytes: int = 512 << 20,
               max_output_chars: int = 4000) -> ScriptResult:
    """Run ``code`` as a script in a fresh ``python -I -S`` (no site-packages, no user site, no PYTHON* variables)
    in an empty temporary directory, with the limits of the module docstring (RLIMIT_AS = ``memory_bytes``).

    Output beyond twice the budget is not even read: the process is killed, so a loop that prints forever costs
    neither memory nor the whole time limit. The directory is removed afterwards."""
    workdir = tempfile.mkdtemp(prefix="minigrpo-python-")
    try:
        with open(os.path.join(workdir, "main.py"), "w", encoding="utf-8") as f:
            f.write(code)
        cpu_seconds = str(math.ceil(timeout) + 1)
        proc = subprocess.Popen([sys.executable, "-I", "-S", "-c", _PYTHON_BOOT, str(memory_bytes), cpu_seconds],
                                cwd=workdir,
                                env=minimal_env(workdir), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, close_fds=True, start_new_session=True)
        output, timed_out = _read_bounded(proc, time.monotonic() + timeout, 2 * max_output_chars + 16)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the script's own children, if it started any
        except (ProcessLookupError, PermissionError):
            pass
        status = proc.wait()
        text = output.decode("utf-8", errors="replace")
        cut = len(text) > max_output_chars
        if cut:
            text = text[:max_output_chars] + f"\n[output cut at {max_output_chars} characters]"
        return ScriptResult(text, None if timed_out else status, timed_out, cut)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _read_bounded(proc: subprocess.Popen, deadline: float, max_bytes: int) -> tuple[bytes, bool]:
    """Read ``proc``'s stdout until EOF, ``max_bytes`` or ``deadline`` (then kill it): (bytes, timed out)."""
    chunks, size = [], 0
    fd = proc.stdout.fileno()
    while size < max_bytes:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.stdout.close()
            return b"".join(chunks), True
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    proc.stdout.close()
    return b"".join(chunks), False
