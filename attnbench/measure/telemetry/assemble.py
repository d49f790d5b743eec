"""Turn one window's raw readings into metrics, each either a value or the reason it is missing. Pure Python.

The sources (``nvml``, ``cpu``) fill the plain records below; nothing here talks to hardware, so every rule
(which utilisation source wins, which energy method, when a case counts as throttled) is tested on synthetic data.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from attnbench.measure.telemetry import reduce
from attnbench.measure.telemetry.sampler import Sample
from attnbench.results.telemetry import GPM_METRICS, GPU_METRICS, MetricValue

Metrics = dict[str, MetricValue]
Unavailable = dict[str, str]
_Reducer = Callable[[list[float]], MetricValue]


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
    samples: Sequence[Sample]  # polled readings, t_s from window start (names: see nvml.READINGS)
    failures: Mapping[str, str] = field(default_factory=dict)  # reading -> reason
    fatal: str = ""  # the driver went away mid-run: every NVML metric is void
    # (NVML timestamp µs, %) from nvmlDeviceGetSamples, and the (after, until] bounds of the window on that clock
    util_samples: Sequence[tuple[int, float]] = ()
    util_bounds_us: tuple[int, int] = (0, 0)
    util_samples_failure: str = "not read"  # "" when util_samples were read
    energy_mj: tuple[int, int] | None = None  # total-energy counter at window start and end
    energy_failure: str = ""
    max_sm_clock_mhz: float | None = None
    max_sm_clock_failure: str = ""
    gpm: Mapping[str, float] = field(default_factory=dict)
    gpm_unavailable: Mapping[str, str] = field(default_factory=dict)


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
    period = reduce.sample_period_s([ts for ts, _ in w.util_samples])
    if w.fatal:
        reason = f"driver gone mid-run: {w.fatal}"
        return {}, dict.fromkeys(GPU_METRICS + GPM_METRICS, reason), [], period
    metrics: Metrics = {}
    unavailable: Unavailable = {}
    notes: list[str] = []
    series = _Series(w)

    after, until = w.util_bounds_us
    util = [v for _, v in reduce.in_window(((float(t), v) for t, v in w.util_samples), after + 1, until)]
    if util:
        metrics["gpu_util_pct"], metrics["gpu_util_max_pct"] = reduce.mean(util), max(util)
        notes.append(f"gpu_util_pct from {len(util)} NVML sample(s), period {period:.3f} s")
    else:
        polled = series.values("gpu_util_pct")
        why = w.util_samples_failure or "no NVML utilisation sample in the window"
        if polled:
            metrics["gpu_util_pct"], metrics["gpu_util_max_pct"] = reduce.mean(polled), max(polled)
            notes.append(f"gpu_util_pct from polled nvmlDeviceGetUtilizationRates ({why})")
        else:
            unavailable["gpu_util_pct"] = unavailable["gpu_util_max_pct"] = series.why("gpu_util_pct")

    series.put(metrics, unavailable, "mem_util_pct", "mem_util_pct", reduce.mean)
    series.put(metrics, unavailable, "gpu_mem_used_max_bytes", "gpu_mem_used_bytes", lambda v: int(max(v)))
    series.put(metrics, unavailable, "power_w", "power_w", reduce.mean)
    energy, how = _energy(w, series)
    if energy is None:
        unavailable["energy_j"] = unavailable["joules_per_token"] = how
    else:
        metrics["energy_j"] = energy
        notes.append(f"energy_j from {how}")
        if tokens > 0:
            metrics["joules_per_token"] = energy / tokens
        else:
            unavailable["joules_per_token"] = "no tokens counted"
    series.put(metrics, unavailable, "sm_clock_mhz", "sm_clock_mhz", reduce.mean)
    series.put(metrics, unavailable, "sm_clock_min_mhz", "sm_clock_mhz", min)
    if w.max_sm_clock_mhz is None:
        unavailable["sm_clock_max_mhz"] = w.max_sm_clock_failure or "not read"
    else:
        metrics["sm_clock_max_mhz"] = w.max_sm_clock_mhz
    series.put(metrics, unavailable, "mem_clock_mhz", "mem_clock_mhz", reduce.mean)
    series.put(metrics, unavailable, "temp_max_c", "temp_c", max)

    masks = [int(m) for m in series.values("throttle_mask")]
    if series.has("throttle_mask"):
        metrics["throttle_reasons"] = reduce.reasons_seen(masks)
    else:
        unavailable["throttle_reasons"] = series.why("throttle_mask")
    clocks = series.values("sm_clock_mhz")
    if series.has("throttle_mask") or (clocks and w.max_sm_clock_mhz is not None):
        metrics["throttled"] = reduce.is_throttled(clocks, w.max_sm_clock_mhz, masks)
    else:
        unavailable["throttled"] = f"no clock-event reasons ({series.why('throttle_mask')}) and no SM clock vs max"

    metrics.update(w.gpm)
    unavailable.update({k: v for k, v in w.gpm_unavailable.items() if k not in w.gpm})
    for name in GPM_METRICS:
        if name not in metrics and name not in unavailable:
            unavailable[name] = "not read"
    return metrics, unavailable, notes, period


def _energy(w: GpuWindow, series: _Series) -> tuple[float | None, str]:
    """(joules, how) — the counter delta where the counter exists, else the power integral; (None, why) if neither."""
    counter_why = w.energy_failure or "not read"
    if w.energy_mj is not None:
        joules = reduce.energy_from_counter(*w.energy_mj, window_s=w.window_s)
        if joules is not None:
            return joules, "the total-energy counter (nvmlDeviceGetTotalEnergyConsumption delta)"
        counter_why = "counter went backwards (reset?)"
    points = series.points("power_w")
    joules = reduce.energy_from_power(points, 0.0, w.window_s) if points else None
    if joules is None:
        return None, f"total-energy counter: {counter_why}; power: {series.why('power_w')}"
    return joules, f"power × time (sampled power integrated; total-energy counter: {counter_why})"


class _Series:
    """The polled samples of one window, read as per-reading series that know why they are missing."""

    def __init__(self, w: GpuWindow) -> None:
        self._w = w
        self._rows = [s for s in w.samples if 0.0 <= float(s["t_s"] or 0.0) <= w.window_s]

    def has(self, reading: str) -> bool:
        return reading not in self._w.failures and any(r.get(reading) is not None for r in self._rows)

    def points(self, reading: str) -> list[tuple[float, float]]:
        if reading in self._w.failures:
            return []
        return [(float(r["t_s"] or 0.0), float(v)) for r in self._rows if (v := r.get(reading)) is not None]

    def values(self, reading: str) -> list[float]:
        return [v for _, v in self.points(reading)]

    def why(self, reading: str) -> str:
        return self._w.failures.get(reading, "no samples")

    def put(self, metrics: Metrics, unavailable: Unavailable, name: str, reading: str, reduce_fn: _Reducer) -> None:
        values = self.values(reading)
        if values:
            metrics[name] = reduce_fn(values)
        else:
            unavailable[name] = self.why(reading)


def _max_int(samples: Sequence[Sample], reading: str) -> int | None:
    values = [int(v) for s in samples if (v := s.get(reading)) is not None]
    return max(values) if values else None


def _put(metrics: Metrics, unavailable: Unavailable, name: str, value: MetricValue, why: str) -> None:
    if value is None:
        unavailable[name] = why or "no samples"
    else:
        metrics[name] = value
