"""NVML's own sample buffers (``nvmlDeviceGetSamples``): utilisation, power and clocks as the driver samples them.

The driver keeps a short ring of recent samples per type. Reading them at the window's ends, and draining them
about twice a second in between (the rings are short: about a hundred entries, at a rate nvml.h does not state),
costs two C calls per type per drain. Polling each reading from Python every 20 ms cost about ten ctypes calls per
poll, each competing with the thread that launches the timed kernels for the GIL (issue 12, item 8).

Timestamps are "CPU timestamp in microseconds" (nvml.h) on a clock the header does not name: the Unix epoch on
some drivers, CLOCK_BOOTTIME on others. Nothing here depends on which: the window is found by a cursor (samples
newer than the newest one seen as the window opened; the first read asks for everything, ``lastSeen`` 0), never
by comparing with a host clock. Which clock it was is worked out once per window (``clock_domain``), only to put
the samples on the window's time axis for the raw sidecar and the power integral.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from typing import Any

# (reading, pynvml sampling-type constant, factor to the reading's unit). Power comes in mW, as from
# nvmlDeviceGetPowerUsage; utilisation in %, clocks in MHz.
BUFFERED: tuple[tuple[str, str, float], ...] = (
    ("gpu_util_pct", "NVML_GPU_UTILIZATION_SAMPLES", 1.0),
    ("mem_util_pct", "NVML_MEMORY_UTILIZATION_SAMPLES", 1.0),
    ("power_w", "NVML_TOTAL_POWER_SAMPLES", 1e-3),
    ("sm_clock_mhz", "NVML_PROCESSOR_CLK_SAMPLES", 1.0),
    ("mem_clock_mhz", "NVML_MEMORY_CLK_SAMPLES", 1.0),
)
DRAIN_EVERY_S = 0.5
# A newest sample this close to a host clock says the timestamps are on that clock.
_CLOCK_TOLERANCE_US = 10_000_000
# nvmlValueType_t -> the c_nvmlValue_t union member holding a sample's value.
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def host_clocks_us() -> dict[str, int]:
    """Now, in µs, on each host clock NVML's sample timestamps might use."""
    clocks = {"wall": time.time_ns() // 1000, "monotonic": time.monotonic_ns() // 1000}
    boottime = getattr(time, "CLOCK_BOOTTIME", None)  # Linux
    if boottime is not None:
        clocks["boottime"] = time.clock_gettime_ns(boottime) // 1000
    return clocks


def clock_domain(newest_us: int, host_us: Mapping[str, int]) -> str:
    """The host clock a just-taken NVML timestamp is on ("wall", "boottime", "monotonic"), or "" if none is near.

    Boottime and monotonic differ only by time spent suspended, so on a server both are near: boottime, which
    drivers are reported to use, is named first."""
    for name in ("wall", "boottime", "monotonic"):
        if name in host_us and abs(host_us[name] - newest_us) <= _CLOCK_TOLERANCE_US:
            return name
    return ""


class SampleBuffer:
    """One sampling type: the cursor (newest timestamp seen) and the samples taken since ``collecting`` began."""

    def __init__(self, nvml: Any, handle: Any, reading: str, constant: str, scale: float) -> None:
        self.nvml, self.handle = nvml, handle
        self.reading, self.sampling_type, self.scale = reading, getattr(nvml, constant), scale
        self.cursor = 0  # 0: everything the ring holds
        self.collecting = False
        self.window: dict[int, float] = {}  # NVML µs -> value, in the reading's unit
        self.failure = ""

    def drain(self) -> None:
        """Take what the driver sampled since the cursor. NVML errors other than "nothing new" propagate."""
        try:
            kind, samples = self.nvml.nvmlDeviceGetSamples(self.handle, self.sampling_type, self.cursor)
        except self.nvml.NVMLError_NotFound:  # nothing newer (an idle GPU's rings also run dry)
            return
        field = _VALUE_FIELDS.get(int(kind), "uiVal")
        for sample in samples:
            stamp = int(sample.timeStamp)
            if stamp <= self.cursor:
                continue
            self.cursor = stamp
            value = float(getattr(sample.sampleValue, field)) * self.scale
            if self.collecting and math.isfinite(value):
                self.window[stamp] = value


class Buffers:
    """Every buffered reading of one GPU for one window; a reading whose buffer cannot be read is in ``failures``
    (its caller polls it instead)."""

    def __init__(self, nvml: Any, handle: Any, fatal: Callable[[Exception], bool]) -> None:
        self._nvml, self._fatal = nvml, fatal
        self.failures: dict[str, str] = {}
        self.buffers: list[SampleBuffer] = []
        for reading, constant, scale in BUFFERED:
            buffer = SampleBuffer(nvml, handle, reading, constant, scale)
            try:
                buffer.drain()  # the first read takes the whole ring: it says whether the type can be read at all
            except nvml.NVMLError as exc:
                if fatal(exc):
                    raise
                self.failures[reading] = f"nvmlDeviceGetSamples: {type(exc).__name__}"
                continue
            self.buffers.append(buffer)
        self._last_drain = 0.0
        self.start_clocks: dict[str, int] = {}
        self.domain = ""

    @property
    def readings(self) -> tuple[str, ...]:
        return tuple(b.reading for b in self.buffers)

    def start(self) -> None:
        """The window opens: move every cursor past what was sampled before it, then collect."""
        self._drain_all()
        for buffer in self.buffers:
            buffer.collecting = True
        self.start_clocks = host_clocks_us()

    def drain_if_due(self) -> None:
        """For the sampler thread: drain when ``DRAIN_EVERY_S`` has passed, before a ring can wrap. Records nothing."""
        if time.perf_counter() - self._last_drain >= DRAIN_EVERY_S:
            self._drain_all()

    def stop(self) -> None:
        """The window closed: take what is left, and work out which clock the timestamps are on."""
        self._drain_all()
        for buffer in self.buffers:
            buffer.collecting = False
        newest = max((b.cursor for b in self.buffers), default=0)
        self.domain = clock_domain(newest, host_clocks_us()) if newest else ""

    def series(self) -> dict[str, list[tuple[float | None, float]]]:
        """Each reading's in-window samples as (seconds from the window's start, or None on an unknown clock;
        value), in time order."""
        origin = self.start_clocks.get(self.domain) if self.domain else None
        return {
            b.reading: [(None if origin is None else (ts - origin) / 1e6, v) for ts, v in sorted(b.window.items())]
            for b in self.buffers
        }

    def timestamps(self, reading: str) -> list[int]:
        return [ts for b in self.buffers if b.reading == reading for ts in sorted(b.window)]

    def _drain_all(self) -> None:
        self._last_drain = time.perf_counter()
        for buffer in list(self.buffers):
            try:
                buffer.drain()
            except self._nvml.NVMLError as exc:
                if self._fatal(exc):
                    raise
                # This type stopped answering mid-run: what it gave covers only part of the window.
                self.buffers.remove(buffer)
                self.failures[buffer.reading] = f"nvmlDeviceGetSamples: {type(exc).__name__}"
