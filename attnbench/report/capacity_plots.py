"""The capacity plot of a run (``mode: capacity``, issue 41): per model, against the context n, the batch whose decode
step fits the memory budget (left) and the tokens per second that batch decodes together (right), with where a
recurrent model's tokens/s cross attention's marked in its colour (dotted and "?": indicative, every length noisy).
One figure per capacity table (``analysis.capacity``). Pure rendering: PNG bytes from stored rows, matplotlib's Agg
canvas, no pyplot.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnbench.analysis.capacity import CapacityTable
from attnbench.core.units import format_bytes
from attnbench.report.plot_style import device_name, line_style, slug
from attnbench.results.records import Run

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@dataclass(frozen=True)
class CapacityPlot:
    """One drawn capacity figure: its title and file name, and the PNG."""

    group: str
    filename: str
    title: str
    png: bytes


def capacity_plots(run: Run, tables: Sequence[CapacityTable], colours: dict[str, int]) -> list[CapacityPlot]:
    """One figure per capacity table (``Reading.capacity``) with a point to draw; ``colours`` maps row labels to
    colour indices (the run's other plots'), and a label not in it is added."""
    plots = []
    for table in tables:
        if not any(p.batch is not None for c in table.curves for p in c.points):
            continue
        png = _draw(run, table, colours)
        plots.append(CapacityPlot(table.title, f"capacity-{slug(table.title)}.png", table.title, png))
    return plots


def _draw(run: Run, table: CapacityTable, colours: dict[str, int]) -> bytes:
    fig = capacity_figure(run, table, colours)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def capacity_figure(run: Run, table: CapacityTable, colours: dict[str, int]) -> Figure:
    """The figure of one capacity table: the batch found (left), the tokens/s at it (right)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11.0, 4.6), dpi=120)
    FigureCanvasAgg(fig)
    batch_ax, rate_ax = fig.subplots(1, 2)
    for curve in table.curves:
        if curve.label not in colours:
            colours[curve.label] = len(colours)
        colour, marker, style = line_style(colours[curve.label])
        # The batch is memory's answer and is drawn whatever the timing did; tokens/s only where the step was timed.
        found = [p for p in curve.points if p.batch is not None]
        timed = [p for p in found if p.tokens_per_s is not None]
        if not found:
            continue
        untimed = [p for p in found if p.untimed]
        label = curve.label + (" (× step not timed)" if untimed else "")
        batch_ax.plot([p.n for p in found], [p.batch for p in found], color=colour, marker=marker, linestyle=style,
                      label=label)  # fmt: skip
        if untimed:  # the timing ran out of budget (or failed): a cross over the batch's marker
            batch_ax.scatter([p.n for p in untimed], [p.batch for p in untimed], s=70, marker="x", color=colour,
                             zorder=4)  # fmt: skip
        if timed:
            rate_ax.plot([p.n for p in timed], [p.tokens_per_s for p in timed], color=colour, marker=marker,
                         linestyle=style)  # fmt: skip
        for ax, points, values in (
            (batch_ax, timed, [p.batch for p in timed]),
            (rate_ax, timed, [p.tokens_per_s for p in timed]),
        ):
            noisy = [(p.n, v) for p, v in zip(points, values, strict=True) if not p.good]
            if noisy:  # the tables' "~": an open marker
                ax.scatter(
                    *zip(*noisy, strict=True), s=46, marker=marker, facecolors="white", edgecolors=colour, zorder=3
                )
    for x, indicative, label in table.crossing_points():  # in the colour of the curve that overtakes attention
        colour = line_style(colours[label])[0] if label in colours else "0.4"
        rate_ax.axvline(x, color=colour, linestyle=":" if indicative else "--", linewidth=1.0, alpha=0.8)
        rate_ax.annotate(
            f"{label} n ≈ {x:.0f}" + ("?" if indicative else ""), (x, 0.02), xycoords=("data", "axes fraction"),
            fontsize=6, rotation=90, va="bottom", ha="right", color=colour,
        )  # fmt: skip
    for ax, label in ((batch_ax, "sequences at capacity"), (rate_ax, "tokens/s at capacity (all sequences)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("context length n (tokens)")
        ax.set_ylabel(label)
        ax.grid(True, which="major", alpha=0.3)
    budget = "" if table.budget_bytes is None else f" under {format_bytes(table.budget_bytes)}"
    batch_ax.set_title(f"largest batch{budget}", fontsize=10)
    rate_ax.set_title("aggregate decode throughput at that batch", fontsize=10)
    batch_ax.legend(fontsize=8, loc="best")
    fig.suptitle(f"{table.title}\n{device_name(run)}", fontsize=10)
    fig.tight_layout()
    return fig
