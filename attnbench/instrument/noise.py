"""The machine's between-process noise, measured (``attnbench calibrate``): compare's noise floor for this machine.

Within one process a case's samples agree to about 1 %; between two processes of unchanged code the same case
moves by 2–15 % on a shared VM (memory layout, thread placement, frequency, the neighbours). ``compare`` with one
process per side cannot see that spread in its samples, so it widens their interval by a floor — and a floor
tuned on another machine fails here (issue 17: ±4 % gave 4 false verdicts in 8 cases on a quiet 2-core EPYC).
So it is measured: a few reference cases, each run in ``processes`` fresh worker processes (one worker per round,
as a sweep is one process), the spread of their medians pooled into one figure (``results.calibration.NoiseFloor``).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import replace

from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.stats import student_t_975
from attnbench.families.references import EXPLICIT_ATTENTION, FUSED_ATTENTION, STEPWISE_RECURRENCE, reference_case
from attnbench.results.calibration import NoiseFloor
from attnbench.results.files import utc_now
from attnbench.sweeps.events import Progress
from attnbench.sweeps.isolated_executor import IsolatedExecutor
from attnbench.timing.executor import ExecutorSettings

# Eight, not five: the floor is a standard deviation estimated from (processes − 1) × 3 degrees of freedom, and on
# the 2-vCPU VM five processes (12) read one machine's floor anywhere from ±10 % to ±17 % from one calibration to
# the next (the estimate's own ±20 %); eight (21) narrow that to about ±15 % for ~25 s more, once per machine.
DEFAULT_PROCESSES = 8

# The timing a regression gate would use (configs/aa-cpu.yaml): tight, with a budget that keeps a process short.
NOISE_POLICY = TimingPolicy(
    target_ci=0.01, min_samples=20, min_time_s=0.5, max_case_s=2.5, warmup_min_calls=3, warmup_max_s=0.5
)


def reference_cases(device: str) -> tuple[Case, ...]:
    """A recurrent forward, an attention training step and a fused attention forward: different kernels, each a
    few ms per call on the device (long against clock resolution, short enough for several processes)."""
    if device.startswith("cuda"):
        return (
            reference_case(STEPWISE_RECURRENCE, "forward", "float32", device, 8, 512, 1024, 16),
            reference_case(EXPLICIT_ATTENTION, "train", "bfloat16", device, 8, 1024, 1024, 16),
            replace(reference_case(FUSED_ATTENTION, "forward", "bfloat16", device, 8, 2048, 1024, 16), layers=4),
        )
    return (
        reference_case(STEPWISE_RECURRENCE, "forward", "float32", device, 4, 256, 256, 4),
        reference_case(EXPLICIT_ATTENTION, "train", "float32", device, 4, 256, 256, 4),
        reference_case(FUSED_ATTENTION, "forward", "float32", device, 4, 256, 256, 4),
    )


def noise_floor(medians: Sequence[Sequence[float]]) -> tuple[float, float]:
    """(floor, sigma_log) from each case's per-process medians: the pooled standard deviation of the log medians,
    and the half-width of a 95 % interval of the ratio of two single processes (``NoiseFloor``)."""
    usable = [m for m in medians if len(m) >= 2]
    if not usable:
        raise ValueError("noise_floor() needs at least two processes of one case")
    df = sum(len(m) - 1 for m in usable)
    ss = sum(sum((math.log(x) - statistics.fmean(math.log(y) for y in m)) ** 2 for x in m) for m in usable)
    sigma = math.sqrt(ss / df)
    return math.expm1(student_t_975(df) * math.sqrt(2) * sigma), sigma


def measure_noise(
    device: str,
    threads: int | None,
    *,
    processes: int = DEFAULT_PROCESSES,
    cases: Sequence[Case] | None = None,
    policy: TimingPolicy = NOISE_POLICY,
    progress: Progress | None = None,
) -> NoiseFloor:
    """Run the reference cases in ``processes`` fresh workers (one per round) and pool their spread.

    A round with a case timed on a busy machine is taken again, up to ``processes`` more rounds in all: compare
    withholds its verdict on contended cases anyway, so the floor it widens the others by is the quiet machine's.
    When the machine stays busy the floor is made of the busy rounds it has, and ``NoiseFloor.contended`` says so.
    """
    if processes < 2:
        raise ValueError("measure_noise() needs at least two processes")
    chosen = tuple(cases or reference_cases(device))
    settings = ExecutorSettings(device=device, timing=policy, threads=threads, telemetry="off")
    quiet: list[list[float]] = []  # per round, its medians in case order
    busy: list[tuple[list[float], int]] = []  # rounds with contended timings, and how many
    while len(quiet) < processes and len(quiet) + len(busy) < 2 * processes:
        medians, contended = _round(settings, chosen)
        if contended:
            busy.append((medians, contended))
            message = f"noise: a process ran on a busy machine ({contended} contended timings), taking it again"
        else:
            quiet.append(medians)
            message = f"noise: process {len(quiet)} of {processes} done"
        if progress is not None:
            progress(message)
    filling = busy[: processes - len(quiet)]  # busy rounds stand in only where quiet ones never came
    kept = quiet + [m for m, _ in filling]
    by_case = [[round_[i] for round_ in kept] for i in range(len(chosen))]
    floor, sigma = noise_floor(by_case)
    return NoiseFloor(
        floor=floor,
        sigma_log=sigma,
        processes=len(kept),
        cases=tuple(case.key for case in chosen),
        spreads=tuple(max(m) / min(m) - 1 for m in by_case),
        measured_utc=utc_now(),
        contended=sum(n for _, n in filling),
    )


def _round(settings: ExecutorSettings, cases: Sequence[Case]) -> tuple[list[float], int]:
    """One fresh worker process timing every reference case: their medians, and how many were contended."""
    executor = IsolatedExecutor(settings)
    medians, contended = [], 0
    try:
        for case in cases:
            result = executor.run(case)
            if result.status == "too_slow_for_budget" and result.measurement is not None:
                # Its calls ran slower than its own warm-up promised, so far that min_samples no longer fit: the
                # machine was busy, whatever the counters saw. A busy round, taken again.
                medians.append(result.measurement.median_s)
                contended += 1
                continue
            if not result.is_timed:
                raise RuntimeError(f"reference case {case.label} ended {result.status}: {result.reason}")
            medians.append(result.median_s)
            contended += result.contended
    finally:
        executor.close()
    return medians, contended
