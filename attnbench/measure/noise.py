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

from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.stats import student_t_975
from attnbench.measure.events import Progress
from attnbench.measure.executor import ExecutorSettings
from attnbench.measure.isolation import IsolatedExecutor
from attnbench.results.calibration import NoiseFloor
from attnbench.results.files import utc_now

DEFAULT_PROCESSES = 5

# The timing a regression gate would use (configs/aa-cpu.yaml): tight, with a budget that keeps a process short.
NOISE_POLICY = TimingPolicy(
    target_ci=0.01, min_samples=20, min_time_s=0.5, max_case_s=2.5, warmup_min_calls=3, warmup_max_s=0.5
)


def reference_cases(device: str) -> tuple[Case, ...]:
    """A recurrent forward, an attention training step and a fused attention forward: different kernels, each a
    few ms per call on the device (long against clock resolution, short enough for several processes)."""
    if device.startswith("cuda"):
        return (
            Case("lstm", "forward", "float32", device, 8, 512, 1024, None, 1, True),
            Case("vanilla", "train", "bfloat16", device, 8, 1024, 1024, 16, 1, False),
            Case("sdpa-flash", "forward", "bfloat16", device, 8, 2048, 1024, 16, 4, False),
        )
    return (
        Case("lstm", "forward", "float32", device, 4, 256, 256, None, 1, True),
        Case("vanilla", "train", "float32", device, 4, 256, 256, 4, 1, False),
        Case("sdpa-flash", "forward", "float32", device, 4, 256, 256, 4, 1, False),
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
    """Run the reference cases in ``processes`` fresh workers (one per round) and pool their spread."""
    if processes < 2:
        raise ValueError("measure_noise() needs at least two processes")
    chosen = tuple(cases or reference_cases(device))
    settings = ExecutorSettings(device=device, timing=policy, threads=threads, telemetry="off")
    medians: dict[str, list[float]] = {case.key: [] for case in chosen}
    contended = 0
    for round_ in range(processes):
        executor = IsolatedExecutor(settings)
        try:
            for case in chosen:
                result = executor.run(case)
                if not result.is_timed:
                    raise RuntimeError(f"reference case {case.label} ended {result.status}: {result.reason}")
                medians[case.key].append(result.median_s)
                contended += result.contended
        finally:
            executor.close()
        if progress is not None:
            progress(f"noise: process {round_ + 1} of {processes} done")
    floor, sigma = noise_floor(list(medians.values()))
    return NoiseFloor(
        floor=floor,
        sigma_log=sigma,
        processes=processes,
        cases=tuple(medians),
        spreads=tuple(max(m) / min(m) - 1 for m in medians.values()),
        measured_utc=utc_now(),
        contended=contended,
    )
