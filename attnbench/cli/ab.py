"""``attnbench ab CONFIG --base-python A --head-python B``: an interleaved A/B session and its paired verdict.

Exit codes: 0 no case slower (and none unclear), 1 a case slower, 2 bad input, 6 no case slower but some unclear.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.table import Table

from attnbench.cli.common import (
    ConfigArg,
    PlotsOpt,
    SetOpt,
    handles_errors,
    plots_wanted,
    print_json,
    print_warnings,
    print_wrote,
    stderr,
    stdout,
)
from attnbench.core.errors import AttnbenchError
from attnbench.core.units import format_change_interval, format_seconds, plural

if TYPE_CHECKING:
    from attnbench.analysis.paired import PairedComparison
    from attnbench.analysis.thresholds import Thresholds
    from attnbench.sweeps.interleaved import Session

_HERE = Path(sys.executable)


def _thresholds(fail_on: list[str] | None) -> Thresholds:
    from attnbench.analysis.thresholds import Thresholds, with_fail_on

    limits = with_fail_on(Thresholds(), fail_on)
    if limits.gated:
        raise AttnbenchError(
            f"--fail-on {limits.gated[0]}: ab judges the median time per call only",
            hint="use median:P% (e.g. median:5%); compare the run folders ab writes to gate the other metrics",
        )
    return limits


def judge(session: Session, thresholds: Thresholds) -> PairedComparison:
    """``analysis.paired``'s verdict on the session: each case by its paired rounds, or by status."""
    from attnbench.analysis.paired import judge_rounds, judge_session, judge_status, worst_status

    judged = []
    for case in session.plan.cases:
        threshold = thresholds.for_case(case)
        held = [session.blocks[role][case.key] for role in ("base", "head")]
        if any(h.failed is not None for h in held):
            base, head = (worst_status([] if h.failed is None else [(h.failed.status, h.failed.reason)]) for h in held)
            judged.append(judge_status(case.key, case, threshold, base, head))
            continue
        base_s, head_s, pairs = session.paired(case.key)
        judged.append(judge_rounds(case.key, case, base_s, head_s, threshold, pairs))
    return judge_session(judged, session.plan.request.rounds)


def _summaries(folder: Path, *, plots: bool) -> list[Path]:
    """summary.csv, summary.md and plots/ of a side's run folder, as ``sweep`` renders its own."""
    from attnbench.report.run_files import write_run_files

    _, paths, notice = write_run_files(folder, plots=plots)
    if notice is not None:
        stderr.print(notice, markup=False)
    return paths


def _table(comparison: PairedComparison) -> Table:
    table = Table(title=f"ab: head / base, {plural(comparison.rounds, 'round')}", title_justify="left")
    numbers = ("base", "head", "head/base", "rounds", "pairs")
    for column in ("case", "base", "head", "head/base", "95 % interval", "rounds", "pairs", "answer", "why"):
        table.add_column(column, justify="right" if column in numbers else "left")
    for c in comparison.cases:
        interval = "" if c.ci_low is None or c.ci_high is None else format_change_interval(c.ci_low - 1, c.ci_high - 1)
        table.add_row(
            c.key,
            format_seconds(c.base_s) if c.base_s is not None else c.base_status,
            format_seconds(c.head_s) if c.head_s is not None else c.head_status,
            "" if c.ratio is None else f"{c.ratio:.3f}",
            interval,
            str(len(c.ratios)),
            str(len(c.pair_ratios) or (1 if c.ratios else 0)),
            c.answer,
            c.note,
        )
    return table


@handles_errors
def ab(
    config: ConfigArg = None,
    base_python: Annotated[
        Path,
        typer.Option(
            "--base-python", help="The base side's Python interpreter (attnbench installed).", show_default="this one"
        ),
    ] = _HERE,
    head_python: Annotated[
        Path,
        typer.Option(
            "--head-python", help="The head side's Python interpreter (attnbench installed).", show_default="this one"
        ),
    ] = _HERE,
    out: Annotated[
        Path, typer.Option("--out", help="Folder that receives both sides' run folders (OUT/base/, OUT/head/).")
    ] = Path("results/ab"),
    rounds: Annotated[
        int, typer.Option("--rounds", help="Judged rounds: each one block a side per case, after a warm-up round.")
    ] = 12,
    block: Annotated[float, typer.Option("--block", help="Seconds of sampling in each side's block.")] = 0.1,
    pair_rounds: Annotated[
        int | None,
        typer.Option(
            "--pair-rounds",
            help="Judged rounds per worker pair: then both sides' workers are replaced by fresh processes "
            "(0: one pair for the whole session).",
            show_default="2",
        ),
    ] = None,
    fail_on: Annotated[
        list[str] | None,
        typer.Option(
            "--fail-on",
            help="Change a case may show before it is slower or faster: median:P%.",
            show_default="median:5%",
        ),
    ] = None,
    overrides: SetOpt = None,
    plots: PlotsOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress lines.")] = False,
    format: Annotated[Literal["table", "json"], typer.Option("--format", "-f")] = "table",
) -> None:
    """Time CONFIG's cases alternately in two Python environments, in one session, and judge the paired ratios
    head / base per case: faster, slower, same or unclear.

    Exit 1 when a case is slower, 6 when none is but some is unclear (its interval straddles the threshold), 0
    otherwise. Both sides' runs are written under --out for compare, history and publish.
    """
    from attnbench.sweeps.interleaved import AbRequest, close_sides, plan_ab, run_session, start_sides, write_runs

    draw_plots = plots_wanted(plots)
    thresholds = _thresholds(fail_on)
    request = AbRequest(
        config,
        out,
        base_python,
        head_python,
        overrides=tuple(overrides or ()),
        rounds=rounds,
        block_s=block,
        pair_rounds=pair_rounds,
    )
    plan = plan_ab(request)
    print_warnings(plan.sweep.warnings)
    if not quiet:
        stderr.print(
            f"ab: {plural(len(plan.cases), 'case')} × {rounds} rounds in {plural(plan.worker_pairs, 'worker pair')} "
            f"(each after a warm-up round) on {plan.sweep.device}, {plural(plan.settings.threads or 0, 'thread')}; "
            f"base {plan.pythons[0]}, head {plan.pythons[1]}",
            markup=False,
            highlight=False,
        )
    sides = start_sides(plan)
    done = False
    try:

        def on_round(round_: int, total: int, pair: int) -> None:
            if not quiet:
                what = f"worker pair {pair + 1}: warm-up round" if round_ == 0 else f"round {round_} of {total}"
                stderr.print(f"ab: {what}", markup=False, highlight=False)

        session = run_session(plan, sides, on_round)
        done = True
    finally:
        close_sides(sides, now=not done)
    comparison = judge(session, thresholds)
    folders = write_runs(session)
    wrote = [path for folder in folders.values() for path in _summaries(folder, plots=draw_plots)]
    if format == "json":
        data = {"schema": "attnbench.ab/1", **comparison.to_dict(), "runs": {k: str(v) for k, v in folders.items()}}
        print_json(data)
    else:
        stdout.print(_table(comparison))
        counts = ", ".join(f"{len(comparison.of(a))} {a}" for a in ("slower", "unclear", "faster", "same"))
        stdout.print(f"ab: {comparison.answer} ({counts})", markup=False, highlight=False)
        print_wrote([*folders.values(), *wrote])
        stdout.print(
            f"compare them: attnbench compare {folders['base']} {folders['head']}", markup=False, highlight=False
        )
    print_warnings(comparison.warnings)
    if comparison.exit_code:
        raise typer.Exit(comparison.exit_code)
