"""Functions named on the command line or in YAML: "package.module:function" or "path/to/file.py:function".

Reward functions (`reward_funcs`) and tools (`tools`) are loaded this way, as TRL's scripts import them.
"""

import importlib
import importlib.util
from pathlib import Path

__all__ = ["load_callable", "callable_name"]


def load_callable(spec: str, key: str, error: type[Exception] = ValueError):
    """The callable a spec names. A spec that does not import, or names no callable, raises `error` in one line
    starting with `key` (the config field it came from)."""
    target, _, attr = spec.rpartition(":")
    if not target or not attr:
        raise error(f"{key}: {spec!r} is not a known name, module:function or file.py:function")
    try:
        if target.endswith(".py"):
            path = Path(target).expanduser()
            if not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            module_spec = importlib.util.spec_from_file_location(f"minigrpo_user_{key}_{path.stem}", path)
            module = importlib.util.module_from_spec(module_spec)
            module_spec.loader.exec_module(module)  # the user's own file, as TRL's scripts import modules
        else:
            module = importlib.import_module(target)
        func = getattr(module, attr)
    except Exception as exc:  # noqa: BLE001 - ImportError, SyntaxError, AttributeError, ...: one line
        raise error(f"{key}: cannot load {spec!r}: {type(exc).__name__}: {exc}") from None
    if not callable(func):
        raise error(f"{key}: {spec!r} is a {type(func).__name__}, not a function")
    return func


def callable_name(func) -> str:
    """The name config.yaml records for a function handed over from Python: "module:function" (what load_callable
    reads back) for a function of an importable module; "__main__:function" for one defined in the script or
    notebook that runs (it cannot be reloaded from the file without running the script again); for an object
    with no name (a reward model, a functools.partial), its class. A bound method is "module:Class.method"."""
    module = getattr(func, "__module__", None)
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", None)
    if module is None or name is None:
        inner = getattr(func, "func", None)  # functools.partial
        return f"partial({callable_name(inner)})" if inner is not None else f"<{type(func).__name__} object>"
    return f"{module}:{name}"
