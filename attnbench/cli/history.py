"""``attnbench history RUN_OR_FOLDER...``: each case's trend over many runs, and where its level stepped (needs no
torch); ``--fail-on-step`` alerts on a step the newest run confirmed, ``--bisect`` says where to look for one.

Exit codes: 0, 1 with ``--fail-on-step`` when the newest run confirmed a step that made things worse, 2 bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from attnbench.cli.common import (
    LATEST_HELP,
    OutputOpt,
    emit,
    handles_errors,
    print_warnings,
    runs_alias,
    stderr,
    stdout,
    write_or_print,
)
from attnbench.core.errors import EXIT_CASE_FAILED

if TYPE_CHECKING:
    from attnbench.report.formats import Format, HistoryView
    from attnbench.workflows.history import Traced

RunsArg = Annotated[
    list[Path],
    typer.Argument(
        help=f"Run folders, or folders that hold run folders (a rolling history); {LATEST_HELP}",
        show_default=False,
        callback=runs_alias,
    ),
]


@handles_errors
def history(
    runs: RunsArg,
    case: Annotated[
        list[str] | None,
        typer.Option("--case", help="Only cases whose key or label matches this pattern (* ?), repeatable."),
    ] = None,
    metric: Annotated[
        Literal["median", "tokens_per_s", "peak_mem", "gbps"],
        typer.Option("--metric", help="median time per call, tokens/s, peak memory, or GB/s (rows with bytes moved)."),
    ] = "median",
    format: Annotated[Literal["table", "md", "csv", "html", "json"], typer.Option("--format", "-f")] = "table",
    output: OutputOpt = None,
    plots: Annotated[
        Path | None,
        # --plots-dir, as `report` names the folder its plots go to; --plots is the name it had before (an alias).
        typer.Option(
            "--plots-dir",
            "--plots",
            help="Write one panel per case (CI bars, steps marked) as PNGs here (--plots: the old name).",
        ),
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
    fail_on_step: Annotated[
        bool,
        typer.Option(
            "--fail-on-step", help="Exit 1 when the newest run confirms a step that made things worse, with an alert."
        ),
    ] = False,
    alert: Annotated[
        Path | None,
        typer.Option("--alert", help="Write the alert (markdown) here; nothing is written when there is none."),
    ] = None,
    bisect: Annotated[
        bool,
        typer.Option("--bisect", help="For each step that made things worse: its commits and a git bisect command."),
    ] = False,
) -> None:
    """Order runs by commit (or time), show each case's trend with its CIs, and find the step changes: where a
    case's level moved by more than the noise between runs. Runs from different environments are separate
    segments, never mixed."""
    from attnbench.report.formats import HISTORY_FORMATS
    from attnbench.workflows.history import HistoryRequest, trace

    fmt = HISTORY_FORMATS[format]
    request = HistoryRequest(
        runs=tuple(runs),
        metric=metric,
        patterns=tuple(case or ()),
        min_change=min_change,
        repo=repo,
        skip_bad=skip_bad,
        figures=fmt.figures,
        plots_dir=plots,
        bisect=bisect,
        alerts=fail_on_step,
        alert=alert,
    )
    _show(trace(request), fmt, output, json_out=format == "json", alert=alert, fail_on_step=fail_on_step)


def _show(
    traced: Traced,
    fmt: Format[HistoryView],
    output: str | None,
    *,
    json_out: bool,
    alert: Path | None,
    fail_on_step: bool,
) -> None:
    """Everything ``history`` prints, in its order: why there are no panels or the panels written, the history, the
    warnings, the bisect hints, and the alert (to ``--alert`` or stderr; exit 1 with ``--fail-on-step``)."""
    if traced.notice is not None:
        stderr.print(f"note: {traced.notice}", markup=False)
    for path in traced.wrote:
        stderr.print(f"wrote {path}", markup=False)
    emit(fmt, traced.view, output, reads=traced.reads)
    print_warnings(traced.warnings)
    if traced.bisect is not None:
        # With -f json stdout is one JSON document a script parses, so the hint goes to stderr beside the warnings.
        (stderr if json_out else stdout).print(traced.bisect, markup=False)
    if traced.alert is None:
        return
    if alert is not None:
        write_or_print(traced.alert, str(alert), reads=traced.reads)
    else:
        stderr.print(traced.alert, markup=False)
    if fail_on_step:
        stderr.print(f"alert: the newest run confirmed {traced.confirmed} new step(s) that made things worse")
        raise typer.Exit(EXIT_CASE_FAILED)
