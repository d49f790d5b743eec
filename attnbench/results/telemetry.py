"""The per-case telemetry summary and its serialisation. Stdlib only: no torch, psutil or pynvml.

The summary is stored inside a result row, so its dict form is versioned with the results schema
(``attnbench.results.SCHEMA_VERSION``): a change here is a change there. Metrics added since the first version
(``ADDED_METRICS``: ``sm_clock_drop_pct``, ``gpm_window_s``, ``gpm_reliable``) are optional on reading, so older
rows read back, and summary.csv puts their columns after every older column.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from attnbench.core.cases import LEVELS
from attnbench.results import fields
from attnbench.results.fields import FieldError

Source = Literal["nvml+psutil", "psutil", "off"]

SOURCES: tuple[Source, ...] = ("nvml+psutil", "psutil", "off")

MetricValue = float | int | bool | str | None

RawValue = float | int | None

# Every metric, in CSV order, with the Python type its value has. Units are in the names (pct, bytes, w, j, mhz, c).
GPU_METRICS: tuple[str, ...] = (
    "gpu_util_pct",  # NVML "percent of time over the past sample period during which one or more kernels ran": mean
    "gpu_util_max_pct",  # the same, max over in-window samples. Not SM occupancy: one tiny kernel counts as 100 %.
    "mem_util_pct",  # memory-controller utilisation (percent of time device memory was read or written), mean
    "gpu_mem_used_max_bytes",  # device memory in use by every process, max
    "power_w",  # board power, mean
    "energy_j",  # total-energy counter delta; power × time only where the counter is not supported (see note)
    "joules_per_token",  # energy_j / (calls × tokens per call)
    "sm_clock_mhz",  # mean
    "sm_clock_min_mhz",
    "sm_clock_max_mhz",  # the device's maximum SM clock, the yardstick of `throttled`
    "mem_clock_mhz",  # mean
    "temp_max_c",
    "throttle_reasons",  # ';'-joined clock-event reasons seen in any sample, "" if none
    "throttled",  # a thermal or power reason fired AND the SM clock fell more than 5 % below its maximum
)

GPM_METRICS: tuple[str, ...] = (  # NVML GPU Performance Monitoring, between samples at window start and end
    "gpm_sm_util_pct",
    "gpm_sm_occupancy_pct",
    "gpm_tensor_util_pct",
    "gpm_dram_bw_util_pct",
)

CPU_METRICS: tuple[str, ...] = (
    "cpu_util_pct",  # this process: CPU time / (window × logical cores) × 100; 100 = every core busy
    "cpu_util_per_core_mean_pct",  # system-wide, mean of per-core utilisation over the window
    "rss_max_bytes",  # this process, sampled
    "threads_max",  # this process, sampled
)

FIRST_METRICS: tuple[str, ...] = GPU_METRICS + GPM_METRICS + CPU_METRICS  # the first contract, in CSV order

GPM_WINDOW_METRICS: tuple[str, ...] = (
    "gpm_window_s",  # the span GPM covers: the sampling phase (warm-up excluded), end to end
    "gpm_reliable",  # False below 1 s: GPM's counters refresh every ~100 ms, so shorter spans are quantised
)

ADDED_METRICS: tuple[str, ...] = (  # issue 12; summary.csv puts these after every older column
    "sm_clock_drop_pct",  # how far the mean SM clock sat below the device's maximum (0 = at it), the size of a fall
    *GPM_WINDOW_METRICS,
)

METRICS: tuple[str, ...] = FIRST_METRICS + ADDED_METRICS

NVML_METRICS: tuple[str, ...] = GPU_METRICS + GPM_METRICS + ADDED_METRICS  # everything that needs NVML

_INT_METRICS = frozenset({"gpu_mem_used_max_bytes", "rss_max_bytes", "threads_max"})
_BOOL_METRICS = frozenset({"throttled", "gpm_reliable"})

METRIC_TYPES: Mapping[str, type] = {
    name: str
    if name == "throttle_reasons"
    else bool
    if name in _BOOL_METRICS
    else int
    if name in _INT_METRICS
    else float
    for name in METRICS
}

_REQUIRED = (
    "source",
    "level",
    "interval_s",
    "window_s",
    "samples",
    "reliable",
    "note",
    "metrics",
    "unavailable",
)


@dataclass(frozen=True)
class TelemetrySummary:
    """What the hardware did during one case's measured window.

    Every metric of ``METRICS`` is either in ``metrics`` or in ``unavailable`` with the reason (except at level
    "off", where both are empty), so CSV columns always exist and an empty cell always has an explanation.
    ``reliable`` is False when the window was too short for NVML's averaging period or held fewer than 3 samples;
    ``note`` says why, and which energy method was used.

    ``gpu_util_pct`` is NVML's figure, the percent of time over its sample period during which one or more kernels
    ran on the GPU: one small kernel keeps it at 100 %. It is the number people quote, not efficiency; the GPM
    metrics (SM util, occupancy, tensor-core and DRAM-bandwidth util, Hopper and newer) and ``pct_of_peak`` are.
    """

    source: str  # one of SOURCES
    level: str  # one of LEVELS
    interval_s: float
    window_s: float
    samples: int
    reliable: bool
    note: str
    metrics: Mapping[str, MetricValue]
    unavailable: Mapping[str, str]
    raw: tuple[Mapping[str, RawValue], ...] = ()  # every polled sample: t_s from window start + readings

    def to_dict(self, include_raw: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {
            "source": self.source,
            "level": self.level,
            "interval_s": self.interval_s,
            "window_s": self.window_s,
            "samples": self.samples,
            "reliable": self.reliable,
            "note": self.note,
            "metrics": {name: self.metrics[name] for name in METRICS if name in self.metrics},
            "unavailable": {name: self.unavailable[name] for name in METRICS if name in self.unavailable},
        }
        if include_raw:
            data["raw"] = [dict(row) for row in self.raw]
        return data

    @classmethod
    def from_dict(cls, data: object) -> TelemetrySummary:
        """Read ``to_dict``'s output back. Anything else raises ``fields.FieldError`` (a ValueError) naming the key."""
        d = fields.record(data, "", _REQUIRED, ("raw",))
        metrics = _metrics(d["metrics"])
        unavailable = fields.record(d["unavailable"], "unavailable", (), METRICS)
        for name, reason in unavailable.items():
            fields.text(reason, fields.path("unavailable", name))
            if name in metrics:
                raise FieldError(fields.path("unavailable", name), "also present in metrics")
        return cls(
            source=fields.choice(d["source"], "source", SOURCES, "telemetry source"),
            level=fields.choice(d["level"], "level", LEVELS, "telemetry level"),
            interval_s=fields.number(d["interval_s"], "interval_s", positive=True),
            window_s=fields.number(d["window_s"], "window_s"),
            samples=fields.integer(d["samples"], "samples", minimum=0),
            reliable=fields.flag(d["reliable"], "reliable"),
            note=fields.text(d["note"], "note"),
            metrics=metrics,
            unavailable=dict(unavailable),
            raw=tuple(fields.items(d.get("raw", []), "raw", _raw_row)),
        )


def _metrics(data: object) -> dict[str, MetricValue]:
    m = fields.record(data, "metrics", (), METRICS)
    out: dict[str, MetricValue] = {}
    for name, value in m.items():
        key, kind = fields.path("metrics", name), METRIC_TYPES[name]
        if value is None:
            out[name] = None
        elif kind is str:
            out[name] = fields.text(value, key)
        elif kind is bool:
            out[name] = fields.flag(value, key)
        elif kind is int:
            out[name] = fields.integer(value, key, minimum=0)
        else:
            out[name] = fields.number(value, key)  # finite, ≥ 0: every float metric is a rate, a level or a total
    return out


def _raw_row(value: object, key: str) -> dict[str, RawValue]:
    if not isinstance(value, dict):
        raise fields.expected(key, "an object", value)
    row: dict[str, RawValue] = {}
    for name, reading in value.items():
        ok = reading is None or (
            isinstance(reading, int | float) and not isinstance(reading, bool) and math.isfinite(reading)
        )
        if not isinstance(name, str) or not ok:
            raise fields.expected(fields.path(key, str(name)), "a finite number or null", reading)
        row[name] = reading
    return row
