"""``attnbench history``'s renderers: the step changes and each case's trend, as markdown, CSV, HTML or a rich
table. Values in, text out; the plots are ``report.history_plots``."""

from __future__ import annotations

import csv
import html
import io
from collections.abc import Sequence
from typing import TYPE_CHECKING

from attnbench.analysis.history import HIGHER_IS_BETTER, CaseHistory, History, Metric, Point, run_name
from attnbench.analysis.steps import MIN_RUNS_PER_LEVEL, Step
from attnbench.core.text import csv_cell, md_cell, md_text
from attnbench.core.units import (
    format_bandwidth,
    format_bytes,
    format_change,
    format_change_interval,
    format_rate,
    format_seconds,
    plural,
)
from attnbench.report.cells import STATUS_TEXT

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.table import Table

METRIC_WORDS: dict[Metric, str] = {
    "median": "median time per call",
    "tokens_per_s": "tokens/s",
    "peak_mem": "peak memory",
    "gbps": "GB/s (compulsory bytes per second)",
}


def value_text(value: float | None, metric: Metric) -> str:
    if value is None:
        return "—"
    if metric == "median":
        return format_seconds(value)
    if metric == "tokens_per_s":
        return format_rate(value) + " tok/s"
    if metric == "gbps":
        return format_bandwidth(value)
    return format_bytes(value)


def point_text(p: Point, metric: Metric) -> str:
    """A run's cell: the value, or the row's status where it has none."""
    if p.value is None:
        return "—" if p.status == "missing" else STATUS_TEXT.get(p.status, p.status)
    return value_text(p.value, metric)


def step_verdict(step: Step, metric: Metric) -> str:
    """``slower`` / ``faster`` (or ``more memory`` / ``less memory``): which way the step went for a user."""
    up = step.change > 0
    if metric == "peak_mem":
        return "more memory" if up else "less memory"
    better = up == HIGHER_IS_BETTER[metric]
    return "faster" if better else "slower"


def _run_label(history: History, index_in_segment: int, c: CaseHistory) -> str:
    stored = history.segments[c.segment].runs[index_in_segment]
    return run_name(stored)


def _global_index(history: History, segment: int, index: int) -> int:
    """1-based position of a segment's run in the whole history."""
    return sum(len(s.runs) for s in history.segments[:segment]) + index + 1


SHIFT_LABEL = "every case together (run-level shift)"


def steps_rows(history: History) -> list[list[str]]:
    """One row per step: case, at run (position and name), before → after, change with its 95 % interval. A
    segment's run-level steps come first: what every case did together."""
    rows = []
    for segment in history.segments:
        if segment.shift is None:
            continue
        for step in segment.shift.fit.steps:
            at = _global_index(history, segment.index, step.index)
            rows.append(
                [
                    f"{SHIFT_LABEL}, {plural(segment.shift.cases, 'case')}",
                    f"{at} ({run_name(segment.runs[step.index])})",
                    f"{format_change(step.before - 1)} → {format_change(step.after - 1)} vs a typical run",
                    format_change(step.change),
                    format_change_interval(step.low, step.high),
                    step_verdict(step, history.metric),
                ]
            )
    for c in history.cases:
        for step in c.fit.steps:
            at = _global_index(history, c.segment, step.index)
            rows.append(
                [
                    c.case.label,
                    f"{at} ({_run_label(history, step.index, c)})",
                    f"{value_text(step.before, history.metric)} → {value_text(step.after, history.metric)}",
                    format_change(step.change),
                    format_change_interval(step.low, step.high),
                    step_verdict(step, history.metric),
                ]
            )
    return rows


STEP_HEADERS = ("case", "from run", "level", "change", "95 % CI", "verdict")


def _segment_lines(history: History) -> list[str]:
    lines = []
    for segment in history.segments:
        first = _global_index(history, segment.index, 0)
        last = first + len(segment.runs) - 1
        fp = segment.fingerprint
        where = ", ".join(
            str(v) for v in (fp.get("gpu_name") or fp.get("cpu_model"), f"torch {fp.get('torch')}") if v is not None
        )
        text = f"runs {first}–{last}" if last > first else f"run {first}"
        text += f" ({where})"
        if segment.changed:
            text += f": a new segment, because {'; '.join(segment.changed)} — steps are not looked for across it"
        if len(segment.runs) < 2 * MIN_RUNS_PER_LEVEL:
            text += f"; {len(segment.runs)} runs are too few to detect steps (two levels need {2 * MIN_RUNS_PER_LEVEL})"
        lines.append(text)
    return lines


def headline(history: History) -> str:
    runs, cases = len(history.runs), len({c.key for c in history.cases})
    found = history.steps
    what = f"{found} step change{'s' if found != 1 else ''}" if found else "no step change"
    return (
        f"{plural(runs, 'run')}, {plural(cases, 'case')}, {METRIC_WORDS[history.metric]}: {what} "
        f"(a level that moved by more than the noise between runs, family-wise 5 % per case)"
    )


# The terminal's trend table shows this many of the newest runs; markdown, CSV and HTML show every run.
TERMINAL_RUNS = 12


def _shown(history: History, last: int | None) -> range:
    total = len(history.runs)
    return range(0 if last is None else max(0, total - last), total)


def _trend_header(history: History, last: int | None = None) -> list[str]:
    return ["case", *(f"{i + 1}" for i in _shown(history, last)), "steps"]


def _trend_row(history: History, c: CaseHistory, last: int | None = None) -> list[str]:
    cells = ["" for _ in history.runs]
    start = _global_index(history, c.segment, 0) - 1
    for i, p in enumerate(c.points):
        cells[start + i] = point_text(p, history.metric)
    steps = ", ".join(f"{format_change(s.change)} at {_global_index(history, c.segment, s.index)}" for s in c.fit.steps)
    return [c.case.label, *(cells[i] for i in _shown(history, last)), steps or "—"]


def _shift_rows(history: History, last: int | None = None) -> list[list[str]]:
    """The run-level shift as one trend row (``+2.1 %`` per run), when any segment has one."""
    if all(s.shift is None for s in history.segments):
        return []
    cells = ["" for _ in history.runs]
    for segment in history.segments:
        if segment.shift is not None:
            start = _global_index(history, segment.index, 0) - 1
            for i, ratio in enumerate(segment.shift.ratios):
                cells[start + i] = format_change(ratio - 1)
    steps = ", ".join(
        f"{format_change(step.change)} at {_global_index(history, s.index, step.index)}"
        for s in history.segments
        if s.shift is not None
        for step in s.shift.fit.steps
    )
    return [["run-level shift", *(cells[i] for i in _shown(history, last)), steps or "—"]]


def _md_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(md_cell(cell) for cell in cells) + " |"

    return [line(header), line(["---"] * len(header)), *(line(r) for r in rows)]


def render_history_markdown(history: History) -> str:
    lines = [
        f"# attnbench history — {METRIC_WORDS[history.metric]}",
        "",
        headline(history) + ".",
        "",
        f"Runs {history.order_note}:",
        "",
        *(
            f"{_global_index(history, s.index, i)}. {md_text(run_name(stored))} — {md_text(stored.run.run_id)}"
            for s in history.segments
            for i, stored in enumerate(s.runs)
        ),
        "",
        "Segments (runs measured in one environment):",
        "",
        *(f"- {md_text(line)}" for line in _segment_lines(history)),
        "",
        "## Step changes",
        "",
    ]
    rows = steps_rows(history)
    lines += _md_table(STEP_HEADERS, rows) if rows else ["None: every case's level held within the noise between runs."]
    trend = [*_shift_rows(history), *(_trend_row(history, c) for c in history.cases)]
    lines += ["", "## Trend", "", *_md_table(_trend_header(history), trend)]
    notes = list(_notes(history))
    if notes:
        lines += ["", "## Notes", "", *(f"- {md_text(n)}" for n in notes)]
    return "\n".join(lines) + "\n"


def _notes(history: History) -> list[str]:
    notes = []
    if any(s.shift is not None for s in history.segments):
        notes.append(
            "a case's step is measured beyond its segment's run-level shift (what every case did together in that "
            "run: the machine's load, clocks or host); each case is tested at a family-wise 5 % over the cases"
        )
    unshifted = [s for s in history.segments if s.shift is None and len(s.runs) >= 2]
    if unshifted:
        notes.append(
            f"{len(unshifted)} segment(s) have too few cases timed in every run to estimate a run-level shift: "
            "their cases are read as measured"
        )
    if history.partial:
        shown = ", ".join(history.partial[:5]) + (
            f" and {len(history.partial) - 5} more" if len(history.partial) > 5 else ""
        )
        notes.append(f"{len(history.partial)} cases are not in every run of their segment (gaps): {shown}")
    quiet = [c for c in history.cases if c.fit.too_short]
    if quiet and len(quiet) < len(history.cases):
        notes.append(f"{len(quiet)} cases have too few runs with a value to detect steps")
    notes.append(
        "a step needs two runs on each side: a change in the newest run alone is reported once a second run confirms it"
    )
    return notes


CSV_COLUMNS = (
    "key",
    "label",
    "segment",
    "run",
    "run_id",
    "run_name",
    "commit",
    "started_utc",
    "value",
    "ci95_low",
    "ci95_high",
    "status",
    "step_change",
    "step_ci95_low",
    "step_ci95_high",
)


def render_history_csv(history: History) -> str:
    """Long form: one row per case and run (SI units: seconds, tokens/s or bytes); a run where a step begins
    carries the step's size and interval. Text cells pass ``csv_cell``: a stored label is never a formula."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for c in history.cases:
        at = {s.index: s for s in c.fit.steps}
        for i, (p, stored) in enumerate(zip(c.points, history.segments[c.segment].runs, strict=True)):
            step = at.get(i)
            writer.writerow(
                csv_cell(cell)
                for cell in [
                    c.key,
                    c.case.label,
                    c.segment + 1,
                    _global_index(history, c.segment, i),
                    stored.run.run_id,
                    run_name(stored),
                    stored.run.commit or "",
                    stored.run.created_utc,
                    "" if p.value is None else p.value,
                    "" if p.low is None else p.low,
                    "" if p.high is None else p.high,
                    p.status,
                    "" if step is None else step.change,
                    "" if step is None else step.low,
                    "" if step is None else step.high,
                ]
            )
    return out.getvalue()


def render_history_html(history: History, figures: Sequence[tuple[str, bytes]] = ()) -> str:
    """One self-contained page: the headline, segments, steps, trend and the plots as data URIs."""
    import base64

    def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
        head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"

    rows = steps_rows(history)
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'><title>attnbench history</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse;"
        "margin:1em 0}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:right}td:first-child,"
        "th:first-child{text-align:left}img{max-width:100%}</style></head><body>",
        f"<h1>attnbench history — {html.escape(METRIC_WORDS[history.metric])}</h1>",
        f"<p>{html.escape(headline(history))}. Runs {html.escape(history.order_note)}.</p>",
        "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in _segment_lines(history)) + "</ul>",
        "<h2>Step changes</h2>",
        table(STEP_HEADERS, rows) if rows else "<p>None: every case's level held within the noise between runs.</p>",
        "<h2>Trend</h2>",
        table(_trend_header(history), [*_shift_rows(history), *(_trend_row(history, c) for c in history.cases)]),
        *(
            f"<figure><img alt='{html.escape(name)}' src='data:image/png;base64,"
            f"{base64.b64encode(png).decode()}'></figure>"
            for name, png in figures
        ),
        "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in _notes(history)) + "</ul>",
        "</body></html>",
    ]
    return "\n".join(parts) + "\n"


def _trend_table(history: History, last: int) -> Table:
    from rich.table import Table

    shown = _shown(history, last)
    title = "trend (runs in history order)"
    if len(shown) < len(history.runs):
        title += f": the newest {len(shown)} of {len(history.runs)} runs (-f md, csv or html show all)"
    trend = Table(title=title, title_justify="left")
    for i, header in enumerate(_trend_header(history, last)):
        trend.add_column(header, justify="left" if i == 0 else "right", no_wrap=i > 0)
    for row in _shift_rows(history, last):
        trend.add_row(*row, style="dim")
    for c in history.cases:
        trend.add_row(*_trend_row(history, c, last))
    return trend


def history_tables(history: History) -> RenderableType:
    """The terminal view: the headline, the segments, the steps as a rich table, and the trend of as many of the
    newest runs as the terminal's width holds."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from attnbench.report.terminal import Fitted

    parts: list[RenderableType] = [Text(headline(history), style="bold"), Text(f"runs {history.order_note}")]
    parts += [Text(f"segment {line}") for line in _segment_lines(history)]
    rows = steps_rows(history)
    if rows:
        table = Table(title="step changes", title_justify="left")
        for header in STEP_HEADERS:
            table.add_column(header, justify="left" if header in ("case", "from run", "verdict") else "right")
        for row in rows:
            style = "red" if row[-1] in ("slower", "more memory") else "green"
            table.add_row(*row, style=style)
        parts.append(table)
    # As many of the newest runs as fit the terminal: a table too wide for it would squeeze the case column away.
    counts = sorted({min(n, len(history.runs)) for n in (TERMINAL_RUNS, 9, 6, 4, 3, 2)}, reverse=True)
    parts.append(Fitted([[_trend_table(history, n)] for n in counts]))
    parts += [Text(f"note: {n}", style="italic") for n in _notes(history)]
    return Group(*parts)
