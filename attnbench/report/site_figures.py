"""The published site's graphs: a plotly figure (plain JSON: ``data`` and ``layout``, no plotly import) per case and
metric, and the index's sparklines as inline SVG. Values in, dicts and text out.

A figure has one point per run (a gap where the case has no value there), one trace per segment (runs of one
environment) so that a change of machine or software is a break, never a line across it; each point's 95 % interval
as an error bar and its run, commit, label, value and interval on hover. A case's own step is a dashed line at the
boundary, its two levels, and a band over the new level for the step's 95 % interval; a run-level step (every case
of the segment moved together) a dotted line with its size; a new segment a grey band naming what changed.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from typing import Any

from attnbench.analysis.capacity import CapacityPoint
from attnbench.analysis.history import HIGHER_IS_BETTER, CaseHistory, History, Metric, Point, run_name
from attnbench.analysis.site import CapacityDigest
from attnbench.core.units import format_bytes, format_change, format_change_interval
from attnbench.report.capacity_md import point_text
from attnbench.report.history_md import METRIC_WORDS, value_text

WORSE, BETTER, SHIFT, SEGMENT = "#d62728", "#2ca02c", "#9467bd", "rgba(120,120,120,0.18)"
CONTENDED_SYMBOL = "circle-open"  # a run timed on a busy machine: hollow, as in a run's own plots
COLOURS = ("#1f77b4", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#7f7f7f")  # one per segment, in turn


def axis_scale(metric: Metric, values: Sequence[float]) -> tuple[float, str]:
    """(divisor, unit) for the y axis: seconds in s, ms or µs; bytes in MiB; rates as they are (SI ticks)."""
    if metric == "median":
        typical = sorted(values)[len(values) // 2] if values else 1.0
        return (1.0, "s") if typical >= 1 else (1e-3, "ms") if typical >= 1e-3 else (1e-6, "µs")
    if metric == "peak_mem":
        return (2.0**20, "MiB")
    if metric == "gbps":
        return (1e9, "GB/s")
    return (1.0, "tokens/s")


def _offset(history: History, segment: int) -> int:
    return sum(len(s.runs) for s in history.segments[:segment])


def plain(text: str) -> str:
    """Stored text as plotly shows it, never as markup: plotly renders a subset of HTML in hover and annotation text
    (``<a href=…>`` becomes a live link, ``<b>`` bold), and decodes entities only after it has found the tags, so a
    run's label or an environment field with ``<`` in it reads as typed."""
    return html.escape(text, quote=False)


def _interval_text(p: Point, metric: Metric) -> str:
    if p.low is None or p.high is None:
        return "—"
    return f"{value_text(p.low, metric)} … {value_text(p.high, metric)}"


def _points_trace(history: History, part: CaseHistory, divisor: float, colour: str) -> dict[str, Any]:
    offset = _offset(history, part.segment)
    runs = history.segments[part.segment].runs
    xs, ys, plus, minus, custom, symbols = [], [], [], [], [], []
    for i, (p, stored) in enumerate(zip(part.points, runs, strict=True)):
        xs.append(offset + i + 1)
        ys.append(None if p.value is None else p.value / divisor)
        has_ci = p.value is not None and p.low is not None and p.high is not None
        plus.append((p.high - p.value) / divisor if has_ci else None)  # type: ignore[operator]
        minus.append((p.value - p.low) / divisor if has_ci else None)  # type: ignore[operator]
        value = value_text(p.value, history.metric) if p.value is not None else p.status
        commit = stored.run.commit[:12] if stored.run.commit else "—"
        busy = "timed on a busy machine (open marker)" if p.contended else "quiet machine"
        texts = (run_name(stored), commit, stored.run.label or "—", value, _interval_text(p, history.metric), busy)
        custom.append([plain(text) for text in texts])
        symbols.append(CONTENDED_SYMBOL if p.contended else "circle")
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "name": f"segment {part.segment + 1}",
        "meta": "runs",
        "x": xs,
        "y": ys,
        "error_y": {"type": "data", "symmetric": False, "array": plus, "arrayminus": minus, "thickness": 1, "width": 3},
        "customdata": custom,
        "hovertemplate": "<b>run %{x}: %{customdata[0]}</b><br>commit %{customdata[1]}<br>label %{customdata[2]}"
        "<br>%{customdata[3]}<br>95 % CI %{customdata[4]}<br>%{customdata[5]}<extra></extra>",
        "line": {"color": colour, "width": 1.5},
        "marker": {"size": 7, "color": colour, "symbol": symbols, "line": {"color": colour, "width": 1.5}},
        "connectgaps": False,
    }


def _vline(x: float, colour: str, dash: str, width: float = 1.5) -> dict[str, Any]:
    return {
        "type": "line",
        "xref": "x",
        "yref": "paper",
        "x0": x,
        "x1": x,
        "y0": 0,
        "y1": 1,
        "line": {"color": colour, "dash": dash, "width": width},
    }


def _steps(history: History, part: CaseHistory, divisor: float) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Shapes and annotations for the case's own steps in one segment."""
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    offset = _offset(history, part.segment)
    bounds = [0, *(s.index for s in part.fit.steps), len(part.points)]
    for k, step in enumerate(part.fit.steps):
        worse = (step.change > 0) != HIGHER_IS_BETTER[history.metric]
        colour = WORSE if worse else BETTER
        x = offset + step.index + 0.5
        start, end = offset + bounds[k] + 0.5, offset + bounds[k + 2] + 0.5
        shapes.append(_vline(x, colour, "dash"))
        for x0, x1, level in ((start, x, step.before), (x, end, step.after)):
            shapes.append(
                {
                    "type": "line",
                    "xref": "x",
                    "yref": "y",
                    "x0": x0,
                    "x1": x1,
                    "y0": level / divisor,
                    "y1": level / divisor,
                    "line": {"color": "#555", "width": 1},
                }
            )
        low, high = step.before * (1 + step.low) / divisor, step.before * (1 + step.high) / divisor
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "y",
                "x0": x,
                "x1": end,
                "y0": low,
                "y1": high,
                "fillcolor": colour,
                "opacity": 0.12,
                "line": {"width": 0},
            }
        )
        text = f"{format_change(step.change)} ({format_change_interval(step.low, step.high)})"
        notes.append(
            {
                "x": x,
                "y": step.after / divisor,
                "xref": "x",
                "yref": "y",
                "text": text,
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "bottom",
                "font": {"color": colour, "size": 11},
            }
        )
    return shapes, notes


def _context(history: History, parts: Sequence[CaseHistory]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Run-level steps of the case's segments, and the breaks between segments."""
    shapes: list[dict[str, Any]] = []
    notes: list[dict[str, Any]] = []
    for part in parts:
        segment = history.segments[part.segment]
        if segment.shift is None:
            continue
        for step in segment.shift.fit.steps:
            x = _offset(history, segment.index) + step.index + 0.5
            shapes.append(_vline(x, SHIFT, "dot", 2))
            text = f"every case {format_change(step.change)} ({format_change_interval(step.low, step.high)})"
            notes.append(
                {
                    "x": x,
                    "y": 1,
                    "xref": "x",
                    "yref": "paper",
                    "text": text,
                    "showarrow": False,
                    "xanchor": "left",
                    "yanchor": "top",
                    "font": {"color": SHIFT, "size": 11},
                }
            )
    for segment in history.segments[1:]:
        x = _offset(history, segment.index) + 0.5
        shapes.append(
            {
                "type": "rect",
                "xref": "x",
                "yref": "paper",
                "x0": x - 0.15,
                "x1": x + 0.15,
                "y0": 0,
                "y1": 1,
                "fillcolor": SEGMENT,
                "line": {"width": 0},
            }
        )
        changed = "; ".join(segment.changed[:2]) + ("; …" if len(segment.changed) > 2 else "")
        notes.append(
            {
                "x": x,
                "y": 0,
                "xref": "x",
                "yref": "paper",
                "text": plain(f"new environment: {changed}"),
                "showarrow": False,
                "xanchor": "left",
                "yanchor": "bottom",
                "textangle": 0,
                "font": {"color": "#666", "size": 10},
            }
        )
    return shapes, notes


def run_tick_step(runs: int) -> int:
    """A whole number of runs between x ticks: every run up to a dozen, then about a dozen ticks."""
    return max(1, math.ceil(runs / 12))


def case_figure(history: History, parts: Sequence[CaseHistory]) -> dict[str, Any]:
    """The plotly figure of one case for ``history.metric`` over every run of the history."""
    values = [p.value for part in parts for p in part.points if p.value is not None]
    divisor, unit = axis_scale(history.metric, values)
    traces = [_points_trace(history, part, divisor, COLOURS[part.segment % len(COLOURS)]) for part in parts]
    shapes, notes = _context(history, parts)
    for part in parts:
        more_shapes, more_notes = _steps(history, part, divisor)
        shapes += more_shapes
        notes += more_notes
    layout = {
        "xaxis": {
            "title": {"text": "run (history order)"},
            "range": [0.5, len(history.runs) + 0.5],
            "zeroline": False,
            # Whole runs only: plotly's own ticks fall on halves for a few runs, which "d" shows as 1, 1, 2, 2, …
            "tickmode": "linear",
            "tick0": 1,
            "dtick": run_tick_step(len(history.runs)),
        },
        "yaxis": {
            "title": {"text": f"{METRIC_WORDS[history.metric]} ({unit})"},
            "zeroline": False,
            "tickformat": ".3s" if history.metric == "tokens_per_s" else "",
        },
        "shapes": shapes,
        "annotations": notes,
        "hovermode": "closest",
        "showlegend": len(parts) > 1,
        "margin": {"l": 70, "r": 20, "t": 30, "b": 50},
        "height": 440,
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "plot_bgcolor": "#fff",
    }
    return {"data": traces, "layout": layout}


def _capacity_symbol(p: CapacityPoint) -> str:
    """The capacity plot's markers (``report.capacity_plots``): a cross where the step was not timed, an open marker
    where its timing is noisy."""
    if p.untimed:
        return "x"
    return "circle-open" if p.tokens_per_s is not None and not p.good else "circle"


def _capacity_axis(title: str, side: str, domain: tuple[float, float], seq_lens: Sequence[int]) -> dict[str, Any]:
    return {
        "domain": list(domain),
        "anchor": f"y{side}",
        "type": "log",
        "title": {"text": title},
        "tickmode": "array",
        "tickvals": list(seq_lens),
        "ticktext": [str(n) for n in seq_lens],
        "zeroline": False,
    }


def capacity_figure(table: CapacityDigest) -> dict[str, Any]:
    """The plotly figure of one capacity table, ``report.capacity_plots``' two panels made interactive: per model
    against the context n, the batch whose decode step fits the budget (left) and the tokens/s that batch decodes
    together (right); a dashed line where a recurrent model's tokens/s overtake attention's (dotted: indicative)."""
    traces: list[dict[str, Any]] = []
    colours: dict[str, str] = {}
    for index, curve in enumerate(table.curves):
        colour = colours.setdefault(curve.label, COLOURS[index % len(COLOURS)])
        found = [p for p in curve.points if p.batch is not None]  # memory's answer, whatever the timing did
        timed = [p for p in found if p.tokens_per_s is not None]
        panels = (("", found, [p.batch for p in found]), ("2", timed, [p.tokens_per_s for p in timed]))
        for side, points, values in panels:
            if not points:
                continue
            traces.append(
                {
                    "type": "scatter",
                    "mode": "lines+markers",
                    "name": plain(curve.label),
                    "legendgroup": plain(curve.label),
                    "showlegend": side == "",
                    "xaxis": f"x{side}",
                    "yaxis": f"y{side}",
                    "x": [p.n for p in points],
                    "y": values,
                    "customdata": [plain(point_text(p)) for p in points],
                    "hovertemplate": "<b>%{fullData.name}</b><br>n=%{x}<br>%{customdata}<extra></extra>",
                    "line": {"color": colour, "width": 1.5},
                    "marker": {"size": 7, "color": colour, "symbol": [_capacity_symbol(p) for p in points]},
                }
            )
    shapes, notes = [], []
    for n, indicative, label in table.crossings:  # in the colour of the curve that overtakes attention
        colour = colours.get(label, "#666")
        line = _vline(n, colour, "dot" if indicative else "dash", 1.0)
        shapes.append({**line, "xref": "x2"})
        notes.append(
            {
                "x": math.log10(n),  # plotly places an annotation on a log axis by the log of its value
                "y": 0.02,
                "xref": "x2",
                "yref": "paper",
                "text": plain(f"{label} n ≈ {n:.0f}" + ("?" if indicative else "")),
                "showarrow": False,
                "textangle": -90,
                "xanchor": "right",
                "yanchor": "bottom",
                "font": {"color": colour, "size": 10},
            }
        )
    budget = "" if table.budget_bytes is None else f" under {format_bytes(table.budget_bytes)}"
    for x, text in ((0.23, f"largest batch{budget}"), (0.77, "aggregate decode throughput at that batch")):
        notes.append({"x": x, "y": 1.0, "xref": "paper", "yref": "paper", "text": text, "showarrow": False,
                      "xanchor": "center", "yanchor": "bottom", "font": {"size": 12}})  # fmt: skip
    axis = "context length n (tokens)"
    layout = {
        "xaxis": _capacity_axis(axis, "", (0.0, 0.44), table.seq_lens),
        "xaxis2": _capacity_axis(axis, "2", (0.56, 1.0), table.seq_lens),
        "yaxis": {"type": "log", "anchor": "x", "title": {"text": "sequences at capacity"}},
        "yaxis2": {
            "type": "log",
            "anchor": "x2",
            "title": {"text": "tokens/s at capacity (all sequences)"},
            "tickformat": ".3s",
        },
        "shapes": shapes,
        "annotations": notes,
        "hovermode": "closest",
        "showlegend": True,
        "margin": {"l": 70, "r": 20, "t": 40, "b": 50},
        "height": 440,
        "font": {"family": "system-ui, sans-serif", "size": 12},
        "plot_bgcolor": "#fff",
    }
    return {"data": traces, "layout": layout}


# The least log-range a sparkline spans: a case that moved 1 % draws almost flat, not full height.
MIN_SPARK_RATIO = 1.2


def spark_ratio(parts_of_cases: Sequence[Sequence[CaseHistory]]) -> float:
    """One scale for every sparkline of a table: the largest max/min ratio of any case's values (at least
    ``MIN_SPARK_RATIO``), so a 3 % move draws short and a 50 % move tall."""
    ratios = [MIN_SPARK_RATIO]
    for parts in parts_of_cases:
        values = [p.value for part in parts for p in part.points if p.value is not None and p.value > 0]
        if values:
            ratios.append(max(values) / min(values))
    return max(ratios)


def sparkline(
    history: History,
    parts: Sequence[CaseHistory],
    colour: str,
    width: int = 140,
    height: int = 30,
    ratio: float | None = None,
) -> str:
    """An inline SVG of the case's values over the runs (log scale; a break between segments). ``ratio``: the
    max/min ratio the full height stands for, shared by a table's rows (``spark_ratio``), the case centred in it;
    None scales the case to its own range."""
    values = [p.value for part in parts for p in part.points if p.value is not None]
    if not values:
        return ""
    low, high = math.log(min(values)), math.log(max(values))
    if ratio is not None:
        middle, half = (low + high) / 2, math.log(max(ratio, max(values) / min(values))) / 2
        low, high = middle - half, middle + half
    span = (high - low) or 1.0
    total = max(1, len(history.runs) - 1)
    lines, last = [], ""
    for part in parts:
        offset = _offset(history, part.segment)
        xy = [
            (2 + (offset + i) / total * (width - 4), height - 3 - (math.log(p.value) - low) / span * (height - 6))
            for i, p in enumerate(part.points)
            if p.value is not None
        ]
        if xy:
            lines.append(" ".join(f"{x:.1f},{y:.1f}" for x, y in xy))
            last = f'<circle cx="{xy[-1][0]:.1f}" cy="{xy[-1][1]:.1f}" r="2.5" fill="{colour}"/>'
    body = "".join(f'<polyline points="{p}" fill="none" stroke="#1f77b4" stroke-width="1.2"/>' for p in lines)
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="trend">{body}{last}</svg>'
    )
