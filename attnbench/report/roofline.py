"""The roofline of a run (Williams, Waterman & Patterson 2009): each timed row a point at its arithmetic intensity
(useful FLOPs per compulsory byte, ``core.traffic``) and its achieved FLOP/s, under the device's two ceilings — the
compute peak for the dtype (flat) and the memory bandwidth times the intensity (sloped), each the calibrated figure
or the vendor's, named in the legend. One figure per kind of device and dtype; whole-sequence modes and decode are
marked apart, since decode sits far left (a few FLOPs per byte of weights and KV cache) where bandwidth is the
ceiling. A row that ran faster than its roofline time (``analysis.efficiency.predict``: measured / predicted
below 1) is ringed in red, round where the prediction is memory-bound (its bytes likelier came from cache),
square where compute-bound (its FLOP count or peak likelier wrong). Pure rendering: PNG bytes from stored rows,
matplotlib's Agg canvas, no pyplot.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from attnbench.analysis.efficiency import (
    BandwidthPeak,
    Peak,
    PeakTable,
    achieved_flops_per_s,
    arithmetic_intensity,
)
from attnbench.analysis.reading import Reading
from attnbench.core.units import format_bandwidth, format_flops
from attnbench.report.plot_style import device_name, line_style, plain_texts, slug
from attnbench.results.records import Result

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from attnbench.results.records import Run

# Where no calibration or vendor figure is known (a CPU before `attnbench calibrate`), the best the run's own rows
# reached stands in for each ceiling: a floor under the true one, drawn dotted and named so.
MEASURED_SOURCE = "best in this run: the true ceiling is at least this"

# Whole-sequence modes filled, decode hollow (and its own marker), so the two read apart at a glance.
_MODE_MARKERS = {"forward": "o", "train": "s", "backward": "D", "decode": "^"}


# A row that beats its roofline time: ringed, round for a memory-bound prediction, square for a compute-bound one.
_BELOW_MARKERS = {"memory": "o", "compute": "s"}
_BELOW_LABELS = {
    "memory": "faster than the roofline, memory-bound: bytes from cache?",
    "compute": "faster than the roofline, compute-bound: FLOPs or peak wrong?",
}


def below_roofline(reading: Reading, results: Sequence[Result]) -> dict[str, Literal["compute", "memory"]]:
    """Those of ``results`` (by case key) that ran faster than their roofline time, each with the ceiling its
    prediction sits under: the likelier cause."""
    faster = reading.faster_than_roofline
    return {r.case.key: faster[r.case.key][0].bound for r in results if r.case.key in faster}


def _points(results: Sequence[Result]) -> list[tuple[Result, float, float]]:
    """(row, intensity, achieved FLOP/s) of every ok, uncontended row that has both."""
    points = []
    for result in results:
        if not result.ok or result.contended:
            continue
        intensity, achieved = arithmetic_intensity(result), achieved_flops_per_s(result)
        if intensity is not None and achieved is not None and intensity > 0 and achieved > 0:
            points.append((result, intensity, achieved))
    return points


@dataclass(frozen=True)
class Roofline:
    """One drawn roofline: its title and file name, and the PNG."""

    group: str
    filename: str
    title: str
    png: bytes


def _colour_for(model: str, colours: dict[str, int]) -> str:
    """A model's colour: the index its row label has in the run's other plots, else a new one."""
    if model not in colours:
        colours[model] = len(colours)
    return line_style(colours[model])[0]


def roofline_plots(reading: Reading, colours: dict[str, int]) -> list[Roofline]:
    """One roofline per (kind of device, dtype) with a point to draw; ``colours`` maps labels to colour indices
    (the run's other plots'), and a model not in it is added."""
    groups: dict[tuple[str, str], list[Result]] = {}
    for result in reading.results:
        groups.setdefault((result.case.device.split(":")[0], result.case.dtype), []).append(result)
    plots = []
    for (device, dtype), rows in groups.items():
        points = _points(rows)
        if not points:
            continue
        title = f"roofline · {dtype} · {device}"
        png = _draw(reading, dtype, points, colours, title)
        plots.append(Roofline(title, f"roofline-{slug(f'{dtype}-{device}')}.png", title, png))
    return plots


def ceilings(
    peaks: PeakTable, dtype: str, points: Sequence[tuple[Result, float, float]]
) -> tuple[Peak | None, BandwidthPeak | None, bool]:
    """The compute and bandwidth ceilings the roofline draws (``peaks``: the run's), and whether they are the run's
    own best (no calibrated or vendor figure known, ``MEASURED_SOURCE``): a roofline without roofs reads as
    nothing."""
    compute, bandwidth = peaks.for_dtype(dtype), peaks.bandwidth()
    if (compute is not None and bandwidth is not None) or not points:
        return compute, bandwidth, False
    if compute is None:
        compute = Peak(max(y for _, _, y in points), MEASURED_SOURCE)
    if bandwidth is None:
        bandwidth = BandwidthPeak(max(y / x for _, x, y in points), MEASURED_SOURCE)
    return compute, bandwidth, True


def _draw(
    reading: Reading, dtype: str, points: Sequence[tuple[Result, float, float]], colours: dict[str, int], title: str
) -> bytes:
    fig = roofline_figure(reading, dtype, points, colours)
    buffer = io.BytesIO()
    plain_texts(fig)
    fig.savefig(buffer, format="png", bbox_inches="tight", pad_inches=0.15, metadata={"Software": None})
    return buffer.getvalue()


def roofline_figure(
    reading: Reading, dtype: str, points: Sequence[tuple[Result, float, float]], colours: dict[str, int]
) -> Figure:
    """The roofline figure of one kind of device and dtype."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    compute, bandwidth, measured = ceilings(reading.peaks, dtype, points)
    fig = Figure(figsize=(8.4, 5.0), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_xscale("log")
    ax.set_yscale("log")
    low_x, high_x = _x_range(points, compute, bandwidth)
    handles = _draw_roofs(ax, compute, bandwidth, measured, low_x, high_x)
    _draw_points(ax, points, colours)
    below = below_roofline(reading, [r for r, _, _ in points])
    _mark_below(ax, points, below)
    handles += _legend_handles(points, colours, below)
    top = max([*(y for _, _, y in points), compute.flops_per_s if compute else 0.0]) * 3
    ax.set_xlim(low_x, high_x)
    ax.set_ylim(min(y for _, _, y in points) / 3, top)
    _finish(fig, ax, handles, reading.run, dtype, measured)
    return fig


def _x_range(
    points: Sequence[tuple[Result, float, float]], compute: Peak | None, bandwidth: BandwidthPeak | None
) -> tuple[float, float]:
    """The intensities drawn: every point's, with room either side, and the ridge point's when both roofs are known."""
    xs = [x for _, x, _ in points]
    low_x, high_x = min(xs) / 3, max(xs) * 3
    if compute is not None and bandwidth is not None:  # room for the ridge point
        ridge = compute.flops_per_s / bandwidth.bytes_per_s
        low_x, high_x = min(low_x, ridge / 3), max(high_x, ridge * 3)
    return low_x, high_x


def _draw_roofs(
    ax: Axes, compute: Peak | None, bandwidth: BandwidthPeak | None, measured: bool, low_x: float, high_x: float
) -> list[Any]:
    """The sloped (memory) and flat (compute) roofs, dotted when they are the run's own best; their legend lines."""
    handles: list[Any] = []
    if bandwidth is not None:
        span = [low_x, high_x]
        if compute is not None:  # the sloped roof ends where it meets the flat one (the ridge point)
            span = [low_x, min(high_x, compute.flops_per_s / bandwidth.bytes_per_s)]
        (line,) = ax.plot(
            span, [bandwidth.bytes_per_s * x for x in span], color="0.35", linestyle=":" if measured else "--",
            linewidth=1.2,
        )  # fmt: skip
        line.set_label(f"memory {format_bandwidth(bandwidth.bytes_per_s)} ({bandwidth.source})")
        handles.append(line)
    if compute is not None:
        line = ax.axhline(compute.flops_per_s, color="0.15", linestyle=":" if measured else "-", linewidth=1.2)
        line.set_label(f"compute {format_flops(compute.flops_per_s)} ({compute.source})")
        handles.append(line)
    return handles


def _draw_points(ax: Axes, points: Sequence[tuple[Result, float, float]], colours: dict[str, int]) -> None:
    """A point per row: its model's colour, its mode's marker (hollow for decode)."""
    for result, x, y in points:
        colour = _colour_for(result.case.model, colours)
        marker = _MODE_MARKERS.get(result.case.mode, "o")
        hollow = result.case.mode == "decode"
        ax.scatter(
            [x],
            [y],
            s=34,
            marker=marker,
            facecolors="none" if hollow else colour,
            edgecolors=colour,
            linewidths=1.3,
            zorder=3,
        )


def _mark_below(
    ax: Axes, points: Sequence[tuple[Result, float, float]], below: dict[str, Literal["compute", "memory"]]
) -> None:
    """A red ring around each point far below its roof, its shape saying which roof."""
    for result, x, y in points:
        bound = below.get(result.case.key)
        if bound is not None:
            ax.scatter([x], [y], s=150, marker=_BELOW_MARKERS[bound], facecolors="none", edgecolors="#b42318", zorder=4)


def _legend_handles(
    points: Sequence[tuple[Result, float, float]],
    colours: dict[str, int],
    below: dict[str, Literal["compute", "memory"]],
) -> list[Any]:
    """The legend's lines after the roofs': the rings drawn, then each model's colour, then each mode's marker."""
    from matplotlib.lines import Line2D

    handles: list[Any] = []
    for bound in dict.fromkeys(below.values()):
        handles.append(
            Line2D(
                [],
                [],
                color="#b42318",
                marker=_BELOW_MARKERS[bound],
                markerfacecolor="none",
                markersize=10,
                linestyle="",
                label=_BELOW_LABELS[bound],
            )
        )
    for model in dict.fromkeys(r.case.model for r, _, _ in points):
        handles.append(Line2D([], [], color=_colour_for(model, colours), marker="o", linestyle="", label=model))
    for mode in dict.fromkeys(r.case.mode for r, _, _ in points):
        hollow = mode == "decode"
        handles.append(
            Line2D(
                [],
                [],
                color="0.3",
                marker=_MODE_MARKERS.get(mode, "o"),
                linestyle="",
                label=mode,
                markerfacecolor="none" if hollow else "0.3",
            )
        )
    return handles


def _finish(fig: Figure, ax: Axes, handles: list[Any], run: Run, dtype: str, measured: bool) -> None:
    """Labels, grid, legend, title, and the note under the x label."""
    ax.set_xlabel("arithmetic intensity (useful FLOPs per compulsory byte, log)")
    ax.set_ylabel("achieved FLOP/s (log)")
    ax.grid(True, which="major", color="0.88", linewidth=0.8, zorder=0)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.legend(handles=handles, fontsize=7.5, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    fig.suptitle(f"Roofline · {device_name(run)} · {dtype}", fontsize=12, fontweight="bold", x=0.02, ha="left")
    note = ""
    if measured:
        note = "ceilings dotted: the run's own best, no calibration known (`attnbench calibrate` measures them)"
    # Under the x label, in points from the axes, so the two never overlap whatever the label's height.
    ax.annotate(
        f"run {run.run_id}. {note}".strip(), xy=(0, 0), xycoords="axes fraction", xytext=(0, -40),
        textcoords="offset points", va="top", fontsize=7.5, color="0.4",
    )  # fmt: skip
