"""Host-process telemetry through psutil: CPU time, per-core utilisation, RSS and threads.

psutil is imported inside functions so that importing the telemetry package needs nothing beyond the stdlib.
"""

from __future__ import annotations

import os
import time
from typing import Any

from attnbench.host.sensors.assemble import HostCounters
from attnbench.host.sensors.faults import TelemetryUnavailable
from attnbench.host.sensors.sampler import Channel, Failure

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
        # The cores this process may run on (taskset, a container's cpuset), not the whole machine's: a process
        # pinned to 2 of 64 cores that keeps both busy is at 100 %, not 3 %.
        try:
            self._cores: list[int] | None = sorted(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            self._cores = None
        self.logical_cores = len(self._cores) if self._cores else psutil.cpu_count(logical=True) or os.cpu_count() or 1
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
            per_core = self._psutil.cpu_times(percpu=True)
            if self._cores and all(i < len(per_core) for i in self._cores):
                per_core = [per_core[i] for i in self._cores]
            cores = [_core_times(t) for t in per_core]
        except (self._psutil.Error, OSError) as exc:
            self.counter_failure = f"{type(exc).__name__}: {exc}"
            return None
        # Children are not counted: the work runs in this process's threads (torch's intra-op pool included).
        return HostCounters(times.user + times.system, at_s, cores)
