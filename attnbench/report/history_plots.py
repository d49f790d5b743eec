"""``attnbench history --plots``: one panel per case over the runs, with 95 % CI bars and the steps marked.

Drawn on matplotlib's Agg canvas without pyplot (as ``report.plots``), at most ``PANELS_PER_FIGURE`` panels per
PNG. Each panel: the case's value per run (hollow where it has no interval), a dashed line where a step begins
and the two levels around it, and a grey line where the environment changed (a new segment).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from attnbench.analysis.history import HIGHER_IS_BETTER, CaseHistory, History
from attnbench.report.history_md import METRIC_WORDS, value_text
from attnbench.report.plot_style import plain_texts
from attnbench.report.plots import INSTALL_HINT, PlotsUnavailable, missing_matplotlib

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.ticker import FuncFormatter

PANELS_PER_FIGURE = 12
COLUMNS = 3
_STEP_COLOUR = {True: "#d62728", False: "#2ca02c"}  # worse, better


@dataclass(frozen=True)
class HistoryPlot:
    filename: str
    title: str
    png: bytes


def _panel(ax: Axes, history: History, c: CaseHistory) -> None:
    offset = sum(len(s.runs) for s in history.segments[: c.segment])
    xs = [offset + i + 1 for i, p in enumerate(c.points) if p.value is not None]
    ys = [p.value for p in c.points if p.value is not None]
    with_ci = [
        (offset + i + 1, p.value, p.low, p.high)
        for i, p in enumerate(c.points)
        if p.value is not None and p.low is not None and p.high is not None
    ]
    ax.plot(xs, ys, color="#1f77b4", linewidth=1.0, marker="o", markersize=3.5, zorder=3)
    if with_ci:
        x, y, low, high = zip(*with_ci, strict=True)
        below = [v - lo for v, lo in zip(y, low, strict=True)]
        above = [hi - v for v, hi in zip(y, high, strict=True)]
        ax.errorbar(x, y, yerr=[below, above], fmt="none", ecolor="#1f77b4", elinewidth=0.8, capsize=2, zorder=2)
    higher_is_worse = not HIGHER_IS_BETTER[history.metric]
    bounds = [0, *(s.index for s in c.fit.steps), len(c.points)]
    for step, (start, end) in zip(c.fit.steps, zip(bounds[:-2], bounds[2:], strict=True), strict=True):
        worse = (step.change > 0) == higher_is_worse
        x_step = offset + step.index + 0.5
        ax.axvline(x_step, color=_STEP_COLOUR[worse], linestyle="--", linewidth=1.1, zorder=1)
        ax.hlines(step.before, offset + start + 1, x_step, color="0.35", linewidth=0.9, zorder=1)
        ax.hlines(step.after, x_step, offset + end, color="0.35", linewidth=0.9, zorder=1)
        ax.annotate(
            f"{step.change * 100:+.1f} %",
            (x_step, step.after),
            textcoords="offset points",
            xytext=(3, 4),
            fontsize=7.5,
            color=_STEP_COLOUR[worse],
        )
    for segment in history.segments[1:]:
        start = sum(len(s.runs) for s in history.segments[: segment.index])
        ax.axvline(start + 0.5, color="0.6", linewidth=2.0, alpha=0.5, zorder=0)
    ax.set_title(c.case.label, fontsize=8, loc="left")
    ax.set_xlim(0.5, len(history.runs) + 0.5)
    ax.tick_params(labelsize=7)
    ax.yaxis.set_major_formatter(_formatter(history))
    ax.grid(True, color="0.9", linewidth=0.6, zorder=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)


def _formatter(history: History) -> FuncFormatter:
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda value, _: value_text(value, history.metric) if value > 0 else "")


def panels_or_notice(history: History) -> tuple[list[HistoryPlot], str | None]:
    """``render_history_plots``, or no panels and the line that says why (matplotlib is missing: how to install it)."""
    notice = missing_matplotlib()
    if notice is not None:
        return [], f"{notice} ({INSTALL_HINT})"
    return render_history_plots(history), None


def render_history_plots(history: History) -> list[HistoryPlot]:
    """The panels, ``PANELS_PER_FIGURE`` to a PNG. Raises ``PlotsUnavailable`` without matplotlib."""
    notice = missing_matplotlib()
    if notice is not None:
        raise PlotsUnavailable(notice, hint=INSTALL_HINT)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    cases = [c for c in history.cases if any(p.value is not None for p in c.points)]
    plots = []
    for page, first in enumerate(range(0, len(cases), PANELS_PER_FIGURE), start=1):
        chunk = cases[first : first + PANELS_PER_FIGURE]
        rows = -(-len(chunk) // COLUMNS)
        fig = Figure(figsize=(4.2 * min(COLUMNS, len(chunk)), 2.6 * rows), dpi=110)
        FigureCanvasAgg(fig)
        for i, c in enumerate(chunk):
            _panel(fig.add_subplot(rows, min(COLUMNS, len(chunk)), i + 1), history, c)
        title = f"{METRIC_WORDS[history.metric]} over {len(history.runs)} runs (x: run in history order)"
        fig.suptitle(title, fontsize=9.5, x=0.01, ha="left")
        fig.tight_layout()
        buffer = io.BytesIO()
        plain_texts(fig)
        fig.savefig(buffer, format="png", metadata={"Software": None})
        stem = re.sub(r"[^a-z0-9]+", "-", history.metric.lower())
        name = f"history-{stem}-{page}.png"
        plots.append(HistoryPlot(name, title, buffer.getvalue()))
    return plots
