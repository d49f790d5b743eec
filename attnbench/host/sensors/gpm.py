"""NVML GPU Performance Monitoring (Hopper and newer): SM, occupancy, tensor-core and DRAM-bandwidth utilisation
between two counter samples.

nvml.h: "the interval between two nvmlGpmSampleGet() calls should be greater than 100ms due to the internal sample
refresh rate", so the counters move in ~100 ms steps and a span of a few hundred ms is quantised by tens of
percent. The first sample is taken when the timing loop starts sampling (``mark``), not when the window opens, so
warm-up (kernel JIT, cuDNN plans, allocator growth) is not averaged in; without a mark the window's start serves.
Spans under ``GPM_MIN_S`` read nothing; under ``GPM_RELIABLE_S`` the values stand but ``gpm_reliable`` is False.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnbench.results.telemetry import GPM_METRICS

GPM_IDS: tuple[tuple[str, str], ...] = (
    ("gpm_sm_util_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("gpm_sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("gpm_tensor_util_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("gpm_dram_bw_util_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
GPM_NEEDS = "GPM needs Hopper or newer (compute capability 9.0+)"
GPM_MIN_S = 0.1  # nvml.h: more than 100 ms between the two samples
GPM_RELIABLE_S = 1.0  # ~10 counter refreshes: quantisation below ~10 %


def gpm_support(nvml: Any, handle: Any) -> str:
    """The reason GPM metrics cannot be read on this device, or "" when they can."""
    try:
        supported = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except nvml.NVMLError as exc:
        return f"GPM support query failed: {type(exc).__name__}"
    except AttributeError:
        return "these NVML bindings have no GPM functions (nvidia-ml-py ≥ 12 needed)"
    if supported:
        return ""
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return f"{GPM_NEEDS}; this GPU is {major}.{minor}"
    except nvml.NVMLError:
        return GPM_NEEDS


@dataclass
class GpmReading:
    """What one window's GPM gave: values, per-metric reasons, the span between the samples, and whether the
    first sample was the sampling phase's start (``marked``) or only the window's."""

    values: dict[str, float] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    window_s: float | None = None
    marked: bool = False


class Gpm:
    """Two GPM samples per window and the metrics between them. ``failure`` set: GPM is not read at all."""

    def __init__(self, nvml: Any, handle: Any, failure: str, note_fatal: Callable[[Exception], None]) -> None:
        self.nvml, self.handle = nvml, handle
        self.failure = failure
        self._note_fatal = note_fatal
        self._allocated: list[Any] = []
        self._first: tuple[Any, float] | None = None
        self._marked = False
        self.reading = GpmReading()

    def start(self) -> None:
        self._first = self._sample()

    def mark(self) -> None:
        """The timing loop starts sampling: GPM is measured from here (the earlier sample is freed at close)."""
        if self._first is None or self._marked:
            return
        sample = self._sample()
        if sample is not None:
            self._first, self._marked = sample, True

    def stop(self) -> None:
        self.reading.marked = self._marked
        if self._first is None:
            return
        first, t0 = self._first
        span = time.perf_counter() - t0
        self.reading.window_s = span
        if span < GPM_MIN_S:
            self.failure = (
                f"GPM needs more than {GPM_MIN_S * 1e3:.0f} ms between its samples; the sampling phase lasted "
                f"{span * 1e3:.0f} ms"
            )
            return
        last = self._sample()
        if last is not None:
            self.reading.window_s = last[1] - t0
            self._metrics(first, last[0])

    def unavailable(self) -> dict[str, str]:
        if self.failure:
            return dict.fromkeys(GPM_METRICS, self.failure)
        return {k: v for k, v in self.reading.unavailable.items() if k not in self.reading.values}

    def close(self) -> None:
        for sample in self._allocated:
            with contextlib.suppress(self.nvml.NVMLError):  # the driver may be gone; nothing left to free
                self.nvml.nvmlGpmSampleFree(sample)
        self._allocated.clear()

    def _sample(self) -> tuple[Any, float] | None:
        if self.failure:
            return None
        try:
            sample = self.nvml.nvmlGpmSampleAlloc()
            self._allocated.append(sample)
            self.nvml.nvmlGpmSampleGet(self.handle, sample)
            return sample, time.perf_counter()
        except self.nvml.NVMLError as exc:
            self.failure = f"GPM sample failed: {type(exc).__name__}"
            self._note_fatal(exc)
            return None

    def _metrics(self, first: Any, last: Any) -> None:
        """The four GPM metrics between two samples (nvmlGpmMetricsGet, one request)."""
        nvml = self.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_IDS)
        request.sample1, request.sample2 = first, last
        for i, (_, constant) in enumerate(GPM_IDS):
            request.metrics[i].metricId = getattr(nvml, constant)
        try:
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as exc:
            self.failure = f"nvmlGpmMetricsGet: {type(exc).__name__}"
            self._note_fatal(exc)
            return
        for i, (name, _) in enumerate(GPM_IDS):
            metric = request.metrics[i]
            if metric.nvmlReturn != nvml.NVML_SUCCESS:  # e.g. counters held by a profiler
                self.reading.unavailable[name] = type(nvml.NVMLError(metric.nvmlReturn)).__name__
            elif not math.isfinite(metric.value):
                self.reading.unavailable[name] = f"non-finite value {metric.value}"
            else:
                self.reading.values[name] = float(metric.value)
