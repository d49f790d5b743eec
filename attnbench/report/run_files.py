"""The files a sweep or a merge leaves beside its rows: summary.csv, summary.md and plots/*.png.

Rendered from the run as stored (a sweep reads its folder back; a merge hands down the rows it read from its
inputs and writes verbatim), so the summaries say exactly what ``attnbench report`` would say about the same folder.
The run is read once (``analysis.reading``) for every file; ``render_run_files`` turns that reading into a frozen
``RunFiles`` and writes nothing, so whoever holds the folder writes them (``results``) without calling back here.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from attnbench.analysis.reading import Reading
from attnbench.core.text import safe_text
from attnbench.report.markdown import render_markdown
from attnbench.report.plots import plots_not_written, plots_or_notice
from attnbench.report.rows import render_csv
from attnbench.results.files import write_files
from attnbench.results.store import PLOTS, SUMMARY_CSV, SUMMARY_MD, load_run


@dataclass(frozen=True)
class RunFiles:
    """A run's files, rendered: ``summaries`` and ``plots`` as (name inside the run folder, content), and, when
    plots could not be drawn, the one line to show instead."""

    summaries: tuple[tuple[str, str], ...]
    plots: tuple[tuple[str, bytes], ...] | None = None  # None: not drawn
    problem: str | None = None

    @property
    def files(self) -> tuple[tuple[str, str | bytes], ...]:
        """Every file, summaries first: the plots come last, so the summaries are safe should they fail."""
        return (*self.summaries, *(self.plots or ()))

    @property
    def subfolders(self) -> tuple[str, ...]:
        """The folders the files go into: plots/ whenever plots were drawn, even none."""
        return () if self.plots is None else (PLOTS,)


def render_run_files(reading: Reading, *, plots: bool = True) -> RunFiles:
    """The summaries and (unless ``plots`` is false: ``sweep --no-plots``, for a CI gate that reads only the rows)
    the plots of a run. Drawing never raises: a missing matplotlib or a drawing failure costs only the plots, never
    the run or its exit code."""
    # summary.md escaped as the terminal would show it: it is read with cat and less as often as in an editor.
    summaries = ((SUMMARY_CSV, render_csv(reading)), (SUMMARY_MD, safe_text(render_markdown(reading))))
    if not plots:
        return RunFiles(summaries)
    # Plots are an extra drawn after the rows are safe on disk: whatever breaks in matplotlib (a font, a backend,
    # a bug of ours) must cost only the plots. Ctrl-C still propagates.
    try:
        drawn, notice = plots_or_notice(reading)
    except Exception as exc:
        return RunFiles(summaries, problem=plots_not_written(exc))
    if notice is not None:
        return RunFiles(summaries, problem=f"note: {notice}")
    return RunFiles(summaries, tuple((f"{PLOTS}/{plot.filename}", plot.png) for plot in drawn))


def write_run_files(folder: Path, *, plots: bool = True) -> tuple[Reading, list[Path], str | None]:
    """Read ``folder`` back, render its files and write them into it. Returns the run's reading, the paths written
    and, when plots could not be drawn or written, the one line to show instead: a summary the disk refuses raises,
    a plot never does."""
    reading = Reading.of(load_run(folder))
    rendered = render_run_files(reading, plots=plots)
    paths = write_files(folder, rendered.summaries)
    if rendered.plots is None:
        return reading, paths, rendered.problem
    try:
        paths += write_files(folder, rendered.plots, rendered.subfolders)
    except Exception as exc:
        return reading, paths, plots_not_written(exc)
    return reading, paths, rendered.problem
