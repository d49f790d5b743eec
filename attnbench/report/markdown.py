"""``summary.md``: the pivot tables as GitHub-flavoured markdown, fit for a README or a PR comment. Text a stored
run holds (model names, labels, reasons, its environment) goes in through ``md_text``/``md_code``: it never becomes
a tag, a link or a code span of its own."""

from __future__ import annotations

from tabulate import tabulate

from attnbench.analysis.reading import Reading
from attnbench.core.text import md_cell, md_code, md_text
from attnbench.core.units import plural
from attnbench.report.capacity_md import capacity_markdown
from attnbench.report.cells import (
    BELOW_ROOFLINE,
    BELOW_ROOFLINE_NOTE,
    CROSSOVER_LEGEND,
    SCALING_LEGEND,
    column_headers,
    contention_lines,
    environment_line,
    memory_text,
    run_checks,
    state_legend,
    state_text,
    time_legend,
    time_text,
)
from attnbench.report.prefix_md import prefix_markdown
from attnbench.report.presets_md import presets_markdown


def _checks(reading: Reading) -> list[str]:
    """The Checks section; nothing when there is nothing to check."""
    checks = run_checks(reading)
    if not checks:
        return []
    lines = ["", "## Checks"]
    if checks.summary:
        lines += ["", checks.summary]
        if checks.flagged:
            lines.append("")
            lines += [
                f"- {md_code(c.train.case.label)}: {c.ratio:.2f} ({c.parts_text}) — {md_text(c.reason)}"
                for c in checks.flagged
            ]
    if checks.over_peak:
        lines += ["", "**Above 100 % of peak** (impossible; do not trust these rows):", ""]
        lines += [f"- {md_text(line)}" for line in checks.over_peak]
    if checks.below_roofline:
        lines += ["", f"**{BELOW_ROOFLINE}** {BELOW_ROOFLINE_NOTE}:", ""]
        lines += [f"- {md_text(line)}" for line in checks.below_roofline]
    return lines


def render_markdown(reading: Reading) -> str:
    """The run as markdown: its pivot tables, capacity, published models, checks and the cases without a timing."""
    run, results = reading.run, reading.results
    lines = [
        f"# attnbench run {md_code(run.run_id)}",
        "",
        environment_line(run, md_code, md_text),
        "",
        f"Config {md_code(run.config_source)} (sha256 `{run.config_sha256[:12]}`), created {md_text(run.created_utc)}, "
        f"state: {run.state}. {plural(len(results), 'case')}, "
        f"{sum(r.ok for r in results)} ok.",
    ]
    headline, busy = contention_lines(results)
    if headline:
        lines += ["", f"**{headline}**", ""] + [f"- {md_text(line)}" for line in busy]
    for table in reading.tables:
        headers = ["model", *column_headers(table)]
        lines += ["", f"## {md_text(table.title)}", ""]
        if table.baseline or table.decode:
            lines += [time_legend(table, md_code(table.baseline or "")), ""]
        time_rows = [
            [md_cell(label), *(time_text(cells.get(n)) for n in table.seq_lens)] for label, cells in table.rows
        ]
        lines.append(tabulate(time_rows, headers=headers, tablefmt="github", disable_numparse=True))
        if table.crossovers:
            lines += ["", CROSSOVER_LEGEND, ""] + [f"- {md_text(line)}" for line in table.crossovers]
        if table.decode:  # what a step reads is the memory story of decoding; its own peak is a few vectors
            lines += ["", md_text(state_legend(table)), ""]
            cell_text = state_text
        else:
            lines += ["", "Peak memory of one call above the post-setup baseline (MiB):", ""]
            cell_text = memory_text
        memory_rows = [
            [md_cell(label), *(cell_text(cells.get(n)) for n in table.seq_lens)] for label, cells in table.rows
        ]
        lines.append(tabulate(memory_rows, headers=headers, tablefmt="github", disable_numparse=True))
        if table.scaling:
            lines += ["", SCALING_LEGEND, ""] + [f"- {md_text(line.text)}" for line in table.scaling]
    lines += capacity_markdown(reading.capacity)
    lines += prefix_markdown(reading.prefix)
    lines += presets_markdown(reading.presets)
    lines += _checks(reading)
    failed = [r for r in results if not r.ok]
    if failed:
        lines += ["", "## Cases without a timing", ""]
        lines += [f"- {md_code(r.case.label)}: **{r.status}** — {md_text(r.reason)}" for r in failed]
    return "\n".join(lines) + "\n"
