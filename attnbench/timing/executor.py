"""The executor seam: what turns one ``Case`` into one ``Result``, and the settings every executor shares.

Three executors keep this contract: ``TorchExecutor`` (in this process), ``IsolatedExecutor`` (each case in a
worker process, so a segfault or a hang costs one row) and ``ReplicatedExecutor`` (each case in several fresh
workers, merged into one row). The sweep loop sees only ``Executor``; ``sweep.make_executor`` picks the one a
sweep asked for. Importing this module does not import torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Protocol

from attnbench.core.cases import Case, Level, TimingPolicy, default_interval_s
from attnbench.results.records import Result


class Executor(Protocol):
    def run(self, case: Case) -> Result:
        """Measure one case; every failure of the work is a row, never an exception (Ctrl-C aside)."""
        ...

    def close(self, *, now: bool = False) -> None:
        """Release workers and devices: politely between cases, at once (``now``) when a case may be running."""
        ...


@dataclass(frozen=True)
class ExecutorSettings:
    """How every case of a sweep is measured, in one value that crosses into a worker process unchanged."""

    device: str  # resolved: "cpu", "cuda:0"
    timing: TimingPolicy = field(default_factory=TimingPolicy)
    seed: int = 0
    threads: int | None = None  # torch's intra-op threads; None leaves torch's default
    timeout_s: float = 600.0  # a case in a worker process still running after this is killed (``timeout``)
    telemetry: Level = "basic"
    telemetry_interval_s: float | None = None  # None: ``default_interval_s`` of the device
    # Validation of `compare` only: busy-wait this fraction of each call's time inside every timed call.
    inject_slowdown: float = 0.0
    # For the profilers people already use (sweep --profile, --nvtx, --run-once): the folder that receives one
    # Chrome trace per ok case (None: no traces); an NVTX range named by the case key around each timed call (a
    # GPU only); one timed call after the warm-up instead of the stopping rule, for nsys and ncu.
    trace_dir: str | None = None
    nvtx: bool = False
    run_once: bool = False
    # Hold each case's output to its family's reference before timing it (timing.reference_check); off: config
    # ``check: off`` or ``sweep --no-check``.
    check: bool = True
    # Case keys whose time budget another run decided (sweep --budget-from: it timed them ok): each takes
    # timing.min_samples even past timing.max_case_s, so a case at the edge of its budget is ok on both sides or
    # neither, and a slowdown is judged by its time, never hidden behind a flip to too_slow_for_budget (issue 51).
    decided_ok: frozenset[str] = frozenset()

    @property
    def interval_s(self) -> float:
        return self.telemetry_interval_s or default_interval_s(self.device)


def detach_cupti_after_profiling() -> None:
    """Have kineto detach CUPTI when a profile ends, so the profiled call costs no later case anything.

    Without ``TEARDOWN_CUPTI=1`` kineto leaves CUPTI subscribed after profiling, and every later kernel launch in
    the process pays for it (10-20 % in pytorch issue 144455). kineto's C++ reads the variable with ``getenv``
    when a profile starts and stops, and the value must be exactly "1". Called before a worker imports torch and
    when an executor starts; a value the user set stands.
    """
    os.environ.setdefault("TEARDOWN_CUPTI", "1")
