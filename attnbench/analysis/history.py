"""A case's trend over many runs, and the step changes in it: what ``attnbench history`` reads.

Runs are ordered by the benchmarked code's commit order when every run records a commit of one repository that
git can order here (the working directory's checkout, or ``repo``), else by when they started. Runs that
``compare`` would refuse to compare (the environment fingerprint differs: another GPU, driver, torch, CPU, …)
are not mixed: the ordered runs are cut into *segments* wherever the fingerprint changes, and steps are looked
for inside each segment only. Cases are matched by key; a case missing from some runs of a segment has gaps
there, and the history lists the cases not in every run.

Each case's series is one value per run (the median time per call, tokens/s, peak memory, or GB/s over the
compulsory bytes a row stores as ``extra.bytes_moved``), with the run's own 95 % interval where it has one;
``analysis.steps`` finds where its level moved by more than the noise between runs. Two refinements make that
work on a real machine, where most of the noise between runs is shared:

* **The run-level shift.** A run taken while the machine was busier, hotter or on another host reads slower in
  every case at once. With at least ``MIN_SHIFT_CASES`` cases timed in every run of a segment, the shift of each
  run is the median, over those cases, of the case's log value less its median over the runs (robust while
  fewer than half the cases move for their own reasons). Steps in the shift itself are reported as run-level
  steps ("every case moved together from run k": a change of machine, of load, or of code every case runs);
  each case's series is divided by it before its own steps are looked for, so a case's step is a step
  *beyond* what the whole run did. On simulated histories where most noise is shared, this is what finds a 10 %
  step in one case without false ones elsewhere (results/history-detection-rates.md, scripts/history_rates.py).
* **Family-wise over the segment.** Half of a 5 % error budget goes to the run-level shift, the other half is
  shared by the cases (each tested at 2.5 % / cases), so a flat history of 20 cases reports a chance step in
  roughly one history in twenty, not in most of them.
"""

from __future__ import annotations

import fnmatch
import math
import statistics
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from attnbench.analysis.steps import ALPHA, MIN_RUNS_PER_LEVEL, StepFit, fit_steps, sigma_from_ci
from attnbench.core.cases import Case
from attnbench.core.errors import AttnbenchError
from attnbench.results.environment import FINGERPRINT_KEYS, Environment
from attnbench.results.records import Result
from attnbench.results.store import StoredRun

Metric = Literal["median", "tokens_per_s", "peak_mem", "gbps"]
METRICS: tuple[Metric, ...] = ("median", "tokens_per_s", "peak_mem", "gbps")
# What each metric reads, in what unit, and whether higher is better (tokens/s, GB/s) or worse (time, memory).
METRIC_UNITS: Mapping[Metric, str] = {"median": "s", "tokens_per_s": "tokens/s", "peak_mem": "bytes", "gbps": "bytes/s"}
HIGHER_IS_BETTER: Mapping[Metric, bool] = {"median": False, "tokens_per_s": True, "peak_mem": False, "gbps": True}
Order = Literal["commit", "time"]
# Fewer cases timed in every run than this and the run-level shift is not estimated (a median of a handful of
# cases is itself noise); each case is then read as it is.
MIN_SHIFT_CASES = 5


@dataclass(frozen=True)
class Point:
    """One run's reading of one case: ``value`` (None when the case did not run ok there) and its 95 % interval."""

    value: float | None
    low: float | None = None
    high: float | None = None
    status: str = "missing"  # the row's status, or "missing" when the run has no such case
    contended: bool = False  # timed while other work competed for the machine (``Result.contended``)


@dataclass(frozen=True)
class CaseHistory:
    """One case over the runs of one segment: a point per run (in the segment's order) and the steps found in it
    beyond the segment's run-level shift (``adjusted``; the points themselves are as measured)."""

    case: Case
    segment: int
    points: tuple[Point, ...]
    fit: StepFit
    adjusted: bool = False

    @property
    def key(self) -> str:
        return self.case.key


@dataclass(frozen=True)
class RunShift:
    """What every case of a segment did together, run by run: the ratio to the case's usual level, typical over
    ``cases`` cases (1.0 = an ordinary run), and the steps in it."""

    ratios: tuple[float, ...]
    cases: int
    fit: StepFit


@dataclass(frozen=True)
class Segment:
    """Consecutive runs (in history order) that share one environment fingerprint, so their timings compare."""

    index: int
    runs: tuple[StoredRun, ...]
    fingerprint: Mapping[str, Any]
    changed: tuple[str, ...] = ()  # from the previous segment: "torch: '2.13.0' → '2.14.1'"
    shift: RunShift | None = None  # None: fewer than MIN_SHIFT_CASES cases ran in every run


@dataclass(frozen=True)
class History:
    metric: Metric
    order: Order
    order_note: str  # why this order (and why not the commit order, when it could not be used)
    segments: tuple[Segment, ...]
    cases: tuple[CaseHistory, ...]
    partial: tuple[str, ...] = ()  # keys of cases missing from some runs of their segment
    warnings: tuple[str, ...] = field(default_factory=tuple)

    @property
    def runs(self) -> tuple[StoredRun, ...]:
        return tuple(stored for segment in self.segments for stored in segment.runs)

    @property
    def steps(self) -> int:
        """Step changes found: in cases, and in the run-level shift of segments."""
        shifts = sum(len(s.shift.fit.steps) for s in self.segments if s.shift is not None)
        return shifts + sum(len(c.fit.steps) for c in self.cases)


def run_name(stored: StoredRun) -> str:
    """How a history names a run: its label, else its commit (short, +dirty), else its id."""
    run = stored.run
    if run.label:
        return run.label
    if run.code is not None:
        return run.code.short
    return run.run_id


def _fingerprint(stored: StoredRun) -> dict[str, Any]:
    env = stored.run.environment
    try:
        return Environment.from_dict(env).fingerprint_fields()
    except TypeError:  # an older or damaged environment: the keys that are there
        return {key: env.get(key) for key in FINGERPRINT_KEYS}


def commit_order(commits: Sequence[str], repo: Path | None = None) -> list[str] | None:
    """The commits in history order (ancestors first), or None when git cannot order them all here."""
    wanted = list(dict.fromkeys(commits))
    try:
        out = subprocess.run(
            ["git", "-C", str(repo or Path.cwd()), "rev-list", "--topo-order", "--reverse", *wanted],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    rank = {commit: i for i, commit in enumerate(out.stdout.split())}
    if any(c not in rank for c in wanted):
        return None
    return sorted(wanted, key=rank.__getitem__)


def order_runs(runs: Sequence[StoredRun], repo: Path | None = None) -> tuple[list[StoredRun], Order, str]:
    """The runs in history order, which order it is, and a sentence saying why."""
    by_time = sorted(runs, key=lambda s: (s.run.created_utc, s.run.run_id))
    commits = [s.run.commit for s in runs]
    if not runs or any(c is None for c in commits):
        missing = sum(c is None for c in commits)
        why = f"{missing} of {len(runs)} runs record no commit" if missing else "no runs"
        return by_time, "time", f"ordered by start time ({why})"
    order = commit_order([c for c in commits if c is not None], repo)
    if order is None:
        return by_time, "time", "ordered by start time (git cannot order these commits in this checkout)"
    rank = {commit: i for i, commit in enumerate(order)}
    ordered = sorted(by_time, key=lambda s: rank[s.run.commit or ""])  # stable: same commit keeps time order
    if len(order) == 1:
        return ordered, "time", "ordered by start time (every run measured one commit)"
    return ordered, "commit", f"ordered by commit ({len(order)} commits, ancestors first; runs of one commit by time)"


def segments_of(runs: Sequence[StoredRun]) -> list[Segment]:
    """Cut ordered runs wherever the environment fingerprint changes."""
    segments: list[Segment] = []
    for stored in runs:
        fingerprint = _fingerprint(stored)
        if segments and segments[-1].fingerprint == fingerprint:
            last = segments[-1]
            segments[-1] = Segment(last.index, (*last.runs, stored), last.fingerprint, last.changed)
            continue
        changed: tuple[str, ...] = ()
        if segments:
            before = segments[-1].fingerprint
            changed = tuple(
                f"{key}: {before.get(key)!r} → {fingerprint.get(key)!r}"
                for key in sorted(set(before) | set(fingerprint))
                if before.get(key) != fingerprint.get(key)
            )
        segments.append(Segment(len(segments), (stored,), fingerprint, changed))
    return segments


def point(result: Result | None, metric: Metric) -> Point:
    """One run's reading of a case for ``metric``."""
    if result is None:
        return Point(None)
    if metric == "peak_mem":
        peak = result.memory.peak_bytes if result.ok and result.memory is not None else None
        return Point(None if peak is None else float(peak), status=result.status)
    if not result.is_timed:
        return Point(None, status=result.status)
    summary = result.timing.summary
    busy = result.contended
    if metric == "median":
        return Point(summary.median, summary.ci_low, summary.ci_high, result.status, busy)
    if metric == "gbps":
        moved = result.extra.get("bytes_moved")
        if not isinstance(moved, int) or isinstance(moved, bool) or moved <= 0:
            return Point(None, status=result.status)
        count = float(moved)
    else:
        count = float(result.tokens_per_call)
    low = count / summary.ci_high if summary.ci_high > 0 else None
    high = count / summary.ci_low if summary.ci_low > 0 else None
    return Point(count / summary.median, low, high, result.status, busy)


# What a history reads of one run for one metric: each case key's case and point. ``readings`` reads a run folder's
# rows; a published site reads the digests it keeps instead (``analysis.site``).
Reader = Callable[[StoredRun, Metric], Mapping[str, tuple[Case, Point]]]


def readings(stored: StoredRun, metric: Metric) -> dict[str, tuple[Case, Point]]:
    """Each case of a stored run, and its point for ``metric``."""
    return {r.case.key: (r.case, point(r, metric)) for r in stored.results}


def _matches(case: Case, patterns: Sequence[str]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(case.key, p) or fnmatch.fnmatchcase(case.label, p) for p in patterns)


def build_history(
    runs: Sequence[StoredRun],
    *,
    metric: Metric = "median",
    patterns: Sequence[str] = (),
    min_change: float = 0.0,
    repo: Path | None = None,
    read: Reader = readings,
) -> History:
    """Order the runs, cut them into comparable segments, and look for steps in every case of every segment.
    ``patterns``: shell patterns a case's key or label must match (any); ``min_change``: the smallest relative
    step worth reporting, on top of the noise rule; ``read``: what each run holds (its rows, by default)."""
    if metric not in METRICS:
        raise AttnbenchError(f"--metric: unknown metric {metric!r}", hint=f"one of: {', '.join(METRICS)}")
    if not runs:
        raise AttnbenchError("history: no runs to read", hint="pass run folders, or folders that hold them")
    unique: dict[tuple[str, str], StoredRun] = {}
    copies: list[str] = []
    for stored in runs:
        # The same run given twice (or copied) is one run, not two agreeing ones. Its id alone does not say so: two
        # sweeps started in one second into two --out folders get the same folder name, and are two runs.
        identity = (stored.run.run_id, stored.run.created_utc)
        if identity in unique:
            copies.append(f"{stored.folder} is run {stored.run.run_id} again (as {unique[identity].folder}): read once")
        else:
            unique[identity] = stored
    ordered, order, note = order_runs(list(unique.values()), repo)
    segments = segments_of(ordered)
    cases: list[CaseHistory] = []
    partial: list[str] = []
    for number, segment in enumerate(segments):
        rows = [read(stored, metric) for stored in segment.runs]
        keys: dict[str, Case] = {}
        for by_key in rows:
            for key, (case, _) in by_key.items():
                keys.setdefault(key, case)
        series = {key: tuple(by_key[key][1] if key in by_key else Point(None) for by_key in rows) for key in keys}
        shift = run_shift(list(series.values()))
        segments[number] = replace(segment, shift=shift)
        chosen = [key for key, case in keys.items() if _matches(case, patterns)]
        # Family-wise over the cases that can be tested at all (a case that never ran ok tests nothing).
        testable = sum(sum(p.value is not None for p in series[key]) >= 2 * MIN_RUNS_PER_LEVEL for key in chosen)
        for key in chosen:
            points = series[key]
            if any(p.status == "missing" for p in points):
                partial.append(key)
            values = [p.value for p in points]
            if shift is not None:
                values = [None if v is None else v / ratio for v, ratio in zip(values, shift.ratios, strict=True)]
            own = [sigma_from_ci(p.low, p.high) if p.low is not None and p.high is not None else None for p in points]
            alpha = ALPHA / 2 / max(1, testable) if shift is not None else ALPHA / max(1, testable)
            fit = fit_steps(values, point_noise_rel=own, min_effect=min_change, alpha=alpha)
            cases.append(CaseHistory(keys[key], segment.index, points, fit, adjusted=shift is not None))
    if patterns and not cases:
        raise AttnbenchError(
            f"--case {' '.join(patterns)}: no case of these runs matches",
            hint="patterns match a case's key (model=…|mode=…|…) or its label, with * and ? wildcards",
        )
    warnings = (*copies, *(w for stored in ordered for w in stored.warnings))
    return History(metric, order, note, tuple(segments), tuple(cases), tuple(dict.fromkeys(partial)), warnings)


def run_shift(series: Sequence[Sequence[Point]]) -> RunShift | None:
    """The segment's run-level shift from the cases with a value in every run, or None with too few of them."""
    complete = [[p.value for p in points] for points in series if all(p.value for p in points)]
    if len(complete) < MIN_SHIFT_CASES or not complete or len(complete[0]) < 2:
        return None
    centred = []
    for values in complete:
        logs = [math.log(v) for v in values if v is not None]
        middle = statistics.median(logs)
        centred.append([x - middle for x in logs])
    ratios = tuple(math.exp(statistics.median(c[run] for c in centred)) for run in range(len(complete[0])))
    return RunShift(ratios, len(complete), fit_steps(list(ratios), alpha=ALPHA / 2))
