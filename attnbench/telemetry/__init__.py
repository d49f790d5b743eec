"""Hardware telemetry per case: GPU utilisation, memory, power, clocks, energy (NVML) and CPU use (psutil).

``open_telemetry(device, level, interval_s)`` gives a context around a case's measured window; after it exits,
``summary(calls=..., tokens_per_call=...)`` gives a ``TelemetrySummary``. Importing this package needs the stdlib
only: psutil, pynvml and torch are imported inside the functions that use them.
"""

from __future__ import annotations

from attnbench.telemetry.session import Telemetry, open_telemetry, telemetry_status
from attnbench.telemetry.summary import (
    CPU_METRICS,
    GPM_METRICS,
    GPU_METRICS,
    LEVELS,
    METRIC_TYPES,
    METRICS,
    Level,
    TelemetrySummary,
)

__all__ = [
    "CPU_METRICS",
    "GPM_METRICS",
    "GPU_METRICS",
    "LEVELS",
    "METRICS",
    "METRIC_TYPES",
    "Level",
    "Telemetry",
    "TelemetrySummary",
    "open_telemetry",
    "telemetry_status",
]
