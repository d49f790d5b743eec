"""Turn one window's raw readings into metrics, each either a value or the reason it is missing. Pure Python.

The sources (``nvml``, ``cpu``) fill the plain records below; nothing here talks to hardware, so every rule
(which utilisation source wins, which energy method, when a case counts as throttled) is tested on synthetic data.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from attnbench.host.sensors import reduce
from attnbench.host.sensors.buffers import BUFFERED
from attnbench.host.sensors.gpm import GPM_RELIABLE_S
from attnbench.host.sensors.sampler import Sample
from attnbench.results.telemetry import GPM_METRICS, GPM_WINDOW_METRICS, NVML_METRICS, MetricValue

Metrics = dict[str, MetricValue]
Unavailable = dict[str, str]
_Reducer = Callable[[list[float]], MetricValue]
POWER_AVERAGING_S = 1.0  # nvmlDeviceGetPowerUsage's trailing average on Ampere (but GA100) and newer (nvml.h)


@dataclass(frozen=True)
class HostCounters:
    """Host counters read at one end of the window."""

    process_cpu_s: float  # user + system time of this process
    at_s: float  # time.perf_counter() when read: the CPU-time ratio uses the counters' own interval
    cores: Sequence[tuple[float, float]] = ()  # (busy_s, total_s) per logical core, system-wide


@dataclass(frozen=True)
class CpuWindow:
    window_s: float
    samples: Sequence[Sample]  # polled: rss_bytes, threads
    failures: Mapping[str, str]  # reading -> reason
    logical_cores: int
    start: HostCounters | None
    end: HostCounters | None
    counter_failure: str = ""  # why start or end is None


@dataclass(frozen=True)
class GpuWindow:
    window_s: float
    samples: Sequence[Sample]  # polled readings, t_s from window start (names: see nvml.NvmlDevice.channels)
    failures: Mapping[str, str] = field(default_factory=dict)  # polled reading -> reason
    fatal: str = ""  # the driver went away mid-run: every NVML metric is void
    # NVML's own samples inside the window (nvmlDeviceGetSamples): reading -> (t_s, or None when the timestamps'
    # clock is unknown; value). A reading here is not polled.
    buffered: Mapping[str, Sequence[tuple[float | None, float]]] = field(default_factory=dict)
    buffer_failures: Mapping[str, str] = field(default_factory=dict)  # reading -> why NVML did not buffer it
    buffer_clock: str = ""  # the host clock the buffers' timestamps are on ("wall", "boottime", …; "" unknown)
    util_timestamps_us: Sequence[int] = ()  # the GPU-utilisation samples' own stamps: NVML's averaging period
    at_end: Mapping[str, float] = field(default_factory=dict)  # one reading at the window's end, where no sample fell
    at_end_failures: Mapping[str, str] = field(default_factory=dict)
    energy_mj: tuple[int, int] | None = None  # total-energy counter at window start and end
    energy_failure: str = ""
    max_sm_clock_mhz: float | None = None
    max_sm_clock_failure: str = ""
    gpm: Mapping[str, float] = field(default_factory=dict)
    gpm_unavailable: Mapping[str, str] = field(default_factory=dict)
    gpm_window_s: float | None = None  # the span between GPM's two samples
    gpm_marked: bool = True  # the first GPM sample was taken where sampling began (not at the window's start)


def cpu_metrics(w: CpuWindow) -> tuple[Metrics, Unavailable]:
    metrics: Metrics = {}
    unavailable: Unavailable = {}
    if w.start is None or w.end is None:
        reason = w.counter_failure or "CPU counters not read"
        unavailable["cpu_util_pct"] = unavailable["cpu_util_per_core_mean_pct"] = reason
    else:
        cpu_s = w.end.process_cpu_s - w.start.process_cpu_s
        # The kernel counts CPU time in clock ticks (10 ms on Linux), so a short window can read a little over 100.
        span_s = w.end.at_s - w.start.at_s
        cpu = reduce.process_cpu_pct(cpu_s, span_s if span_s > 0 else w.window_s, w.logical_cores)
        _put(metrics, unavailable, "cpu_util_pct", cpu, "empty window")
        per_core = reduce.per_core_mean_pct(w.start.cores, w.end.cores)
        _put(metrics, unavailable, "cpu_util_per_core_mean_pct", per_core, "no core's clock advanced in the window")
    for name, reading in (("rss_max_bytes", "rss_bytes"), ("threads_max", "threads")):
        # A reading that failed part-way covers only part of the window: report the reason, not a partial max.
        value = None if reading in w.failures else _max_int(w.samples, reading)
        _put(metrics, unavailable, name, value, w.failures.get(reading, ""))
    return metrics, unavailable


def gpu_metrics(w: GpuWindow, tokens: int) -> tuple[Metrics, Unavailable, list[str], float]:
    """GPU and GPM metrics, notes for the summary, and NVML's utilisation period (for the reliability check).

    ``tokens`` is calls × tokens per call over the window, the denominator of ``joules_per_token``.
    """
    period = reduce.sample_period_s(list(w.util_timestamps_us))
    if w.fatal:
        reason = f"driver gone mid-run: {w.fatal}"
        return {}, dict.fromkeys(NVML_METRICS, reason), [], period
    metrics: Metrics = {}
    unavailable: Unavailable = {}
    readings = _Readings(w)
    readings.put(metrics, unavailable, "gpu_util_pct", "gpu_util_pct", reduce.mean)
    readings.put(metrics, unavailable, "gpu_util_max_pct", "gpu_util_pct", max)
    readings.put(metrics, unavailable, "mem_util_pct", "mem_util_pct", reduce.mean)
    readings.put(metrics, unavailable, "gpu_mem_used_max_bytes", "gpu_mem_used_bytes", lambda v: int(max(v)))
    readings.put(metrics, unavailable, "power_w", "power_w", reduce.mean)
    notes = readings.notes()
    if readings.source("power_w") in ("poll", "end") and w.window_s < POWER_AVERAGING_S:
        # nvmlDeviceGetPowerUsage is a ~1 s trailing average on Ampere and newer: a shorter window partly
        # reads the previous case or idle time. The energy counter (energy_j) has no such lag.
        notes.append(f"power_w averages over ~{POWER_AVERAGING_S:g} s, longer than this {w.window_s:.2f} s window")
    energy, how = _energy(w, readings)
    if energy is None:
        unavailable["energy_j"] = unavailable["joules_per_token"] = how
    else:
        metrics["energy_j"] = energy
        notes.append(f"energy_j from {how}")
        if tokens > 0:
            metrics["joules_per_token"] = energy / tokens
        else:
            unavailable["joules_per_token"] = "no tokens counted"
    readings.put(metrics, unavailable, "sm_clock_mhz", "sm_clock_mhz", reduce.mean)
    readings.put(metrics, unavailable, "sm_clock_min_mhz", "sm_clock_mhz", min)
    if w.max_sm_clock_mhz is None:
        unavailable["sm_clock_max_mhz"] = w.max_sm_clock_failure or "not read"
    else:
        metrics["sm_clock_max_mhz"] = w.max_sm_clock_mhz
    readings.put(metrics, unavailable, "mem_clock_mhz", "mem_clock_mhz", reduce.mean)
    readings.put(metrics, unavailable, "temp_max_c", "temp_c", max)
    notes += _throttling(w, readings, metrics, unavailable)
    notes += _gpm(w, metrics, unavailable)
    return metrics, unavailable, notes, period


def _throttling(w: GpuWindow, readings: _Readings, metrics: Metrics, unavailable: Unavailable) -> list[str]:
    """The clock-event reasons seen, how far the SM clock sat below its maximum, and whether that is throttling."""
    masks = [int(m) for m in readings.values("throttle_mask")]
    if masks:
        metrics["throttle_reasons"] = reduce.reasons_seen(masks)
    else:
        unavailable["throttle_reasons"] = readings.why("throttle_mask")
    clocks = readings.values("sm_clock_mhz")
    drop = reduce.clock_drop_pct(clocks, w.max_sm_clock_mhz)
    if drop is None:
        why = readings.why("sm_clock_mhz") if not clocks else w.max_sm_clock_failure or "no maximum SM clock"
        unavailable["sm_clock_drop_pct"] = why
        unavailable["throttled"] = f"no SM clock against its maximum to tell whether the clock fell ({why})"
        return []
    metrics["sm_clock_drop_pct"] = drop
    if not masks:
        unavailable["throttled"] = f"no clock-event reasons ({readings.why('throttle_mask')})"
        return []
    metrics["throttled"] = reduce.is_throttled(drop, masks)
    power_or_heat = reduce.reasons_seen(m & reduce.THERMAL_OR_POWER_MASK for m in masks)
    if not power_or_heat:
        return []
    mean = reduce.mean(clocks)
    clock = f"{mean:.0f} of {w.max_sm_clock_mhz:.0f} MHz"
    if metrics["throttled"]:
        return [f"throttled: {power_or_heat} with the SM clock {drop:.1f} % below its maximum ({clock})"]
    return [
        f"{power_or_heat} set, but the SM clock held within {reduce.THROTTLE_DROP_PCT:g} % of its maximum "
        f"({clock}): not throttled"
    ]


def _gpm(w: GpuWindow, metrics: Metrics, unavailable: Unavailable) -> list[str]:
    metrics.update(w.gpm)
    unavailable.update({k: v for k, v in w.gpm_unavailable.items() if k not in w.gpm})
    for name in GPM_METRICS:
        if name not in metrics and name not in unavailable:
            unavailable[name] = "not read"
    if not w.gpm or w.gpm_window_s is None:
        reason = next(iter(w.gpm_unavailable.values()), "not read")
        unavailable.update(dict.fromkeys(GPM_WINDOW_METRICS, reason))
        return []
    metrics["gpm_window_s"] = w.gpm_window_s
    metrics["gpm_reliable"] = w.gpm_window_s >= GPM_RELIABLE_S
    notes = [] if w.gpm_marked else ["GPM over the whole window, warm-up included (sampling was never marked)"]
    if w.gpm_window_s < GPM_RELIABLE_S:
        notes.append(
            f"GPM over {w.gpm_window_s:.2f} s (< {GPM_RELIABLE_S:g} s): its counters refresh every ~100 ms, so "
            "the GPM metrics are quantised and unreliable"
        )
    return notes


def _energy(w: GpuWindow, readings: _Readings) -> tuple[float | None, str]:
    """(joules, how) — the counter delta where the counter exists, else the power integral; (None, why) if neither."""
    counter_why = w.energy_failure or "not read"
    if w.energy_mj is not None:
        joules = reduce.energy_from_counter(*w.energy_mj, window_s=w.window_s)
        if joules is not None:
            return joules, "the total-energy counter (nvmlDeviceGetTotalEnergyConsumption delta)"
        counter_why = "counter went backwards (reset?)"
    points = readings.points("power_w")
    joules = reduce.energy_from_power(points, 0.0, w.window_s) if points else None
    if joules is None and readings.values("power_w"):  # samples on an unknown clock: their mean over the window
        joules = statistics.fmean(readings.values("power_w")) * w.window_s
    if joules is None:
        return None, f"total-energy counter: {counter_why}; power: {readings.why('power_w')}"
    return joules, f"power × time (sampled power integrated; total-energy counter: {counter_why})"


class _Readings:
    """One window's readings, from wherever each came: NVML's buffer, the poll, or one read at the window's end."""

    def __init__(self, w: GpuWindow) -> None:
        self._w = w
        self._rows = [s for s in w.samples if 0.0 <= float(s["t_s"] or 0.0) <= w.window_s]

    def source(self, reading: str) -> str:
        if self._w.buffered.get(reading):
            return "buffer"
        if reading not in self._w.failures and any(r.get(reading) is not None for r in self._rows):
            return "poll"
        return "end" if reading in self._w.at_end else ""

    def points(self, reading: str) -> list[tuple[float, float]]:
        """(seconds from window start, value), where each value's time is known."""
        source = self.source(reading)
        if source == "buffer":
            return [(t, v) for t, v in self._w.buffered[reading] if t is not None]
        if source == "poll":
            return [(float(r["t_s"] or 0.0), float(v)) for r in self._rows if (v := r.get(reading)) is not None]
        return []

    def values(self, reading: str) -> list[float]:
        source = self.source(reading)
        if source == "buffer":
            return [v for _, v in self._w.buffered[reading]]
        if source == "end":
            return [self._w.at_end[reading]]
        return [v for _, v in self.points(reading)]

    def why(self, reading: str) -> str:
        w = self._w
        return w.failures.get(reading) or w.at_end_failures.get(reading) or "no samples"

    def put(self, metrics: Metrics, unavailable: Unavailable, name: str, reading: str, reduce_fn: _Reducer) -> None:
        values = self.values(reading)
        if values:
            metrics[name] = reduce_fn(values)
        else:
            unavailable[name] = self.why(reading)

    def notes(self) -> list[str]:
        """Where the buffered kinds of reading came from, one note per source."""
        by_source: dict[str, list[str]] = {}
        for reading, _, _ in BUFFERED:
            by_source.setdefault(self.source(reading), []).append(reading)
        notes = []
        if by_source.get("buffer"):
            counts = ", ".join(f"{r} {len(self._w.buffered[r])}" for r in by_source["buffer"])
            clock = self._w.buffer_clock or "an unknown clock"
            notes.append(f"NVML's buffered samples: {counts} (timestamps on {clock})")
        if by_source.get("poll"):
            reasons = sorted({self._w.buffer_failures.get(r, "not buffered") for r in by_source["poll"]})
            notes.append(f"polled ({'; '.join(reasons)}): {', '.join(by_source['poll'])}")
        if by_source.get("end"):
            notes.append(f"one reading at the window's end (no NVML sample inside it): {', '.join(by_source['end'])}")
        return notes


def _max_int(samples: Sequence[Sample], reading: str) -> int | None:
    values = [int(v) for s in samples if (v := s.get(reading)) is not None]
    return max(values) if values else None


def _put(metrics: Metrics, unavailable: Unavailable, name: str, value: MetricValue, why: str) -> None:
    if value is None:
        unavailable[name] = why or "no samples"
    else:
        metrics[name] = value
