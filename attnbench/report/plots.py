"""PNG plots of a stored run: latency, peak memory, tokens/s and speed-up against sequence length.

Torch-free. One PNG per metric per pivot table (``Reading.tables`` decides the grouping, so a plot
always shows exactly the rows of one table). matplotlib is a dependency of the package, imported only inside the
drawing functions; an install without it (``--no-deps``) skips the plots with a one-line notice. Figures are drawn
on an Agg canvas directly, without pyplot, so no GUI backend is ever chosen, no window can open and no global
figure state leaks between calls.

The numbers drawn come from ``series``, which is pure Python and tested on its own; drawing only lays them out.

A decode table's plots read per decode step and against the context length n; its memory plot draws the KV cache
or recurrent state a step reads (computed, as lines; measured, as hollow markers) in place of the step's peak.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from attnbench.analysis.pivot import Cell, PivotTable
from attnbench.analysis.reading import Reading
from attnbench.core.errors import AttnbenchError
from attnbench.core.text import safe_text
from attnbench.core.units import format_bytes, format_rate, format_seconds
from attnbench.report.capacity_plots import capacity_plots
from attnbench.report.cells import status_text
from attnbench.report.plot_style import device_name, line_style, plain_texts, slug
from attnbench.report.roofline import roofline_plots
from attnbench.results.files import make_subfolder, write_atomic
from attnbench.results.records import Run

if TYPE_CHECKING:
    from matplotlib.axes import Axes

Metric = Literal["latency", "memory", "throughput", "speedup", "roofline", "capacity"]
METRICS: tuple[Metric, ...] = ("latency", "memory", "throughput", "speedup")

INSTALL_HINT = "pip install matplotlib"
MISSING_NOTICE = f"plots skipped: matplotlib is not installed ({INSTALL_HINT})"


class PlotsUnavailable(AttnbenchError):
    """matplotlib cannot be imported here."""


@dataclass(frozen=True)
class Plot:
    """One rendered figure. ``group`` is the title of the pivot table it draws."""

    metric: Metric
    group: str
    filename: str
    title: str
    png: bytes


@dataclass(frozen=True)
class Point:
    """One x position of a series: a value with its interval, or why there is none (``status``)."""

    n: int
    value: float | None
    low: float | None = None
    high: float | None = None
    status: str = "ok"  # "ok", or the pivot's status text for a case without a timing ("OOM", "n/a", ...)
    noisy: bool = False  # the tables' "~"
    contended: bool = False  # the tables' "!": timed while other work competed for the machine

    @property
    def hollow(self) -> bool:
        """Drawn as an open marker: a time that is no evidence, noisy or timed on a busy machine (a filled marker
        is a cell the fits, crossovers and speed-ups may use: ``scaling.good_evidence``)."""
        return self.noisy or self.contended


@dataclass(frozen=True)
class Series:
    label: str
    is_baseline: bool
    points: tuple[Point, ...]
    # A decode row's measured state, drawn as markers alone in the colour of its row (``label`` says which row).
    measured: bool = False
    row: str = ""  # the row whose colour it takes; "" = its own label

    @property
    def colour_key(self) -> str:
        return self.row or self.label

    @property
    def values(self) -> list[Point]:
        return [p for p in self.points if p.value is not None]

    @property
    def failures(self) -> list[Point]:
        return [p for p in self.points if p.status != "ok"]


def missing_matplotlib() -> str | None:
    """The one-line notice to print when matplotlib cannot be imported, else None."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return MISSING_NOTICE
    return None


# ---------------------------------------------------------------------------------------------------- the numbers


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _point(metric: Metric, n: int, cell: Cell, decode: bool = False) -> Point | None:
    """What ``metric`` draws for one cell; None when there is nothing to draw and nothing to flag. A decode
    table's memory is the state a step reads, computed."""
    r = cell.result
    if not r.ok:
        return Point(n, None, status=status_text(cell))
    if metric == "memory" and decode:
        return None if r.state_bytes is None else Point(n, float(r.state_bytes))
    m = r.measurement
    if m is None:
        return None
    s = m.summary
    if metric == "latency":
        return Point(n, s.median, _finite(s.ci_low), _finite(s.ci_high), noisy=cell.noisy, contended=r.contended)
    if metric == "throughput":
        tokens = r.tokens_per_call
        low = tokens / s.ci_high if math.isfinite(s.ci_high) and s.ci_high > 0 else None
        high = tokens / s.ci_low if math.isfinite(s.ci_low) and s.ci_low > 0 else None
        return Point(n, tokens / s.median, low, high, noisy=cell.noisy, contended=r.contended)
    if metric == "memory":
        peak = r.memory.peak_bytes if r.memory is not None else None
        return None if peak is None else Point(n, float(peak))
    # speedup: a conservative interval, the baseline's CI bounds over this cell's opposite bounds, per token as the
    # speed-up is (rows of one table may call with different token counts: a capacity row's batch is its own).
    if cell.speedup is None:
        return None
    low = high = None
    base = cell.base
    if base is not None and base.measurement is not None:
        b = base.measurement.summary
        if all(math.isfinite(x) and x > 0 for x in (b.ci_low, b.ci_high, s.ci_low, s.ci_high)):
            per_token = r.tokens_per_call / base.tokens_per_call
            low, high = per_token * b.ci_low / s.ci_high, per_token * b.ci_high / s.ci_low
    noisy = cell.noisy or (base is not None and Cell(base, None).noisy)
    contended = r.contended or (base is not None and base.contended)
    return Point(n, cell.speedup, low, high, noisy=noisy, contended=contended)


def series(table: PivotTable, metric: Metric) -> list[Series]:
    """The lines ``metric`` draws for one table, one per row, in row order. The speed-up plot has no baseline
    line: the baseline is the 1× reference drawn across it."""
    out = []
    for label, cells in table.rows:
        is_baseline = table.is_baseline(label)
        if metric == "speedup" and is_baseline:
            continue
        points = []
        for n in table.seq_lens:
            cell = cells.get(n)
            if cell is None:
                continue
            point = _point(metric, n, cell, table.decode)
            if point is not None:
                points.append(point)
        out.append(Series(label, is_baseline, tuple(points)))
        if metric == "memory" and table.decode:
            out.append(_measured_state(label, is_baseline, table, cells))
    return out


def _measured_state(label: str, is_baseline: bool, table: PivotTable, cells: dict[int, Cell]) -> Series:
    """A decode row's measured state, at the lengths where the method saw it (a 0 B reading has no logarithm,
    and says only that the state is smaller than the method resolves)."""
    points = []
    for n in table.seq_lens:
        cell = cells.get(n)
        held = cell.result.state_mem_bytes if cell is not None and cell.result.ok else None
        if held:
            points.append(Point(n, float(held)))
    return Series(f"{label} (measured)", is_baseline, tuple(points), measured=True, row=label)


# ---------------------------------------------------------------------------------------------------- axes text


def seq_len_text(n: int) -> str:
    """Sequence lengths as ML papers write them: 512, 4k (= 4096), 1M (= 2^20); other lengths in full."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20}M"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}k"
    return f"{n:,}"


def log_ticks(low: float, high: float) -> list[float]:
    """Round tick values for a log axis over [low, high]: decades when they give at least three ticks, else
    1-2-5 steps, else 1..9 steps; every other decade when there are more than eight."""
    if not (low > 0 and high > low):
        return [low] if low > 0 else []
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    ticks: list[float] = []
    for steps in ((1,), (1, 2, 5), (1, 2, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [m * 10.0**k for k in range(first, last + 1) for m in steps if low <= m * 10.0**k <= high]
        if len(ticks) >= 3 or (steps != (1,) and len(ticks) >= 2):
            break
    if len(ticks) > 8:
        ticks = ticks[::2]
    if len(ticks) < 2:  # narrower than one step: its ends and middle, to as few digits as keep them inside
        middle = math.sqrt(low * high)
        for digits in range(2, 7):
            ticks = sorted({t for x in (low, middle, high) if low <= (t := float(f"{x:.{digits}g}")) <= high})
            if len(ticks) >= 2:
                break
        ticks = ticks or [middle]
    return ticks


def byte_ticks(low: float, high: float) -> list[float]:
    """Ticks for a memory axis: powers of two (64 KiB, 128 KiB, ...), with the 1.5× steps when narrow."""
    first, last = math.floor(math.log2(low)), math.ceil(math.log2(high))
    ticks = [2.0**k for k in range(first, last + 1) if low <= 2.0**k <= high]
    if len(ticks) < 3:
        ticks = sorted(t for k in range(first, last + 1) for t in (2.0**k, 1.5 * 2.0**k) if low <= t <= high)
    while len(ticks) > 8:
        ticks = ticks[::2]
    return ticks if len(ticks) >= 2 else log_ticks(low, high)


def ratio_ticks(low: float, high: float) -> list[float]:
    """Ticks for a speed-up axis: powers of two (0.25×, 0.5×, 1×, 2×, ...), decades over a very wide range, or
    round values when narrow."""
    if math.log10(high / low) > 2.5:
        return log_ticks(low, high)
    ticks = [2.0**k for k in range(math.floor(math.log2(low)), math.ceil(math.log2(high)) + 1)]
    ticks = [t for t in ticks if low <= t <= high]
    if len(ticks) > 9:
        ticks = [t for t in ticks if round(math.log2(t)) % 2 == 0]
    return ticks if len(ticks) >= 3 else log_ticks(low, high)


def _ratio_text(x: float) -> str:
    return f"{x:.3g}×" if x < 1000 else f"{x:,.0f}×"


def _time_text(seconds: float) -> str:
    return format_seconds(seconds) if seconds < 1000 else f"{seconds:,.0f} s"  # never "1e+03 s" on an axis


def _bytes_text(n_bytes: float) -> str:
    return format_bytes(n_bytes) if n_bytes < 1000 * 2**30 else f"{n_bytes / 2**30:,.0f} GiB"


_Y: dict[Metric, tuple[str, Callable[[float], str]]] = {
    "latency": ("median time per call", _time_text),
    "memory": ("peak memory per call", _bytes_text),
    "throughput": ("tokens per second\n(batch × n ÷ median time)", format_rate),
    "speedup": ("speed-up", _ratio_text),
}
_TITLES: dict[Metric, str] = {
    "latency": "Latency vs sequence length",
    "memory": "Peak memory vs sequence length",
    "throughput": "Throughput vs sequence length",
    "speedup": "Speed-up vs {baseline}",
}
# A decode table's: per step, against the context length.
_DECODE_Y: dict[Metric, str] = {
    "latency": "median time per decode step\n(the next token of every sequence)",
    "memory": "KV cache or recurrent state",
    "throughput": "tokens per second\n(batch ÷ median time per step)",
    "speedup": "speed-up",
}
_DECODE_TITLES: dict[Metric, str] = {
    "latency": "Per-token latency vs context length",
    "memory": "KV cache / recurrent state vs context length",
    "throughput": "Decode throughput vs context length",
    "speedup": "Decode speed-up vs {baseline}",
}


def _title(table: PivotTable, metric: Metric) -> str:
    return (_DECODE_TITLES if table.decode else _TITLES)[metric].format(baseline=table.baseline)


# ---------------------------------------------------------------------------------------------------- drawing


def _strip_fraction(levels: int) -> float:
    """The share of the axes height the no-timing strip takes: room for ``levels`` rows of markers."""
    return min(0.1 + 0.06 * levels, 0.4) if levels else 0.0


def _widen_down(log: bool, low: float, high: float, fraction: float) -> float:
    """The lower y limit that leaves the data [low, high] the upper (1 − fraction) of the axes."""
    if log:
        span = math.log10(high) - math.log10(low)
        return float(10 ** (math.log10(low) - span * fraction / (1 - fraction)))
    return low - (high - low) * fraction / (1 - fraction)


def _snap(low: float, high: float, base: float) -> tuple[float, float]:
    """Log-axis limits widened to the next power of ``base`` when it is close, so the ends carry a labelled tick."""
    reach = 1.6 if base == 10.0 else 1.25
    below, above = base ** math.floor(math.log(low, base)), base ** math.ceil(math.log(high, base))
    return (below if low / below < reach else low), (above if above / high < reach else high)


def _plot_lines(ax: Axes, lines: Sequence[Series], colours: dict[str, int]) -> tuple[bool, bool]:
    """Each series as a line with its interval band; noisy and contended points hollow. Returns (any band, any
    hollow point)."""
    banded = noisy = False
    for s in lines:
        if not s.values:
            continue
        colour, marker, style = line_style(colours[s.colour_key])
        # A case without a timing breaks the line (NaN) instead of being bridged; unmeasured lengths are skipped.
        xs = [p.n for p in s.points]
        ys = [p.value if p.value is not None else math.nan for p in s.points]
        if s.measured:  # markers alone, hollow and larger, around the computed line's points
            ax.plot(xs, ys, linestyle="", marker=marker, markersize=9, markerfacecolor="none", color=colour, zorder=4)
            continue
        label = s.label + (" (baseline)" if s.is_baseline else "")
        width = 2.6 if s.is_baseline else 1.7
        ax.plot(xs, ys, style, color=colour, marker=marker, markersize=4.5, linewidth=width, label=label, zorder=3)
        hollow = [(p.n, p.value) for p in s.points if p.hollow and p.value is not None]
        if hollow:
            noisy = True
            ax.plot(
                [n for n, _ in hollow],
                [y for _, y in hollow],
                linestyle="",
                marker=marker,
                markersize=6,
                markerfacecolor="white",
                markeredgecolor=colour,
                markeredgewidth=1.5,
                zorder=4,
            )
        bounded = [p.value is not None and p.low is not None and p.high is not None for p in s.points]
        if not any(bounded):
            continue
        banded = True
        lows = [p.low if ok and p.low is not None else math.nan for p, ok in zip(s.points, bounded, strict=True)]
        highs = [p.high if ok and p.high is not None else math.nan for p, ok in zip(s.points, bounded, strict=True)]
        ax.fill_between(xs, lows, highs, where=bounded, color=colour, alpha=0.18, linewidth=0, zorder=2)
        for i, p in enumerate(s.points):
            # A lone point with an interval gets no band from fill_between: it gets an error bar instead.
            alone = bounded[i] and not (i > 0 and bounded[i - 1]) and not (i + 1 < len(bounded) and bounded[i + 1])
            if alone and p.value is not None and p.low is not None and p.high is not None:
                err = [[max(0.0, p.value - p.low)], [max(0.0, p.high - p.value)]]
                ax.errorbar([p.n], [p.value], yerr=err, color=colour, capsize=3, linewidth=1, zorder=2)
    return banded, noisy


Failures = list[tuple[str, list[tuple[str, list[int]]]]]


def _failures(lines: Sequence[Series]) -> Failures:
    """For each plotted row with cases without a timing: its runs of consecutive lengths with the same status.
    Rows with nothing plotted at all are left to the notes under the axes."""
    rows: Failures = []
    for s in lines:
        if s.measured or not s.values or not s.failures:
            continue
        runs: list[tuple[str, list[int]]] = []
        previous_failed = False
        for p in s.points:
            failed = p.status != "ok"
            if failed and previous_failed and runs[-1][0] == p.status:
                runs[-1][1].append(p.n)
            elif failed:
                runs.append((p.status, [p.n]))
            previous_failed = failed
        rows.append((s.label, runs))
    return rows


def _y_axis(ax: Axes, table: PivotTable, metric: Metric, log_y: bool, levels: int) -> None:
    """Limits (the data, the 1× line for speed-ups, the no-timing strip below), round ticks, and the label."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    ax.relim()
    ax.autoscale_view()
    low, high = ax.get_ylim()
    if metric == "speedup":  # keep the 1× reference in view
        low, high = min(low, 0.8), max(high, 1.25)
    if log_y:
        low, high = _snap(low, high, base=2.0 if metric in ("memory", "speedup") else 10.0)
    data_low = low
    if levels:
        low = _widen_down(log_y, low, high, _strip_fraction(levels))
        ax.axhspan(low, data_low, color="0.94", zorder=0, linewidth=0)
    ax.set_ylim(low, high)
    label, fmt = _Y[metric]
    if table.decode:
        label = _DECODE_Y[metric]
    if metric == "memory" and table.decode:
        methods = sorted(
            {
                str(c.result.extra.get("state_mem_method"))
                for _, cells in table.rows
                for c in cells.values()
                if c.result.ok
            }
        )
        label += f"\n(lines computed; markers measured, {', '.join(methods)})"
    elif metric == "memory":
        methods = sorted({c.result.memory.method for _, cells in table.rows for c in cells.values() if c.result.memory})
        label += f"\nabove the post-setup baseline ({', '.join(methods)})"
    elif metric == "speedup":
        label = f"speed-up vs {table.baseline}\n({table.baseline} time ÷ model time)"
    ax.set_ylabel(label, fontsize=9.5)
    if log_y:
        ticks = {"speedup": ratio_ticks, "memory": byte_ticks}.get(metric, log_ticks)(data_low, high)
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_formatter(NullFormatter())
    # No tick labels inside the strip: its height is room for markers, not a range of values.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _pos: fmt(y) if y >= data_low else ""))


def _x_axis(ax: Axes, table: PivotTable, seq_lens: Sequence[int]) -> None:
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    shown = seq_lens if len(seq_lens) <= 10 else seq_lens[:: math.ceil(len(seq_lens) / 10)]
    ax.xaxis.set_major_locator(FixedLocator(list(shown)))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: seq_len_text(round(x))))
    ax.set_xlim(seq_lens[0] / 1.35, seq_lens[-1] * 1.35)
    label = "sequence length n (tokens, log scale)"
    if table.decode:
        label = "context length n (tokens already in the KV cache or state, log scale)"
    if table.batch_for_seq:
        label += " · batch tied to n (constant tokens per call)"
    ax.set_xlabel(label, fontsize=9.5)


def _mark_failures(ax: Axes, failing: Failures, colours: dict[str, int], first_n: int) -> None:
    """An ✕ in the row's colour at each length without a timing, in the strip under the data, one level per row,
    and the status once per run of lengths: left of the run, or right of it when the run starts the axis."""
    strip = ax.get_xaxis_transform()  # x in data, y as a fraction of the axes
    per_level = (_strip_fraction(len(failing)) - 0.02) / max(len(failing), 1)
    for k, (row, runs) in enumerate(failing):
        colour = line_style(colours[row])[0]
        y = 0.015 + per_level * (k + 0.5)
        for status, lengths in runs:
            ax.plot(lengths, [y] * len(lengths), "x", color=colour, markersize=7, markeredgewidth=2, transform=strip)
            left = lengths[0] != first_n
            ax.annotate(
                status,
                xy=(lengths[0] if left else lengths[-1], y),
                xycoords=strip,
                xytext=(-7 if left else 7, 0),
                textcoords="offset points",
                ha="right" if left else "left",
                va="center",
                fontsize=7.5,
                color=colour,
                fontweight="bold",
            )


HOLLOW_LABEL = "noisy or contended\n(~ or ! in the tables)"


def _legend(
    ax: Axes, metric: Metric, banded: bool, noisy: bool, failures: bool, baseline: str | None, measured: bool = False
) -> None:
    """Outside the axes on the right, so it never hides a line; with keys for the band, hollow and ✕ marks."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles, labels = ax.get_legend_handles_labels()
    if measured:
        handles.append(Line2D([], [], marker="o", linestyle="", color="0.3", markerfacecolor="none", markersize=9))
        labels.append("measured (lines: computed)")
    if banded:
        handles.append(Patch(color="0.5", alpha=0.3, linewidth=0))
        labels.append("95 % CI" if metric != "speedup" else "CI (conservative)")
    if noisy:
        handles.append(Line2D([], [], marker="o", linestyle="", color="0.3", markerfacecolor="white", markersize=6))
        labels.append(HOLLOW_LABEL)
    if failures:
        handles.append(Line2D([], [], marker="x", linestyle="", color="0.3", markersize=7, markeredgewidth=2))
        labels.append("no timing (status shown)")
    if baseline is not None:  # the speed-up plot's reference line
        handles.append(Line2D([], [], color="0.2", linewidth=1.1, linestyle="--"))
        labels.append(f"1× = as fast as {baseline}\n(above: faster)")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8.5, frameon=False)


def _texts(ax: Axes, run: Run, table: PivotTable, metric: Metric, lines: Sequence[Series]) -> None:
    """Title (what, on which device), subtitle (the table), and below the axes what was not plotted and the run."""
    title = f"{_title(table, metric)} · {device_name(run)}"
    # Offsets in points, not axes fractions: the layout holds whatever the figure's size.
    for text, dy, size, weight in ((title, 22, 12.0, "bold"), (table.title, 8, 9.5, "normal")):
        ax.annotate(
            text,
            xy=(0, 1),
            xycoords="axes fraction",
            xytext=(0, dy),
            textcoords="offset points",
            fontsize=size,
            fontweight=weight,
        )
    notes = [
        f"not plotted: {s.label} ({', '.join(sorted({p.status for p in s.failures}))} at every length)"
        for s in lines
        if not s.values and s.failures
    ]
    notes.append(f"run {safe_text(run.run_id, lines=False)}")  # stored text: no control character in a figure
    ax.annotate(
        "\n".join(notes),
        xy=(0, 0),
        xycoords="axes fraction",
        xytext=(0, -34),
        textcoords="offset points",
        va="top",
        fontsize=7.5,
        color="0.4",
    )


def _draw(
    run: Run, table: PivotTable, metric: Metric, lines: Sequence[Series], colours: dict[str, int]
) -> bytes | None:
    """One PNG, or None when no row has a value to draw."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    values = [p.value for s in lines for p in s.values if p.value is not None]
    if not values:
        return None
    fig = Figure(figsize=(8.4, 4.8), dpi=120)
    FigureCanvasAgg(fig)  # Agg, explicitly: a raster canvas that never talks to a display
    ax = fig.add_subplot()
    log_y = metric != "memory" or min(values) > 0  # a 0-byte peak (a CPU RSS reading) has no logarithm
    ax.set_xscale("log")
    ax.set_yscale("log" if log_y else "linear")
    # The x range before any line: one length alone is a zero-width range, which log axes cannot transform.
    seq_lens = sorted({p.n for s in lines for p in s.points})
    _x_axis(ax, table, seq_lens)
    banded, noisy = _plot_lines(ax, lines, colours)
    if metric == "speedup":
        ax.axhline(1.0, color="0.2", linewidth=1.1, linestyle="--", zorder=1)
    failing = _failures(lines)
    _y_axis(ax, table, metric, log_y, len(failing))
    ax.tick_params(labelsize=8.5)
    ax.grid(True, which="major", color="0.85", linewidth=0.8, zorder=0)
    ax.grid(True, which="minor", axis="y", color="0.93", linewidth=0.5, zorder=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    _mark_failures(ax, failing, colours, seq_lens[0])
    measured = any(s.measured and s.values for s in lines)
    _legend(ax, metric, banded, noisy, bool(failing), table.baseline if metric == "speedup" else None, measured)
    _texts(ax, run, table, metric, lines)
    buffer = io.BytesIO()
    # No "Software" text chunk: the same run renders to the same bytes on the same matplotlib.
    plain_texts(fig)
    fig.savefig(buffer, format="png", bbox_inches="tight", pad_inches=0.15, metadata={"Software": None})
    return buffer.getvalue()


def _colour_indices(tables: Sequence[PivotTable]) -> dict[str, int]:
    """One colour per row label across the whole run, so a model keeps its colour from plot to plot."""
    order: dict[str, int] = {}
    for table in tables:
        for label, _ in table.rows:
            order.setdefault(label, len(order))
    return order


def render_plots(reading: Reading) -> list[Plot]:
    """Every plot of a run: for each pivot table, latency, memory, throughput and (with a baseline) speed-up; a
    roofline per kind of device and dtype; and a capacity figure per table of capacity rows.
    A plot with nothing to draw (no case timed) is left out. Raises ``PlotsUnavailable`` without matplotlib."""
    notice = missing_matplotlib()
    if notice is not None:
        raise PlotsUnavailable(notice, hint=INSTALL_HINT)
    run, tables = reading.run, reading.tables
    colours = _colour_indices(tables)
    plots: list[Plot] = []
    names: set[str] = set()
    for table in tables:
        stem = slug(table.title)
        while stem in names:  # two tables with one title (cannot happen today) must not overwrite each other
            stem += "-2"
        names.add(stem)
        for metric in METRICS:
            if metric == "speedup" and not table.baseline:
                continue
            png = _draw(run, table, metric, series(table, metric), colours)
            if png is not None:
                title = f"{_title(table, metric)} · {table.title}"
                plots.append(Plot(metric, table.title, f"{metric}-{stem}.png", title, png))
    # A roofline per kind of device and dtype, over every table's rows (issue 27).
    for roof in roofline_plots(reading, colours):
        plots.append(Plot("roofline", roof.group, roof.filename, roof.title, roof.png))
    # Capacity under the memory budget, and its tokens/s, against n (issue 41).
    for figure in capacity_plots(run, reading.capacity, colours):
        plots.append(Plot("capacity", figure.group, figure.filename, figure.title, figure.png))
    return plots


def plots_or_notice(reading: Reading) -> tuple[list[Plot], str | None]:
    """``render_plots``, or no plots and the one-line notice when matplotlib is missing."""
    try:
        return render_plots(reading), None
    except PlotsUnavailable as exc:
        return [], exc.message


class Png(Protocol):
    """Anything drawn to a PNG with a file name: a run's ``Plot``, a history page."""

    @property
    def filename(self) -> str: ...

    @property
    def png(self) -> bytes: ...


def write_plots(plots: Sequence[Png], folder: Path, *, in_run: bool = False) -> list[Path]:
    """Write each plot as ``folder/<filename>`` (atomically: a reader never sees half a PNG). ``in_run``: the
    folder is a run folder's plots/, which must not be a link (nothing is written out of a run folder)."""
    try:
        if in_run:
            make_subfolder(folder)
        else:
            folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for plot in plots:
            path = folder / plot.filename
            write_atomic(path, plot.png)
            paths.append(path)
    except OSError as exc:
        raise AttnbenchError(
            f"cannot write plots to {folder}: {exc.strerror or exc}", hint="choose a writable folder with --plots-dir"
        ) from None
    return paths


def write_run_plots(reading: Reading, folder: Path) -> tuple[list[Path], str | None]:
    """For ``sweep``: draw and write every plot, never raising. Returns the paths written and, when plots could
    not be drawn, the line to print instead (a notice without matplotlib, a warning on any failure)."""
    try:
        plots, notice = plots_or_notice(reading)
        if notice is not None:
            return [], f"note: {notice}"
        return write_plots(plots, folder, in_run=True), None
    # Plots are an extra drawn after the rows are safe on disk: whatever breaks in matplotlib (a font, a backend,
    # a bug of ours) must cost only the plots, never the run or its exit code. Ctrl-C still propagates.
    except Exception as exc:
        return [], plots_not_written(exc)


def plots_not_written(exc: Exception) -> str:
    """The warning shown instead of a run's plots when drawing or writing them failed: the run itself is saved."""
    reason = exc.message if isinstance(exc, AttnbenchError) else f"{type(exc).__name__}: {exc}"
    return f"warning: plots not drawn ({reason}); the run is saved; retry with 'attnbench report RUN --plots'"
