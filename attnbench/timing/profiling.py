"""Traces for the profilers people already use (sweep --profile, --nvtx), torch.

- ``write_trace``: one call under ``torch.profiler`` (kineto, the same profiler the kernel count uses), CPU
  activity and, on a GPU, CUDA activity, exported as a Chrome trace that chrome://tracing and Perfetto load.
  The call is made after the timing, outside the timed samples, so the trace costs the row nothing; one warm-up
  step under the profiler comes first and is not recorded (a fresh CUPTI's first call pays its set-up). Its size
  is bounded by the kernels a call launches (the executor's profiled count, just before): a step-loop model
  launches 10⁵–10⁶ kernels in the seconds a time bound alone allowed, each a few events with record_shapes.
- ``nvtx_range``: each timed call inside an NVTX range named by the case key, so ``nsys profile attnbench sweep
  …`` shows which kernels belong to which case and ``ncu --nvtx --nvtx-include`` can select one.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from attnbench.core.cases import Case
from attnbench.core.units import format_seconds
from attnbench.results.store import TRACES

__all__ = ["TRACES", "nvtx_range", "trace_name", "trace_refusal", "write_trace"]

# A call longer than this is not traced: a step-loop model at long n makes hundreds of thousands of events, a
# file of hundreds of MB that neither chrome://tracing nor the disk of a long sweep wants. On a GPU, where a call's
# kernels are counted just before, the count bounds it (a few events each: ~20 000 kernels make tens of MB), and a
# GPU call whose kernels went uncounted is held to the profile's own bound.
TRACE_MAX_CALL_S = 5.0
TRACE_MAX_KERNELS = 20_000
TRACE_MAX_UNCOUNTED_GPU_CALL_S = 0.5


def trace_name(case: Case) -> str:
    """A file name that says which case it is and cannot collide: the readable axes, then a hash of the key
    (which also holds the options). Only [A-Za-z0-9._-]: no separator, whatever a user's model is called."""
    readable = f"{case.model}-{case.mode}-{case.dtype}-b{case.batch}-n{case.seq_len}"
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", readable)[:120]
    digest = hashlib.sha256(case.key.encode("utf-8")).hexdigest()[:10]
    return f"{readable}-{digest}.json"


def trace_refusal(median_s: float, kernels: int | None = None, *, gpu: bool = False) -> str | None:
    """Why a call is not traced, or None when it is: more than ``TRACE_MAX_KERNELS`` kernels (``kernels``, counted
    by the profile just before), or longer than ``TRACE_MAX_CALL_S`` (two calls are made), or on a GPU without a
    count longer than ``TRACE_MAX_UNCOUNTED_GPU_CALL_S`` (its kernels are what fill a trace)."""
    if kernels is not None and kernels > TRACE_MAX_KERNELS:
        return (
            f"not traced: a call launches {kernels} kernels, over {TRACE_MAX_KERNELS}; its trace would run to "
            "hundreds of MB (trace a shorter length, or use nsys with --nvtx)"
        )
    limit = TRACE_MAX_UNCOUNTED_GPU_CALL_S if gpu and kernels is None else TRACE_MAX_CALL_S
    if median_s <= limit:
        return None
    return (
        f"not traced: a call takes {format_seconds(median_s)}, over {format_seconds(limit)}; its trace "
        "would run to hundreds of MB (trace a shorter length, or use nsys with --nvtx)"
    )


def write_trace(step: Callable[[], object], device: torch.device, folder: Path, name: str) -> Path:
    """Run ``step`` twice under the profiler, the first a warm-up it does not record, and write the second call's
    Chrome trace to ``folder/name``; returns the path.

    Written beside the target and renamed over it, so a reader never sees half a trace and the name is never a
    link written through (a link in its place is replaced, not followed)."""
    from torch.profiler import ProfilerActivity, profile, schedule

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{name}.", suffix=".tmp")
    os.close(fd)
    exported: list[str] = []

    def export(prof: Any) -> None:
        prof.export_chrome_trace(tmp)
        exported.append(tmp)

    try:
        warm_then_record = schedule(wait=0, warmup=1, active=1, repeat=1)
        with profile(
            activities=activities, record_shapes=True, schedule=warm_then_record, on_trace_ready=export
        ) as prof:
            for _ in range(2):
                step()
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                prof.step()
        if not exported:
            raise RuntimeError("the profiler recorded no call to export")
        target = folder / name
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


@functools.cache
def nvtx_problem() -> str:
    """Why this process cannot make NVTX ranges ("" when it can), found once: one empty range pushed and popped."""
    from torch.cuda import nvtx

    try:
        nvtx.range_push("attnbench")
        nvtx.range_pop()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return ""


def nvtx_range(name: str) -> Callable[[Callable[[], object]], Callable[[], object]]:
    """A wrapper that runs a call inside an NVTX range called ``name`` (about a microsecond of host time each,
    which a GPU call hides behind its kernels); RuntimeError now, not mid-timing, where torch has no NVTX (checked
    once per process)."""
    from torch.cuda import nvtx

    problem = nvtx_problem()
    if problem:
        raise RuntimeError(f"NVTX ranges are unavailable here: {problem}")

    def wrap(fn: Callable[[], object]) -> Callable[[], object]:
        def ranged() -> object:
            nvtx.range_push(name)
            try:
                return fn()
            finally:
                nvtx.range_pop()

        return ranged

    return wrap
