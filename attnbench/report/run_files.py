"""The files a sweep leaves beside its rows: summary.csv, summary.md and plots/*.png, rendered from what is stored.

Rendered from the run folder itself (never from rows held in memory), so the summaries say exactly what
``attnbench report`` would say about the same folder; the folder is read once (``analysis.reading``) for every file,
and that reading is handed back for the caller to show.
"""

from __future__ import annotations

from pathlib import Path

from attnbench.analysis.reading import Reading
from attnbench.core.text import safe_text
from attnbench.report.markdown import render_markdown
from attnbench.report.plots import write_run_plots
from attnbench.report.rows import render_csv
from attnbench.results.files import write_atomic
from attnbench.results.store import PLOTS, SUMMARY_CSV, SUMMARY_MD, load_run


def write_run_files(folder: Path, *, plots: bool = True) -> tuple[Reading, list[Path], str | None]:
    """Write the summaries, then the plots (unless ``plots`` is false: ``sweep --no-plots``, for a CI gate that
    reads only the rows). Returns the run's reading, the paths written and, when plots could not be drawn, the one
    line to show instead: plots come last and never raise, so a missing matplotlib or a drawing failure costs only
    the plots, never the run or its exit code."""
    reading = Reading.of(load_run(folder))
    paths = [folder / SUMMARY_CSV, folder / SUMMARY_MD]
    write_atomic(paths[0], render_csv(reading))
    # Escaped as the terminal would show it: summary.md is read with cat and less as often as in an editor.
    write_atomic(paths[1], safe_text(render_markdown(reading)))
    if not plots:
        return reading, paths, None
    drawn, problem = write_run_plots(reading, folder / PLOTS)
    return reading, [*paths, *drawn], problem
