"""The shared-prefix section of ``summary.md``, ``attnbench report`` and the HTML page: per model and prompt, both
strategies' time to every request's first token and the memory held (``analysis.prefix``)."""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from attnbench.analysis.prefix import PrefixPoint, PrefixTable
from attnbench.core.text import md_cell, md_text
from attnbench.core.units import format_bytes, format_fixed, format_seconds
from attnbench.report.cells import STATUS_TEXT

LEGEND = (
    "M requests whose prompts (n tokens each) begin with the same P tokens, prefilled to every request's first token: "
    "with the prefix shared (attention's cache read by reference, a recurrent state restored from a checkpoint) "
    "against M independent prefills, both timed in the same row (`~`: noisy), and the memory each holds: its caches, "
    "states and checkpoints (measured)."
)
HEADERS = ("model", "n", "shared", "independent", "sooner", "held shared", "held independent", "÷ one request's",
           "prefix reused")  # fmt: skip


def cells(point: PrefixPoint) -> list[str]:
    """One row's cells, as every format shows them (a status where the row has no timing)."""
    if point.shared_s is None:  # the bytes held may still have been measured: they stay
        shared, independent, sooner = STATUS_TEXT.get(point.status, point.status), "", ""
    else:
        mark = "" if point.good else "~"
        shared = f"{mark}{format_seconds(point.shared_s)}"
        independent = format_seconds(point.independent_s) if point.independent_s is not None else ""
        sooner = f"{format_fixed(point.speedup)}×" if point.speedup is not None else ""
    held = format_bytes(point.shared_bytes) if point.shared_bytes is not None else ""
    alone = format_bytes(point.independent_bytes) if point.independent_bytes is not None else ""
    over = f"{format_fixed(point.held_over_one)}×" if point.held_over_one is not None else ""
    reused = str(point.reused) if point.reused is not None else ""
    return [point.label, str(point.n), shared, independent, sooner, held, alone, over, reused]


def prefix_markdown(tables: Sequence[PrefixTable]) -> list[str]:
    """Every prefix table of a run (``Reading.prefix``), as markdown lines (none without prefix rows)."""
    lines: list[str] = []
    for table in tables:
        rows = [[md_cell(c) for c in cells(p)] for p in table.points]
        lines += ["", f"## {md_text(table.title)}", "", LEGEND, ""]
        lines.append(tabulate(rows, headers=HEADERS, tablefmt="github", disable_numparse=True))
    return lines
