"""The confirmed steps of a history as events — which run was the first at the new level, which the last before it —
and the ones the newest run confirmed: what ``history --fail-on-step`` alerts on. Torch-free.

A step needs two runs at its new level (``steps.MIN_RUNS_PER_LEVEL``), so a change in the newest run alone is not
yet a step; the run after it confirms it. A step is *new* when the history without its newest run did not report it:
matched by metric, case (or the run-level shift) and first bad run, give or take one run, since one more point can
move a boundary by one. Only steps that made things worse (slower, fewer tokens/s or GB/s, more memory) alert.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnbench.analysis.history import HIGHER_IS_BETTER, History, Metric, build_history
from attnbench.analysis.steps import Step
from attnbench.core.cases import Case
from attnbench.results.store import StoredRun

SHIFT_KEY = "run-level shift"


@dataclass(frozen=True)
class StepEvent:
    """One confirmed step: in a case (``case``), or in its segment's run-level shift (``case`` None: every case of
    the segment moved together, ``cases`` of them counted)."""

    metric: Metric
    case: Case | None
    cases: int
    segment: int
    step: Step
    first_bad: StoredRun
    last_good: StoredRun
    position: int  # 1-based position of the first bad run in the whole history
    good_position: int

    @property
    def key(self) -> str:
        return SHIFT_KEY if self.case is None else self.case.key

    @property
    def worse(self) -> bool:
        """Slower, fewer tokens/s or GB/s, or more memory."""
        return (self.step.change > 0) != HIGHER_IS_BETTER[self.metric]


def _offset(history: History, segment: int) -> int:
    return sum(len(s.runs) for s in history.segments[:segment])


def step_events(history: History) -> list[StepEvent]:
    """Every confirmed step of ``history``, in history order of their first bad run (run-level steps first)."""
    events: list[StepEvent] = []
    for segment in history.segments:
        if segment.shift is None:
            continue
        offset = _offset(history, segment.index)
        for step in segment.shift.fit.steps:
            good = step.first_possible - 1
            events.append(
                StepEvent(
                    history.metric,
                    None,
                    segment.shift.cases,
                    segment.index,
                    step,
                    segment.runs[step.index],
                    segment.runs[good],
                    offset + step.index + 1,
                    offset + good + 1,
                )
            )
    for c in history.cases:
        runs = history.segments[c.segment].runs
        offset = _offset(history, c.segment)
        for step in c.fit.steps:
            good = step.first_possible - 1
            events.append(
                StepEvent(
                    history.metric,
                    c.case,
                    1,
                    c.segment,
                    step,
                    runs[step.index],
                    runs[good],
                    offset + step.index + 1,
                    offset + good + 1,
                )
            )
    return sorted(events, key=lambda e: (e.position, e.case is not None))


def new_steps(history: History, before: History | None) -> list[StepEvent]:
    """The steps of ``history`` that ``before`` (the same runs less the newest) did not report."""
    position = {stored.run.run_id: i + 1 for i, stored in enumerate(history.runs)}
    seen = [] if before is None else step_events(before)
    out = []
    for event in step_events(history):
        known = any(
            old.metric == event.metric
            and old.key == event.key
            and abs(position.get(old.first_bad.run.run_id, -10) - event.position) <= 1
            for old in seen
        )
        if not known:
            out.append(event)
    return out


def newest_run(history: History) -> StoredRun:
    return history.runs[-1]


def without_newest(runs: Sequence[StoredRun], history: History) -> list[StoredRun]:
    """``runs`` less the newest run of ``history`` (the last in its order): the history an alert compares with."""
    newest = newest_run(history).run.run_id
    return [stored for stored in runs if stored.run.run_id != newest]


def alert_steps(
    runs: Sequence[StoredRun],
    history: History,
    *,
    patterns: Sequence[str] = (),
    min_change: float = 0.0,
    repo: Path | None = None,
) -> list[StepEvent]:
    """What ``history --fail-on-step`` and ``--alert`` raise: the steps that made things worse which the newest run
    confirmed, i.e. those of ``history`` (built from ``runs`` with ``patterns``, ``min_change`` and ``repo``) that the
    history of the same runs less the newest, built the same way, did not report."""
    earlier = without_newest(runs, history)
    before = None
    if earlier:
        before = build_history(earlier, metric=history.metric, patterns=patterns, min_change=min_change, repo=repo)
    return [e for e in new_steps(history, before) if e.worse]


def representative_case(history: History, event: StepEvent) -> Case | None:
    """The case a bisection sweeps for ``event``: its own, or, for a run-level step, the case of that segment that
    moved most the same way across it (every case moved, so any would do; the clearest is quickest to judge)."""
    if event.case is not None:
        return event.case
    best: tuple[float, Case] | None = None
    step = event.step
    for c in history.cases:
        if c.segment != event.segment:
            continue
        before = [p.value for p in c.points[: step.first_possible] if p.value]
        after = [p.value for p in c.points[step.index :] if p.value]
        if not before or not after:
            continue
        moved = math.fsum(map(math.log, after)) / len(after) - math.fsum(map(math.log, before)) / len(before)
        signed = moved if step.change > 0 else -moved
        if best is None or signed > best[0]:
            best = (signed, c.case)
    return None if best is None else best[1]
