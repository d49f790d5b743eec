"""GPU-only timing aids (torch): an L2 flush, CUDA-graph replay, and a kernel-level profile.

Each answers a question the CUDA-event median cannot answer alone:
- ``cache: cold``: what a call costs when its weights and activations are not already in L2 (a model too big
  for L2, or a layer run once per step). The flush overwrites ``flush_bytes`` (at least 4× the L2, at least
  256 MiB) and the clock waits for it before the start event, so it is never timed and cannot hide launch gaps.
  (A CPU's flush is ``clocks.cpu_flusher``.)
- ``cuda_graph: true``: what the kernels cost without the host's per-launch overhead.
- the profile: how many kernels one call launches (the sequential depth a recurrent model pays per step) and
  how busy they keep the device. Event time well above the summed kernel time means the device idled between
  kernels, waiting on the host: the case is launch-bound and its median measures Python and the driver.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from attnbench.core.cases import FlushKind
from attnbench.core.units import MIB, format_seconds
from attnbench.timing.executor import detach_cupti_after_profiling

# Event time per call above this multiple of the kernels' busy time marks a case launch-bound (issue 3: 1.15×).
LAUNCH_BOUND_RATIO = 1.15
# Writing exactly L2_cache_size bytes does not evict Hopper's L2, which is split in two partitions with their own
# replacement (and may keep lines the write never touched); triton's do_bench writes 256 MiB for the same reason.
FLUSH_L2_MULTIPLE = 4
FLUSH_MIN_BYTES = 256 * MIB
# A call longer than this is not profiled: one call of a step-loop model at long n launches hundreds of thousands
# of kernels, whose records take longer to collect and read than the whole case took to time.
PROFILE_MAX_CALL_S = 0.5
# What a profile counts as the device's work for the call: its kernels, copies and memsets. Not annotations
# (record_function spans, ProfilerStep#) nor synchronisation spans, which are also "on the device" in kineto.
DEVICE_WORK = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})


def flush_bytes(l2_bytes: int) -> int:
    """How much a cold-cache flush writes: ``FLUSH_L2_MULTIPLE`` × the L2, and never less than 256 MiB."""
    return max(FLUSH_L2_MULTIPLE * max(l2_bytes, 0), FLUSH_MIN_BYTES)


class DeviceFlush:
    """Evicts what the timed call could find in L2 by touching ``size_bytes`` of device memory, one of two ways
    (``timing.flush``): ``zero`` overwrites the buffer (a memset, int32: a byte-wise zero_ runs ~3× slower, triton
    PR 840; triton's do_bench does this), leaving up to an L2 of dirty lines that are written back while the timed call
    runs; ``read`` reduces it to one scalar, so L2 holds only clean lines and the call pays no write-back. Which one
    puts a cold decode nearer its roofline is to be measured on the first GPU (docs/explanation/methodology.md)."""

    def __init__(self, size_bytes: int, device: torch.device, kind: FlushKind = "zero") -> None:
        self.kind = kind
        self.buffer = torch.zeros(max(size_bytes // 4, 1), dtype=torch.int32, device=device)
        self._sink = torch.zeros((), dtype=torch.int64, device=device)  # the read's one written value

    def __call__(self) -> None:
        if self.kind == "read":
            torch.sum(self.buffer, 0, out=self._sink)
        else:
            self.buffer.zero_()


def l2_flusher(device: torch.device, kind: FlushKind = "zero") -> DeviceFlush:
    """The cold-cache flush of ``device``: ``flush_bytes`` of its L2, zeroed or read (``DeviceFlush``)."""
    return DeviceFlush(flush_bytes(int(torch.cuda.get_device_properties(device).L2_cache_size)), device, kind)


def graphed(step: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """Capture ``step`` into a CUDA graph and return its replay (warm-up on a side stream, as torch requires)."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(3):  # let lazy inits (cuBLAS handles, autotuning) happen outside the capture
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    torch.cuda.synchronize(device)

    def replay() -> object:
        graph.replay()
        return None

    return replay


@dataclass(frozen=True)
class KernelProfile:
    kernels: int  # device activities (kernels, memsets, copies) one call queues
    busy_s: float  # the union of their intervals: time the device was doing this call's work


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals: overlapping kernels (several streams) count once."""
    total, current_end = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end <= current_end:
            continue
        total += end - max(start, current_end)
        current_end = end
    return total


@dataclass(frozen=True)
class DeviceEvent:
    """One kineto record, as much of it as counting needs. ``activity`` is kineto's activity type ("kernel",
    "gpu_memcpy", …) where torch exposes it, else None; ``on_device`` and ``annotation`` serve older torch."""

    activity: str | None
    on_device: bool
    annotation: bool
    start_ns: int
    end_ns: int

    @property
    def is_work(self) -> bool:
        if self.activity is not None:
            return self.activity in DEVICE_WORK
        return self.on_device and not self.annotation


def device_work(events: Iterable[DeviceEvent]) -> KernelProfile:
    """How many kernels, copies and memsets the events hold, and the union of their intervals."""
    work = [e for e in events if e.is_work]
    return KernelProfile(kernels=len(work), busy_s=busy_time([(e.start_ns / 1e9, e.end_ns / 1e9) for e in work]))


def profile_refusal(median_s: float) -> str | None:
    """Why a call this long is not profiled, or None when it is."""
    if median_s <= PROFILE_MAX_CALL_S:
        return None
    return (
        f"not profiled: a call takes {format_seconds(median_s)}, over {format_seconds(PROFILE_MAX_CALL_S)}, and "
        "its kernel records could take longer to read than the case took to time"
    )


def profile_kernels(step: Callable[[], object], device: torch.device) -> KernelProfile:
    """Run ``step`` once under the kineto profiler, CUDA activity only, and sum what the device did for it.

    No CPU activity: the operators' records are not needed and cost most of a profile. kineto's raw records
    are read without building torch's event tree, which for a long step loop would take seconds."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    detach_cupti_after_profiling()
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    records = prof.profiler.kineto_results.events()
    return device_work(
        DeviceEvent(
            activity=e.activity_type() if hasattr(e, "activity_type") else None,
            on_device=e.device_type() == DeviceType.CUDA,
            annotation=bool(getattr(e, "is_user_annotation", lambda: False)()),
            start_ns=int(e.start_ns()),
            end_ns=int(e.end_ns()),
        )
        for e in records
    )


def launch_bound(median_s: float, busy_s: float) -> bool | None:
    """Whether the device idled more than the cut during a call; None when the profile saw no device work."""
    if busy_s <= 0:
        return None
    return median_s > LAUNCH_BOUND_RATIO * busy_s
