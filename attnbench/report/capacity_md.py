"""The capacity section of ``summary.md`` and ``attnbench report``: per model and context n, the batch that fits the
memory budget and the aggregate tokens/s at it, and where a recurrent model starts serving more than attention."""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from attnbench.analysis.capacity import CapacityPoint, CapacityTable
from attnbench.core.text import md_cell, md_text
from attnbench.core.units import format_bytes, format_rate
from attnbench.report.cells import STATUS_TEXT

LEGEND = (
    "Each cell: the largest batch whose decode step at context n fits the budget (weights, every sequence's KV cache "
    "or state, the step's working memory; measured), and the tokens per second that batch decodes together "
    "(`~`: noisy; `≥`: the search's largest batch, more would fit; a batch with a status instead of tokens/s: the "
    "memory was measured, the step's timing was not)."
)
CROSSINGS = "Where the aggregate tokens/s at capacity cross:"
PER_SEQUENCE = "Memory one more sequence adds (its state and its share of the step):"


def point_text(point: CapacityPoint | None) -> str:
    if point is None:
        return ""
    mark = "≥" if point.capped else ""
    if point.batch is None:
        return STATUS_TEXT.get(point.status, point.status)
    if point.tokens_per_s is None:  # the capacity is memory's answer, whatever the timing did
        return f"{mark}{point.batch} · {STATUS_TEXT.get(point.status, point.status)}"
    noisy = "" if point.good else "~"
    return f"{mark}{point.batch} · {noisy}{format_rate(point.tokens_per_s)} tok/s"


def bytes_text(point: CapacityPoint | None) -> str:
    if point is None or point.bytes_per_sequence is None:
        return ""
    return format_bytes(point.bytes_per_sequence)


def table_lines(table: CapacityTable) -> list[str]:
    """One table's markdown: batch · tokens/s, the bytes per sequence, the crossovers."""
    headers = ["model", *(f"n={n}" for n in table.seq_lens)]
    rows = [[md_cell(c.label), *(point_text(next((p for p in c.points if p.n == n), None)) for n in table.seq_lens)]
            for c in table.curves]  # fmt: skip
    per_sequence = [
        [md_cell(c.label), *(bytes_text(next((p for p in c.points if p.n == n), None)) for n in table.seq_lens)]
        for c in table.curves
    ]
    lines = ["", f"## {md_text(table.title)}", "", LEGEND, ""]
    lines.append(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    if table.crossovers:
        lines += ["", CROSSINGS, ""] + [f"- {md_text(line)}" for line in table.crossovers]
    lines += ["", PER_SEQUENCE, ""]
    lines.append(tabulate(per_sequence, headers=headers, tablefmt="github", disable_numparse=True))
    return lines


def capacity_markdown(tables: Sequence[CapacityTable]) -> list[str]:
    """Every capacity table of a run (``Reading.capacity``), as markdown lines (none without capacity rows)."""
    return [line for table in tables for line in table_lines(table)]
