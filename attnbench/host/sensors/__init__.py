"""Hardware telemetry per case: GPU utilisation, memory, power, clocks, energy (NVML) and CPU use (psutil).

``open_telemetry(device, level, interval_s)`` gives a context around a case's measured window; ``mark_sampling()``
inside it says where warm-up ended (GPM is taken from there); after it exits, ``summary(calls=...,
tokens_per_call=...)`` gives a ``TelemetrySummary`` (``results.telemetry``: the stored value).
Importing this package needs the stdlib only: psutil, pynvml and torch are imported inside the functions that use them.
"""

from __future__ import annotations

from attnbench.host.sensors.session import Telemetry, open_telemetry, telemetry_status

__all__ = ["Telemetry", "open_telemetry", "telemetry_status"]
