"""One case's comparison, torch-free: the verdict vocabulary, the intervals of a ratio of times (processes, or
samples widened by the noise floor) and ``compare_case``, which ``compare`` runs for every case and ``gates``
builds its metrics' verdicts on. The rules are stated in ``analysis.compare``'s notes.
"""

from __future__ import annotations

import hashlib
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Protocol, TypeVar

from attnbench.analysis.thresholds import Thresholds
from attnbench.core.cases import Case
from attnbench.core.stats import student_t_975
from attnbench.results.measurement import Measurement
from attnbench.results.records import FAILED, Result

Verdict = Literal["regressed", "improved", "same", "noisy", "new", "missing"]

VERDICTS: tuple[Verdict, ...] = ("regressed", "improved", "same", "noisy", "new", "missing")

Evidence = Literal["processes", "samples", "status", "none"]

Role = Literal["base", "current"]

# Half-width of a 95 % interval of the ratio between two processes of unchanged code, assumed when a side has one
# process and no floor was measured on the machine (``attnbench calibrate``) or given (``--noise-floor``); added in
# quadrature to the bootstrap's. It is deliberately wide, because without a measurement nothing bounds the spread:
# 4 % held on a quiet 2-vCPU Xeon (results/compare-aa-cpu.md), but on a quiet 2-vCPU EPYC the same LSTM case read
# 3.66 ms in one process and 6.51 ms in the next (+78 %: oneDNN's two-thread RNN is bimodal between processes,
# results/README.md), and ±4 % turned that A/A pair into two regressions (issue 30). At ×2 one process a side still
# fails a build on a gross change (a kernel falling off its fast path) and calls nothing else; the warning says how
# to get verdicts at the threshold: calibrate the machine once (runs record its measured floor), or several
# processes per side (timing.processes, folders of runs), where the spread is measured instead.
DEFAULT_NOISE_FLOOR = 1.0

CONFIDENCE = 0.95  # of every interval (the bootstrap's, and stats.student_t_975's for processes)

RESAMPLES = 2000

MIN_SAMPLES = 6  # below this there is no distribution-free 95 % interval of one median (stats.median_ci_ranks)


@dataclass(frozen=True)
class Policy:
    """How verdicts are reached; everything the reader of a verdict needs to know to trust it."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    # None: the larger of the floors the two runs recorded (their calibration's measured between-process noise),
    # else DEFAULT_NOISE_FLOOR; ``compare_sides`` resolves it, and says where it came from.
    noise_floor: float | None = None
    floor_source: str = "given by --noise-floor"
    resamples: int = RESAMPLES
    allow_mismatch: frozenset[str] = frozenset()


# ---------------------------------------------------------------------------------------------------- statistics


def _seed(key: str) -> int:
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def _bootstrap_medians(ordered: Sequence[float], rng: random.Random, resamples: int) -> list[float]:
    """Medians of ``resamples`` bootstrap resamples of ``ordered`` (sorted), drawn exactly but in O(1) each.

    Resampling with replacement from sorted x is x[⌊n·U⌋] for uniform U, monotone in U, so the k-th smallest of
    a resample is x[⌊n·U₍ₖ₎⌋] with U₍ₖ₎ ~ Beta(k, n − k + 1); given U₍ₖ₎ = u, the next order statistic is
    u + (1 − u)·Beta(1, n − k). The same distribution as sorting n random draws, without the sort.
    """
    n = len(ordered)
    k = (n + 1) // 2  # the (lower) middle rank, 1-based
    last = n - 1
    out: list[float] = []
    for _ in range(resamples):
        u = rng.betavariate(k, n - k + 1)
        low = ordered[min(last, int(u * n))]
        if n % 2:
            out.append(low)
        else:
            u2 = u + (1 - u) * rng.betavariate(1, n - k)
            out.append((low + ordered[min(last, int(u2 * n))]) / 2)
    return out


def bootstrap_ratio_ci(
    base: Sequence[float], current: Sequence[float], *, key: str, confidence: float, resamples: int
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(current) / median(base), both resampled; seeded by ``key``."""
    rng = random.Random(_seed(key))
    b = _bootstrap_medians(sorted(base), rng, resamples)
    c = _bootstrap_medians(sorted(current), rng, resamples)
    ratios = sorted(ci / bi for bi, ci in zip(b, c, strict=True))
    alpha = 1 - confidence
    lo = ratios[max(0, math.floor(alpha / 2 * resamples))]
    hi = ratios[min(resamples - 1, math.ceil((1 - alpha / 2) * resamples) - 1)]
    return lo, hi


def _widen(ratio: float, lo: float, hi: float, floor: float) -> tuple[float, float]:
    """Add the between-process floor to a within-process interval, in quadrature on the log scale."""
    spread = math.log1p(floor)
    below = math.hypot(max(0.0, math.log(ratio / lo)), spread)
    above = math.hypot(max(0.0, math.log(hi / ratio)), spread)
    return ratio * math.exp(-below), ratio * math.exp(above)


def process_ratio_ci(base: Sequence[float], current: Sequence[float]) -> tuple[float, float, float]:
    """(ratio, lo, hi) from per-process medians: a 95 % Student t interval of the difference of mean log medians,
    the variance pooled over both sides (one machine measured both, so one between-process spread).

    Needs at least three medians in all, two on one side. The ratio is of geometric means.
    """
    se = pooled_log_sd(base, current) * math.sqrt(1 / len(base) + 1 / len(current))
    half = student_t_975(len(base) + len(current) - 2) * se
    diff = statistics.fmean(math.log(x) for x in current) - statistics.fmean(math.log(x) for x in base)
    return math.exp(diff), math.exp(diff - half), math.exp(diff + half)


def pooled_log_sd(base: Sequence[float], current: Sequence[float]) -> float:
    """The standard deviation of log values about each side's own mean, pooled over both sides (at least three
    values in all)."""
    lb, lc = [math.log(x) for x in base], [math.log(x) for x in current]
    mb, mc = statistics.fmean(lb), statistics.fmean(lc)
    ss = sum((x - mb) ** 2 for x in lb) + sum((x - mc) ** 2 for x in lc)
    return math.sqrt(ss / (len(lb) + len(lc) - 2))


def runs_for_interval(spread: float, threshold: float, most: int = 1000) -> int:
    """Runs a side that bring a 95 % interval like ``process_ratio_ci``'s within ±threshold when one run's log
    value spreads ``spread`` (a standard deviation): the smallest K with t(2K − 2) · spread · √(2/K) ≤
    ln(1 + threshold), or ``most`` when even that many would not. Such an interval calls unchanged code ``same``
    and a change of twice the threshold ``regressed`` most of the time."""
    target = math.log1p(threshold)
    for k in range(2, most + 1):
        if student_t_975(2 * k - 2) * spread * math.sqrt(2 / k) <= target:
            return k
    return most


# ---------------------------------------------------------------------------------------------------- verdicts


@dataclass(frozen=True)
class CaseComparison:
    """One case's verdict and the numbers behind it. Ratios are current/base; times are seconds per call."""

    key: str
    case: Case
    verdict: Verdict
    evidence: Evidence
    threshold: float
    base_status: str | None = None  # None: the side has no row for the case
    current_status: str | None = None
    base_s: float | None = None
    current_s: float | None = None
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    base_n: int = 0  # processes (evidence "processes") or samples (evidence "samples")
    current_n: int = 0
    note: str = ""
    # The sides whose timing of the case was contended (another process competed for the machine): the verdict is
    # then ``noisy``, whatever the numbers say.
    contended: tuple[Role, ...] = ()
    # Contended runs (base, current) a folder of runs had for the case and the verdict was reached without.
    left_out: tuple[int, int] = (0, 0)

    @property
    def verdict_text(self) -> str:
        """The verdict as tables show it: ``noisy (contended: base)`` when contention decided it."""
        return f"{self.verdict} (contended: {' and '.join(self.contended)})" if self.contended else self.verdict


def process_medians(measurement: Measurement) -> tuple[float, ...]:
    """Per-process medians the measurement carries (between-process replicates), or its own median."""
    return measurement.replicate_medians_s or (measurement.median_s,)


_SEVERITY = ("crashed", "error", "incorrect", "timeout", "oom", "unsupported", "too_slow_for_budget")


def _side_status(rows: Sequence[Result]) -> tuple[str, str]:
    """A side's status for a case over its runs: ok only if every run was; else the worst, and its reason."""
    bad = [r for r in rows if not r.ok or r.measurement is None]
    if not bad:
        return "ok", ""
    worst = min(bad, key=lambda r: _SEVERITY.index(r.status) if r.status in _SEVERITY else len(_SEVERITY))
    status = worst.status if worst.status != "ok" else "error"  # "ok" without a measurement: a damaged row
    share = f" in {len(bad)} of {len(rows)} runs" if len(rows) > 1 else ""
    return status, _clip(f"{status}{share}: {worst.reason}" if worst.reason else f"{status}{share}")


def _clip(text: str, limit: int = 320) -> str:
    """Reasons can hold a whole exception message; a verdict table needs its first line, and not all of it. The
    limit holds every reason of ours whole (a too-slow one, about 250 characters, ends with what to raise); a
    longer line is cut at a clause or a word, never inside one."""
    line = text.splitlines()[0] if text else ""
    if len(line) <= limit:
        return line
    head = line[: limit - 1]
    cut = max(head.rfind("; "), head.rfind(", "), head.rfind(" "))
    return (head[:cut] if cut > limit // 2 else head).rstrip(" ;,:") + " …"


# A case that went from ok to too slow for its budget, or back: whether enough samples fit in the time budget is a
# timing too (a case at the edge of its budget flips on unchanged code: issue 51), so it is no status change.
BUDGET_FLIP = frozenset({"ok", "too_slow_for_budget"})


def budget_flip(base: str | None, current: str | None) -> bool:
    """Whether a case's two statuses are ok and too_slow_for_budget, either way round."""
    return {base, current} == BUDGET_FLIP


def _by_status(key: str, case: Case, threshold: float, base: str, current: str, note: str) -> CaseComparison:
    if budget_flip(base, current):
        flip = (
            "ok ↔ too slow for the budget: whether enough samples fit in the time budget is a timing, not a status "
            "change, so no verdict (a longer timing.max_case_s, or sweep --budget-from the base run, decides)"
        )
        verdict: Verdict = "noisy"
        note = "; ".join(part for part in (note, flip) if part)
    elif base == "ok":
        verdict = "regressed"
    elif current == "ok":
        verdict = "improved"
    elif current in FAILED and base not in FAILED:
        verdict = "regressed"
    else:
        verdict = "same"
    return CaseComparison(key, case, verdict, "status", threshold, base, current, note=note)


def _centre(rows: Sequence[Result]) -> float | None:
    """A side's time per call for a case it alone has: the geometric mean of its per-process medians."""
    if _side_status(rows)[0] != "ok":
        return None
    return statistics.geometric_mean([x for r in rows if r.measurement for x in process_medians(r.measurement)])


def ratio_verdict(lo: float, hi: float, threshold: float) -> Verdict:
    """The rule for an interval [lo, hi] of current/base against ±threshold (the module notes of ``compare``)."""
    if lo > 1 + threshold:
        return "regressed"
    if hi < 1 - threshold:
        return "improved"
    if lo >= 1 - threshold and hi <= 1 + threshold:
        return "same"
    return "noisy"


# The false-discovery rate ``control_discoveries`` holds each direction to: a case's 95 % interval alone calls a
# change at one-sided 2.5 %, so a comparison of one case reads as before, and a comparison of many can call a false
# regression no more often than a comparison of one.
DISCOVERY_RATE = (1 - CONFIDENCE) / 2

Direction = Literal["above", "below"]


def beyond_p(
    ratio: float, lo: float, hi: float, threshold: float, direction: Direction, df: int | None = None
) -> float:
    """One-sided p of "the ratio lies above 1 + threshold" (or below 1 − threshold), from its 95 % interval [lo, hi]
    read on the log scale: a normal one (the bootstrap widened by the floor) when ``df`` is None, else a Student t
    one on ``df`` degrees of freedom (per-process medians, ``process_ratio_ci``). It is 2.5 % where the interval's
    end touches the threshold, so ``ratio_verdict`` and this agree at one case. A zero-width interval (a peak read
    once a side) is certain either way."""
    if direction == "above":
        beyond, half = math.log(ratio) - math.log1p(threshold), math.log(ratio / lo)
    else:
        beyond, half = math.log1p(-min(threshold, 0.999)) - math.log(ratio), math.log(hi / ratio)
    if half <= 0:
        return 0.0 if beyond > 0 else 1.0
    if df is None:
        normal = statistics.NormalDist()
        return 1 - normal.cdf(normal.inv_cdf(1 - DISCOVERY_RATE) * beyond / half)
    from scipy.stats import t  # a dependency of ruptures (analysis.steps); only folders of runs come here

    return float(t.sf(student_t_975(df) * beyond / half, df))


def change_p(c: CaseComparison, direction: Literal["regressed", "improved"]) -> float | None:
    """``beyond_p`` of a case's timed interval in ``direction`` (slower is "above"); None for a case without one (a
    status, a new or missing case, a contended one)."""
    if c.contended or c.ratio is None or c.ci_low is None or c.ci_high is None:
        return None
    if c.evidence not in ("processes", "samples"):
        return None
    df = c.base_n + c.current_n - 2 if c.evidence == "processes" else None
    side: Direction = "above" if direction == "regressed" else "below"
    return beyond_p(c.ratio, c.ci_low, c.ci_high, c.threshold, side, df)


def discoveries(ps: Sequence[float]) -> set[int]:
    """The indices of ``ps`` that the Benjamini–Hochberg step-up keeps at ``DISCOVERY_RATE``: every p up to the
    largest rank i whose p is at most the rate × i / k."""
    ranked = sorted(range(len(ps)), key=lambda i: ps[i])
    kept = 0
    for rank, i in enumerate(ranked, 1):
        if ps[i] <= DISCOVERY_RATE * rank / len(ps):
            kept = rank
    return set(ranked[:kept])


def held_note(direction: str, p: float, k: int) -> str:
    """Why a call did not survive the control (``control_discoveries``, the metric gates' own)."""
    return (
        f"{direction} at its own 95 % interval (p = {p:.2g}), but not among the changes that hold across the {k} "
        f"compared (false discoveries held to {DISCOVERY_RATE:.1%}, Benjamini–Hochberg)"
    )


class Call(Protocol):
    """What the control takes a call from: a frozen dataclass with a verdict and a note (a case, a metric's gate)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def verdict(self) -> Verdict: ...

    @property
    def note(self) -> str: ...


C = TypeVar("C", bound=Call)


def withdraw_unheld(
    calls: Sequence[C], p_of: Callable[[C, Literal["regressed", "improved"]], float | None]
) -> tuple[C, ...]:
    """``calls`` with each regression or improvement that the Benjamini–Hochberg step-up over every call with a p
    (``p_of``; at ``DISCOVERY_RATE`` per direction) does not keep turned ``noisy``, its note saying why."""
    out = list(calls)
    for direction in ("regressed", "improved"):
        tested = [(i, p) for i, call in enumerate(calls) if (p := p_of(call, direction)) is not None]
        kept = discoveries([p for _, p in tested])
        for n, (i, p) in enumerate(tested):
            call = out[i]
            if call.verdict == direction and n not in kept:
                note = "; ".join(part for part in (call.note, held_note(direction, p, len(tested))) if part)
                out[i] = replace(call, verdict="noisy", note=note)
    return tuple(out)


def control_discoveries(cases: Sequence[CaseComparison]) -> tuple[CaseComparison, ...]:
    """The cases, with a regression or improvement that does not survive the Benjamini–Hochberg procedure over
    every case with a timed interval (``change_p``; at ``DISCOVERY_RATE`` per direction) turned ``noisy``, saying
    why.

    Why: each case's interval misses at 2.5 % a side, so a comparison of eight cases of unchanged code fails one
    time in six, and one of eighty almost always (an A/A series on a 2-vCPU VM: 1 of 160 cases in 20 pairs, with
    one pair failing for it). Benjamini–Hochberg holds the share of false calls among the calls to the rate; under
    no change at all that is the chance of any false call (for independent cases, or cases that move together), so
    it does not grow with the number of cases. When many cases move together (a slowdown of everything) each needs
    only its own 2.5 %, so the power to catch it stays; a lone case needs p ≤ 2.5 % / k. It only ever takes a call
    away."""
    return withdraw_unheld(cases, change_p)


def compare_case(key: str, base: Sequence[Result], current: Sequence[Result], policy: Policy) -> CaseComparison:
    """The verdict for one case key from its rows on each side (one row per run; either side may be empty).

    A timed verdict resting on a contended row (either side) is ``noisy``: a machine busy with other work slows
    a case by an amount nobody measured, so neither a regression nor an improvement, nor sameness, follows. The
    same holds for a case that went from ``ok`` to ``too_slow_for_budget`` or back (or stayed too slow): how many
    samples fit in the budget is a timing too. Where a side is a folder of runs, its contended runs are left out
    and the case is judged on the others when both sides keep at least one and there are at least three in all
    (the evidence of processes): on a shared machine most folders have a contended run somewhere, and the rest
    still carry a verdict that rests on no contended timing."""
    decided = _compare_case(key, base, current, policy)
    timing_statuses = {decided.base_status, decided.current_status} <= {"ok", "too_slow_for_budget"}
    if decided.evidence not in ("processes", "samples") and not (decided.evidence == "status" and timing_statuses):
        return decided
    both: tuple[tuple[Role, Sequence[Result]], ...] = (("base", base), ("current", current))
    sides = tuple(role for role, rows in both if any(r.contended for r in rows))
    if not sides:
        return decided
    quiet_base = [r for r in base if not r.contended]
    quiet_current = [r for r in current if not r.contended]
    if quiet_base and quiet_current and len(quiet_base) + len(quiet_current) >= 3:
        judged = _compare_case(key, quiet_base, quiet_current, policy)
        if judged.evidence == "processes":
            left_out = (len(base) - len(quiet_base), len(current) - len(quiet_current))
            counted = " and ".join(
                f"{n} of {len(rows)} {role}" for (role, rows), n in zip(both, left_out, strict=True) if n
            )
            note = f"judged without the runs timed on a busy machine ({counted} left out)"
            return replace(judged, left_out=left_out, note="; ".join(part for part in (judged.note, note) if part))
    reasons = [
        f"{role}: {'; '.join(r.contention.reasons)}"
        for role, rows in both
        for r in rows
        if r.contended and r.contention is not None
    ]
    note = f"timed on a busy machine, so no verdict ({' | '.join(reasons)})"
    return replace(decided, verdict="noisy", contended=sides, note=_clip(note, 300))


def _compare_case(key: str, base: Sequence[Result], current: Sequence[Result], policy: Policy) -> CaseComparison:
    case = (current or base)[0].case
    threshold = policy.thresholds.for_case(case)
    if not base:
        status = _side_status(current)[0]
        return CaseComparison(key, case, "new", "none", threshold, current_status=status, current_s=_centre(current))
    if not current:
        status = _side_status(base)[0]
        return CaseComparison(key, case, "missing", "none", threshold, base_status=status, base_s=_centre(base))
    base_status, base_note = _side_status(base)
    current_status, current_note = _side_status(current)
    if base_status != "ok" or current_status != "ok":
        if base_note == current_note:
            note = f"both {base_note}"
        else:
            note = "; ".join(
                f"{side} {text}" for side, text in (("base", base_note), ("current", current_note)) if text
            )
        decided = _by_status(key, case, threshold, base_status, current_status, note)
        return replace(decided, base_s=_centre(base), current_s=_centre(current))
    base_m = [r.measurement for r in base if r.measurement is not None]
    current_m = [r.measurement for r in current if r.measurement is not None]
    ok = CaseComparison(key, case, "noisy", "samples", threshold, "ok", "ok")
    pb = [x for m in base_m for x in process_medians(m)]
    pc = [x for m in current_m for x in process_medians(m)]
    if len(pb) + len(pc) >= 3:
        ratio, lo, hi = process_ratio_ci(pb, pc)
        return replace(
            ok,
            verdict=ratio_verdict(lo, hi, threshold),
            evidence="processes",
            base_s=statistics.geometric_mean(pb),
            current_s=statistics.geometric_mean(pc),
            ratio=ratio,
            ci_low=lo,
            ci_high=hi,
            base_n=len(pb),
            current_n=len(pc),
        )
    b, c = base_m[0], current_m[0]
    ratio = c.median_s / b.median_s
    timed = replace(
        ok, base_s=b.median_s, current_s=c.median_s, ratio=ratio, base_n=len(b.samples_s), current_n=len(c.samples_s)
    )
    if min(len(b.samples_s), len(c.samples_s)) < MIN_SAMPLES:
        return replace(timed, note=f"fewer than {MIN_SAMPLES} samples on one side: no interval")
    lo, hi = bootstrap_ratio_ci(b.samples_s, c.samples_s, key=key, confidence=CONFIDENCE, resamples=policy.resamples)
    floor = DEFAULT_NOISE_FLOOR if policy.noise_floor is None else policy.noise_floor
    lo, hi = _widen(ratio, lo, hi, floor)
    return replace(timed, verdict=ratio_verdict(lo, hi, threshold), ci_low=lo, ci_high=hi)
