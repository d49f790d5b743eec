"""``attnbench sweep``: run an experiment into a run folder, show it as it goes, and render it at the end."""

from __future__ import annotations

import importlib
import signal
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from attnbench.cli.common import (
    LATEST_HELP,
    ConfigArg,
    PlotsOpt,
    SetOpt,
    SweepDeviceOpt,
    caused_by_interrupt,
    fail,
    handles_errors,
    interrupted,
    one_run,
    plots_wanted,
    print_warnings,
    print_wrote,
    state,
    stderr,
    stdout,
)
from attnbench.cli.progress import SweepDisplay
from attnbench.cli.signals import Interrupts
from attnbench.core.cases import CacheState, Case
from attnbench.core.errors import EXIT_CASE_FAILED, AttnbenchError, ResultsError, StorageError
from attnbench.core.units import format_duration, plural
from attnbench.results.records import FAILED, Result

if TYPE_CHECKING:
    from collections.abc import Callable

    from attnbench.analysis.reading import Reading
    from attnbench.results.contention import Contention
    from attnbench.sweeps.runner import Sweep, SweepPlan, SweepRequest


@handles_errors
def sweep(
    config: ConfigArg = None,
    device: SweepDeviceOpt = None,
    out: Annotated[Path, typer.Option("--out", help="Folder that receives the run folder.")] = Path("results/runs"),
    overrides: SetOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="List the cases and the time budget, then stop (no torch).")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the paths written.")] = False,
    isolate: Annotated[
        bool | None,
        typer.Option("--isolate/--no-isolate", help="Each case in a worker process.", show_default="config's"),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume", help=f"Finish an interrupted run folder; {LATEST_HELP}", show_default=False, callback=one_run
        ),
    ] = None,
    retry_failed: Annotated[bool, typer.Option("--retry-failed", help="With --resume: rerun non-ok cases.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Allow a grid above the 10000-case cap.")] = False,
    telemetry: Annotated[
        Literal["off", "basic", "full"] | None,
        typer.Option("--telemetry", help="Hardware telemetry: off, basic, full (+ GPM).", show_default="config's"),
    ] = None,
    cache: Annotated[
        CacheState | None,
        typer.Option(
            "--cache",
            help="cold: flush the last-level cache before every timed call (untimed); warm: do not.",
            show_default="config's, else decode cold and the rest warm",
        ),
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
    wait_idle: Annotated[
        float,
        typer.Option(
            "--wait-idle",
            min=0.0,
            max=86_400.0,
            metavar="SECONDS",
            help="When the machine is busy before the first case, wait up to this long for quiet (0: check and go on).",
        ),
    ] = 0.0,
    plots: PlotsOpt = None,
    profile: Annotated[
        bool,
        typer.Option(
            "--profile",
            help="Write a Chrome trace of one call per ok case to traces/ (chrome://tracing, ui.perfetto.dev).",
        ),
    ] = False,
    nvtx: Annotated[
        bool,
        typer.Option("--nvtx", help="GPU: each timed call inside an NVTX range named by the case key (for nsys)."),
    ] = False,
    run_once: Annotated[
        bool,
        typer.Option("--run-once", help="Time one call per case after the warm-up (under nsys or ncu); no CI."),
    ] = False,
    no_check: Annotated[
        bool,
        typer.Option(
            "--no-check",
            help="Time without first holding each case's output to its family's reference (the config's check: off).",
        ),
    ] = False,
    budget_from: Annotated[
        Path | None,
        typer.Option(
            "--budget-from",
            help="A run whose budget decisions to keep: each case it timed ok takes timing.min_samples here even "
            f"past timing.max_case_s, so that compare sees no ok ↔ too-slow flip; {LATEST_HELP}",
            show_default=False,
            callback=one_run,
        ),
    ] = None,
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
    """Run an experiment into a new run folder, results/runs/<run_id>/ by default (run.json, results.jsonl,
    summary.csv, summary.md, plots/)."""
    from attnbench.core.shards import parse_shard
    from attnbench.sweeps.runner import SweepRequest, plan_sweep

    draw_plots = plots_wanted(plots)
    if retry_failed and resume is None:
        raise AttnbenchError("--retry-failed needs --resume RUN", hint="attnbench sweep --resume RUN --retry-failed")
    request = SweepRequest(
        config=config,
        device=device,
        out=out,
        # --telemetry and --cache are shorthand for --set telemetry=… and cache=…: part of the config, so resume
        # checks them too.
        overrides=(
            *(overrides or ()),
            *((f"telemetry={telemetry}",) if telemetry else ()),
            *((f"cache={cache}",) if cache else ()),
        ),
        isolate=isolate,
        resume=resume,
        retry_failed=retry_failed,
        force=force,
        inject_slowdown=inject_slowdown,
        label=label,
        dry_run=dry_run,
        shard=None if shard is None else parse_shard(shard),
        devices=devices,
        allow_mixed_devices=allow_mixed_devices,
        wait_idle_s=wait_idle,
        profile=profile,
        nvtx=nvtx,
        run_once=run_once,
        no_check=no_check,
        budget_from=budget_from,
    )
    if dry_run:
        _print_plan(plan_sweep(request))
        return
    interrupts = Interrupts()
    with interrupts.installed(), ExitStack() as stack:
        run = _start(request, interrupts, stack, quiet)
        print_warnings(run.warnings)
        if not quiet:
            _announce(run)
        code = _run_and_render(run, quiet, interrupts, plots=draw_plots)
    if code:
        raise typer.Exit(code)


def _start(request: SweepRequest, interrupts: Interrupts, stack: ExitStack, quiet: bool) -> Sweep:
    """Import torch, then open the sweep (the environment, the folder) inside ``stack``; a signal on the way is an
    interrupt that leaves nothing behind."""
    from attnbench.sweeps.runner import open_sweep

    try:
        # torch's import runs C++ module initialisers that cannot carry a Python exception through: a Ctrl-C
        # raised inside one ended the process in std::terminate ("terminate called after throwing an instance
        # of 'pybind11::error_already_set'"). So it is imported disarmed; a signal that came meanwhile is acted on
        # the moment arming begins below.
        importlib.import_module("torch")
        with interrupts.arming():  # the rest of start-up (the environment, the folder) is abandoned at once
            run = stack.enter_context(open_sweep(request, on_busy=_waiting(quiet)))
    except BaseException as exc:
        # A signal came while starting: whatever it surfaced as (an extension being imported may turn the
        # KeyboardInterrupt into an error of its own), it is an interrupt. open_sweep removed the folder it may
        # have made: nothing is left behind.
        if interrupts.signal is None and not caused_by_interrupt(exc):
            raise
        raise interrupted(interrupts.signal or signal.SIGINT, "stopped before the first case") from None
    if interrupts.signal is not None:
        # The signal came while starting, and an import swallowed it (torch imports numpy inside a try, which
        # can leave a half-imported module behind): measure and render nothing in this interpreter.
        run.stop_before_start()
        raise interrupted(
            interrupts.signal, f"stopped before the first case; resume with: attnbench sweep --resume {run.folder}"
        )
    return run


def _announce(run: Sweep) -> None:
    """The line that says what this sweep measures, where, and into which folder."""
    plan, environment = run.plan, run.environment
    what = (
        f"resuming {run.folder}: {len(plan.todo)} of {len(plan.cases)} cases left"
        if plan.stored
        else f"{plural(len(plan.todo), 'case')} from {plan.experiment.source}"
    )
    if plan.shard is not None:
        what += f", shard {plan.shard}"
    stdout.print(
        f"attnbench: {what} on {_where(plan.device, plan.devices)} "
        f"({environment.gpu_name or environment.cpu_model}, "
        f"torch {environment.torch}, {_threads(plan, environment.torch_threads)}"
        f"{', each case in a worker process' if plan.isolate else ''}) → {run.folder}",
        markup=False,
        highlight=False,
    )


def _waiting(quiet: bool) -> Callable[[Contention, float], None]:
    """Says once that the sweep waits for a busy machine to go quiet (--wait-idle), with the evidence."""
    said = False

    def on_busy(busy: Contention, left_s: float) -> None:
        nonlocal said
        if not said and not quiet:
            stderr.print(
                f"the machine is busy ({'; '.join(busy.reasons)}): waiting up to {left_s:.0f} s for quiet",
                markup=False,
                highlight=False,
            )
        said = True

    return on_busy


def _print_plan(plan: SweepPlan) -> None:
    """--dry-run: every case key, the count, how the device was told (without torch), and the time budget."""
    print_warnings(plan.warnings)
    for case in plan.todo:
        stdout.print(case.key, markup=False, highlight=False)
    where = _where(plan.device, plan.devices)
    if plan.shard is not None:
        whole = len(plan.experiment.cases(plan.device))
        stdout.print(
            f"{plural(len(plan.todo), 'case')} of shard {plan.shard} ({whole} in the config) on {where} "
            "(dry run: nothing measured)",
            markup=False,
        )
    else:
        stdout.print(f"{plural(len(plan.todo), 'case')} on {where} (dry run: nothing measured)", markup=False)
    if plan.device_basis:
        stdout.print(f"device: auto → {plan.device} ({plan.device_basis})", markup=False)
    timing = plan.experiment.timing
    processes = f" × {timing.processes} processes" if timing.processes > 1 else ""
    processes += f" in {timing.rounds} rounds" if timing.rounds > 1 else ""
    estimate = plan.estimate
    if estimate.earlier_run is not None:
        basis = f"{estimate.known} of {len(plan.todo)} cases as long as in {estimate.earlier_run}"
    else:
        basis = f"no earlier run of this config in {plan.request.out}: each case as long as converging takes"
    stdout.print(
        f"estimate: about {format_duration(estimate.likely_s)} ({basis}); at most {format_duration(estimate.most_s)} "
        f"of warm-up and sampling ({plural(len(plan.todo), 'case')}{processes} × timing.max_case_s "
        f"{timing.max_case_s:g} s), "
        "starting up and the report on top",
        markup=False,
    )


def _where(device: str, devices: tuple[str, ...]) -> str:
    return f"{','.join(devices)} (one worker per device)" if devices else device


class _ArmedWhileMeasuring:
    """The display, and the signal handler armed while any case's work is under way (one at a time, or one per
    device with --devices): a signal then abandons the work; one that comes while a row is stored, the folder
    closed or the summaries rendered is noted and acted on at the next case, or at the end."""

    def __init__(self, display: SweepDisplay, interrupts: Interrupts) -> None:
        self.display = display
        self.interrupts = interrupts
        self.in_flight = 0

    def round_started(self, number: int, rounds: int) -> None:
        self.display.round_started(number, rounds)

    def started(self, index: int, case: Case) -> None:
        self.in_flight += 1
        self.interrupts.arm()
        self.display.started(index, case)

    def measured(self, index: int, result: Result) -> None:
        self.in_flight = max(0, self.in_flight - 1)
        if self.in_flight == 0:
            self.interrupts.disarm()
        self.display.measured(index, result)

    def finished(self, index: int, result: Result) -> None:
        self.display.finished(index, result)

    def warning(self, text: str) -> None:
        self.display.warning(text)


def _run_and_render(run: Sweep, quiet: bool, interrupts: Interrupts, *, plots: bool) -> int:
    """Measure, then render the folder whatever stopped the loop; the exit code: 0, 1 (a case failed), 74 (the
    disk refused a write) or 128 + the signal that interrupted the sweep."""
    from attnbench.report.markdown import render_markdown
    from attnbench.report.terminal import comparison_tables
    from attnbench.results.store import RESULTS_FILE, ROUNDS_FILE, RUN_FILE, TELEMETRY_FILE, TRACES

    interrupts.on_second.append(run.abort)
    plan = run.plan
    display = SweepDisplay(
        stdout, len(plan.todo), quiet=quiet, errors=stderr, cases=plan.todo, policy=plan.experiment.timing
    )
    failure: ResultsError | None = None
    try:
        with display:
            run.run(_ArmedWhileMeasuring(display, interrupts))
    except KeyboardInterrupt:
        interrupts.signal = interrupts.signal or signal.SIGINT
    except StorageError as exc:  # a full disk: the rows before it are intact, and the resume line says what next
        failure = exc
    except BaseException:
        # A bug of ours: the stored rows still get their summaries, then it propagates.
        _write_summaries(run.folder, plots=plots)
        raise
    # Whatever ended the loop, the folder was closed by run(); the summaries are rendered from what was stored.
    reading, paths, problem = _write_summaries(run.folder, plots=plots)
    failure = failure or problem
    if not quiet:
        # A terminal gets rich tables; a pipe or CI log gets the same tables as plain markdown.
        if stdout.is_terminal:
            stdout.print(comparison_tables(reading))
        else:
            stdout.print(render_markdown(reading), markup=False, highlight=False)
    sidecar = [run.folder / name for name in (TELEMETRY_FILE, ROUNDS_FILE) if (run.folder / name).exists()]
    print_wrote([run.folder / RUN_FILE, run.folder / RESULTS_FILE, *sidecar, *paths])
    if reading.run.traces:
        stdout.print(
            f"wrote {run.folder / TRACES}/ ({len(reading.run.traces)} Chrome traces: ui.perfetto.dev, chrome://tracing)",
            markup=False,
            highlight=False,
        )
    # Counted on disk: a row stored just as a signal came is finished, whether or not the display heard of it.
    keys = {r.case.key for r in reading.results}
    done = sum(case.key in keys for case in run.plan.cases)
    saved = f"{done} of {len(run.plan.cases)} cases finished and are saved in {run.folder}"
    resume = f"resume with: attnbench sweep --resume {run.folder}"
    if failure is not None:
        fail(f"{failure.message}; {saved}", f"{failure.hint}, then {resume}", failure.exit_code)
        return failure.exit_code
    stopped = interrupts.signal
    if stopped:
        stderr.print(f"interrupted by {signal.Signals(stopped).name}: {saved}", markup=False)
        stderr.print(resume, markup=False)
        state["interrupt_said"] = True
        return 128 + stopped
    return EXIT_CASE_FAILED if any(r.status in FAILED for r in reading.results) else 0


def _write_summaries(folder: Path, *, plots: bool) -> tuple[Reading, list[Path], ResultsError | None]:
    """summary.csv, summary.md and (``plots``) the plots of what is stored; a summary the disk (or a planted link)
    refuses is returned as the problem, never raised: the rows are safe either way."""
    from attnbench.analysis.reading import Reading
    from attnbench.report.run_files import write_run_files
    from attnbench.results.store import load_run

    try:
        reading, paths, notice = write_run_files(folder, plots=plots)
    except ResultsError as exc:
        return Reading.of(load_run(folder)), [], exc
    if notice is not None:
        stderr.print(notice, markup=False)
    return reading, paths, None


def _threads(plan: SweepPlan, threads: int | None) -> str:
    """The thread count, and when the default left a CPU free, that it did (a config's `threads` takes it back)."""
    from attnbench.host.busy import logical_cores

    said = plural(threads or 0, "thread")
    left_free = plan.threads is not None and plan.threads == logical_cores() - 1
    if plan.stored is None and plan.experiment.threads is None and left_free:
        said += f", 1 of {logical_cores()} CPUs left free"
    return said
