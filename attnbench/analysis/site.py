"""What ``attnbench publish`` shows, torch-free: every metric's history over the runs, each case with its latest
verdict, and the confirmed steps newest first — read from *digests*, so a site can grow by the new runs alone.

A digest (``RunDigest``) is what a site keeps of a run: its ``run.json`` as stored, and per case the status, the
median time per call with its 95 % interval, the peak memory and the compulsory bytes (``extra.bytes_moved``) —
every number a history reads (``history.point``), a few hundred bytes a case where the run folder keeps every raw
sample. Publishing into an existing site reads its digests back, adds the new runs', and builds the histories over
all of them (``build_history`` with ``digest_reader``), so the site needs no run folder but the new ones.

Schema history of a digest (``attnbench.site-run``): 1 — first version; ``contended`` (optional, true only) and
``tokens`` (a row's tokens per call where not its case's: a capacity row's batch found) added later, optional, so
older digests read back as they always did; ``capacity`` (the run's capacity tables as its section shows them:
``CapacityDigest``) added later, written only for a run with capacity rows, so every other digest reads as before.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from attnbench.analysis.alerts import StepEvent, step_events
from attnbench.analysis.capacity import CapacityCurve, CapacityPoint, CapacityTable
from attnbench.analysis.history import (
    HIGHER_IS_BETTER,
    METRICS,
    CaseHistory,
    History,
    Metric,
    Point,
    Reader,
    build_history,
)
from attnbench.analysis.reading import Reading
from attnbench.core.cases import Case
from attnbench.core.errors import ResultsError
from attnbench.results import fields
from attnbench.results.fields import FieldError
from attnbench.results.records import Result, Run
from attnbench.results.store import StoredRun

DIGEST_SCHEMA = "attnbench.site-run/1"
# Steps listed on the regressions page. tokens/s is the median turned round (the same steps, mirrored): left out.
STEP_METRICS: tuple[Metric, ...] = ("median", "peak_mem", "gbps")
Kind = Literal["worse", "better", "steady", "short", "failed", "missing"]


# ------------------------------------------------------------------------------------------------------ digests
@dataclass(frozen=True)
class RowDigest:
    """One case of one run: what every history metric reads of its row."""

    case: Case
    status: str
    median_s: float | None = None
    ci_low_s: float | None = None
    ci_high_s: float | None = None
    peak_bytes: int | None = None
    bytes_moved: int | None = None
    contended: bool = False  # timed on a busy machine: drawn apart on the case's page
    tokens: int | None = None  # tokens per call (``Result.tokens_per_call``) where not the case's own

    @property
    def tokens_per_call(self) -> int:
        return self.tokens if self.tokens is not None else self.case.tokens

    @classmethod
    def of(cls, result: Result) -> RowDigest:
        moved = result.extra.get("bytes_moved")
        peak = result.memory.peak_bytes if result.memory is not None else None
        if not result.is_timed:
            return cls(result.case, result.status, peak_bytes=peak if result.ok else None)
        s = result.timing.summary
        good_moved = moved if isinstance(moved, int) and not isinstance(moved, bool) and moved > 0 else None
        # An interval with an infinite or zero end (too few samples) is kept as none: no reader takes noise from it.
        bounded = 0 < s.ci_low <= s.ci_high and math.isfinite(s.ci_high)
        low, high = (s.ci_low, s.ci_high) if bounded else (None, None)
        tokens = result.tokens_per_call if result.tokens_per_call != result.case.tokens else None
        return cls(result.case, result.status, s.median, low, high, peak, good_moved, result.contended, tokens)

    def point(self, metric: Metric) -> Point:
        """The same point ``history.point`` reads from the row itself."""
        if metric == "peak_mem":
            value = None if self.status != "ok" or self.peak_bytes is None else float(self.peak_bytes)
            return Point(value, status=self.status)
        if self.median_s is None:
            return Point(None, status=self.status)
        if metric == "median":
            return Point(self.median_s, self.ci_low_s, self.ci_high_s, self.status, self.contended)
        count = float(self.tokens_per_call) if metric == "tokens_per_s" else self.bytes_moved
        if count is None:
            return Point(None, status=self.status)
        low = None if self.ci_high_s is None else count / self.ci_high_s
        high = None if self.ci_low_s is None else count / self.ci_low_s
        return Point(count / self.median_s, low, high, self.status, self.contended)

    def to_dict(self) -> dict[str, Any]:
        numbers = {
            "median_s": self.median_s,
            "ci_low_s": self.ci_low_s,
            "ci_high_s": self.ci_high_s,
            "peak_bytes": self.peak_bytes,
            "bytes_moved": self.bytes_moved,
            "tokens": self.tokens,
        }
        present: dict[str, Any] = {k: v for k, v in numbers.items() if v is not None}
        if self.contended:  # written only when true: a quiet run's digest reads as before
            present["contended"] = True
        return {"case": self.case.to_dict(), "status": self.status, **present}

    @classmethod
    def from_dict(cls, data: object) -> RowDigest:
        if not isinstance(data, dict):
            raise FieldError("rows", f"expected an object, found {type(data).__name__}")
        # The case and status are checked as a stored row's are (catalogue, bounds), through Result's own reader.
        checked = Result.from_dict({"case": data.get("case"), "status": "unsupported"})
        status = data.get("status")
        if not isinstance(status, str) or not re.fullmatch(r"[a-z_]{1,40}", status):
            raise FieldError("status", f"expected a status word, found {status!r}")
        out: dict[str, Any] = {}
        for key in ("median_s", "ci_low_s", "ci_high_s"):
            value = data.get(key)
            if value is not None and not (
                isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
            ):
                raise FieldError(key, f"expected a positive number of seconds, found {value!r}")
            out[key] = None if value is None else float(value)
        # Bounded as a stored row's are (results.records): a peak may be 0 (a tiny case the method cannot resolve),
        # the compulsory traffic may not (RowDigest.of keeps only a positive one).
        for key, least in (("peak_bytes", 0), ("bytes_moved", 1), ("tokens", 1)):
            value = data.get(key)
            out[key] = None if value is None else fields.integer(value, key, minimum=least)
        contended = data.get("contended", False)
        if not isinstance(contended, bool):
            raise FieldError("contended", f"expected true or false, found {contended!r}")
        return cls(checked.case, status, **out, contended=contended)


_POINT_KEYS = ("n", "status", "batch", "bytes_per_sequence", "tokens_per_s", "capped", "good")


def _point_dict(p: CapacityPoint) -> dict[str, Any]:
    return {k: v for k, v in zip(_POINT_KEYS, (p.n, p.status, p.batch, p.bytes_per_sequence, p.tokens_per_s,
                                                p.capped, p.good), strict=True) if v is not None}  # fmt: skip


def _point_from(data: object, key: str) -> CapacityPoint:
    d = fields.record(data, key, ("n", "status", "capped", "good"), ("batch", "bytes_per_sequence", "tokens_per_s"))
    status = fields.text(d["status"], fields.path(key, "status"))
    if not re.fullmatch(r"[a-z_]{1,40}", status):
        raise FieldError(fields.path(key, "status"), f"expected a status word, found {status!r}")

    def optional(name: str, read: Any) -> Any:
        return None if d.get(name) is None else read(d[name], fields.path(key, name))

    return CapacityPoint(
        fields.integer(d["n"], fields.path(key, "n")),
        status,
        optional("batch", fields.integer),
        optional("bytes_per_sequence", lambda v, k: fields.integer(v, k, minimum=0)),
        optional("tokens_per_s", lambda v, k: fields.number(v, k, positive=True)),
        fields.flag(d["capped"], fields.path(key, "capped")),
        fields.flag(d["good"], fields.path(key, "good")),
    )


def _curve_from(data: object, key: str) -> CapacityCurve:
    d = fields.record(data, key, ("label", "model", "points"))
    points = fields.items(d["points"], fields.path(key, "points"), _point_from)
    return CapacityCurve(fields.text(d["label"], fields.path(key, "label")),
                         fields.text(d["model"], fields.path(key, "model")), tuple(points))  # fmt: skip


def _crossing_from(data: object, key: str) -> tuple[float, bool, str]:
    if not isinstance(data, list) or len(data) != 3:
        raise fields.expected(key, "[n, indicative, label]", data)
    n, indicative, label = data
    return (fields.number(n, fields.path(key, 0), positive=True), fields.flag(indicative, fields.path(key, 1)),
            fields.text(label, fields.path(key, 2)))  # fmt: skip


@dataclass(frozen=True)
class CapacityDigest:
    """One capacity table (``analysis.capacity``) as a site keeps it: what its section shows — every model's
    points, the crossings in words (``CapacityTable.crossovers``) and where they fall on n
    (``CapacityTable.crossing_points``) — so a site re-rendered from its digests shows it without the run folder."""

    title: str
    budget_bytes: int | None
    seq_lens: tuple[int, ...]
    curves: tuple[CapacityCurve, ...]
    crossovers: tuple[str, ...]
    crossings: tuple[tuple[float, bool, str], ...]  # (n, indicative, the curve that overtakes attention)

    @classmethod
    def of(cls, table: CapacityTable) -> CapacityDigest:
        crossings = tuple(table.crossing_points())
        return cls(table.title, table.budget_bytes, table.seq_lens, table.curves, table.crossovers, crossings)

    def to_dict(self) -> dict[str, Any]:
        curves = [{"label": c.label, "model": c.model, "points": [_point_dict(p) for p in c.points]}
                  for c in self.curves]  # fmt: skip
        data: dict[str, Any] = {"title": self.title, "seq_lens": list(self.seq_lens), "curves": curves}
        if self.budget_bytes is not None:
            data["budget_bytes"] = self.budget_bytes
        return {**data, "crossovers": list(self.crossovers), "crossings": [list(c) for c in self.crossings]}

    @classmethod
    def from_dict(cls, data: object, key: str) -> CapacityDigest:
        d = fields.record(data, key, ("title", "seq_lens", "curves", "crossovers", "crossings"), ("budget_bytes",))
        budget = d.get("budget_bytes")
        return cls(
            fields.text(d["title"], fields.path(key, "title")),
            None if budget is None else fields.integer(budget, fields.path(key, "budget_bytes")),
            tuple(fields.items(d["seq_lens"], fields.path(key, "seq_lens"), fields.integer)),
            tuple(fields.items(d["curves"], fields.path(key, "curves"), _curve_from)),
            tuple(fields.items(d["crossovers"], fields.path(key, "crossovers"), fields.text)),
            tuple(fields.items(d["crossings"], fields.path(key, "crossings"), _crossing_from)),
        )


@dataclass(frozen=True)
class RunDigest:
    """What a site keeps of one run: its run.json, a ``RowDigest`` per case, and its capacity tables (none for a
    run without capacity rows)."""

    run: Run
    rows: tuple[RowDigest, ...]
    capacity: tuple[CapacityDigest, ...] = ()

    @classmethod
    def of(cls, stored: StoredRun) -> RunDigest:
        capacity = tuple(CapacityDigest.of(t) for t in Reading.of(stored).capacity)
        return cls(stored.run, tuple(RowDigest.of(r) for r in stored.results), capacity)

    def to_dict(self) -> dict[str, Any]:
        data = {"schema": DIGEST_SCHEMA, "run": self.run.to_dict(), "rows": [r.to_dict() for r in self.rows]}
        if self.capacity:  # written only when there is some: every other run's digest reads as before
            data["capacity"] = [t.to_dict() for t in self.capacity]
        return data

    @classmethod
    def from_dict(cls, data: object, where: str) -> RunDigest:
        """Read ``to_dict``'s output back; anything else is a ``ResultsError`` naming ``where`` and the key."""
        try:
            if not isinstance(data, dict) or data.get("schema") != DIGEST_SCHEMA:
                found = data.get("schema") if isinstance(data, dict) else type(data).__name__
                raise FieldError("schema", f"expected {DIGEST_SCHEMA!r}, found {found!r}")
            rows = data.get("rows")
            if not isinstance(rows, list):
                raise FieldError("rows", "expected a list")
            capacity = fields.items(data.get("capacity", []), "capacity", CapacityDigest.from_dict)
            return cls(Run.from_dict(data.get("run")), tuple(RowDigest.from_dict(r) for r in rows), tuple(capacity))
        except FieldError as exc:
            raise ResultsError(
                f"{where}: {exc}", hint="a site's data/runs/*.json are written by attnbench publish"
            ) from None

    def as_stored(self) -> StoredRun:
        """A ``StoredRun`` without rows, for ``build_history`` (``digest_reader`` reads the rows)."""
        return StoredRun(Path(self.run.run_id), self.run, ())


def digest_reader(digests: Sequence[RunDigest]) -> Reader:
    """What ``build_history`` reads of each run: the digest's points, by run id."""
    by_id = {d.run.run_id: d for d in digests}

    def read(stored: StoredRun, metric: Metric) -> dict[str, tuple[Case, Point]]:
        return {row.case.key: (row.case, row.point(metric)) for row in by_id[stored.run.run_id].rows}

    return read


# --------------------------------------------------------------------------------------------------- the site
@dataclass(frozen=True)
class Latest:
    """A case's latest verdict: the newest step that moved it (its own, or every case's together), or why none."""

    kind: Kind
    text: str
    change: float | None = None
    position: int | None = None  # first run of the new level, 1-based


@dataclass(frozen=True)
class CaseView:
    """One case on the site: its page name, its group, its history per metric (one part per segment it ran in)."""

    case: Case
    slug: str
    series: Mapping[Metric, tuple[CaseHistory, ...]]
    latest: Latest

    @property
    def group(self) -> tuple[str, str, str]:
        return (self.case.model, self.case.mode, self.case.dtype)


@dataclass(frozen=True)
class Board:
    """One config's history on the site: runs of different configs are never one history (compare refuses them,
    and a case missing from every other run would leave no run-level shift), so each config is a board of its own,
    and a run added to one leaves the others' pages as they were."""

    config: str
    histories: Mapping[Metric, History]  # the metrics any case has a value for, median first
    cases: tuple[CaseView, ...]
    events: tuple[StepEvent, ...]  # confirmed steps of STEP_METRICS, newest first

    @property
    def history(self) -> History:
        return self.histories["median"]

    @property
    def runs(self) -> tuple[StoredRun, ...]:
        return self.history.runs


@dataclass(frozen=True)
class Site:
    boards: tuple[Board, ...]  # by config name

    @property
    def cases(self) -> tuple[CaseView, ...]:
        return tuple(view for board in self.boards for view in board.cases)

    @property
    def runs(self) -> tuple[StoredRun, ...]:
        return tuple(stored for board in self.boards for stored in board.runs)

    @property
    def events(self) -> tuple[tuple[Board, StepEvent], ...]:
        """Every board's confirmed steps, the newest first run first."""
        pairs = [(board, e) for board in self.boards for e in board.events]
        return tuple(sorted(pairs, key=lambda pair: pair[1].first_bad.run.created_utc, reverse=True))


def config_name(run: Run) -> str:
    """The config a run was swept from, by name (a slug; ``run`` for a run whose config has none)."""
    name = run.config.get("name")
    return name if isinstance(name, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,80}", name) else "run"


def slug(config: str, case: Case) -> str:
    """A page name for a case: its config, its label in lower-case words and the start of its key's hash."""
    words = re.sub(r"[^a-z0-9]+", "-", case.label.lower()).strip("-")
    digest = hashlib.sha256(f"{config}|{case.key}".encode()).hexdigest()[:8]
    return f"{config.lower()}-{words[:80]}-{digest}"


def _latest(history: History, parts: Sequence[CaseHistory], key: str) -> Latest:
    if not parts:
        statuses = {c.points[-1].status for c in history.cases if c.key == key}
        return Latest("failed", " / ".join(sorted(statuses)) or "not timed")
    last = parts[-1]
    segment = history.segments[last.segment]
    offset = sum(len(s.runs) for s in history.segments[: last.segment])
    newest = last.points[-1]
    if last.segment != len(history.segments) - 1 or newest.status == "missing":
        return Latest("missing", "not in the newest run")
    if newest.status != "ok":
        return Latest("failed", newest.status)
    steps = [(s.index, s, "") for s in last.fit.steps]
    if segment.shift is not None:
        steps += [(s.index, s, "every case ") for s in segment.shift.fit.steps]
    if steps:
        index, step, who = max(steps, key=lambda item: item[0])
        worse = (step.change > 0) != HIGHER_IS_BETTER[history.metric]
        word = "slower" if worse else "faster"
        position = offset + index + 1
        text = f"{who}{word} {step.change * 100:+.1f} % from run {position}"
        return Latest("worse" if worse else "better", text, step.change, position)
    if last.fit.too_short:
        return Latest("short", "too few runs to tell")
    return Latest("steady", "steady")


def _case_order(case: Case) -> tuple[object, ...]:
    """Model, mode, dtype, then the sizes as numbers (n=256 before n=1024, as a key's text would not), the key last
    for what else varies."""
    sizes = (case.batch, case.seq_len, case.d_model, case.heads or 0, case.layers)
    return (case.model, case.mode, case.dtype, *sizes, case.key)


def build_board(config: str, digests: Sequence[RunDigest], *, repo: Path | None = None) -> Board:
    """One config's board: every metric's history over its digests, the cases with their latest verdict, and the
    confirmed steps newest first."""
    stored = [d.as_stored() for d in digests]
    read = digest_reader(digests)
    histories: dict[Metric, History] = {}
    for metric in METRICS:
        history = build_history(stored, metric=metric, repo=repo, read=read)
        if metric == "median" or any(p.value is not None for c in history.cases for p in c.points):
            histories[metric] = history
    median = histories["median"]
    keys: dict[str, Case] = {}
    for c in median.cases:
        keys.setdefault(c.key, c.case)
    order = sorted(keys.values(), key=_case_order)
    cases = []
    for case in order:
        series = {m: tuple(c for c in h.cases if c.key == case.key) for m, h in histories.items()}
        series = {m: parts for m, parts in series.items() if any(p.value is not None for c in parts for p in c.points)}
        cases.append(CaseView(case, slug(config, case), series, _latest(median, series.get("median", ()), case.key)))
    events = [e for metric in STEP_METRICS if metric in histories for e in step_events(histories[metric])]
    events.sort(key=lambda e: (-e.position, STEP_METRICS.index(e.metric), e.case is not None, e.key))
    return Board(config, histories, tuple(cases), tuple(events))


def build_site(digests: Sequence[RunDigest], *, repo: Path | None = None) -> Site:
    """A board per config name over the digests (one digest per run id)."""
    by_config: dict[str, list[RunDigest]] = {}
    for digest in digests:
        by_config.setdefault(config_name(digest.run), []).append(digest)
    return Site(tuple(build_board(name, by_config[name], repo=repo) for name in sorted(by_config)))
