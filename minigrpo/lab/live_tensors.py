"""The peak of live tensor memory over a block of code, counted tensor by tensor: deterministic, on any device.

    with LiveTensorBytes() as live:
        logp, _ = completion_logprobs(model, *ids)
        logp.sum().backward()
    live.peak          # bytes: the most that tensors made inside the block held at once

`peak_memory.PeakMemory` reads what the operating system or CUDA's allocator says, which is what a user pays but
moves with the allocator (glibc keeps freed heap, a page is resident or not). This counts instead the storage of
every tensor an operator returns inside the block (forward and backward alike: on the CPU backward runs in the
calling thread), from the moment it is made until its storage is freed. Tensors that existed before the block
are not counted, nor is the memory an operator uses inside itself and frees before it returns (a matmul's
workspace). So the same code gives the same figure on every run: a test can bound it.
"""

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["LiveTensorBytes"]


class LiveTensorBytes(TorchDispatchMode):
    """`peak` (bytes) after the block: the largest sum of the storages of the tensors made in it that were alive
    at the same time; `live`: what is still alive when the block ends."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._counted = set()  # the storages counted and not yet freed

    def _freed(self, key, nbytes):
        self._counted.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage()._cdata for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in tree_leaves(out):
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = storage._cdata
            if key in self._counted or key in inputs:  # a view, or an in-place result: no new memory
                continue
            self._counted.add(key)
            self.live += storage.nbytes()
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key, storage.nbytes())  # torch keeps the storage's Python object
        return out                                                            # alive as long as the storage itself
