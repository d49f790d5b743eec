"""Device-correct clocks for ``attnbench.timing.adaptive.measure`` (imports torch).

GPU work is asynchronous: a host timer around a launch measures the launch, not the kernel. So on CUDA each
sample is bracketed by CUDA events recorded on the current stream, with one synchronise per block of samples
so the host never idles between samples.

Either clock takes a ``flush`` (``cache: cold``): run before every sample, outside the timed region, so each sample
finds the cache emptied of what the call reads. On CUDA ``gpu_timing.l2_flusher``; on a CPU ``cpu_flusher``.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from attnbench.host.caches import cpu_flush_bytes, last_level_cache_bytes


class CpuClock:
    """``perf_counter`` around each group of calls; the work is synchronous on CPU."""

    def __init__(self, flush: Callable[[], object] | None = None) -> None:
        # Run before each sample's start: its writes are done when it returns (the CPU's work is synchronous).
        self.flush = flush

    def now(self) -> float:
        return time.perf_counter()

    def time(self, fn: Callable[[], object], calls_per_sample: int, samples: int) -> list[float]:
        out: list[float] = []
        for _ in range(samples):
            if self.flush is not None:
                self.flush()
            t0 = time.perf_counter()
            for _ in range(calls_per_sample):
                fn()
            out.append((time.perf_counter() - t0) / calls_per_sample)
        return out

    def time_each(self, fn: Callable[[], object], prepare: Callable[[], object], calls: int) -> list[float]:
        """Each of ``calls`` calls timed alone, ``prepare`` (then the flush) run before it, untimed."""
        out: list[float] = []
        for _ in range(calls):
            prepare()
            out += self.time(fn, 1, 1)
        return out


class CudaClock:
    """CUDA events around each group of calls on ``device``'s current stream."""

    def __init__(self, device: torch.device, flush: Callable[[], object] | None = None) -> None:
        self.device = device
        # Enqueued before each sample's start event, never waited for (as triton's do_bench): the start event fires
        # when the flush's kernel ends, with the call already queued behind it, so a cold sample times the call and
        # not the host's launch of its first kernel nor the Python before it (a host sync there left the GPU idle).
        self.flush = flush

    def now(self) -> float:
        return time.perf_counter()

    def time(self, fn: Callable[[], object], calls_per_sample: int, samples: int) -> list[float]:
        return self._events(fn, None, calls_per_sample, samples)

    def time_each(self, fn: Callable[[], object], prepare: Callable[[], object], calls: int) -> list[float]:
        """Each of ``calls`` calls timed alone, ``prepare`` (then the flush) enqueued before its start event,
        untimed: one synchronise for them all, so no host wait stands between what is put back and the call."""
        return self._events(fn, prepare, 1, calls)

    def _events(
        self, fn: Callable[[], object], prepare: Callable[[], object] | None, calls_per_sample: int, samples: int
    ) -> list[float]:
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(samples)]
        with torch.cuda.device(self.device):
            # Drain earlier work so the first event does not absorb it.
            torch.cuda.synchronize()
            for start, end in zip(starts, ends, strict=True):
                if prepare is not None:
                    prepare()
                if self.flush is not None:
                    self.flush()  # queued, not waited for: the start event below waits for it on the stream
                start.record()
                for _ in range(calls_per_sample):
                    fn()
                end.record()
            torch.cuda.synchronize()
        # elapsed_time is in milliseconds.
        return [s.elapsed_time(e) / 1e3 / calls_per_sample for s, e in zip(starts, ends, strict=True)]


def clock_for(device: torch.device, flush: Callable[[], object] | None = None) -> CpuClock | CudaClock:
    return CudaClock(device, flush) if device.type == "cuda" else CpuClock(flush)


def cpu_flusher(size_bytes: int | None = None) -> Callable[[], None]:
    """A function that reads and writes ``size_bytes`` (default: ``host.caches.cpu_flush_bytes`` of this CPU's
    last-level cache) with torch's threads, the ones the timed call runs on: every line is loaded and dirtied, so
    what the call left in the caches (its weights, its state) is evicted. A plain memset would not do: large ones
    use non-temporal stores, which bypass the cache they were meant to empty."""
    size = size_bytes if size_bytes is not None else cpu_flush_bytes(last_level_cache_bytes())
    buffer = torch.zeros(max(size // 4, 1), dtype=torch.int32)

    def flush() -> None:
        buffer.add_(1)

    return flush
