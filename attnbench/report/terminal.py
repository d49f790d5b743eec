"""Rich renderables for the terminal: the comparison tables, the telemetry table and one line per finished case."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from attnbench.analysis.pivot import Cell, PivotTable
from attnbench.analysis.reading import Reading
from attnbench.core.units import format_bytes, format_rate, format_seconds
from attnbench.report.cells import (
    column_headers,
    contention_lines,
    memory_text,
    run_checks,
    speedup_text,
    state_text,
    time_text,
)
from attnbench.report.telemetry import INTRO, telemetry_table
from attnbench.results.records import Result


def case_line(result: Result) -> str:
    """One plain, parseable line for a finished case (also what --quiet and non-TTY output print)."""
    head = result.case.label
    if not result.ok or result.measurement is None:
        return f"{head}: {result.status.upper()} — {result.reason}"
    s = result.measurement.summary
    ci = s.ci_halfwidth_rel
    ci_text = f"±{ci:.1%}" if ci != float("inf") else "±?"
    parts = [f"{format_seconds(s.median)} {ci_text}", f"{format_rate(result.tokens_per_s or 0)} tok/s"]
    if result.memory is not None and result.memory.peak_bytes is not None:
        parts.append(f"{format_bytes(result.memory.peak_bytes)} peak")
    if not result.measurement.converged:
        parts.append("not converged")
    return f"{head}: " + " · ".join(parts)


def comparison_tables(reading: Reading, memory: bool = False) -> Group:
    """The run's pivot tables for a terminal (with the memory tables when ``memory``), then its checks."""
    renderables: list[RenderableType] = []
    headline, busy = contention_lines(reading.results)
    if headline:
        renderables.append(Text(headline, style="bold yellow"))
        renderables += [Text(f"  {line}", style="yellow") for line in busy]
    for table in reading.tables:
        renderables.append(Fitted(_time_layouts(table)))
        if memory:
            what, cell_text = (
                ("cache/state computed / measured", state_text) if table.decode else ("peak memory MiB", memory_text)
            )
            renderables.append(Fitted(_chunks(table, f"{what} · {table.title}", cell_text)))
        for line in table.crossovers:
            renderables.append(Text(f"  {line}", style="italic"))
        for scaling in table.scaling:
            renderables.append(Text(f"  {scaling.text}", style="italic"))
    renderables += _checks(reading)
    return Group(*renderables)


Cells = Callable[[Cell | None], str]


def _table(table: PivotTable, title: str, text: Cells, seq_lens: Sequence[int], caption: str | None = None) -> Table:
    """One rich table of ``table``'s rows over ``seq_lens``, each cell written by ``text``."""
    out = Table(title=title, caption=caption, title_justify="left")
    out.add_column("model", style="bold")
    headers = dict(zip(table.seq_lens, column_headers(table), strict=True))
    for n in seq_lens:
        out.add_column(headers[n], justify="right")
    for label, cells in table.rows:
        out.add_row(label, *(text(cells.get(n)) for n in seq_lens), style="cyan" if table.is_baseline(label) else None)
    return out


def _chunks(table: PivotTable, title: str, text: Cells, caption: str | None = None) -> list[list[Table]]:
    """The table whole, then split into 2, 3, … tables of consecutive lengths: the layouts to try, widest first."""
    lengths = table.seq_lens
    layouts: list[list[Table]] = []
    for parts in range(1, len(lengths) + 1):
        size = -(-len(lengths) // parts)
        spans = [lengths[i : i + size] for i in range(0, len(lengths), size)]
        layout = [
            _table(table, title if i == 0 else f"{title} (continued)", text, span) for i, span in enumerate(spans)
        ]
        layout[-1].caption = caption
        if not layouts or len(layout) != len(layouts[-1]):
            layouts.append(layout)
    return layouts


def _time_layouts(table: PivotTable) -> list[list[Table]]:
    """Medians with their speed-ups in one table; where that is too wide for the terminal, medians and speed-ups
    in two tables; where even that is too wide, the lengths split over several tables. A cell never wraps."""
    noisy = "~ = noisy"
    what = "time per decode step at context n " if table.decode else ""
    if table.baseline is None:
        return _chunks(table, table.title, time_text, f"{what}({noisy})")
    both = _chunks(table, table.title, time_text, f"{what}(speed-up vs {table.baseline}; {noisy})")
    times = _chunks(table, table.title, lambda cell: time_text(cell, speedup=False), f"{what}({noisy})")
    ups = _chunks(table, f"speed-up vs {table.baseline} (the table above)", speedup_text, f"(> 1× = faster; {noisy})")
    return [both[0], times[0] + ups[0], *both[1:]]


class Fitted:
    """The first layout whose tables all fit the console's width at their natural size, so no cell wraps; the
    last layout when none does. Decided at render time, when the width is known."""

    def __init__(self, layouts: list[list[Table]]) -> None:
        self.layouts = layouts

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        unbounded = options.update_width(1 << 20)  # measured against the console's own, a table shrinks to fit
        for layout in self.layouts:
            if all(Measurement.get(console, unbounded, t).maximum <= options.max_width for t in layout):
                yield from layout
                return
        yield from self.layouts[-1]


def _checks(reading: Reading) -> list[Text]:
    """train / (forward + backward): one summary line, then each flagged case with its reason; then any row
    above 100 % of its peak."""
    checks = run_checks(reading)
    out = [Text(checks.summary, style="bold")] if checks.summary else []
    out += [Text(f"  {c.text} — {c.reason}", style="yellow") for c in checks.flagged]
    out += [Text(f"above 100 % of peak: {line}", style="bold red") for line in checks.over_peak]
    return out + [Text(f"faster than the roofline: {line}", style="yellow") for line in checks.below_roofline]


def telemetry_renderable(results: Sequence[Result]) -> Table:
    """``report --telemetry`` in a terminal: the markdown's table (``telemetry_table``) as a rich table, with what
    every case label shares (dtype, batch, width…) said once in the caption, so the case column stays narrow."""
    table = telemetry_table(results)
    labels = [row[0].split() for row in table.rows]
    shared = [word for word in labels[0] if all(word in label for label in labels)] if labels else []
    caption = f"{INTRO} {table.footer(' '.join(shared))}"
    out = Table(title="Telemetry per case", title_justify="left", caption=caption, caption_justify="left")
    for header in table.headers:
        # "cpu % (process)" on two lines: a figure's column is as narrow as its figures, the case keeps its width.
        out.add_column(header.replace(" (", "\n("), justify="left" if header in ("case", "note") else "right")
    for words, row in zip(labels, table.rows, strict=True):
        out.add_row(" ".join(w for w in words if w not in shared), *row[1:])
    return out
