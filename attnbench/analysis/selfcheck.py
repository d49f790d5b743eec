"""``attnbench selfcheck``'s verdicts: our timer's medians against the references', op by op. Torch-free.

The measuring is ``measure.selfcheck``, which returns raw per-round medians (``results.selfcheck``); ``judge``
turns them into the values below, which carry the rules:
an op whose reference median is ≥ ``GATE_MIN_S`` must agree within ``TOLERANCE`` of each reference; the median of
the per-round ratios is the estimate, and a wide spread of those ratios says the machine was noisy.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from attnbench.core.units import format_seconds
from attnbench.results.selfcheck import DO_BENCH, TIMER, SelfcheckOp, SelfcheckTimings

TOLERANCE: dict[str, float] = {TIMER: 0.05, DO_BENCH: 0.03}

GATE_MIN_S = 100e-6  # ops shorter than this are shown, not gated: per-call overheads differ by design

# Per-round ratios spread wider than this (max − min) say the machine drifted or was loaded during the check.
NOISY_SPREAD = 0.20


@dataclass(frozen=True)
class Reference:
    """One reference timer's medians for one op, a round at a time, beside ours."""

    timer: str
    medians_s: tuple[float, ...]
    ours_s: tuple[float, ...]

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.timer]

    @property
    def median_s(self) -> float:
        return statistics.median(self.medians_s)

    @property
    def ratios(self) -> tuple[float, ...]:
        """attnbench / reference in each round: > 1 means attnbench reports the op slower."""
        return tuple(o / r for o, r in zip(self.ours_s, self.medians_s, strict=True))

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def gated(self) -> bool:
        return self.median_s >= GATE_MIN_S

    @property
    def failed(self) -> bool:
        return self.gated and abs(self.ratio - 1.0) > self.tolerance

    @property
    def noisy(self) -> bool:
        return self.gated and max(self.ratios) - min(self.ratios) > NOISY_SPREAD


@dataclass(frozen=True)
class OpCheck:
    op: SelfcheckOp
    ours_s: tuple[float, ...] = ()  # attnbench's median in each round
    references: tuple[Reference, ...] = ()
    skipped: str = ""  # why the op could not run here

    @property
    def ours_median_s(self) -> float | None:
        return statistics.median(self.ours_s) if self.ours_s else None

    @property
    def verdict(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        failed = [r for r in self.references if r.failed]
        if failed:
            parts = [f"{r.timer} {r.ratio - 1:+.1%} > ±{r.tolerance:.0%}" for r in failed]
            return "FAIL (" + "; ".join(parts) + ")"
        if not any(r.gated for r in self.references):
            return f"not gated (< {format_seconds(GATE_MIN_S)})"
        return "ok"


@dataclass(frozen=True)
class SelfcheckReport:
    """What was timed (``timings``: device, rounds, the references in column order, notes) and the verdicts."""

    timings: SelfcheckTimings
    checks: tuple[OpCheck, ...]

    @property
    def failures(self) -> list[OpCheck]:
        return [c for c in self.checks if any(r.failed for r in c.references)]


def noise_note(report: SelfcheckReport) -> str | None:
    """A warning when rounds disagreed widely: the verdict then says more about the machine than the timer."""
    noisy = [c for c in report.checks if any(r.noisy for r in c.references)]
    if not noisy:
        return None
    names = ", ".join(f"{c.op.name} {c.op.shape}" for c in noisy)
    return (
        f"noisy machine: per-round ratios spread by more than {NOISY_SPREAD:.0%} for {len(noisy)} gated ops "
        f"({names}); other load or frequency changes were at work, so rerun on a quiet machine before trusting "
        "the verdict either way"
    )


def summary_line(report: SelfcheckReport) -> str:
    gated = sum(1 for c in report.checks if any(r.gated for r in c.references))
    if report.failures:
        names = ", ".join(f"{c.op.name} {c.op.shape}" for c in report.failures)
        return f"selfcheck FAILED: {len(report.failures)} of {gated} gated ops disagree ({names})"
    return f"selfcheck passed: {gated} gated ops agree within tolerance"


def judge(timings: SelfcheckTimings) -> SelfcheckReport:
    """The verdicts on what ``measure.selfcheck`` timed: one ``OpCheck`` per op, one ``Reference`` per timer."""
    checks = tuple(
        OpCheck(
            t.op,
            t.ours_s,
            tuple(Reference(timer, medians, t.ours_s) for timer, medians in t.references),
            t.skipped,
        )
        for t in timings.ops
    )
    return SelfcheckReport(timings, checks)
