"""The verdict vocabulary, the ``ClaimResult`` value, and the interval and evidence rules every claim shares.

Verdicts
--------
- **supported**: the measured interval lies inside the article's range, or beyond it in the direction the
  article argues (a larger speed-up, a lower RNN utilisation).
- **contradicted**: the interval lies entirely on the other side of the range.
- **inconclusive**: the interval straddles a boundary, or the evidence is thin: a slope from fewer than 3
  lengths, a ratio built on a noisy cell (IQR above 10 % of the median) or one that missed its CI target, more
  than half a slope's points noisy, telemetry windows too short to trust, peaks too small for RSS to resolve,
  or growth this device cannot attribute (claim 1, attention).
- **not measurable**: the run lacks the cases, or the device cannot give the metric; ``why`` names the cases
  and the config that has them (``configs/claims.yaml`` on a GPU, ``configs/claims-cpu.yaml`` on a CPU).
- **not a performance claim**: the statement is about accuracy or structure (BLEU, GLUE, what heads attend
  to). What the run says about its cost is shown, without pretending that settles it.

Intervals
---------
A ratio of two medians gets the conservative interval of their 95 % CIs, [a_low/b_high, a_high/b_low]. A slope
is ``scaling.fit_power_law``'s log-log exponent with its 95 % CI. NVML readings and peak memory are one reading
per case, without an interval, so their thresholds keep a margin.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from attnbench.analysis.scaling import PowerLaw
from attnbench.claims.selection import label
from attnbench.core.units import MIB
from attnbench.results.records import Result, Run

Verdict = Literal["supported", "contradicted", "inconclusive", "not measurable", "not a performance claim"]
VERDICTS: tuple[Verdict, ...] = (
    "supported",
    "contradicted",
    "inconclusive",
    "not measurable",
    "not a performance claim",
)

# A slope (an exponent of n) needs this many lengths for a CI.
MIN_SLOPE_POINTS = 3
GPU_CONFIG = "configs/claims.yaml"
CPU_CONFIG = "configs/claims-cpu.yaml"
# Below this an RSS high-water mark mostly measures page granularity and allocator caching, not the case.
RSS_MIN_BYTES = 4 * MIB


@dataclass(frozen=True)
class ClaimResult:
    """One claim (or one model's part of it) against the run: what the article says, what was measured, the
    verdict and why. ``evidence_cases`` are the ``Case.key`` of every row the measurement used."""

    claim_id: str
    claim: str
    article_figure: str
    measured: str
    evidence_cases: tuple[str, ...]
    verdict: Verdict
    why: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "claim_id": self.claim_id,
            "claim": self.claim,
            "article_figure": self.article_figure,
            "measured": self.measured,
            "evidence_cases": list(self.evidence_cases),
            "verdict": self.verdict,
            "why": self.why,
        }


def config_for(run: Run) -> str:
    """The config whose sweep has the cases this run's device needs."""
    return CPU_CONFIG if run.environment.get("device_type") == "cpu" else GPU_CONFIG


def not_measurable(claim_id: str, claim: str, figure: str, why: str) -> ClaimResult:
    """A claim the run has no rows for."""
    return ClaimResult(claim_id, claim, figure, "—", (), "not measurable", why)


def join_reasons(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def exponent_text(fit: PowerLaw) -> str:
    """'n^1.02 [0.97–1.08]' (or '[no CI]' from fewer than ``MIN_SLOPE_POINTS`` lengths)."""
    ci = "no CI" if fit.points < MIN_SLOPE_POINTS else f"{fit.exponent_low:.2f}–{fit.exponent_high:.2f}"
    return f"n^{fit.exponent:.2f} [{ci}]"


def few_points(fit: PowerLaw | None) -> str:
    """Why a slope has too few lengths to judge ("" when it has enough)."""
    if fit is None or fit.points < MIN_SLOPE_POINTS:
        have = 0 if fit is None else fit.points
        return f"only {have} usable length{'s' * (have != 1)}; a slope needs ≥ {MIN_SLOPE_POINTS}"
    return ""


def thin_slope(fit: PowerLaw | None, points: Sequence[Result]) -> str:
    """Why a *time* slope is too thin to judge ("" when it is not): too few lengths, or most of them noisy or
    timed on a busy machine. A memory slope is judged by ``few_points`` alone: timing noise says nothing about a
    peak (issue 17, item 6)."""
    few = few_points(fit)
    if few:
        return few
    rough = [r for r in points if noisy(r) or r.contended]
    if 2 * len(rough) > len(points):
        return (
            f"{len(rough)} of {len(points)} points are noisy (IQR > 10 % of the median or CI target missed) or "
            "were timed on a busy machine"
        )
    return ""


def undecided(low: float, high: float) -> str:
    return f"k's CI overlaps the undecided band {low}–{high}"


# ---------------------------------------------------------------------------------------------------------------
# Ratios and their intervals


@dataclass(frozen=True)
class Interval:
    value: float
    low: float
    high: float

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high) and self.low > 0


def ratio(num: Result, den: Result) -> Interval:
    """num's median / den's median, with the conservative interval of their 95 % CIs."""
    a, b = num.measurement, den.measurement
    assert a is not None and b is not None
    sa, sb = a.summary, b.summary
    low = sa.ci_low / sb.ci_high if math.isfinite(sa.ci_low) and math.isfinite(sb.ci_high) else 0.0
    high = sa.ci_high / sb.ci_low if math.isfinite(sa.ci_high) and sb.ci_low > 0 else math.inf
    return Interval(sa.median / sb.median, low, high)


def format_times(x: Interval) -> str:
    """A ratio as a factor: '3.20× [2.90–3.50]'."""
    if not x.bounded:
        return f"{x.value:.2f}× (CI unbounded)"
    return f"{x.value:.2f}× [{x.low:.2f}–{x.high:.2f}]"


def format_signed_pct(fraction: float) -> str:
    return f"{fraction * 100:+.0f}".replace("-", "−")


# ---------------------------------------------------------------------------------------------------------------
# Thin evidence


def noisy(r: Result) -> bool:
    """The pivot tables' "~": IQR above 10 % of the median, or the CI target was not reached."""
    return r.measurement is not None and r.measurement.noisy


def thin_cells(rows: Iterable[Result]) -> str:
    """'noisy: <first noisy case> and N more', or "" when no row is noisy."""
    rough = [r for r in rows if noisy(r)]
    if not rough:
        return ""
    more = f" and {len(rough) - 1} more" if len(rough) > 1 else ""
    return f"noisy: {label(rough[0].case)}{more}"


def speedup_verdict(x: Interval, claimed_low: float, rows: Sequence[Result]) -> tuple[Verdict, str]:
    """A "faster by ≥ claimed_low" verdict from a ratio interval (> 1 = the claimed side is faster); the reason
    is "" when the verdict needs no qualifying."""
    if not x.bounded:
        return "inconclusive", "a CI is unbounded (fewer than 6 samples)"
    if x.low >= claimed_low:
        verdict: Verdict = "supported"
    elif x.high < claimed_low:
        verdict = "contradicted"
    else:
        return "inconclusive", f"the interval straddles {claimed_low:g}×"
    thin = thin_cells(rows)
    if thin:
        return "inconclusive", f"would be {verdict}, but the evidence is thin ({thin})"
    return verdict, ""
