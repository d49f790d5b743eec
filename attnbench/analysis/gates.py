"""``compare``'s gates on measures besides the median time: ``peak_mem``, ``tokens_per_s`` and ``gbps``. Torch-free.

A metric is gated only where a threshold names it (``analysis.thresholds``), per model, ``model/mode`` pattern or
for every case, and each verdict follows the median's rule — regressed only when the whole 95 % interval of the
ratio current/base lies beyond the threshold *in the direction that is worse*, so noise alone cannot fail a build:

* **tokens_per_s** and **gbps** are rates over the same call: tokens (or the compulsory bytes, ``bytes_moved``)
  divided by the time per call. Each side divides its own count (``Result.tokens_per_call``: a capacity row's
  batch found), so the rate's ratio is the inverse of the time's times the counts' ratio (1 but for capacity), and
  its interval is the median's interval inverted and scaled — the same evidence (processes, or samples
  widened by the noise floor), the same contention rule. Lower is worse.
* **peak_mem** is one reading per run (the allocator's peak over an extra call), which repeats to the byte for
  unchanged code. With several runs in all (three or more, as a case's processes), the interval is the Student t
  interval of the log peaks, variance pooled (``compare.process_ratio_ci``); with one run a side it is the ratio
  itself, as no spread was measured. Higher is worse; contention does not move it.

Status changes (ok → oom) are the median gate's to judge, so a metric gate judges cases ok on both sides only.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from attnbench.analysis.case_compare import (
    CaseComparison,
    Verdict,
    beyond_p,
    process_ratio_ci,
    withdraw_unheld,
)
from attnbench.analysis.thresholds import GateMetric, Thresholds
from attnbench.core.cases import Case
from attnbench.results.records import Result

HIGHER_IS_WORSE: Mapping[GateMetric, bool] = {"median": True, "peak_mem": True, "tokens_per_s": False, "gbps": False}


@dataclass(frozen=True)
class MetricVerdict:
    """One case's verdict on one gated metric. Ratios are current/base of the metric (bytes, tokens/s, bytes/s)."""

    metric: GateMetric
    key: str
    case: Case
    verdict: Verdict
    threshold: float
    ratio: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    base: float | None = None  # the side's value: a peak in bytes, or a rate per second
    current: float | None = None
    note: str = ""
    df: int | None = None  # the interval's degrees of freedom when it is a Student t one (processes), else normal
    contended: bool = False  # its verdict is noisy for contention, whatever the interval: no p for the control

    def to_dict(self) -> dict[str, object]:
        return {
            "metric": self.metric,
            "key": self.key,
            "verdict": self.verdict,
            "threshold": self.threshold,
            "base": self.base,
            "current": self.current,
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "note": self.note,
        }


def judge(lo: float, hi: float, threshold: float, higher_is_worse: bool) -> Verdict:
    """The median's rule (``case_compare.ratio_verdict``), turned round for a metric where lower is worse."""
    if (lo > 1 + threshold) if higher_is_worse else (hi < 1 - threshold):
        return "regressed"
    if (hi < 1 - threshold) if higher_is_worse else (lo > 1 + threshold):
        return "improved"
    if lo >= 1 - threshold and hi <= 1 + threshold:
        return "same"
    return "noisy"


def _count(result: Result, metric: GateMetric) -> float | None:
    """What a rate divides by the time per call: tokens (``Result.tokens_per_call``, the one definition every reader
    uses: a capacity row's batch found), or the stored compulsory bytes (None without them)."""
    if metric == "tokens_per_s":
        return float(result.tokens_per_call)
    moved = result.extra.get("bytes_moved")
    return float(moved) if isinstance(moved, int) and not isinstance(moved, bool) and moved > 0 else None


def _side_count(rows: Sequence[Result], metric: GateMetric) -> float | None:
    """A side's count over its runs: the median of each row's own (a capacity row found its batch on its own side,
    so the two sides may divide different counts: a capacity that doubled is twice the tokens a call)."""
    counts = [_count(r, metric) for r in rows]
    if not counts or any(c is None for c in counts):
        return None
    return float(statistics.median(c for c in counts if c is not None))


def _rate(
    c: CaseComparison, base: Sequence[Result], current: Sequence[Result], metric: GateMetric, threshold: float
) -> MetricVerdict | None:
    count_b, count_c = _side_count(base, metric), _side_count(current, metric)
    if count_b is None or count_c is None:  # a run without bytes_moved has no GB/s to gate
        return None
    base_rate = None if c.base_s is None else count_b / c.base_s
    current_rate = None if c.current_s is None else count_c / c.current_s
    # rate ratio = (count_c / count_b) × (base_s / current_s): the time's ratio inverted, scaled by the counts'.
    scale = count_c / count_b
    ratio = None if c.ratio is None else scale / c.ratio
    if c.ci_low is None or c.ci_high is None or ratio is None:
        why = c.note or "no interval of the time per call"
        return MetricVerdict(metric, c.key, c.case, "noisy", threshold, ratio, None, None, base_rate, current_rate, why)
    lo, hi = scale / c.ci_high, scale / c.ci_low
    verdict = "noisy" if c.contended else judge(lo, hi, threshold, higher_is_worse=False)
    df = c.base_n + c.current_n - 2 if c.evidence == "processes" else None
    return MetricVerdict(
        metric, c.key, c.case, verdict, threshold, ratio, lo, hi, base_rate, current_rate, c.note, df, bool(c.contended)
    )


def _peaks(rows: Sequence[Result]) -> list[float]:
    return [float(r.memory.peak_bytes) for r in rows if r.ok and r.memory is not None and r.memory.peak_bytes]


def _memory(
    c: CaseComparison, base: Sequence[Result], current: Sequence[Result], threshold: float
) -> MetricVerdict | None:
    pb, pc = _peaks(base), _peaks(current)
    if not pb or not pc:  # a side that recorded no peak (a device without a memory reading)
        return None
    df = None
    if len(pb) + len(pc) >= 3:
        ratio, lo, hi = process_ratio_ci(pb, pc)
        df = len(pb) + len(pc) - 2
    else:
        ratio = lo = hi = pc[0] / pb[0]
    verdict = judge(lo, hi, threshold, higher_is_worse=True)
    return MetricVerdict(
        "peak_mem", c.key, c.case, verdict, threshold, ratio, lo, hi, _geomean(pb), _geomean(pc), df=df
    )


def _geomean(values: Sequence[float]) -> float:
    return statistics.geometric_mean(values)


def gate_metrics(
    cases: Sequence[CaseComparison],
    base_rows: Mapping[str, Sequence[Result]],
    current_rows: Mapping[str, Sequence[Result]],
    thresholds: Thresholds,
) -> tuple[MetricVerdict, ...]:
    """A verdict per case and gated metric, for every case ok on both sides whose metric has a threshold."""
    out: list[MetricVerdict] = []
    for metric in thresholds.gated:
        for c in cases:
            limit = thresholds.limit(metric, c.case)
            if limit is None or c.base_status != "ok" or c.current_status != "ok" or c.evidence == "status":
                continue
            base, current = base_rows.get(c.key, ()), current_rows.get(c.key, ())
            judged = (
                _memory(c, base, current, limit) if metric == "peak_mem" else _rate(c, base, current, metric, limit)
            )
            if judged is not None:
                out.append(judged)
    return tuple(out)


def control_gates(verdicts: Sequence[MetricVerdict]) -> tuple[MetricVerdict, ...]:
    """Each metric's calls held to the false-discovery rate across its cases, as ``control_discoveries`` holds the
    median's (``withdraw_unheld``). Rates come from the cases' intervals before the median's own control, so each
    gate is judged once, at its own threshold."""
    out = list(verdicts)
    for metric in dict.fromkeys(v.metric for v in verdicts):
        mine = [i for i, v in enumerate(verdicts) if v.metric == metric]
        for i, held in zip(mine, withdraw_unheld([verdicts[i] for i in mine], _p), strict=True):
            out[i] = held
    return tuple(out)


def _p(v: MetricVerdict, direction: Literal["regressed", "improved"]) -> float | None:
    if v.contended or v.ratio is None or v.ci_low is None or v.ci_high is None:
        return None
    worse = HIGHER_IS_WORSE[v.metric] == (direction == "regressed")
    return beyond_p(v.ratio, v.ci_low, v.ci_high, v.threshold, "above" if worse else "below", v.df)
