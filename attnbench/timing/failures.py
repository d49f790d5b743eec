"""How a failure of the work reads as a row: out of memory (``oom``) or not (``error``), and its one-line reason."""

from __future__ import annotations

import torch

# How the CPU allocator words an allocation it could not satisfy (c10/core/CPUAllocator.cpp, alloc_cpu.cpp).
_OOM_MARKERS = (
    "DefaultCPUAllocator: can't allocate memory",
    "not enough memory",
    "Cannot allocate memory",
    # GPU libraries that report a failed allocation as their own status rather than OutOfMemoryError.
    "CUDA error: out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, torch.cuda.OutOfMemoryError | MemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MARKERS)


def describe(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".strip()
