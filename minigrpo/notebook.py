"""Small helpers the notebooks share: what is installed, and whether to run the short version.

    from minigrpo.notebook import print_versions, fast_mode
    print_versions()          # python, torch, transformers, peft, minigrpo, and the device in use
    FAST = fast_mode()        # True when MINIGRPO_FAST=1: notebooks shrink their runs (CI does this)
"""

import os
import platform
import sys
from importlib import metadata
from pathlib import Path

__all__ = ["versions", "print_versions", "fast_mode"]


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "not installed"


def versions() -> dict[str, str]:
    """Versions of the libraries a result depends on, and the device `device="auto"` picks."""
    import torch

    import minigrpo
    from minigrpo.models import resolve_device

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
        "minigrpo": f"{minigrpo.__version__} ({Path(minigrpo.__file__).parent})",
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
