"""``compare``: a noise-aware regression verdict per case between two stored runs. Torch-free.

Per case (matched by ``Case.key``) the estimate is the ratio current/base of the median time per call, with a
confidence interval from one of two kinds of evidence:

* **processes** — when a side holds several per-process medians (a folder of runs of the same config, e.g. base
  and head swept in alternation, or ``Measurement.replicate_medians_s``): a Student t interval of the difference
  of mean log medians, with the variance pooled over both sides (the same machine measured both). This is the
  variation that matters, because two processes of unchanged code differ by far more than the samples inside one
  process suggest (memory layout, thread placement, clocks, other load).
* **samples** — one process per side: a bootstrap of the ratio of medians over the raw samples (seeded by the
  case key, so deterministic), widened by a **noise floor** for the between-process variation that samples from
  one process cannot show. The floor is the half-width of a 95 % interval of the ratio between two processes of
  unchanged code on the machine, measured by ``attnbench calibrate`` (``measure.noise``) and recorded with each run
  (the larger of the two runs' figures is used, ``resolve_floor``; ``--noise-floor`` overrides it, and without
  either the default applies); it is combined with the bootstrap interval in quadrature on the log scale, since
  the two errors are independent. When the floor is at least the threshold, a warning names timing.processes.

Verdict, with threshold t for the case (its model/mode pattern, its model, or the default): ``regressed`` when the
interval lies entirely above 1 + t, ``improved`` entirely below 1 − t, ``same`` inside [1 − t, 1 + t], ``noisy``
otherwise. A change must be both
larger than the threshold *and* significant to regress, so noise alone cannot fail a build. Statuses decide before
timings: ok → anything else (oom, unsupported, error, timeout, crashed, incorrect) is ``regressed``, a non-ok case
that now runs is ``improved``, a case that newly ends error/timeout/crashed/incorrect is ``regressed``, two non-ok
ends are ``same``; ok ↔ too_slow_for_budget is no status change but ``noisy`` (how many samples fit a budget is a
timing: a case at its budget's edge flips on unchanged code, ``case_compare.budget_flip``);
``new`` and ``missing`` cases have no counterpart and never fail. A timed verdict on a row that was contended
(``Result.contended``: another process competed for the machine while it was timed) on either side is ``noisy``,
and says which side — unless a side is a folder of runs with enough uncontended ones to judge on without them.

A comparison asks this of every case at once, so a timed regression or improvement must also survive the
Benjamini–Hochberg procedure over all the timed cases, at 2.5 % per direction (``case_compare.control_discoveries``):
under no change the chance of any false call then stays at 2.5 % however many cases there are, and a change of many
cases keeps each case's own 2.5 %. A call that does not survive is ``noisy``, its note says why.

Thresholds may also name ``peak_mem``, ``tokens_per_s`` and ``gbps``: ``compare_sides`` judges them by the same
rule on each metric's interval (``analysis.gates``) and adds them to the comparison, where a regression fails it
too, so every caller (the CLI, ``attnbench.api.compare``, a script) gets the same verdict.

One case's verdict and its intervals are ``analysis.case_compare``'s; this module judges the sides.

With folders of runs (two or more a side) the sides are also judged as wholes (``Overall``): one score per run
over every case it timed, the two sides' scores compared as a case's processes are; a regression there fails the
comparison too.

Runs are compared only when their environments agree on the hard keys (``HARD_KEYS``); otherwise ``compare``
refuses (exit 3) and lists the differences, unless ``allow_mismatch`` names them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from attnbench.analysis.case_compare import (
    CONFIDENCE,
    DEFAULT_NOISE_FLOOR,
    MIN_SAMPLES,
    RESAMPLES,
    VERDICTS,
    CaseComparison,
    Evidence,
    Policy,
    Role,
    Verdict,
    bootstrap_ratio_ci,
    compare_case,
    control_discoveries,
    pooled_log_sd,
    process_medians,
    process_ratio_ci,
    ratio_verdict,
    runs_for_interval,
)
from attnbench.analysis.gates import MetricVerdict, control_gates, gate_metrics
from attnbench.core.errors import (
    EXIT_CASE_FAILED,
    EXIT_NO_BASELINE,
    EXIT_NOT_COMPARABLE,
    EXIT_OK,
    AttnbenchError,
    ResultsError,
)
from attnbench.core.units import format_percent
from attnbench.results.calibration import foreign
from attnbench.results.environment import FINGERPRINT_KEYS, Environment, packages_of
from attnbench.results.records import Result
from attnbench.results.store import RUN_FILE, StoredRun, load_run

# The environment keys that must match (environment.FINGERPRINT_KEYS) plus what was measured: the dtypes and the
# resolved config. A different torch or GPU makes a timing difference meaningless as a regression signal.
__all__ = [
    "CONFIDENCE",
    "DEFAULT_NOISE_FLOOR",
    "HARD_KEYS",
    "MIN_SAMPLES",
    "RESAMPLES",
    "VERDICTS",
    "CaseComparison",
    "Comparison",
    "Evidence",
    "Mismatch",
    "NoBaselineError",
    "NotComparableError",
    "Overall",
    "Policy",
    "Role",
    "Side",
    "Verdict",
    "allowed_keys",
    "bootstrap_ratio_ci",
    "check_comparable",
    "compare_case",
    "compare_paths",
    "compare_sides",
    "hard_fields",
    "load_side",
    "mismatches",
    "overall_rule",
    "overall_verdict",
    "pooled_log_sd",
    "process_medians",
    "process_ratio_ci",
    "resolve_floor",
    "runs_for_interval",
]

HARD_KEYS: tuple[str, ...] = (*FINGERPRINT_KEYS, "dtypes", "config_sha256")

BASELINE_HINT = (
    "sweep the base commit on this machine (attnbench sweep CONFIG --out DIR) and pass DIR, or keep a committed "
    "baseline: attnbench sweep CONFIG --out results/baselines/<name> (see results/baselines/README.md)"
)


class NotComparableError(AttnbenchError):
    """The two runs were measured on different hardware or software, or of different configs."""

    exit_code = EXIT_NOT_COMPARABLE


class NoBaselineError(ResultsError):
    """The base path holds no run to compare against."""

    exit_code = EXIT_NO_BASELINE


# ---------------------------------------------------------------------------------------------------- the runs


@dataclass(frozen=True)
class Side:
    """One side of a comparison: a run, or a folder of runs of the same config (one process each)."""

    path: Path
    runs: tuple[StoredRun, ...]
    # What loading found worth saying: sub-folders that are not runs, copies counted once.
    warnings: tuple[str, ...] = ()

    @property
    def run_ids(self) -> tuple[str, ...]:
        return tuple(stored.run.run_id for stored in self.runs)

    @property
    def environment(self) -> Mapping[str, Any]:
        return self.runs[0].run.environment

    @property
    def commits(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(str(s.run.environment.get("git_commit") or "?") for s in self.runs))

    def rows(self) -> dict[str, list[Result]]:
        """Every run's row for each case key, in run order."""
        rows: dict[str, list[Result]] = {}
        for stored in self.runs:
            for result in stored.results:
                rows.setdefault(result.case.key, []).append(result)
        return rows


def load_side(path: Path, role: Role) -> Side:
    """A run folder, or a folder holding run folders (replicate processes of one side). A base that does not exist
    or holds no rows is ``NoBaselineError`` (exit 4); anything unreadable is the loader's ``ResultsError``.

    Evidence is counted once: run folders of one ``run_id`` (a run copied twice into the folder) are one run, and
    a timed row that repeats another run's exactly (the same samples from the same start) is one measurement; each
    is a warning naming the folders. Copies of one run that disagree on a case are an error."""
    missing: type[ResultsError] = NoBaselineError if role == "base" else ResultsError
    hint = BASELINE_HINT if role == "base" else "pass a folder written by 'attnbench sweep'"
    try:
        if not path.exists():
            raise missing(f"{role} {path}: no such run folder", hint=hint)
        warnings: list[str] = []
        if path.is_dir() and not (path / RUN_FILE).exists():
            members: list[Path] = []
            for sub in sorted(p for p in path.iterdir() if p.is_dir()):
                if (sub / RUN_FILE).is_file():
                    members.append(sub)
                else:
                    warnings.append(f"{role} {path}: skipped {sub.name}/ (no {RUN_FILE} in it, so not a run)")
            if not members:
                raise missing(f"{role} {path}: holds no run (no {RUN_FILE}, no run folders inside)", hint=hint)
            runs, copies = _distinct_runs([load_run(p) for p in members], role)
            warnings += copies
        else:
            runs = [load_run(path)]
    except OSError as exc:  # a folder we may not list or enter
        raise ResultsError(f"{role} {path}: cannot read it ({exc.strerror or exc})", hint=hint) from None
    if not any(stored.results for stored in runs):
        what = "the run has no results" if len(runs) == 1 else f"none of its {len(runs)} runs has results"
        raise missing(f"{role} {path}: {what} (the sweep stopped before its first case)", hint=hint)
    return Side(path, tuple(runs), tuple(warnings))


def _distinct_runs(runs: Sequence[StoredRun], role: Role) -> tuple[list[StoredRun], list[str]]:
    """The runs with each piece of evidence once: folders of one run_id merged into the first (they must agree on
    every case they share), and timed rows that repeat an earlier run's exactly dropped."""
    out: list[StoredRun] = []
    warnings: list[str] = []
    for stored in runs:
        first = next((i for i, kept in enumerate(out) if kept.run.run_id == stored.run.run_id), None)
        if first is None:
            out.append(stored)
            continue
        earlier = out[first]
        rows = {r.case.key: r for r in earlier.results}
        clash = next((r.case.key for r in stored.results if rows.get(r.case.key, r) != r), None)
        if clash is not None:
            raise ResultsError(
                f"{role} {earlier.folder} and {stored.folder} both hold run {stored.run.run_id}, with different "
                f"rows for case {clash}",
                hint="a folder of runs holds distinct runs (one process each); remove the copy that does not belong",
            )
        extra = tuple(r for r in stored.results if r.case.key not in rows)
        out[first] = replace(earlier, results=earlier.results + extra)
        warnings.append(f"{role} {stored.folder}: the same run as {earlier.folder} ({stored.run.run_id}); counted once")
    seen: dict[str, list[Result]] = {}
    for index, stored in enumerate(out):
        kept = []
        for result in stored.results:
            if result.is_timed and result in seen.get(result.case.key, ()):
                continue
            seen.setdefault(result.case.key, []).append(result)
            kept.append(result)
        if len(kept) < len(stored.results):
            repeated = len(stored.results) - len(kept)
            warnings.append(
                f"{role} {stored.folder}: {repeated} of its rows repeat another run's exactly (the same "
                "measurement, copied); counted once"
            )
            out[index] = replace(stored, results=tuple(kept))
    return out, warnings


def hard_fields(stored: StoredRun) -> dict[str, Any]:
    """The values of ``HARD_KEYS`` for one run."""
    env = stored.run.environment
    try:
        fields = Environment.from_dict(env).fingerprint_fields()
    except TypeError:  # an environment from an older or damaged run.json: read what is there
        driver = env.get("driver")
        fields = {key: env.get(key) for key in FINGERPRINT_KEYS}
        fields["packages"] = packages_of(env)
        fields["driver_major"] = str(driver).split(".", 1)[0] if driver else None
    dtypes = stored.run.config.get("dtype")
    if not (isinstance(dtypes, list) and all(isinstance(d, str) for d in dtypes)):
        dtypes = [r.case.dtype for r in stored.results]
    fields["dtypes"] = ",".join(sorted(set(dtypes)))
    fields["config_sha256"] = stored.run.config_sha256
    return fields


@dataclass(frozen=True)
class Mismatch:
    key: str
    base: Any
    current: Any

    def describe(self, left: str = "base", right: str = "current") -> str:
        return f"{self.key}: {self.base!r} ({left}) vs {self.current!r} ({right})"


def mismatches(a: StoredRun, b: StoredRun) -> tuple[Mismatch, ...]:
    fa, fb = hard_fields(a), hard_fields(b)
    return tuple(Mismatch(key, fa[key], fb[key]) for key in HARD_KEYS if fa[key] != fb[key])


def allowed_keys(allow: Iterable[str], known: Sequence[str] = HARD_KEYS) -> frozenset[str]:
    """The keys ``--allow-mismatch`` named, each checked to be one of ``known``."""
    allowed = frozenset(allow)
    unknown = sorted(allowed - set(known))
    if unknown:
        raise AttnbenchError(
            f"--allow-mismatch: unknown key {', '.join(repr(k) for k in unknown)}", hint=f"one of: {', '.join(known)}"
        )
    return allowed


def check_comparable(base: Side, current: Side, allow: Iterable[str] = ()) -> tuple[Mismatch, ...]:
    """The differences that ``allow`` lets through; any other difference raises ``NotComparableError``."""
    allowed = allowed_keys(allow)
    for side, role in ((base, "base"), (current, "current")):
        for stored in side.runs[1:]:
            inner = [m for m in mismatches(side.runs[0], stored) if m.key not in allowed]
            if inner:
                raise NotComparableError(
                    f"{role} {side.path}: its runs differ from each other: "
                    + "; ".join(m.describe(side.runs[0].run.run_id, stored.run.run_id) for m in inner),
                    hint="a folder of runs must hold repeats of one config on one machine",
                )
    found = mismatches(base.runs[0], current.runs[0])
    refused = [m for m in found if m.key not in allowed]
    if refused:
        raise NotComparableError(
            "the runs are not comparable: " + "; ".join(m.describe() for m in refused),
            hint="compare runs of the same config on the same machine and software; to compare anyway, "
            + " ".join(f"--allow-mismatch {m.key}" for m in refused),
        )
    return found


@dataclass(frozen=True)
class Overall:
    """Every case together: whether the run as a whole got slower, by more than any one case can show alone.

    A change that moves every case by 10 % can leave each case's interval straddling the threshold on a noisy
    machine, while eight cases that all moved say plainly that something did. Each run (one process) gets one
    score: the mean over cases of its log time relative to that case's mean over every run of both sides. The
    verdict rests on a Student t interval of the difference of the two sides' mean scores (variance pooled). One
    score per run, not per case, because the cases of a run shared its process: whatever made that process slow
    moved them together, and counting them as independent would call that drift a regression. Only folders of
    runs (two or more a side) have runs to score; timed, uncontended rows of cases ok on both sides count.

    It is judged as asv judges a change (``overall_rule``): regressed when the interval excludes no change and the
    estimate is beyond the threshold, not only when the whole interval is. A case's verdict demands the whole
    interval beyond the threshold (and the false-discovery control across the cases) because a comparison asks it
    of every case at once; this is one question per comparison, so unchanged code still
    fails it at most 2.5 % of the time, while a change of twice the threshold no longer needs an interval narrower
    than the gap between change and threshold: where runs spread 6 % (a 2-vCPU VM, results/README.md "Honest on
    a busy machine"), ten runs a side catch a 10 % change nine times in ten, where the whole-interval rule needs
    about thirty-five (tests/analysis/test_compare.py simulates both)."""

    verdict: Verdict
    ratio: float
    ci_low: float
    ci_high: float
    threshold: float
    cases: int  # the cases scored
    base_runs: int
    current_runs: int
    # How far one run's score strays from its side's mean (exp of the pooled log standard deviation, less 1), and
    # the runs a side that spread allows an interval within ±threshold on (``runs_for_interval``): what a noisy
    # verdict would take to become a verdict.
    spread: float
    runs_needed: int


MIN_OVERALL_CASES = 2


def overall_verdict(base: Side, current: Side, cases: Sequence[CaseComparison], threshold: float) -> Overall | None:
    """The sides' verdict as a whole (``Overall``), or None when either side has fewer than two runs or fewer
    than two cases were timed ok on both."""
    if len(base.runs) < 2 or len(current.runs) < 2:
        return None
    keys = {c.key for c in cases if c.base_status == "ok" and c.current_status == "ok" and c.evidence != "status"}

    def logs(side: Side) -> list[dict[str, float]]:
        out = []
        for stored in side.runs:
            run: dict[str, float] = {}
            for r in stored.results:
                if r.case.key in keys and r.ok and r.measurement is not None and not r.contended:
                    run[r.case.key] = statistics.fmean(math.log(x) for x in process_medians(r.measurement))
            out.append(run)
        return out

    b, c = logs(base), logs(current)
    every = [run for run in (*b, *c) if run]
    scored = {k for run in every for k in run}
    if len(scored) < MIN_OVERALL_CASES:
        return None
    centre = {k: statistics.fmean(run[k] for run in every if k in run) for k in scored}

    def scores(runs: list[dict[str, float]]) -> list[float]:
        return [statistics.fmean(v - centre[k] for k, v in run.items()) for run in runs if run]

    sb, sc = scores(b), scores(c)
    if not sb or not sc or len(sb) + len(sc) < 4:
        return None
    b_scores, c_scores = [math.exp(x) for x in sb], [math.exp(x) for x in sc]
    ratio, lo, hi = process_ratio_ci(b_scores, c_scores)
    spread = pooled_log_sd(b_scores, c_scores)
    return Overall(
        overall_rule(ratio, lo, hi, threshold),
        ratio,
        lo,
        hi,
        threshold,
        len(scored),
        len(sb),
        len(sc),
        math.expm1(spread),
        runs_for_interval(spread, threshold),
    )


def overall_rule(ratio: float, lo: float, hi: float, threshold: float) -> Verdict:
    """``Overall``'s verdict from its ratio and 95 % interval: beyond the threshold and significant is a change;
    otherwise a case's rule (which then can only say ``same`` or ``noisy``)."""
    if lo > 1 and ratio > 1 + threshold:
        return "regressed"
    if hi < 1 and ratio < 1 - threshold:
        return "improved"
    return ratio_verdict(lo, hi, threshold)


@dataclass(frozen=True)
class Comparison:
    """Every case's verdict, with what was compared and how."""

    base: Side
    current: Side
    policy: Policy
    cases: tuple[CaseComparison, ...]
    allowed: tuple[Mismatch, ...] = ()
    warnings: tuple[str, ...] = ()
    overall: Overall | None = None
    gates: tuple[MetricVerdict, ...] = ()  # the other metrics a threshold names (analysis.gates)

    def counts(self) -> dict[Verdict, int]:
        counts: dict[Verdict, int] = dict.fromkeys(VERDICTS, 0)
        for c in self.cases:
            counts[c.verdict] += 1
        return counts

    def of(self, verdict: Verdict) -> tuple[CaseComparison, ...]:
        return tuple(c for c in self.cases if c.verdict == verdict)

    @property
    def regressed(self) -> bool:
        """A case regressed, or every case together did (``Overall``)."""
        overall = self.overall is not None and self.overall.verdict == "regressed"
        gated = any(g.verdict == "regressed" for g in self.gates)
        return overall or gated or any(c.verdict == "regressed" for c in self.cases)

    @property
    def exit_code(self) -> int:
        return EXIT_CASE_FAILED if self.regressed else EXIT_OK

    def evidence(self) -> dict[Evidence, int]:
        counts: dict[Evidence, int] = {}
        for c in self.cases:
            counts[c.evidence] = counts.get(c.evidence, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """``compare --format json``. Schema ``attnbench.compare/1``; seconds per call, ratios current/base."""
        return {
            "schema": "attnbench.compare/1",
            "regressed": self.regressed,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "policy": {
                "threshold": self.policy.thresholds.default,
                "thresholds_per_model": dict(self.policy.thresholds.per_model),
                "thresholds_described": self.policy.thresholds.describe(),
                "noise_floor": self.policy.noise_floor,
                "noise_floor_source": self.policy.floor_source,
                "confidence": CONFIDENCE,
                "resamples": self.policy.resamples,
            },
            "base": _side_dict(self.base),
            "current": _side_dict(self.current),
            "allowed_mismatches": [vars(m).copy() for m in self.allowed],
            "warnings": list(self.warnings),
            "cases": [_case_dict(c) for c in self.cases],
            "overall": None if self.overall is None else vars(self.overall).copy(),
            "gates": [g.to_dict() for g in self.gates],
        }


def _side_dict(side: Side) -> dict[str, Any]:
    return {"path": str(side.path), "run_ids": list(side.run_ids), "commits": list(side.commits)}


def _case_dict(c: CaseComparison) -> dict[str, Any]:
    return {
        "key": c.key,
        "case": c.case.to_dict(),
        "verdict": c.verdict,
        "evidence": c.evidence,
        "threshold": c.threshold,
        "base_status": c.base_status,
        "current_status": c.current_status,
        "base_median_s": c.base_s,
        "current_median_s": c.current_s,
        "ratio": c.ratio,
        "ci_low": c.ci_low,
        "ci_high": c.ci_high,
        "base_n": c.base_n,
        "current_n": c.current_n,
        "note": c.note,
        "contended": list(c.contended),
        "contended_runs_left_out": {"base": c.left_out[0], "current": c.left_out[1]},
    }


def _side_warnings(side: Side, role: Role) -> list[str]:
    out = [*side.warnings, *(f"{role} {s.folder}: {w}" for s in side.runs for w in s.warnings)]
    out += [
        f"{role} run {s.run.run_id} is {s.run.state}: cases it did not reach show as missing or new"
        for s in side.runs
        if s.run.state != "complete"
    ]
    if len(side.commits) > 1:
        out.append(f"{role} {side.path}: its runs come from different commits ({', '.join(side.commits)})")
    for stored in side.runs:
        slowed = [r for r in stored.results if r.measurement is not None and r.measurement.injected_delay_s > 0]
        if slowed:
            out.append(
                f"{role} run {stored.run.run_id}: {len(slowed)} of {len(stored.results)} cases carry a busy-wait "
                "added on purpose (--inject-slowdown, a test of this gate)"
            )
    return out


UNMEASURED_SOURCE = "the default, as neither run recorded a measured one (attnbench calibrate measures this machine's)"


def resolve_floor(policy: Policy, base: Side, current: Side) -> Policy:
    """The policy with its noise floor decided: the one given, else the larger floor the runs recorded (measured
    by ``attnbench calibrate`` on the machine, stored with the run), else the default — and where it came from."""
    if policy.noise_floor is not None:
        return policy
    recorded = [
        (stored.run.calibration.noise.floor, stored.run.run_id)
        for side in (base, current)
        for stored in side.runs
        if stored.run.calibration is not None
        and stored.run.calibration.noise is not None
        and foreign(stored.run.calibration, stored.run.environment) is None
    ]
    if recorded:
        floor, run_id = max(recorded)
        source = f"measured on this machine by attnbench calibrate (the larger of the runs' figures, run {run_id})"
        return replace(policy, noise_floor=floor, floor_source=source)
    return replace(policy, noise_floor=DEFAULT_NOISE_FLOOR, floor_source=UNMEASURED_SOURCE)


def _foreign_warnings(base: Side, current: Side, policy: Policy) -> list[str]:
    """A recorded calibration another machine, device, torch or thread count measured is ignored: say so."""
    if policy.noise_floor is not None:  # a floor given: no recorded one is used
        return []
    out = []
    for side in (base, current):
        for stored in side.runs:
            calibration = stored.run.calibration
            why = (
                None
                if calibration is None or calibration.noise is None
                else foreign(calibration, stored.run.environment)
            )
            if why:
                out.append(
                    f"run {stored.run.run_id} records a calibration of another machine or stack ({why}): its "
                    "noise floor is ignored; run `attnbench calibrate` on the machine that swept it"
                )
    return out


def _floor_warning(comparison: Comparison) -> list[str]:
    """When the floor leaves no room for a verdict at the threshold, say so and how to get one."""
    floor = comparison.policy.noise_floor or 0.0
    one_process = [c for c in comparison.cases if c.evidence == "samples"]
    if not one_process or floor < min(c.threshold for c in one_process):
        return []
    if comparison.policy.floor_source == UNMEASURED_SOURCE:
        return [
            f"neither run recorded a noise floor measured on this machine, so with one process per side a case is "
            f"judged against ±{format_percent(floor)} between processes: only a change beyond that regresses "
            f"({len(one_process)} cases); for verdicts at the threshold run `attnbench calibrate` once on the "
            "machine (later runs record its measured floor), or set timing.processes (e.g. 5) in the config, or "
            "compare folders of repeated runs"
        ]
    return [
        f"the between-process noise floor (±{format_percent(floor)}) is at least the threshold, so with one process "
        f"per side no case can be called same and only changes well beyond it regress ({len(one_process)} cases); "
        "for a verdict at the threshold set timing.processes (e.g. 5) in the config, or compare folders of "
        "repeated runs"
    ]


def _window(side: Side) -> tuple[str, str]:
    """When a side's runs were timed: from the first one's start to the last one's end (ISO 8601 UTC strings of
    one format, so they order as text; a run that never finished counts by its start)."""
    return (
        min(stored.run.created_utc for stored in side.runs),
        max(stored.run.finished_utc or stored.run.created_utc for stored in side.runs),
    )


def _span(start: str, end: str) -> str:
    """``2026-12-03 15:45–15:54``; the end's date too when it is another day."""
    return f"{start[:10]} {start[11:16]}–{end[11:16] if end[:10] == start[:10] else f'{end[:10]} {end[11:16]}'}"


def _window_warning(comparison: Comparison) -> list[str]:
    """Cases judged on the spread between processes whose two sides were timed in separate windows: that spread is
    within a window and cannot show the machine's drift between them, so say so and how to avoid it."""
    if not any(c.evidence == "processes" for c in comparison.cases):
        return []
    (b0, b1), (c0, c1) = _window(comparison.base), _window(comparison.current)
    if b0 <= c1 and c0 <= b1:  # the windows overlap: the sides were swept alternately, or at the same time
        return []
    return [
        f"base and current were timed in separate windows (base {_span(b0, b1)}, current {_span(c0, c1)} UTC): "
        "each interval is the spread of a side's processes within its window, "
        "which cannot show how the machine drifted between the two (on a shared 2-vCPU VM, windows ten minutes "
        "apart differed by up to 15 % as wholes); where that matters, sweep base and current alternately in one "
        'window (README, "Alternate the two sides in one window")'
    ]


def compare_sides(base: Side, current: Side, policy: Policy) -> Comparison:
    """Check the sides are comparable (raises ``NotComparableError``), then judge every case key."""
    allowed = check_comparable(base, current, policy.allow_mismatch)
    ignored = _foreign_warnings(base, current, policy)
    policy = resolve_floor(policy, base, current)
    base_rows, current_rows = base.rows(), current.rows()
    keys = list(base_rows) + [k for k in current_rows if k not in base_rows]
    judged = [compare_case(k, base_rows.get(k, []), current_rows.get(k, []), policy) for k in keys]
    cases = control_discoveries(judged)
    warnings = _side_warnings(base, "base") + _side_warnings(current, "current") + ignored
    overall = overall_verdict(base, current, cases, policy.thresholds.default)
    gated = policy.thresholds.gated
    gates = control_gates(gate_metrics(judged, base_rows, current_rows, policy.thresholds)) if gated else ()
    comparison = Comparison(base, current, policy, cases, allowed, tuple(warnings), overall, gates)
    return replace(
        comparison, warnings=(*comparison.warnings, *_floor_warning(comparison), *_window_warning(comparison))
    )


def compare_paths(base: Path, current: Path, policy: Policy) -> Comparison:
    """Load both sides (a missing base is ``NoBaselineError``) and compare them."""
    return compare_sides(load_side(base, "base"), load_side(current, "current"), policy)
