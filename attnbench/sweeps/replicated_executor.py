"""Between-process replicates (``timing.processes``): one case, several fresh worker processes, one row.

Within one process the samples of a case agree to a few per cent; between processes the same case moves by
10–25 % on a shared machine (memory layout, thread placement, the neighbours' load). A regression gate needs
that second spread, and only fresh processes show it. Pure Python: the worker processes do the torch work.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Literal

from attnbench.core.cases import Case
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result
from attnbench.timing.executor import Executor


class ReplicatedExecutor:
    """Runs every case in ``processes`` fresh workers of ``inner`` in turn and merges their rows."""

    def __init__(self, inner: Executor, processes: int) -> None:
        if processes < 2:
            raise ValueError("ReplicatedExecutor needs at least two processes")
        self.inner = inner
        self.processes = processes

    def run(self, case: Case) -> Result:
        results: list[Result] = []
        for index in range(self.processes):
            self.inner.close()  # the next run starts a fresh worker: a new process is the point
            result = self.inner.run(case)
            if not result.ok:
                # One failed replicate fails the case: a case that crashes one time in three is not "ok".
                prefix = f"replicate {index + 1} of {self.processes}: "
                return replace(result, reason=prefix + result.reason)
            results.append(result)
        return merge_replicates(results)

    def close(self, *, now: bool = False) -> None:
        self.inner.close(now=now)


def merge_replicates(results: Sequence[Result], unit: Literal["replicate", "round"] = "replicate") -> Result:
    """One row from several ok replicates of the same case (``unit`` round: the blocks of ``timing.rounds``).

    Samples are pooled (the within-process view) and each replicate's median is kept (the between-process
    view, which widens the CI: ``Measurement.summary``). Memory is the largest peak; telemetry and extras are
    the first replicate's, and the row says so (``extra.replicates``, or ``extra.rounds``, counts them);
    contention is the first contended replicate's, if any.
    """
    if not results or any(not r.ok or r.measurement is None for r in results):
        raise ValueError("merge_replicates() takes ok results with measurements")
    first = results[0]
    if any(r.case != first.case for r in results):
        raise ValueError("merge_replicates() takes replicates of one case")
    measurements = [r.measurement for r in results if r.measurement is not None]
    warnings = [f"{unit} {i + 1}: {w}" for i, m in enumerate(measurements) for w in m.warnings]
    grouping = {m.calls_per_sample for m in measurements}
    if len(grouping) > 1:
        warnings.append(f"{unit}s grouped calls differently ({sorted(grouping)} calls per sample)")
    merged = Measurement(
        samples_s=tuple(s for m in measurements for s in m.samples_s),
        calls_per_sample=measurements[0].calls_per_sample,
        warmup_calls=sum(m.warmup_calls for m in measurements),
        warmup_s=sum(m.warmup_s for m in measurements),
        converged=all(m.converged for m in measurements),
        stop_reason=next((m.stop_reason for m in measurements if not m.converged), "converged"),
        target_ci=measurements[0].target_ci,
        warnings=tuple(warnings),
        warmup_moved=sum(m.warmup_moved for m in measurements),
        replicate_medians_s=tuple(m.median_s for m in measurements),
        injected_delay_s=statistics.fmean(m.injected_delay_s for m in measurements),
    )
    peaks = [r.memory.peak_bytes for r in results if r.memory is not None and r.memory.peak_bytes is not None]
    memory = replace(first.memory, peak_bytes=max(peaks)) if first.memory is not None and peaks else first.memory
    extra = {**first.extra, f"{unit}s": len(results), "telemetry_from": f"{unit} 1"}
    return replace(
        first,
        measurement=merged,
        memory=memory,
        duration_s=sum(r.duration_s for r in results),
        extra=extra,
        # One contended replicate makes the merged row contended: its median is in the pooled evidence.
        contention=next((r.contention for r in results if r.contended), first.contention),
    )
