"""GPU-only timing aids (torch): an exact L2 flush, CUDA-graph replay, and a kernel-level profile.

Each answers a question the CUDA-event median cannot answer alone:
- ``cache: cold``: what a call costs when its weights and activations are not already in L2 (a model too big
  for L2, or a layer run once per step). The flush is enqueued before the start event, so it is never timed.
- ``cuda_graph: true``: what the kernels cost without the host's per-launch overhead.
- the profile: how many kernels one call launches (the sequential depth a recurrent model pays per step) and
  how busy they keep the device. Event time well above the summed kernel time means the device idled between
  kernels, waiting on the host: the case is launch-bound and its median measures Python and the driver.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Event time per call above this multiple of the kernels' busy time marks a case launch-bound (issue 3: 1.15×).
LAUNCH_BOUND_RATIO = 1.15


def l2_flusher(device: torch.device) -> Callable[[], None]:
    """A function that overwrites exactly the device's L2 (its size as the driver reports it) with a memset."""
    size = int(torch.cuda.get_device_properties(device).L2_cache_size)
    buffer = torch.empty(max(size, 1), dtype=torch.uint8, device=device)

    def flush() -> None:
        buffer.zero_()

    return flush


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


def profile_kernels(step: Callable[[], object], device: torch.device) -> KernelProfile:
    """Run ``step`` once under the kineto profiler and sum what the device did for it (CUPTI timings)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize(device)
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    intervals = [(e.time_range.start / 1e6, e.time_range.end / 1e6) for e in events]  # µs → s
    return KernelProfile(kernels=len(events), busy_s=busy_time(intervals))


def launch_bound(median_s: float, busy_s: float) -> bool | None:
    """Whether the device idled more than the cut during a call; None when the profile saw no device work."""
    if busy_s <= 0:
        return None
    return median_s > LAUNCH_BOUND_RATIO * busy_s
