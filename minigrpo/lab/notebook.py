"""Small helpers the notebooks share: what is installed, how many threads, and whether to run the short version.

    from minigrpo.lab.notebook import fast_mode, print_versions, set_threads
    set_threads(1)            # one torch thread, as the shipped runs were made: live runs then repeat them exactly
    print_versions()          # python, torch, transformers, peft, minigrpo (and its commit), the device in use
    FAST = fast_mode()        # True when MINIGRPO_FAST=1: notebooks shrink their runs (CI does this)
"""

import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

__all__ = ["versions", "print_versions", "fast_mode", "set_threads", "source"]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    """Versions of the libraries a result depends on, and the device `device="auto"` picks."""
    import torch

    import minigrpo
    from minigrpo.loading.models import resolve_device

    device = resolve_device("auto")
    if device.type == "cuda":
        device_name = f"cuda ({torch.cuda.get_device_name(device)})"
    else:
        device_name = f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": _version("transformers"),
        "peft": _version("peft"),
        "minigrpo": f"{minigrpo.__version__} ({source()})",
        "device": device_name,
    }


def print_versions() -> dict[str, str]:
    """Print `versions()` one per line (the first cell of every notebook) and return them."""
    found = versions()
    for name, value in found.items():
        print(f"{name:13s} {value}")
    return found


def fast_mode() -> bool:
    """True when the environment variable MINIGRPO_FAST is 1: same code path, a few steps instead of many."""
    return os.environ.get("MINIGRPO_FAST", "0").strip().lower() in ("1", "true", "yes")


def source() -> str:
    """Where the imported minigrpo comes from, without the machine's paths: "git checkout, commit 46b497a" when
    it is a git checkout (the commit says which code made a notebook's outputs), else "installed package"."""
    import minigrpo

    package_dir = Path(minigrpo.__file__).resolve().parent
    try:
        commit = subprocess.run(["git", "-C", str(package_dir.parent), "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):  # no git, or not a checkout
        return "installed package"
    return f"git checkout, commit {commit}"


def set_threads(num_threads: int = 1) -> int:
    """Use `num_threads` torch threads in this process (the notebooks' first cell asks for 1); returns it.

    Why one: the shipped runs in data/reference_runs/ were made with one thread (OMP_NUM_THREADS=1). Work split
    over several threads can add its terms in another order, which changes the last bits of the log-probs and
    gradients (measured on this project's CPU: with 3, 4 or 8 threads a batch's log-probs differed from one
    thread's by up to 2e-6 and its gradient by 3e-5); the weights then drift apart, sampling draws a different
    token somewhere, and a live run is no longer the shipped run's first steps. With one thread the notebooks'
    "identical to the shipped run" checks hold on any machine with the same torch. At this model's size one thread costs little, and on a CPU shared with other
    jobs it also avoids OpenMP's busy-waiting (scripts/run_notebooks.py).
    """
    import torch

    torch.set_num_threads(num_threads)
    return torch.get_num_threads()
