"""Fakes for true seams only: a seeded clock for the timing loop, and an executor (``measure.executor.Executor``)
that turns cases into canned, realistic rows without running anything."""

from __future__ import annotations

import math
import os
import random
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Literal

from attnbench.core.cases import Case
from attnbench.families.catalogue import is_recurrent
from attnbench.families.flops import count_flops
from attnbench.host.sensors.assemble import CpuWindow, HostCounters, cpu_metrics
from attnbench.host.sensors.reduce import reliability
from attnbench.host.sensors.sampler import Sample
from attnbench.results.contention import Contention
from attnbench.results.files import utc_now
from attnbench.results.measurement import Measurement
from attnbench.results.records import Memory, Result
from attnbench.results.telemetry import NVML_METRICS, TelemetrySummary
from attnbench.timing.executor import Executor, ExecutorSettings


class FakeClock:
    """Each call of the timed function 'takes' a duration drawn from ``durations``; time advances by it.

    ``durations(call_index, rng)`` returns seconds, so a test can script warm-up (slow first calls), noise
    levels and drifts exactly, with a fixed seed.
    """

    def __init__(
        self, durations: Callable[[int, random.Random], float], seed: int = 0, overhead_s: float = 0.0
    ) -> None:
        self.durations = durations
        self.rng = random.Random(seed)
        self.t = 0.0
        self.calls = 0
        self.overhead_s = overhead_s

    def now(self) -> float:
        return self.t

    def time(self, fn: Callable[[], object], calls_per_sample: int, samples: int) -> list[float]:
        out = []
        for _ in range(samples):
            total = 0.0
            for _ in range(calls_per_sample):
                fn()
                total += self.durations(self.calls, self.rng)
                self.calls += 1
            self.t += total + self.overhead_s
            out.append(total / calls_per_sample)
        return out


def gaussian(
    median_s: float, rel_sd: float, warmup_calls: int = 0, warmup_factor: float = 5.0
) -> Callable[[int, random.Random], float]:
    """Stationary noise around ``median_s`` after ``warmup_calls`` calls that are ``warmup_factor`` slower."""

    def durations(i: int, rng: random.Random) -> float:
        base = median_s * (warmup_factor if i < warmup_calls else 1.0)
        return max(base * 1e-3, rng.gauss(base, base * rel_sd))

    return durations


# ------------------------------------------------------------------------------------------ the executor seam
Outcome = Literal[
    "ok",
    "oom",
    "unsupported",
    "error",
    "timeout",
    "crashed",
    "too_slow_for_budget",
    "interrupt",  # the case is under way when Ctrl-C (or the CLI's SIGTERM handler) raises KeyboardInterrupt
    "process_crash",  # the sweep's own process dies mid-case (SIGKILL to itself): only for a sweep in a subprocess
]

# What each failure says, worded as the real executors word it (measure.failures, measure.isolation), so that
# everything downstream reads the rows it would read after a real sweep.
REASONS: dict[str, str] = {
    "oom": "RuntimeError: [enforce fail at alloc_cpu.cpp:119] DefaultCPUAllocator: not enough memory: you tried to "
    "allocate 137438953472 bytes.",
    "unsupported": "sdpa-efficient needs CUDA (this is cpu)",
    "error": "ValueError: injected by the fake executor",
    "timeout": "still running after 1 s (case_timeout_s); the worker was killed",
    "crashed": "the worker was killed by SIGSEGV",
    "too_slow_for_budget": "too slow for the budget: a sample takes 400 ms, so timing.min_samples = 5 samples "
    "cannot fit in the 1 s left of timing.max_case_s",
}


def selects(pattern: str, case: Case) -> bool:
    """Whether ``pattern`` — ``key=value`` parts of a case key joined by ``|``, e.g. ``model=lstm|seq_len=32`` —
    names ``case``: every part it gives is one of the key's."""
    parts = set(case.key.split("|"))
    return all(part in parts for part in pattern.split("|"))


def latency_s(case: Case) -> float:
    """A plausible median per call on a small CPU: recurrent models ∝ n (one step per token), attention ∝ n²
    past a fixed cost, train ≈ 3× forward, decode one step. The numbers only need the shapes of real curves."""
    tokens = case.batch * case.seq_len
    width = (case.d_model / 32) ** 2 * case.layers
    if case.mode == "decode":
        steps = case.batch * (1 if is_recurrent(case) else case.seq_len / 64)
        return 20e-6 + 2e-6 * steps * width
    if is_recurrent(case):
        per_call = 30e-6 + 4e-6 * tokens * width
    else:
        per_call = 40e-6 + 1e-6 * tokens * width + 2e-9 * case.batch * case.seq_len**2 * (case.heads or 1)
    return per_call * (3.0 if case.mode == "train" else 2.0 if case.mode == "backward" else 1.0)


class FakeExecutor:
    """The ``Executor`` protocol with canned rows, in the manner of hyperfine's ``MockExecutor``: nothing runs, so
    a sweep of a hundred cases takes milliseconds and says exactly what the test scripted.

    ``outcomes`` maps case-key patterns (``selects``) to what that case does; the first pattern that names a case
    wins, and every other case is ``ok``. An ``ok`` row holds a real ``Measurement``: seeded log-normal samples
    around ``latency(case) × slowdown``, a warm-up record, converged or not; a ``too_slow_for_budget`` row its few
    samples. Rows carry memory, parameters, the FLOP count and, unless telemetry is off, a psutil-style telemetry
    window with raw samples, as the in-process executor's do. ``delay_s`` sleeps in each case (so that a signal
    lands inside one). What ran is kept in ``ran``; ``closed`` records each ``close(now=…)``."""

    def __init__(
        self,
        settings: ExecutorSettings | None = None,
        outcomes: Mapping[str, Outcome] | None = None,
        *,
        latency: Callable[[Case], float] = latency_s,
        slowdown: float = 1.0,
        noise: float = 0.03,
        delay_s: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.settings = settings or ExecutorSettings("cpu")
        self.outcomes = dict(outcomes or {})
        self.latency = latency
        self.slowdown = slowdown
        self.noise = noise
        self.delay_s = delay_s
        self.seed = seed
        self.ran: list[Case] = []
        self.closed: list[bool] = []

    def outcome(self, case: Case) -> Outcome:
        return next((outcome for pattern, outcome in self.outcomes.items() if selects(pattern, case)), "ok")

    def run(self, case: Case) -> Result:
        started, t0 = utc_now(), time.perf_counter()
        self.ran.append(case)
        outcome = self.outcome(case)
        if self.delay_s:
            time.sleep(self.delay_s)
        if outcome == "interrupt":
            raise KeyboardInterrupt
        if outcome == "process_crash":
            os.kill(os.getpid(), signal.SIGKILL)
        if outcome == "ok" or outcome == "too_slow_for_budget":
            result = self._timed(case, outcome)
        else:
            assert outcome != "process_crash"  # SIGKILL does not return
            result = Result(case, outcome, REASONS[outcome])
        return replace(result, started_utc=started, duration_s=time.perf_counter() - t0 + self._spent(result))

    def close(self, *, now: bool = False) -> None:
        self.closed.append(now)

    # -------------------------------------------------------------------------------------------- the rows
    def _rng(self, case: Case) -> random.Random:
        return random.Random(f"{self.seed}|{case.key}")  # the same case, the same samples, in any order

    def _timed(self, case: Case, outcome: Literal["ok", "too_slow_for_budget"]) -> Result:
        policy = self.settings.timing
        rng = self._rng(case)
        median = self.latency(case) * self.slowdown
        slow = outcome == "too_slow_for_budget"
        count = 2 if slow else max(policy.min_samples, 24)
        samples = tuple(median * math.exp(rng.gauss(0.0, self.noise)) for _ in range(count))
        calls = max(1, math.ceil(policy.min_sample_s / median))
        warnings = (REASONS["too_slow_for_budget"],) if slow else ()
        measurement = Measurement(
            samples,
            calls,
            policy.warmup_min_calls + 2,
            (policy.warmup_min_calls + 2) * median * 1.5,
            not slow,
            "too_slow_for_budget" if slow else "converged",
            policy.target_ci,
            warnings,
        )
        work = count_flops(case)
        extra: dict[str, str | int | float | bool | None] = {
            "torch_threads": self.settings.threads or 1,
            "flops": work.flops,
            "flops_formula": work.formula,
        }
        window_s = sum(samples) * calls
        return Result(
            case,
            outcome,
            REASONS["too_slow_for_budget"] if slow else "",
            measurement=measurement,
            memory=Memory(4096 * case.batch * case.seq_len * case.layers, "rss-hwm"),
            parameters=4 * case.d_model * case.d_model * case.layers,
            extra=extra,
            telemetry=None if self.settings.telemetry == "off" else _cpu_telemetry(self.settings, window_s, rng),
            contention=Contention(False, (), window_s, threads=self.settings.threads or 1, logical_cores=2),
        )

    @staticmethod
    def _spent(result: Result) -> float:
        """The wall time the row says its case took: its warm-up and samples, plus building the model."""
        m = result.measurement
        return 0.0 if m is None else 0.02 + m.warmup_s + sum(m.samples_s) * m.calls_per_sample


def _cpu_telemetry(settings: ExecutorSettings, window_s: float, rng: random.Random) -> TelemetrySummary:
    """A CPU run's telemetry window, assembled by the real reducers from psutil-style samples."""
    interval = settings.interval_s
    count = max(1, min(50, int(window_s / interval) + 1))
    rss = 200 * 2**20
    samples: list[Sample] = [
        {"t_s": i * interval, "rss_bytes": rss + rng.randrange(2**20), "threads": settings.threads or 1}
        for i in range(count)
    ]
    # One core busy with the case, the other mostly idle: (busy_s, total_s) per core at each end.
    start = HostCounters(process_cpu_s=1.0, at_s=0.0, cores=((0.0, 0.0), (0.0, 0.0)))
    cores = ((0.95 * window_s, window_s), (0.05 * window_s, window_s))
    end = HostCounters(process_cpu_s=1.0 + 0.95 * window_s, at_s=window_s, cores=cores)
    metrics, unavailable = cpu_metrics(CpuWindow(window_s, samples, {}, 2, start, end))
    unavailable.update(dict.fromkeys(NVML_METRICS, "CPU run"))
    reliable, why = reliability(window_s, count, None)
    note = "; ".join(why)
    return TelemetrySummary(
        "psutil", settings.telemetry, interval, window_s, count, reliable, note, metrics, unavailable, tuple(samples)
    )


class FakeExecutors:
    """Builds a ``FakeExecutor`` for each sweep, with ``outcomes`` and ``options`` as they are when the sweep starts:
    pass it as ``open_sweep(request, executor=…)``, or take the ``fake_executors`` fixture, which puts it in place of
    ``measure.sweep.make_executor`` for sweeps the CLI starts. ``built`` holds every executor it made."""

    def __init__(self, outcomes: Mapping[str, Outcome] | None = None, **options: Any) -> None:
        self.outcomes: dict[str, Outcome] = dict(outcomes or {})
        self.options: dict[str, Any] = options
        self.built: list[FakeExecutor] = []

    def __call__(self, settings: ExecutorSettings, *, isolate: bool) -> Executor:
        self.built.append(FakeExecutor(settings, self.outcomes, **self.options))
        return self.built[-1]

    @property
    def ran(self) -> list[Case]:
        """Every case any of them ran, in order."""
        return [case for executor in self.built for case in executor.ran]
