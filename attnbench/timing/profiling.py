"""Traces for the profilers people already use (sweep --profile, --nvtx), torch.

- ``write_trace``: one call under ``torch.profiler`` (kineto, the same profiler the kernel count uses), CPU
  activity and, on a GPU, CUDA activity, exported as a Chrome trace that chrome://tracing and Perfetto load.
  The call is made after the timing, outside the timed samples, so the trace costs the row nothing.
- ``nvtx_range``: each timed call inside an NVTX range named by the case key, so ``nsys profile attnbench sweep
  …`` shows which kernels belong to which case and ``ncu --nvtx --nvtx-include`` can select one.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from attnbench.core.cases import Case
from attnbench.core.units import format_seconds
from attnbench.results.store import TRACES

__all__ = ["TRACES", "nvtx_range", "trace_name", "trace_refusal", "write_trace"]

# A call longer than this is not traced: a step-loop model at long n makes hundreds of thousands of events, a
# file of hundreds of MB that neither chrome://tracing nor the disk of a long sweep wants.
TRACE_MAX_CALL_S = 5.0


def trace_name(case: Case) -> str:
    """A file name that says which case it is and cannot collide: the readable axes, then a hash of the key
    (which also holds the options). Only [A-Za-z0-9._-]: no separator, whatever a user's model is called."""
    readable = f"{case.model}-{case.mode}-{case.dtype}-b{case.batch}-n{case.seq_len}"
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", readable)[:120]
    digest = hashlib.sha256(case.key.encode("utf-8")).hexdigest()[:10]
    return f"{readable}-{digest}.json"


def trace_refusal(median_s: float) -> str | None:
    """Why a call this long is not traced, or None when it is."""
    if median_s <= TRACE_MAX_CALL_S:
        return None
    return (
        f"not traced: a call takes {format_seconds(median_s)}, over {format_seconds(TRACE_MAX_CALL_S)}; its trace "
        "would run to hundreds of MB (trace a shorter length, or use nsys with --nvtx)"
    )


def write_trace(step: Callable[[], object], device: torch.device, folder: Path, name: str) -> Path:
    """Run ``step`` once under the profiler and write its Chrome trace to ``folder/name``; returns the path.

    Written beside the target and renamed over it, so a reader never sees half a trace and the name is never a
    link written through (a link in its place is replaced, not followed)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with profile(activities=activities, record_shapes=True) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        target = folder / name
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def nvtx_range(name: str) -> Callable[[Callable[[], object]], Callable[[], object]]:
    """A wrapper that runs a call inside an NVTX range called ``name`` (about a microsecond of host time each,
    which a GPU call hides behind its kernels); fails now, not mid-timing, where torch has no NVTX."""
    from torch.cuda import nvtx

    nvtx.range_push(name)
    nvtx.range_pop()

    def wrap(fn: Callable[[], object]) -> Callable[[], object]:
        def ranged() -> object:
            nvtx.range_push(name)
            try:
                return fn()
            finally:
                nvtx.range_pop()

        return ranged

    return wrap
