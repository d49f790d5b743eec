"""``attnbench history RUN_OR_FOLDER...``: each case's trend over many runs, and where its level stepped (needs no
torch); ``--fail-on-step`` alerts on a step the newest run confirmed, ``--bisect`` says where to look for one.

Exit codes: 0, 1 with ``--fail-on-step`` when the newest run confirmed a step that made things worse, 2 bad input.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from attnbench.cli.common import (
    LATEST_HELP,
    OutputOpt,
    emit,
    handles_errors,
    print_warnings,
    refuse_input_as_output,
    runs_alias,
    stderr,
    stdout,
    write_or_print,
)
from attnbench.core.errors import EXIT_CASE_FAILED, AttnbenchError
from attnbench.core.units import format_percent

if TYPE_CHECKING:
    from attnbench.analysis.alerts import StepEvent
    from attnbench.analysis.history import History
    from attnbench.report.alerts_md import Where
    from attnbench.report.history_plots import HistoryPlot

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
    from attnbench.analysis.history import build_history
    from attnbench.analysis.thresholds import parse_fraction
    from attnbench.report.formats import HISTORY_FORMATS, HistoryView
    from attnbench.results.store import load_runs

    stored, warnings = load_runs(runs, skip_bad=skip_bad)
    reads = [s.folder for s in stored]
    if alert is not None:
        check_alert_path(alert, reads)  # before anything is written: an alert replaces or removes only an alert
    change = 0.0 if min_change is None else parse_fraction(min_change, "--min-change")
    result = build_history(stored, metric=metric, patterns=tuple(case or ()), min_change=change, repo=repo)
    fmt = HISTORY_FORMATS[format]
    pictures = _pictures(result, plots) if plots is not None or fmt.figures else []
    emit(fmt, HistoryView(result, [(p.filename, p.png) for p in pictures]), output, reads=reads)
    print_warnings([*warnings, *result.warnings])
    # Where to look for a step's commit runs git and reads the run's config: once per step, though --bisect and the
    # alert both name it.
    wheres: dict[tuple[str, int, int], Where] = {}

    def look(event: StepEvent) -> Where:
        key = (event.key, event.segment, event.position)
        if key not in wheres:
            wheres[key] = where_to_look(result, event, repo)
        return wheres[key]

    if bisect:
        from attnbench.analysis.alerts import step_events
        from attnbench.report.alerts_md import render_bisect

        worse = [e for e in step_events(result) if e.worse]
        # With -f json stdout is one JSON document a script parses, so the hint goes to stderr beside the warnings.
        (stderr if format == "json" else stdout).print(render_bisect(worse, [look(e) for e in worse]), markup=False)
    if fail_on_step or alert is not None:
        from attnbench.analysis.alerts import alert_steps

        fresh = alert_steps(stored, result, patterns=tuple(case or ()), min_change=change, repo=repo)
        _raise_alert(result, fresh, look, alert, fail_on_step, reads)


def _pictures(result: History, folder: Path | None) -> list[HistoryPlot]:
    """One panel per case, written as PNGs into ``folder`` when it is given; none (with a note) without matplotlib."""
    from attnbench.report.history_plots import render_history_plots
    from attnbench.report.plots import PlotsUnavailable, write_plots

    pictures: list[HistoryPlot] = []
    try:
        pictures = render_history_plots(result)
    except PlotsUnavailable as exc:
        stderr.print(f"note: {exc.message} ({exc.hint})", markup=False)
    if folder is not None:
        for path in write_plots(pictures, folder):
            stderr.print(f"wrote {path}", markup=False)
    return pictures


def _raise_alert(
    result: History,
    fresh: list[StepEvent],
    look: Callable[[StepEvent], Where],
    alert: Path | None,
    fail_on_step: bool,
    reads: list[Path],
) -> None:
    """The alert for the new steps that made things worse: written to ``--alert`` (or stderr), exit 1 with
    ``--fail-on-step``; without one, an alert file of an earlier history is removed."""
    if fresh:
        from attnbench.report.alerts_md import render_alert

        text = render_alert(result, fresh, [look(e) for e in fresh])
        if alert is not None:
            write_or_print(text, str(alert), reads=reads)
        else:
            stderr.print(text, markup=False)
        if fail_on_step:
            stderr.print(f"alert: the newest run confirmed {len(fresh)} new step(s) that made things worse")
            raise typer.Exit(EXIT_CASE_FAILED)
    elif alert is not None and alert.exists():
        alert.unlink()  # an alert of an earlier history must not be posted again (check_alert_path: ours)


ALERT_HINT = (
    "--alert names the alert's own file: a new one, or one an earlier 'history --alert' wrote, which is replaced "
    "when the newest run confirms a step and removed when it does not"
)


def check_alert_path(alert: Path, reads: list[Path]) -> None:
    """``--alert`` names a file this command may replace or remove: a new or empty one, or an alert attnbench wrote
    (it starts with ``ALERT_MARKER``). A folder, a link, a file inside a run folder or any other file is refused,
    before anything is written: without a new step the alert file is deleted, and it must never be someone's."""
    from attnbench.report.alerts_md import ALERT_MARKER
    from attnbench.results.files import open_for_reading, refuse_special

    refuse_input_as_output(alert, reads, "--alert")
    try:
        refuse_special(alert)
        if not alert.exists():
            return
        marker = ALERT_MARKER.encode()
        with open_for_reading(alert, ALERT_HINT) as handle:
            head = handle.read(len(marker))
    except AttnbenchError as exc:
        raise AttnbenchError(f"--alert {exc.message}", hint=ALERT_HINT) from None
    if head and head != marker:
        raise AttnbenchError(
            f"--alert {alert}: not an alert attnbench wrote, so it is neither replaced nor removed", hint=ALERT_HINT
        )


def where_to_look(history: History, event: StepEvent, repo: Path | None) -> Where:
    """The bisect hint for ``event``, or a sentence saying why there is nothing to bisect. The one-case overrides
    are checked against the run's own config here (the CLI may read configs; analysis may not)."""
    from attnbench.analysis.alerts import representative_case
    from attnbench.analysis.bisect import bisect_hint, bisectable, gates_for, noise_floor_for, one_case_sets
    from attnbench.config.experiment import load_experiment_text, resolved_text
    from attnbench.core.text import md_code, md_text

    good, bad = event.last_good.run.commit, event.first_bad.run.commit
    if not good or not bad:
        return "the runs record no commit (sweep inside a git checkout to bisect)"
    if good == bad:
        return (
            f"both runs measured commit `{good[:12]}`, so the step is not in the code: the machine, its load or its "
            "software changed"
        )
    case = representative_case(history, event)
    if case is None:
        return "no case of the step has a value on both sides to sweep"
    run = event.first_bad.run
    try:
        # As stored (its users key says what each model the user brought was), narrowed to the one case.
        stored = resolved_text(run.config)
        pinned = load_experiment_text(stored, run.config_source, one_case_sets(case), force=True, stored=True)
        keys = [c.key for c in pinned.cases(case.device)]
    except AttnbenchError as exc:
        keys, why = [], exc.message
    else:
        why = f"it gives {len(keys)} cases"
    if keys != [case.key]:
        return (
            f"commits `{good[:12]}..{bad[:12]}`; the config cannot be narrowed to {md_code(case.label)} alone "
            f"({md_text(why)})"
        )
    config = None if run.config_source.startswith("builtin:") else run.config_source
    # One process a side at each commit: the spread the history measured between its runs of this case, or the
    # machine's calibrated floor the last good run recorded, whichever is wider.
    floor = noise_floor_for(history, event.segment, case, event.step)
    recorded = event.last_good.run.calibration
    if floor is not None and recorded is not None and recorded.noise is not None:
        floor = max(floor, recorded.noise.floor)
    if not bisectable(event.step.change, floor):
        return (
            f"commits `{good[:12]}..{bad[:12]}`; one run a commit cannot bisect this step of "
            f"{format_percent(event.step.change)}: {md_code(case.label)} moved ±{format_percent(floor or 0)} between "
            "two runs here, more than the room between half the step and the whole; sweep with timing.processes "
            "(e.g. 5) to bisect by hand"
        )
    return bisect_hint(
        case,
        good,
        bad,
        config=config,
        baseline=event.last_good.folder.resolve(),
        gates=gates_for(event.metric, event.step.change),
        noise_floor=floor,
        python=sys.executable,
        repo=repo,
    )
