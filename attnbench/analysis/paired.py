"""``attnbench ab``'s verdicts, torch-free: one case judged on the per-round ratios of two sides timed alternately.

An interleaved session times each case in rounds; a round is one short block on each side (base, head), adjacent
in time, the order alternating. A shared 2-core machine moves a case by 10-25 % for seconds at a time (a state of
the machine, issue 50); both blocks of a round see the same state, so it cancels in the round's ratio head / base,
where it does not cancel between two runs taken minutes apart (``compare``'s one run a side).

The rule, per case: the median of the per-round ratios, and its distribution-free 95 % interval, the order
statistics a sign test gives (``core.stats.median_ci_ranks``; no assumption about the shape of the ratios, which
on this machine is bimodal). Against the threshold t (``--fail-on median:P%``):

* ``slower``: the interval lies above 1 + t; ``faster``: below 1 − t; ``same``: inside [1 − t, 1 + t];
* ``unclear``: it straddles 1 + t or 1 − t (or there are fewer than ``MIN_ROUNDS`` paired rounds): neither a pass
  nor a failure, with the reason;
* a side whose case failed (error, crashed, timeout, oom, …) judges by status, as ``compare`` does.

**Fresh worker pairs.** Pairing in time cancels the machine's state, not a lasting difference between the two worker
processes (where their memory landed, which core their threads settled on), which each side would keep for the
whole session: a constant offset no number of rounds averages away (1 false regression in 20 A/A sessions, issue
50). So a session replaces both workers every few rounds (``sweeps.interleaved``), and the rounds come in clusters,
one per worker pair, each with its own draw of that offset. The rounds of one pair are not independent evidence
about it, so the statistic is one per pair: the median of its rounds' ratios (at three rounds a pair or more, one
odd round does not move it). The case's ratio is the geometric mean of the pairs' ratios, and its 95 % interval
Student's t on their logs with (pairs − 1) degrees of freedom: the spread between pairs holds both the rounds'
noise and the workers' offsets, so a per-process bias widens the interval instead of shifting it. Fewer than
``MIN_PAIRS`` pairs give no interval (unclear). A session of one worker pair (``--pair-rounds 0``) is judged on its
rounds as above: it cannot see a per-process offset.

Over the whole set, a slower or faster call must survive the Benjamini–Hochberg control ``compare`` uses
(``case_compare.withdraw_unheld``), with the exact one-sided sign-test p of "the median ratio lies beyond the
threshold" (for pairs of workers, the one-sided t-test's p against the threshold, which agrees with the interval
the same way): eight cases of unchanged code must not fail a build one time in six. The set is ``slower`` when any
case is, else ``unclear`` when any case is, else ``faster`` when any case is, else ``same``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from attnbench.analysis.case_compare import CONFIDENCE, Verdict, ratio_verdict, withdraw_unheld
from attnbench.core.cases import Case
from attnbench.core.errors import EXIT_CASE_FAILED, EXIT_OK, EXIT_UNCLEAR
from attnbench.core.stats import median_ci_ranks

Answer = Literal["faster", "slower", "same", "unclear"]
ANSWERS: tuple[Answer, ...] = ("slower", "unclear", "faster", "same")  # the set's answer: the first one present

# compare's vocabulary → ab's: the false-discovery control (``withdraw_unheld``) speaks compare's.
_ANSWER: dict[Verdict, Answer] = {"regressed": "slower", "improved": "faster", "same": "same", "noisy": "unclear"}

# Below this many paired rounds no 95 % interval of a median exists (``median_ci_ranks``).
MIN_ROUNDS = 6
# Below this many worker pairs the interval over pairs is too wide to call anything (t at 1 degree of freedom: 12.7).
MIN_PAIRS = 3

_TIMING_STATUSES = {"ok", "too_slow_for_budget"}
_FAILED_FIRST = ("crashed", "error", "timeout", "oom", "unsupported", "too_slow_for_budget")


@dataclass(frozen=True)
class PairedCase:
    """One case's paired verdict. ``ratios`` are head / base per round; times are seconds per call (medians)."""

    key: str
    case: Case
    verdict: Verdict  # compare's word (``answer`` is ab's), so the false-discovery control applies unchanged
    threshold: float
    ratios: tuple[float, ...] = ()
    ratio: float | None = None  # the median of ``ratios``; over several worker pairs, the geometric mean of theirs
    pairs: tuple[int, ...] = ()  # the worker pair of each of ``ratios`` (empty: one pair for the whole session)
    pair_ratios: tuple[float, ...] = ()  # each worker pair's median ratio: the observations the interval rests on
    ci_low: float | None = None
    ci_high: float | None = None
    base_s: float | None = None  # the median of the base's block medians
    head_s: float | None = None
    base_status: str = "ok"
    head_status: str = "ok"
    note: str = ""

    @property
    def answer(self) -> Answer:
        return _ANSWER.get(self.verdict, "unclear")

    def to_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "answer": self.answer,
            "threshold": self.threshold,
            "ratio": self.ratio,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "rounds": len(self.ratios),
            "ratios": list(self.ratios),
            "worker_pairs": len(self.pair_ratios) or 1,
            "pair_ratios": list(self.pair_ratios),
            "base_s": self.base_s,
            "head_s": self.head_s,
            "base_status": self.base_status,
            "head_status": self.head_status,
            "note": self.note,
        }


def median_interval(ratios: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float] | None:
    """(median, lo, hi) of ``ratios``: the distribution-free interval of their median at ``confidence`` (the sign
    test's order statistics), or None below ``MIN_ROUNDS``."""
    ranks = median_ci_ranks(len(ratios), confidence)
    if ranks is None:
        return None
    ordered = sorted(ratios)
    return statistics.median(ordered), ordered[ranks[0]], ordered[ranks[1]]


def sign_p(ratios: Sequence[float], threshold: float, direction: Literal["regressed", "improved"]) -> float:
    """The exact one-sided sign-test p of "the median ratio lies above 1 + threshold" (``regressed``) or below
    1 − threshold (``improved``): the chance of at most as many rounds on the other side of it when the median sat
    on it. The interval of ``median_interval`` lies beyond the threshold exactly when this is ≤ 2.5 %, so one case
    reads the same either way."""
    n = len(ratios)
    if direction == "regressed":
        against = sum(r <= 1 + threshold for r in ratios)
    else:
        against = sum(r >= 1 - threshold for r in ratios)
    return sum(math.comb(n, k) for k in range(against + 1)) / 2**n


def pair_medians(ratios: Sequence[float], pairs: Sequence[int]) -> tuple[float, ...]:
    """Each worker pair's median ratio, in the order the pairs first appear."""
    grouped: dict[int, list[float]] = {}
    for pair, ratio in zip(pairs, ratios, strict=True):
        grouped.setdefault(pair, []).append(ratio)
    return tuple(statistics.median(group) for group in grouped.values())


def pairs_interval(pair_ratios: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float] | None:
    """(centre, lo, hi): the geometric mean of the pairs' ratios and Student's t interval on their logs, or None
    below ``MIN_PAIRS``."""
    m = len(pair_ratios)
    if m < MIN_PAIRS:
        return None
    from scipy.stats import t as student  # scipy is slow to import; only a judged session needs it

    logs = [math.log(r) for r in pair_ratios]
    mean = statistics.fmean(logs)
    half = float(student.ppf(0.5 + confidence / 2, m - 1)) * statistics.stdev(logs) / math.sqrt(m)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def pairs_p(pair_ratios: Sequence[float], threshold: float, direction: Literal["regressed", "improved"]) -> float:
    """The one-sided t-test's p of "the pairs' mean log-ratio lies beyond the threshold" (above log(1 + threshold)
    for ``regressed``, below log(1 − threshold) for ``improved``): ≤ 2.5 % exactly when ``pairs_interval`` lies
    beyond it, as ``sign_p`` is for one pair's rounds."""
    from scipy.stats import t as student

    logs = [math.log(r) for r in pair_ratios]
    m = len(logs)
    mean = statistics.fmean(logs)
    beyond = mean - math.log1p(threshold) if direction == "regressed" else math.log1p(-threshold) - mean
    se = statistics.stdev(logs) / math.sqrt(m)
    if se == 0.0:
        return 0.0 if beyond > 0 else 1.0
    return float(student.sf(beyond / se, m - 1))


def judge_rounds(
    key: str,
    case: Case,
    base_s: Sequence[float],
    head_s: Sequence[float],
    threshold: float,
    pairs: Sequence[int] = (),
) -> PairedCase:
    """One case from its rounds' block medians, paired by position (round i of base with round i of head).
    ``pairs`` gives each round's worker pair; over more than one pair the case is judged on the pairs (module
    notes), else on the rounds."""
    if len(base_s) != len(head_s) or (pairs and len(pairs) != len(base_s)):
        raise ValueError("judge_rounds() takes one base and one head median (and one pair, if any) per round")
    ratios = tuple(h / b for b, h in zip(base_s, head_s, strict=True))
    centre = (statistics.median(base_s), statistics.median(head_s)) if ratios else (None, None)
    judged = PairedCase(key, case, "noisy", threshold, ratios, base_s=centre[0], head_s=centre[1])
    if len(set(pairs)) > 1:
        return _judge_pairs(replace(judged, pairs=tuple(pairs), pair_ratios=pair_medians(ratios, pairs)))
    found = median_interval(ratios)
    if found is None:
        median = statistics.median(ratios) if ratios else None
        note = f"{len(ratios)} paired rounds, fewer than the {MIN_ROUNDS} an interval needs: add --rounds"
        return replace(judged, ratio=median, note=note)
    ratio, lo, hi = found
    verdict = ratio_verdict(lo, hi, threshold)
    note = ""
    if verdict == "noisy":
        edge = 1 + threshold if lo <= 1 + threshold <= hi else 1 - threshold
        note = (
            f"the 95 % interval {lo:.3f}-{hi:.3f} of {len(ratios)} rounds' ratios straddles {edge:.3f} "
            "(the threshold): more --rounds narrow it"
        )
    return replace(judged, verdict=verdict, ratio=ratio, ci_low=lo, ci_high=hi, note=note)


def _judge_pairs(judged: PairedCase) -> PairedCase:
    found = pairs_interval(judged.pair_ratios)
    m = len(judged.pair_ratios)
    if found is None:
        note = f"{m} worker pairs, fewer than the {MIN_PAIRS} an interval needs: add --rounds"
        return replace(judged, ratio=math.exp(statistics.fmean(math.log(r) for r in judged.pair_ratios)), note=note)
    ratio, lo, hi = found
    verdict = ratio_verdict(lo, hi, judged.threshold)
    note = ""
    if verdict == "noisy":
        edge = 1 + judged.threshold if lo <= 1 + judged.threshold <= hi else 1 - judged.threshold
        note = (
            f"the 95 % interval {lo:.3f}-{hi:.3f} of {m} worker pairs' ratios straddles {edge:.3f} "
            "(the threshold): more --rounds (more worker pairs) narrow it"
        )
    return replace(judged, verdict=verdict, ratio=ratio, ci_low=lo, ci_high=hi, note=note)


def judge_status(key: str, case: Case, threshold: float, base: tuple[str, str], head: tuple[str, str]) -> PairedCase:
    """A case a side could not time, by status as ``compare`` judges one: a head that fails where the base ran
    is slower, the reverse faster, both failing the same; a side too slow for the budget where the other ran (or
    was too slow too) is unclear, as ``compare`` holds it: how many samples fit in a budget is a timing."""
    base_status, head_status = base[0], head[0]
    verdict: Verdict
    if {base_status, head_status} <= _TIMING_STATUSES:
        verdict = "noisy"  # how many samples fit in a block's budget is a timing too, and a noisy machine's
    elif base_status == "ok":
        verdict = "regressed"
    elif head_status == "ok":
        verdict = "improved"
    else:
        verdict = "same"
    note = "; ".join(f"{side} {status}: {why}" for side, status, why in (("base", *base), ("head", *head)) if why)
    return PairedCase(key, case, verdict, threshold, base_status=base_status, head_status=head_status, note=note)


def _p_of(case: PairedCase, direction: Literal["regressed", "improved"]) -> float | None:
    if case.ci_low is None or not case.ratios:
        return None  # judged by status, or without an interval: nothing to control
    if case.pair_ratios:
        return pairs_p(case.pair_ratios, case.threshold, direction)
    return sign_p(case.ratios, case.threshold, direction)


@dataclass(frozen=True)
class PairedComparison:
    """The whole set: every case (after the false-discovery control), its answer and the exit code."""

    cases: tuple[PairedCase, ...]
    rounds: int = 0
    warnings: tuple[str, ...] = field(default=())

    @property
    def answer(self) -> Answer:
        answers = {c.answer for c in self.cases}
        return next((a for a in ANSWERS if a in answers), "same")

    def of(self, answer: Answer) -> tuple[PairedCase, ...]:
        return tuple(c for c in self.cases if c.answer == answer)

    @property
    def exit_code(self) -> int:
        """1 when a case is slower (as ``compare``'s regression), ``EXIT_UNCLEAR`` when none is but some case
        could not be told from the threshold, else 0."""
        if self.of("slower"):
            return EXIT_CASE_FAILED
        return EXIT_UNCLEAR if self.of("unclear") else EXIT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "answer": self.answer,
            "exit_code": self.exit_code,
            "rounds": self.rounds,
            "counts": {a: len(self.of(a)) for a in ANSWERS},
            "cases": [c.to_dict() for c in self.cases],
            "warnings": list(self.warnings),
        }


def judge_session(cases: Sequence[PairedCase], rounds: int, warnings: Sequence[str] = ()) -> PairedComparison:
    """The set's verdict: each case's, with the calls the Benjamini–Hochberg control does not keep made unclear."""
    return PairedComparison(withdraw_unheld(cases, _p_of), rounds, tuple(warnings))


def worst_status(statuses: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """A side's (status, reason) over its blocks of a case: ok only when every block was, else the worst."""
    bad = [s for s in statuses if s[0] != "ok"]
    if not bad:
        return "ok", ""
    return min(bad, key=lambda s: _FAILED_FIRST.index(s[0]) if s[0] in _FAILED_FIRST else len(_FAILED_FIRST))
