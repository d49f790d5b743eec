"""``attnbench selfcheck``'s verdicts: our timer's medians against the references', op by op. Torch-free.

The measuring is ``measure.selfcheck``, which returns raw per-round medians (``results.selfcheck``); ``judge``
turns them into the values below, which carry the rules:

* an op is gated when attnbench's own median is ≥ ``GATE_MIN_S`` (shorter ops differ by per-call overheads by
  design, and are shown, not judged);
* the estimate is the median of the per-round ratios attnbench / reference, and its 95 % interval a Student t
  interval of the log ratios over the rounds, around that median (rounds are few, and their ratios close to
  log-normal; the distribution-free interval of a median needs at least 6 rounds);
* **fail** when the whole interval lies beyond ±``TOLERANCE``, **pass** when it lies inside, **inconclusive**
  otherwise: a machine too noisy to tell is said to be so (exit ``EXIT_INCONCLUSIVE``), not called a failure.
  ``measure.selfcheck`` adds rounds, within a budget, while an op is inconclusive (``decided`` tells it).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Literal

from attnbench.core.errors import EXIT_CASE_FAILED, EXIT_INCONCLUSIVE, EXIT_OK
from attnbench.core.stats import student_t_975
from attnbench.core.units import (
    format_change,
    format_change_interval,
    format_duration,
    format_percent,
    format_seconds,
    plural,
)
from attnbench.results.selfcheck import DO_BENCH, TIMER, OpTimings, SelfcheckOp, SelfcheckTimings

Outcome = Literal["pass", "fail", "inconclusive", "not gated"]

TOLERANCE: dict[str, float] = {TIMER: 0.05, DO_BENCH: 0.03}

GATE_MIN_S = 100e-6  # ops shorter than this are shown, not gated: per-call overheads differ by design

# Per-round ratios spread wider than this (max − min; over ten rounds, the middle 80 %) say the machine drifted or
# was loaded during the check.
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
        return statistics.median(self.medians_s) if self.medians_s else math.nan

    @property
    def ratios(self) -> tuple[float, ...]:
        """attnbench / reference in each round: > 1 means attnbench reports the op slower."""
        return tuple(o / r for o, r in zip(self.ours_s, self.medians_s, strict=True))

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios) if self.ratios else math.nan

    @property
    def ours_median_s(self) -> float:
        """NaN when no round ran (the check's time ran out before this op's first)."""
        return statistics.median(self.ours_s) if self.ours_s else math.nan

    @property
    def gated(self) -> bool:
        """Judged only when attnbench's own time is ≥ ``GATE_MIN_S`` (issue 17: a 15 µs matmul was gated); an op
        with no round is judged too (inconclusive), so that running out of time never reads as a pass."""
        return not self.ours_s or self.ours_median_s >= GATE_MIN_S

    @property
    def interval(self) -> tuple[float, float] | None:
        """The 95 % interval of the ratio over the rounds; None with a single round."""
        n = len(self.ratios)
        if n < 2:
            return None
        logs = [math.log(r) for r in self.ratios]
        half = student_t_975(n - 1) * statistics.stdev(logs) / math.sqrt(n)
        centre = math.log(self.ratio)
        return math.exp(centre - half), math.exp(centre + half)

    @property
    def outcome(self) -> Outcome:
        if not self.gated:
            return "not gated"
        interval = self.interval
        if interval is None:
            return "inconclusive"
        lo, hi = interval
        if lo > 1 + self.tolerance or hi < 1 - self.tolerance:
            return "fail"
        if lo >= 1 - self.tolerance and hi <= 1 + self.tolerance:
            return "pass"
        return "inconclusive"

    @property
    def failed(self) -> bool:
        return self.outcome == "fail"

    @property
    def noisy(self) -> bool:
        """The rounds' ratios spread wider than ``NOISY_SPREAD``: across all of them for a few rounds, across the
        middle 80 % for ten or more (among many short rounds a stray one is expected, and says little)."""
        ratios = sorted(self.ratios)
        if len(ratios) < 2:
            return False
        if len(ratios) >= 10:
            deciles = statistics.quantiles(ratios, n=10)
            low, high = deciles[0], deciles[-1]
        else:
            low, high = ratios[0], ratios[-1]
        return self.gated and high - low > NOISY_SPREAD

    def text(self) -> str:
        """ "attnbench 15.1 µs vs torch.utils.benchmark 30.4 µs: −50.3 % (95 % CI −52.0 % to −48.1 %), beyond ±5 %"."""
        if not self.ratios:
            return f"{self.timer}: no round ran in the time the check had"
        where = {"pass": "within", "fail": "beyond", "inconclusive": "straddles", "not gated": "not gated at"}
        interval = self.interval
        ci = (
            "no interval from one round"
            if interval is None
            else f"95 % CI {format_change_interval(interval[0] - 1, interval[1] - 1)}"
        )
        return (
            f"attnbench {format_seconds(self.ours_median_s)} vs {self.timer} {format_seconds(self.median_s)}: "
            f"{format_change(self.ratio - 1)} ({ci}), {where[self.outcome]} ±{format_percent(self.tolerance)}"
        )


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
    def outcome(self) -> Outcome:
        """fail if any reference fails, else inconclusive if any is, else pass; not gated when none is gated."""
        outcomes = {r.outcome for r in self.references}
        for outcome in ("fail", "inconclusive", "pass"):
            if outcome in outcomes:
                return outcome
        return "not gated"

    @property
    def verdict(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        if self.outcome == "not gated":
            return f"not gated (< {format_seconds(GATE_MIN_S)})"
        label = {"fail": "FAIL", "inconclusive": "inconclusive", "pass": "pass"}[self.outcome]
        return f"{label}: " + "; ".join(r.text() for r in self.references if r.gated)


@dataclass(frozen=True)
class SelfcheckReport:
    """What was timed (``timings``: device, rounds, the references in column order, notes) and the verdicts."""

    timings: SelfcheckTimings
    checks: tuple[OpCheck, ...]

    @property
    def failures(self) -> list[OpCheck]:
        return [c for c in self.checks if not c.skipped and c.outcome == "fail"]

    @property
    def inconclusive(self) -> list[OpCheck]:
        return [c for c in self.checks if not c.skipped and c.outcome == "inconclusive"]

    @property
    def exit_code(self) -> int:
        """1 when an op disagrees, ``EXIT_INCONCLUSIVE`` when none does but some could not be decided, else 0."""
        if self.failures:
            return EXIT_CASE_FAILED
        return EXIT_INCONCLUSIVE if self.inconclusive else EXIT_OK


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
    gated = sum(1 for c in report.checks if not c.skipped and any(r.gated for r in c.references))
    if report.failures:
        names = ", ".join(f"{c.op.name} {c.op.shape}" for c in report.failures)
        return f"selfcheck FAILED: {len(report.failures)} of {gated} gated ops disagree ({names})"
    if report.inconclusive:
        names = ", ".join(f"{c.op.name} {c.op.shape}" for c in report.inconclusive)
        cut = {t.op for t in report.timings.ops if t.cut_short}
        if cut and all(c.op in cut for c in report.inconclusive):
            budget = format_duration(report.timings.budget_s or 0.0)
            return (
                f"selfcheck inconclusive: the {budget} budget ran out before {len(report.inconclusive)} of {gated} "
                f"gated ops could be told apart from the tolerance ({names}); the budget, not the "
                "evidence, ended it: --budget-s (and --max-rounds) give it more"
            )
        return (
            f"selfcheck inconclusive: {len(report.inconclusive)} of {gated} gated ops could not be told apart from "
            f"the tolerance after {plural(report.timings.rounds, 'round')} or more ({names}); the machine is too "
            "noisy for a verdict: rerun on a quiet one"
        )
    return f"selfcheck passed: {gated} gated ops agree within tolerance"


def decided(timings: OpTimings) -> bool:
    """Whether one op's rounds so far give every gated reference a pass or a fail (``measure.selfcheck`` adds
    rounds while they do not)."""
    check = judge_op(timings)
    return bool(check.skipped) or check.outcome != "inconclusive"


def judge_op(t: OpTimings) -> OpCheck:
    return OpCheck(
        t.op, t.ours_s, tuple(Reference(timer, medians, t.ours_s) for timer, medians in t.references), t.skipped
    )


def judge(timings: SelfcheckTimings) -> SelfcheckReport:
    """The verdicts on what ``measure.selfcheck`` timed: one ``OpCheck`` per op, one ``Reference`` per timer."""
    return SelfcheckReport(timings, tuple(judge_op(t) for t in timings.ops))
