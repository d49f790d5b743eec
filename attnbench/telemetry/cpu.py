"""Host-process telemetry through psutil: CPU time, per-core utilisation, RSS and threads (layer 5).

psutil is imported inside functions so that importing the telemetry package needs nothing beyond the stdlib.
"""

from __future__ import annotations

import os
import time
from typing import Any

from attnbench.telemetry.assemble import HostCounters
from attnbench.telemetry.errors import TelemetryUnavailable
from attnbench.telemetry.sampler import Channel, Failure

GROUP = "psutil"


def _core_times(times: Any) -> tuple[float, float]:
    """(busy_s, total_s) of one core, counted as psutil.cpu_percent counts them: iowait is idle, and guest time is
    already inside user time on Linux."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total


class HostProcess:
    """This process, and the machine's cores, seen through psutil."""

    def __init__(self) -> None:
        try:
            import psutil
        except ImportError as exc:
            raise TelemetryUnavailable(f"psutil is not importable ({exc})") from None
        self._psutil = psutil
        self._process = psutil.Process(os.getpid())
        self.logical_cores = psutil.cpu_count(logical=True) or os.cpu_count() or 1
        self.counter_failure = ""  # why read_counters returned None

    def classify(self, exc: Exception) -> Failure | None:
        if isinstance(exc, self._psutil.Error | OSError):
            return Failure(f"{type(exc).__name__}: {exc}")
        return None

    def channels(self) -> list[Channel]:
        return [
            Channel("rss_bytes", lambda: int(self._process.memory_info().rss), self.classify, GROUP),
            Channel("threads", lambda: int(self._process.num_threads()), self.classify, GROUP),
        ]

    def read_counters(self) -> HostCounters | None:
        try:
            at_s = time.perf_counter()
            times = self._process.cpu_times()
            cores = [_core_times(t) for t in self._psutil.cpu_times(percpu=True)]
        except (self._psutil.Error, OSError) as exc:
            self.counter_failure = f"{type(exc).__name__}: {exc}"
            return None
        # Children are not counted: the work runs in this process's threads (torch's intra-op pool included).
        return HostCounters(times.user + times.system, at_s, cores)
