"""Running one tool call, safely: whatever the tool raises, however long it runs or however much it prints, the run
gets back ``(text, failed)`` and goes on. Not limited: its memory, and what a process of the trainer's user may do
(the worker is a fork of the trainer: a tool that fills the memory or kills its parent ends the run).

    text, failed = execute_tool_call(call, {"calculator": calculator}, timeout=10.0, max_output_chars=4000)

What comes back for each way a call can go wrong (``failed`` is True for all but the last line):

    malformed call (bad JSON, no name, ...)     the parser's error text (calls.py)
    unknown tool name                           "Error: unknown tool 'x'; the tools are: a, b."
    the tool raises                             "ZeroDivisionError: division by zero" (its type and message)
    the tool runs past `timeout` seconds        "Error: the tool 'x' did not return within 2 s and was stopped."
    its process dies (os._exit, a crash)        "Error: the tool 'x' ended its process (exit code 3)."
    it returns megabytes                        the first `max_output_chars` characters, then "[... 1999000 more
                                                characters cut]" (not a failure: the tool did answer)

A non-string result is written as JSON (``json.dumps``) when it can be, else with ``str``.

**Where a tool runs.** A Python thread cannot be stopped, so a function that never returns would hang a run that
waits for it, or leak a thread spinning forever beside it. Plain functions (TRL's ``tools=[fn, ...]``) therefore run
in a ``ToolWorker``: one child process, started once and reused for every call, which gets ``(name, arguments)``
through a pipe and sends back the finished text (cut to the budget there, so megabytes never cross the pipe). A call
past its time limit kills the worker (and any process the tool started: the worker leads its own process group) and
the next call starts a fresh one. Why one persistent worker rather than a process per call: a call then costs a
round trip through a pipe, ~0.1 ms, where forking the trainer's process (a gigabyte of torch, tokenizers and model
in its page tables) costs milliseconds per call, hundreds of times a step. The worker is forked where the platform
allows (Linux), so any function works, lambdas and closures included, and it sees the modules the trainer imported;
elsewhere it is spawned, and the functions must be importable by name. The worker must not use the GPU or torch's
thread pools (a forked child cannot); tools are plain Python.

Methods of an environment (``environment_factory``) are different: their state must persist between calls and be
read by ``get_reward`` in the trainer's process. They run in this process, in a thread that is waited on for
``timeout`` seconds; one that does not return in time is abandoned (a daemon thread, left running), the call fails,
and the caller should stop using that environment (``execute_tool_call`` reports it as a timeout).
"""

import json
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable

from .calls import ToolCall

__all__ = ["execute_tool_call", "ToolWorker", "tool_output_text", "cut_output"]


def tool_output_text(value) -> str:
    """A tool's return value as the text the model reads: a string as it is, else JSON, else ``str``."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def cut_output(text: str, max_chars: int) -> str:
    """At most ``max_chars`` characters of ``text``, with a note of how many more were cut."""
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[... {len(text) - max_chars} more characters cut]"


def _call(fn: Callable, arguments: dict, max_chars: int) -> tuple[str, bool]:
    """Call a tool; its answer or its exception as (text, failed)."""
    try:
        return cut_output(tool_output_text(fn(**arguments)), max_chars), False
    except Exception as e:  # the error text is the model's answer; a KeyboardInterrupt still stops the run
        return cut_output(f"{type(e).__name__}: {e}", max_chars), True


def execute_tool_call(call: ToolCall, tools: dict[str, Callable], *, timeout: float, max_output_chars: int,
                      worker: "ToolWorker | None" = None) -> tuple[str, bool]:
    """Run one parsed call against the table ``tools`` ({name: callable}); returns (text, failed).

    A tool the ``worker`` was started with runs there; any other (an environment's method) runs in this process,
    in a thread waited on for ``timeout`` seconds. See the module docstring for every failure's text.
    """
    if not call.ok:
        return call.error, True
    fn = tools.get(call.name)
    if fn is None:
        known = ", ".join(sorted(tools)) or "(none)"
        return f"Error: unknown tool {call.name!r}; the tools are: {known}.", True
    if worker is not None and worker.runs(call.name, fn):
        return worker.call(call.name, call.arguments, timeout=timeout)
    return _call_in_thread(call.name, fn, call.arguments, timeout, max_output_chars)


def _timeout_text(name: str, timeout: float) -> str:
    return f"Error: the tool {name!r} did not return within {timeout:g} s and was stopped."


def _call_in_thread(name: str, fn: Callable, arguments: dict, timeout: float, max_chars: int) -> tuple[str, bool]:
    answer = []
    thread = threading.Thread(target=lambda: answer.append(_call(fn, arguments, max_chars)), daemon=True)
    thread.start()
    thread.join(timeout)
    if not answer:  # still running: abandoned (a thread cannot be stopped)
        return _timeout_text(name, timeout), True
    return answer[0]


def _serve(conn, tools: dict[str, Callable], max_chars: int) -> None:
    """The worker's loop: receive (name, arguments), send back (text, failed), until the pipe closes."""
    if hasattr(os, "setsid"):
        os.setsid()  # its own process group, so a timeout kills what the tool started too
    conn.send("ready")
    while True:
        try:
            name, arguments = conn.recv()
        except (EOFError, KeyboardInterrupt):  # the trainer closed the pipe, or went away
            return
        conn.send(_call(tools[name], arguments, max_chars))


class ToolWorker:
    """One child process that runs a fixed table of tools, one call at a time (see the module docstring).

    Started on the first call (or ``start()``), restarted after a call that timed out or killed it; ``close()``
    ends it (also a context manager). ``start_method``: "fork" where available, else "spawn".
    """

    def __init__(self, tools: dict[str, Callable], *, max_output_chars: int, start_method: str | None = None):
        self.tools, self.max_output_chars = dict(tools), max_output_chars
        methods = multiprocessing.get_all_start_methods()
        self._context = multiprocessing.get_context(start_method or ("fork" if "fork" in methods else "spawn"))
        self._process, self._conn = None, None

    def runs(self, name: str, fn: Callable) -> bool:
        """Whether this worker holds ``fn`` under ``name``."""
        return self.tools.get(name) is fn

    def start(self) -> None:
        self._conn, child_conn = self._context.Pipe()
        self._process = self._context.Process(target=_serve, args=(child_conn, self.tools, self.max_output_chars),
                                              daemon=True, name="minigrpo-tool-worker")
        self._process.start()
        child_conn.close()
        if not self._conn.poll(60) or self._conn.recv() != "ready":
            self.close()
            raise RuntimeError("the tool worker process did not start within 60 s")

    def call(self, name: str, arguments: dict, *, timeout: float) -> tuple[str, bool]:
        """Run ``tools[name](**arguments)`` in the worker; (text, failed), a timeout or a dead worker included."""
        if self._process is None or not self._process.is_alive():
            self.start()
        try:
            self._conn.send((name, arguments))
            if not self._conn.poll(timeout):
                self.close()
                return _timeout_text(name, timeout), True
            return self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._process.join(1)
            code = self._process.exitcode
            self.close()
            return f"Error: the tool {name!r} ended its process (exit code {code}).", True

    def close(self) -> None:
        """Kill the worker and whatever it started; a later call starts a fresh one."""
        if self._process is not None:
            if self._process.is_alive():
                try:
                    os.killpg(self._process.pid, signal.SIGKILL)  # the worker leads its own group (setsid)
                except (AttributeError, ProcessLookupError, PermissionError):
                    self._process.kill()
            self._process.join(5)
            self._process.close()
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
