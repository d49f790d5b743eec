"""``attnbench report RUN``: a stored run as a table, CSV, markdown, JSON, HTML, raw samples or dashboard JSON.

Needs no torch: every renderer reads the run folder alone.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from attnbench.cli.common import OutputOpt, RunArg, emit, handles_errors, print_warnings, stderr
from attnbench.core.errors import AttnbenchError

if TYPE_CHECKING:
    from attnbench.report.formats import RunView

ReportFormat = Literal["table", "csv", "md", "json", "html", "samples", "gab", "bmf", "parquet"]


@handles_errors
def report(
    run: RunArg,
    format: Annotated[
        ReportFormat,
        typer.Option(
            "--format",
            "-f",
            help="table, csv, md, json; parquet (the summary frame: every csv column typed, options as columns; "
            "needs pyarrow and -o FILE); html (one self-contained page with the plots); samples (every raw sample: "
            "JSON lines, or CSV/Parquet by the -o name); gab, bmf (github-action-benchmark, Bencher JSON).",
        ),
    ] = "table",
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="Model the speed-ups are against.", show_default="first recurrent model"),
    ] = None,
    output: OutputOpt = None,
    telemetry: Annotated[bool, typer.Option("--telemetry", help="Show the per-case telemetry table.")] = False,
    plots: Annotated[bool, typer.Option("--plots", help="Also write PNG plots (needs matplotlib).")] = False,
    plots_dir: Annotated[
        Path | None,
        typer.Option("--plots-dir", help="Where --plots writes; implies --plots.", show_default="RUN/plots"),
    ] = None,
) -> None:
    """Render a stored run: table, CSV, markdown, JSON, HTML, raw samples or dashboard JSON (needs no torch)."""
    from attnbench.report.formats import REPORT_FORMATS, TELEMETRY_FORMATS, RunView
    from attnbench.results.store import load_run

    stored = load_run(run)
    models = list(dict.fromkeys(r.case.model for r in stored.results))
    if baseline is not None and baseline not in models:
        raise AttnbenchError(
            f"--baseline: no model {baseline!r} in this run", hint=f"the run's models: {', '.join(models)}"
        )
    print_warnings(stored.warnings)
    view = RunView.of(stored, baseline)
    if plots or plots_dir is not None or (REPORT_FORMATS[format].figures and not telemetry):
        view = _with_plots(view, plots or plots_dir is not None, plots_dir)
    if telemetry and format not in TELEMETRY_FORMATS:
        raise AttnbenchError(
            f"--telemetry renders a table (-f table) or markdown (-f md), not {format}",
            hint="the raw samples are in telemetry.jsonl; per-case figures are in the csv",
        )
    chosen = TELEMETRY_FORMATS[format] if telemetry else REPORT_FORMATS[format]
    emit(chosen, view, output, reads=[stored.folder])


def _with_plots(view: RunView, write: bool, plots_dir: Path | None) -> RunView:
    """``view`` with the run's plots drawn (for an HTML page), written as PNGs when ``write`` (``--plots``,
    ``--plots-dir``); when they cannot be drawn, the notice that says why, shown as a note."""
    from attnbench.report.plots import plots_or_notice, write_plots

    stored = view.stored
    figures, notice = plots_or_notice(view.reading)
    if notice is not None:
        stderr.print(f"note: {notice}", markup=False)
    elif write:
        for path in write_plots(figures, plots_dir or stored.folder / "plots", in_run=plots_dir is None):
            stderr.print(f"wrote {path}", markup=False)
    return replace(view, figures=tuple(figures), notice=notice or "")
