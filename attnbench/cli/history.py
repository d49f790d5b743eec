"""``attnbench history RUN_OR_FOLDER...``: each case's trend over many runs, and where its level stepped (needs no
torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from attnbench.cli.common import OutputOpt, handles_errors, print_warnings, stderr, stdout, write_or_print

RunsArg = Annotated[
    list[Path],
    typer.Argument(help="Run folders, or folders that hold run folders (a rolling history).", show_default=False),
]


@handles_errors
def history(
    runs: RunsArg,
    case: Annotated[
        list[str] | None,
        typer.Option("--case", help="Only cases whose key or label matches this pattern (* ?), repeatable."),
    ] = None,
    metric: Annotated[
        Literal["median", "tokens_per_s", "peak_mem"],
        typer.Option("--metric", help="median time per call, tokens/s, or peak memory."),
    ] = "median",
    format: Annotated[Literal["table", "md", "csv", "html"], typer.Option("--format", "-f")] = "table",
    output: OutputOpt = None,
    plots: Annotated[
        Path | None,
        typer.Option("--plots", help="Write one panel per case (CI bars, steps marked) as PNGs here."),
    ] = None,
    min_change: Annotated[
        str | None,
        typer.Option("--min-change", help="Smallest step worth reporting, e.g. 5%.", show_default="any beyond noise"),
    ] = None,
    repo: Annotated[
        Path | None,
        typer.Option("--repo", help="Git checkout that orders the runs' commits.", show_default="this folder"),
    ] = None,
    skip_bad: Annotated[
        bool, typer.Option("--skip-bad", help="Leave out run folders that do not read, with a warning.")
    ] = False,
) -> None:
    """Order runs by commit (or time), show each case's trend with its CIs, and find the step changes: where a
    case's level moved by more than the noise between runs. Runs from different environments are separate
    segments, never mixed."""
    from attnbench.analysis.history import build_history
    from attnbench.analysis.thresholds import parse_fraction
    from attnbench.report.history import (
        history_tables,
        render_history_csv,
        render_history_html,
        render_history_markdown,
    )
    from attnbench.results.store import load_runs

    stored, warnings = load_runs(runs, skip_bad=skip_bad)
    change = 0.0 if min_change is None else parse_fraction(min_change, "--min-change")
    result = build_history(stored, metric=metric, patterns=tuple(case or ()), min_change=change, repo=repo)
    pictures = []
    if plots is not None or format == "html":
        from attnbench.report.history_plots import render_history_plots
        from attnbench.report.plots import PlotsUnavailable, write_plots

        try:
            pictures = render_history_plots(result)
        except PlotsUnavailable as exc:
            stderr.print(f"note: {exc.message} ({exc.hint})", markup=False)
        if plots is not None:
            for path in write_plots(pictures, plots):
                stderr.print(f"wrote {path}", markup=False)
    if format == "table" and output in (None, "-"):
        stdout.print(history_tables(result))
    elif format == "csv":
        write_or_print(render_history_csv(result), output)
    elif format == "html":
        write_or_print(render_history_html(result, [(p.filename, p.png) for p in pictures]), output)
    else:  # md, or a table written to a file (the markdown one, as with `report`)
        write_or_print(render_history_markdown(result), output)
    print_warnings([*warnings, *result.warnings])
