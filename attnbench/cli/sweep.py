"""``attnbench sweep``: run an experiment into a run folder, show it as it goes, and render it at the end."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from attnbench.cli.common import (
    ConfigArg,
    SetOpt,
    SweepDeviceOpt,
    handles_errors,
    print_warnings,
    print_wrote,
    stderr,
    stdout,
)
from attnbench.cli.progress import SweepDisplay
from attnbench.cli.signals import Interrupts
from attnbench.core.errors import EXIT_CASE_FAILED, AttnbenchError
from attnbench.results.records import FAILED

if TYPE_CHECKING:
    from attnbench.measure.sweep import Sweep


@handles_errors
def sweep(
    config: ConfigArg = None,
    device: SweepDeviceOpt = None,
    out: Annotated[Path, typer.Option("--out", help="Folder that receives the run folder.")] = Path("results/runs"),
    overrides: SetOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="List the cases and stop.")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the paths written.")] = False,
    isolate: Annotated[
        bool | None,
        typer.Option("--isolate/--no-isolate", help="Each case in a worker process.", show_default="config's"),
    ] = None,
    resume: Annotated[
        Path | None, typer.Option("--resume", help="Finish an interrupted run folder.", show_default=False)
    ] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="With --resume: rerun non-ok cases.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Allow a grid above the 10000-case cap.")] = False,
    telemetry: Annotated[
        Literal["off", "basic", "full"] | None,
        typer.Option("--telemetry", help="Hardware telemetry: off, basic, full (+ GPM).", show_default="config's"),
    ] = None,
    label: Annotated[
        str, typer.Option("--label", help="A free label for this run, shown by history and compare.")
    ] = "",
    shard: Annotated[
        str | None,
        typer.Option(
            "--shard",
            help="Measure slice i of N (0 ≤ i < N) of the cases, split by a hash of each case's key.",
            show_default=False,
        ),
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(
            "--devices",
            help="One isolated worker per device, cases dealt from one queue: all, or cuda:0,cuda:1,… (cpu,cpu).",
            show_default=False,
        ),
    ] = None,
    allow_mixed_devices: Annotated[
        bool, typer.Option("--allow-mixed-devices", help="With --devices: allow GPUs of different models.")
    ] = False,
    inject_slowdown: Annotated[
        float,
        typer.Option(
            "--inject-slowdown",
            min=0.0,
            max=10.0,
            hidden=True,  # a validation aid for `compare`, not a measurement option
            help="CPU only: busy-wait this fraction of each call's warm-up time inside every timed call.",
        ),
    ] = 0.0,
) -> None:
    """Run an experiment and write results/<run_id>/ (run.json, results.jsonl, summary.csv, summary.md)."""
    from attnbench.core.shards import parse_shard
    from attnbench.measure.sweep import SweepRequest, open_sweep, plan_sweep

    if retry_failed and resume is None:
        raise AttnbenchError("--retry-failed needs --resume RUN", hint="attnbench sweep --resume RUN --retry-failed")
    request = SweepRequest(
        config=config,
        device=device,
        out=out,
        # --telemetry is shorthand for --set telemetry=…: part of the config, so resume checks it too.
        overrides=(*(overrides or ()), *((f"telemetry={telemetry}",) if telemetry else ())),
        isolate=isolate,
        resume=resume,
        retry_failed=retry_failed,
        force=force,
        inject_slowdown=inject_slowdown,
        label=label,
        shard=None if shard is None else parse_shard(shard),
        devices=devices,
        allow_mixed_devices=allow_mixed_devices,
    )
    if dry_run:
        plan = plan_sweep(request)
        print_warnings(plan.warnings)
        for case in plan.todo:
            stdout.print(case.key, markup=False, highlight=False)
        where = _where(plan.device, plan.devices)
        if plan.shard is not None:
            whole = len(plan.experiment.cases(plan.device))
            stdout.print(
                f"{len(plan.todo)} cases of shard {plan.shard} ({whole} in the config) on {where} "
                "(dry run: nothing measured)",
                markup=False,
            )
        else:
            stdout.print(f"{len(plan.todo)} cases on {where} (dry run: nothing measured)", markup=False)
        return
    with open_sweep(request) as run:
        plan, environment = run.plan, run.environment
        print_warnings(run.warnings)
        if not quiet:
            what = (
                f"resuming {run.folder}: {len(plan.todo)} of {len(plan.cases)} cases left"
                if plan.stored
                else f"{len(plan.todo)} cases from {plan.experiment.source}"
            )
            if plan.shard is not None:
                what += f", shard {plan.shard}"
            stdout.print(
                f"attnbench: {what} on {_where(plan.device, plan.devices)} "
                f"({environment.gpu_name or environment.cpu_model}, "
                f"torch {environment.torch}, {environment.torch_threads} threads"
                f"{', each case in a worker process' if plan.isolate else ''}) → {run.folder}",
                markup=False,
                highlight=False,
            )
        code = _run_and_render(run, quiet)
    if code:
        raise typer.Exit(code)


def _where(device: str, devices: tuple[str, ...]) -> str:
    return f"{','.join(devices)} (one worker per device)" if devices else device


def _run_and_render(run: Sweep, quiet: bool) -> int:
    """Measure, then render the folder whatever stopped the loop; the exit code: 0, 1 (a case failed), or
    128 + the signal that interrupted the sweep."""
    from attnbench.report.markdown import render_markdown
    from attnbench.report.run_files import write_run_files
    from attnbench.report.terminal import comparison_tables
    from attnbench.results.store import RESULTS_FILE, RUN_FILE, TELEMETRY_FILE

    interrupts = Interrupts()
    interrupts.on_second.append(run.abort)
    display = SweepDisplay(stdout, len(run.plan.todo), quiet=quiet, errors=stderr)
    with interrupts.installed():
        try:
            with display, interrupts.arming():
                run.run(display)
        except KeyboardInterrupt:
            interrupts.signal = interrupts.signal or signal.SIGINT
        finally:
            # Whatever ended the loop (a signal, a full disk, a bug of ours), the folder was closed by run();
            # the summaries are rendered from what was stored before anything propagates.
            stored, paths, problem = write_run_files(run.folder)
            if problem is not None:
                stderr.print(problem, markup=False)
        if not quiet:
            # A terminal gets rich tables; a pipe or CI log gets the same tables as plain markdown.
            if stdout.is_terminal:
                stdout.print(comparison_tables(stored.results, run=stored.run))
            else:
                stdout.print(render_markdown(stored.run, stored.results), markup=False, highlight=False)
        sidecar = [run.folder / TELEMETRY_FILE] if (run.folder / TELEMETRY_FILE).exists() else []
        print_wrote([run.folder / RUN_FILE, run.folder / RESULTS_FILE, *sidecar, *paths])
        stopped = interrupts.signal
        if stopped:
            name = signal.Signals(stopped).name
            stderr.print(
                f"interrupted by {name}: {len(display.results)} of {len(run.plan.todo)} cases finished and "
                f"are saved in {run.folder}",
                markup=False,
            )
            stderr.print(f"resume with: attnbench sweep --resume {run.folder}", markup=False)
            return 128 + stopped
    return EXIT_CASE_FAILED if any(r.status in FAILED for r in stored.results) else 0
