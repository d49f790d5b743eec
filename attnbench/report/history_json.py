"""``attnbench history -f json``: the whole history as one JSON document, for scripts and dashboards.

Values in SI units, as the CSV has them (seconds, tokens/s or bytes; ``unit`` says which), runs named by run id and
by the name the tables use. Numbers that are not finite (an unbounded interval) are ``null``, so the text is strict
JSON (``allow_nan=False``). Layout (named as ``compare --format json`` names its own, ``attnbench.compare/1``):

``{"schema": "attnbench.history/1", "metric", "unit", "order", "order_note", "runs": [...],
"segments": [...], "cases": [...], "partial": [...], "steps": N, "warnings": [...]}``
"""

from __future__ import annotations

import json
import math
from typing import Any

from attnbench.analysis.history import METRIC_UNITS, History, Point, run_name
from attnbench.analysis.steps import Step, StepFit
from attnbench.results.store import StoredRun

SCHEMA = "attnbench.history/1"  # a key is only ever added; a change that could break a reader raises the number


def _number(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _run(stored: StoredRun, position: int, segment: int) -> dict[str, Any]:
    run = stored.run
    return {
        "position": position,  # 1-based, in history order
        "run_id": run.run_id,
        "name": run_name(stored),
        "label": run.label,
        "commit": run.commit,
        "started_utc": run.created_utc,
        "segment": segment,
    }


def _step(step: Step, runs: tuple[StoredRun, ...]) -> dict[str, Any]:
    return {
        "run_id": runs[step.index].run.run_id,
        "earliest_run_id": runs[step.first_possible].run.run_id,
        "before": _number(step.before),
        "after": _number(step.after),
        "change": _number(step.change),
        "ci95_low": _number(step.low),
        "ci95_high": _number(step.high),
        "runs_before": step.runs_before,
        "runs_after": step.runs_after,
    }


def _fit(fit: StepFit, runs: tuple[StoredRun, ...]) -> dict[str, Any]:
    return {
        "steps": [_step(step, runs) for step in fit.steps],
        "noise_rel": _number(fit.sigma),
        "noise_source": fit.sigma_source,
        "runs_used": fit.runs,
        "too_short": fit.too_short,
    }


def _point(point: Point, stored: StoredRun) -> dict[str, Any]:
    return {
        "run_id": stored.run.run_id,
        "value": _number(point.value),
        "ci95_low": _number(point.low),
        "ci95_high": _number(point.high),
        "status": point.status,
    }


def history_dict(history: History) -> dict[str, Any]:
    """The history as plain data (the document ``render_history_json`` writes)."""
    runs: list[dict[str, Any]] = []
    segments: list[dict[str, Any]] = []
    for segment in history.segments:
        for stored in segment.runs:
            runs.append(_run(stored, len(runs) + 1, segment.index + 1))
        shift = segment.shift
        segments.append(
            {
                "segment": segment.index + 1,
                "run_ids": [stored.run.run_id for stored in segment.runs],
                "changed": list(segment.changed),
                "shift": None
                if shift is None
                else {
                    "cases": shift.cases,
                    "ratios": [_number(r) for r in shift.ratios],
                    **_fit(shift.fit, segment.runs),
                },
            }
        )
    cases = []
    for c in history.cases:
        in_segment = history.segments[c.segment].runs
        cases.append(
            {
                "key": c.key,
                "label": c.case.label,
                "segment": c.segment + 1,
                "beyond_run_shift": c.adjusted,
                "points": [_point(p, stored) for p, stored in zip(c.points, in_segment, strict=True)],
                **_fit(c.fit, in_segment),
            }
        )
    return {
        "schema": SCHEMA,
        "metric": history.metric,
        "unit": METRIC_UNITS[history.metric],
        "order": history.order,
        "order_note": history.order_note,
        "runs": runs,
        "segments": segments,
        "cases": cases,
        "partial": list(history.partial),
        "steps": history.steps,
        "warnings": list(history.warnings),
    }


def render_history_json(history: History) -> str:
    return json.dumps(history_dict(history), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
