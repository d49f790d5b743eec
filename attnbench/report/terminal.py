"""Rich renderables for the terminal: the comparison tables and one line per finished case."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text

from attnbench.core.units import format_bytes, format_rate, format_seconds
from attnbench.report.cells import column_headers, contention_lines, memory_text, run_checks, time_text
from attnbench.report.pivot import pivot_tables
from attnbench.results.records import Result, Run


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


def comparison_tables(
    results: Sequence[Result], baseline_model: str | None = None, memory: bool = False, run: Run | None = None
) -> Group:
    renderables: list[Table | Text] = []
    headline, busy = contention_lines(results)
    if headline:
        renderables.append(Text(headline, style="bold yellow"))
        renderables += [Text(f"  {line}", style="yellow") for line in busy]
    for table in pivot_tables(results, baseline_model):
        caption = f"(speed-up vs {table.baseline}; ~ = noisy)" if table.baseline else "(~ = noisy)"
        out = Table(title=table.title, caption=caption, title_justify="left")
        out.add_column("model", style="bold")
        for header in column_headers(table):
            out.add_column(header, justify="right")
        for label, cells in table.rows:
            out.add_row(
                label,
                *(time_text(cells.get(n)) for n in table.seq_lens),
                style="cyan" if table.is_baseline(label) else None,
            )
        renderables.append(out)
        if memory:
            mem = Table(title=f"peak memory MiB · {table.title}", title_justify="left")
            mem.add_column("model", style="bold")
            for header in column_headers(table):
                mem.add_column(header, justify="right")
            for label, cells in table.rows:
                mem.add_row(label, *(memory_text(cells.get(n)) for n in table.seq_lens))
            renderables.append(mem)
        for line in table.crossovers:
            renderables.append(Text(f"  {line}", style="italic"))
        for scaling in table.scaling:
            renderables.append(Text(f"  {scaling.text}", style="italic"))
    renderables += _checks(run, results)
    return Group(*renderables)


def _checks(run: Run | None, results: Sequence[Result]) -> list[Text]:
    """train / (forward + backward): one summary line, then each flagged case with its reason; then any row
    above 100 % of its peak."""
    checks = run_checks(run, results)
    out = [Text(checks.summary, style="bold")] if checks.summary else []
    out += [Text(f"  {c.text} — {c.reason}", style="yellow") for c in checks.flagged]
    return out + [Text(f"above 100 % of peak: {line}", style="bold red") for line in checks.over_peak]
