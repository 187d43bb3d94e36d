"""Peak memory, one way for the whole package: the trainers' summary, `minigrpo bench` and `minigrpo memory`.

    peak_memory_bytes(device)      the peak so far: CUDA's allocator peak, or the process's peak resident set
    with PeakMemory(device) as p:  the peak a block of code adds on top of what was live when it started
        ...
    p.peak                         bytes

CUDA counts tensors only (torch.cuda.max_memory_allocated: not the caching allocator's slack, not the CUDA
context). On the CPU torch keeps no statistics, so the operating system's figure is used: the peak resident set
size (VmHWM), which Linux can reset to the current size (/proc/self/clear_refs, "5"), so a block's own peak is
measured exactly, not sampled. Elsewhere the peak covers the process's whole life (getrusage).
"""

import ctypes
import gc
import resource
import sys

import torch

__all__ = ["peak_memory_bytes", "reset_peak_memory", "PeakMemory"]


def peak_memory_bytes(device: torch.device | str) -> int:
    """The peak memory since the process started or since `reset_peak_memory`, in bytes.

    CPU, Linux: VmHWM from /proc/self/status, not getrusage's ru_maxrss: ru_maxrss survives fork + exec, so a
    process started by a big parent (a notebook, `minigrpo memory`) would report the parent's RSS as its own peak
    (measured: a 10 MB child of a 1.5 GB parent reports 1.5 GB). Elsewhere ru_maxrss (KiB on Linux, bytes on
    macOS). CPU figures include Python and torch's own libraries (a few hundred MB).
    """
    if torch.device(device).type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = _proc_status_bytes("VmHWM")
    if peak is None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = int(rss if sys.platform == "darwin" else rss * 1024)
    return peak


def current_memory_bytes(device: torch.device | str) -> int | None:
    """What is live now: CUDA's allocated tensors, or the process's resident set (VmRSS; None if unknown)."""
    if torch.device(device).type == "cuda":
        return int(torch.cuda.memory_allocated(device))
    return _proc_status_bytes("VmRSS")


def _proc_status_bytes(field: str) -> int | None:
    """A memory field of /proc/self/status (Linux; given in KiB) in bytes, or None where there is none."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith(f"{field}:"))
    except (OSError, StopIteration):
        return None


def reset_peak_memory(device: torch.device | str) -> None:
    """Start counting the peak afresh from what is live now. CPU: returns freed heap to the OS first (glibc
    keeps it otherwise, and the resident set would still hold the last block's memory); a no-op off Linux."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class PeakMemory:
    """The peak memory a block adds on top of what was live when it started: `peak` bytes after the block.

    Weights and optimizer states that exist before the block are not counted, so around one training step this
    is the step's own memory: activations, KV cache, logits, gradients (and Adam's moments on the first step)."""

    def __init__(self, device: torch.device | str):
        self.device, self.peak = torch.device(device), None

    def __enter__(self):
        reset_peak_memory(self.device)
        self.base = current_memory_bytes(self.device)
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if self.base is not None:
            self.peak = peak_memory_bytes(self.device) - self.base
