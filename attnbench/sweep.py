"""The ``sweep`` command's work: config → cases → executor → run folder → renders (DESIGN §1).

Layer 5 (it drives the torch executor). Every result is appended to results.jsonl the moment it exists; the
summaries are re-rendered from what is stored, so they read exactly what ``attnbench report`` would. A first
Ctrl-C or SIGTERM abandons the case in flight, keeps everything finished and says how to resume; a second one
exits at once (the rows on disk are whole lines either way).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console

from attnbench.cases import Case
from attnbench.config import Experiment, load_experiment, load_experiment_text, resolved_text
from attnbench.devices import device_slug, resolve_device
from attnbench.environment import Environment
from attnbench.errors import AttnbenchError, ResultsError
from attnbench.lock import RunLock
from attnbench.report.markdown import render_markdown
from attnbench.report.progress import SweepDisplay
from attnbench.report.summary import render_csv
from attnbench.report.terminal import comparison_tables
from attnbench.results import (
    FAILED,
    Result,
    Run,
    RunWriter,
    StoredRun,
    load_run,
    rewrite_rows,
    utc_now,
    write_atomic,
)
from attnbench.runner import OomSkipper, run_sweep


@dataclass(frozen=True)
class SweepOptions:
    config: Path | None
    device: str | None
    out: Path
    overrides: tuple[str, ...] = ()
    dry_run: bool = False
    quiet: bool = False
    isolate: bool | None = None
    resume: Path | None = None
    retry_failed: bool = False
    force: bool = False
    # Validation of `compare` only: busy-wait this fraction of each call's time inside every timed call.
    inject_slowdown: float = 0.0


@dataclass(frozen=True)
class SweepOutcome:
    folder: Path | None
    results: tuple[Result, ...]
    interrupted_by: int | None = None  # the signal number that stopped the sweep

    @property
    def failed(self) -> bool:
        return any(r.status in FAILED for r in self.results)


class _Interrupts:
    """First SIGINT/SIGTERM: abandon the case in flight (KeyboardInterrupt while ``armed``), else just note it.
    Second: leave at once, after killing a worker that may be running."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.armed = False
        self.on_second: list[Any] = []

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:
            for action in self.on_second:
                action()
            os._exit(128 + signum)
        self.signal = signum
        if self.armed:
            raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[_Interrupts]:
        previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self  # held while the partial summary is written too: a second signal still exits at once
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    @contextmanager
    def arming(self) -> Iterator[None]:
        self.armed = True
        try:
            if self.signal is not None:
                raise KeyboardInterrupt
            yield
        finally:
            self.armed = False


def _new_run_folder(out: Path, experiment: Experiment, device: str) -> Path:
    """A fresh folder. The name comes from the config, which only admits a slug ([a-z0-9][a-z0-9._-]*), so it
    cannot climb out of --out."""
    stem = f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{experiment.name}-{device_slug(device)}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            folder = out / (stem if n == 1 else f"{stem}-{n}")
            try:
                folder.mkdir()  # exclusive: two sweeps started in the same second get two folders
                return folder
            except FileExistsError:
                continue
    except OSError as exc:
        raise AttnbenchError(
            f"--out: cannot create a run folder in {out}: {exc.strerror}", hint="choose a writable folder with --out"
        ) from None
    raise AttnbenchError(f"--out: {out} already holds 999 runs named {stem}", hint="choose another --out")


def _render_files(folder: Path) -> tuple[StoredRun, list[Path]]:
    """The summaries, then the plots (``<run>/plots/*.png``). Plots come last and never raise: without matplotlib,
    or when drawing fails, the sweep says so in one line on stderr and keeps its files and its exit code."""
    from attnbench.report.plots import write_run_plots

    stored = load_run(folder)
    paths = [folder / "summary.csv", folder / "summary.md"]
    write_atomic(paths[0], render_csv(stored.results, stored.run))
    write_atomic(paths[1], render_markdown(stored.run, stored.results))
    plots, problem = write_run_plots(stored.run, stored.results, folder / "plots")
    if problem is not None:
        print(problem, file=sys.stderr, flush=True)
    return stored, [*paths, *plots]


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _differences(then: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """``key.path: <then> then, <now> now`` for every leaf that differs."""
    a, b = _flatten(then), _flatten(now)
    return [f"{k}: {a.get(k)!r} then, {b.get(k)!r} now" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _resume_experiment(options: SweepOptions, stored: StoredRun) -> Experiment:
    """The stored run's own config, or the one given, which must resolve to the same thing."""
    if options.config is None:
        text = resolved_text(stored.run.config)
        experiment = load_experiment_text(text, stored.run.config_source, options.overrides, force=True)
    else:
        experiment = load_experiment(options.config, options.overrides, force=options.force)
    if experiment.sha256 != stored.run.config_sha256:
        diff = _differences(dict(stored.run.config), experiment.resolved)
        raise ResultsError(
            f"--resume {stored.folder}: the config differs from the one the run was started with "
            f"({'; '.join(diff) or 'sha256 differs'})",
            hint="resume with the run's own config (give no CONFIG and no --set), or start a new sweep",
        )
    return experiment


def _check_same_environment(stored: StoredRun, environment: Environment) -> None:
    try:
        then = Environment.from_dict(stored.run.environment).resume_fields()
    except TypeError as exc:
        raise ResultsError(
            f"{stored.folder}/run.json: the environment is incomplete ({exc})",
            hint="this run cannot be resumed; start a new sweep",
        ) from None
    now = environment.resume_fields()
    if then != now:
        raise ResultsError(
            f"--resume {stored.folder}: this machine or code differs from the one the run was started with "
            f"({'; '.join(_differences(then, now))})",
            hint="timings from different environments cannot share a run; start a new sweep here",
        )


def run_experiment(options: SweepOptions, stdout: Console, stderr: Console) -> SweepOutcome:
    import torch

    from attnbench.environment import collect_environment

    lock: RunLock | None = None
    stored: StoredRun | None = None
    try:
        if options.resume is not None:
            # Lock first, then read: nobody may append between our reading the rows and adding ours.
            if not options.dry_run:
                lock = (
                    RunLock(Path(options.resume)).acquire() if (Path(options.resume) / "run.json").is_file() else None
                )
            stored = load_run(options.resume)
            for warning in stored.warnings:
                stderr.print(f"warning: {warning}", markup=False)
            experiment = _resume_experiment(options, stored)
            device = resolve_device(options.device or str(stored.run.environment.get("device", "cpu")))
        else:
            device_type = resolve_device(options.device or "auto").split(":")[0] if options.config is None else "cpu"
            experiment = load_experiment(
                options.config, options.overrides, device_type=device_type, force=options.force
            )
            device = resolve_device(options.device or experiment.device)
        if options.inject_slowdown and not device.startswith("cpu"):
            raise AttnbenchError(
                f"--inject-slowdown busy-waits on the host, which does not slow work queued on {device}",
                hint="use it on --device cpu, where it exists to validate `attnbench compare`",
            )
        gpu_only = [
            f"timing.{k}"
            for k, on in (("cache", experiment.timing.cache == "cold"), ("cuda_graph", experiment.timing.cuda_graph))
            if on
        ]
        if gpu_only and not device.startswith("cuda"):
            raise AttnbenchError(
                f"{' and '.join(gpu_only)} apply to CUDA devices; this sweep runs on {device}",
                hint="set timing.cache: warm and timing.cuda_graph: false for CPU runs",
            )
        if experiment.threads is not None:
            torch.set_num_threads(experiment.threads)
        # The rows a resume keeps (and does not rerun): all of them, or with --retry-failed only the ok ones.
        kept = [r for r in stored.results if r.ok or not options.retry_failed] if stored else []
        done = {r.case.key for r in kept}
        cases = experiment.cases(device)
        todo = [case for case in cases if case.key not in done]
        if options.dry_run:
            for case in todo:
                stdout.print(case.key, markup=False, highlight=False)
            stdout.print(f"{len(todo)} cases on {device} (dry run: nothing measured)", markup=False)
            return SweepOutcome(None, ())

        environment = collect_environment(device)
        if stored is not None:
            _check_same_environment(stored, environment)
            folder = stored.folder
            run = replace(stored.run, state="running", finished_utc="")
            rewrite_rows(folder, lambda r: r.ok or not options.retry_failed)  # the same rule as `kept`
        else:
            folder = _new_run_folder(options.out, experiment, device)
            lock = RunLock(folder).acquire()
            from attnbench.calibration import load_cached

            # The machine's cached ceilings, if 'attnbench calibrate' ran here: never measured implicitly (that
            # takes a minute); without them pct_of_peak falls back to vendor peaks. A damaged cache costs a warning.
            try:
                calibration = load_cached(environment.fingerprint())
            except ResultsError as exc:
                stderr.print(f"warning: {exc.message}; pct_of_peak uses vendor peaks ({exc.hint})", markup=False)
                calibration = None
            run = Run(
                run_id=folder.name,
                created_utc=utc_now(),
                config_source=experiment.source,
                config=experiment.resolved,
                config_sha256=experiment.sha256,
                timing=experiment.timing,
                environment=environment.to_dict(),
                command=tuple(sys.argv),
                calibration=calibration,
            )
        if experiment.timing.processes > 1 and options.isolate is False:
            raise AttnbenchError(
                f"timing.processes = {experiment.timing.processes} runs each case in fresh worker "
                "processes, which --no-isolate forbids",
                hint="drop --no-isolate, or set timing.processes: 1",
            )
        isolate = options.isolate if options.isolate is not None else experiment.isolate_on(device)
        if not options.quiet:
            total = len(cases)
            what = (
                f"resuming {folder}: {len(todo)} of {total} cases left"
                if stored
                else (f"{len(todo)} cases from {experiment.source}")
            )
            stdout.print(
                f"attnbench: {what} on {device} ({environment.gpu_name or environment.cpu_model}, "
                f"torch {environment.torch}, {environment.torch_threads} threads"
                f"{', each case in a worker process' if isolate else ''}) → {folder}",
                markup=False,
                highlight=False,
            )
        if not isolate and experiment.case_timeout_s is not None:
            stderr.print(
                "warning: case_timeout_s applies only with isolation (--isolate); in-process cases are "
                "bounded by timing.max_case_s alone",
                markup=False,
            )
        # Only kept rows may skip longer cases: an OOM about to be retried must not veto its longer lengths.
        seen = kept
        skipper = (
            OomSkipper(tied_batch=experiment.tokens is not None, seen=seen)
            if (experiment.skip_larger_after_oom)
            else None
        )
        return _sweep(options, experiment, device, todo, RunWriter(folder, run), isolate, skipper, stdout, stderr)
    finally:
        if lock is not None:
            lock.release()


def _sweep(
    options: SweepOptions,
    experiment: Experiment,
    device: str,
    todo: list[Case],
    writer: RunWriter,
    isolate: bool,
    skipper: OomSkipper | None,
    stdout: Console,
    stderr: Console,
) -> SweepOutcome:
    from attnbench.executor import TorchExecutor
    from attnbench.isolation import IsolatedExecutor
    from attnbench.replicates import ReplicatedExecutor

    executor: TorchExecutor | IsolatedExecutor | ReplicatedExecutor
    if isolate:
        isolated = IsolatedExecutor(
            device,
            experiment.timing,
            seed=experiment.seed,
            threads=experiment.threads,
            timeout_s=experiment.timeout_s,
            telemetry=experiment.telemetry,
            telemetry_interval_s=experiment.interval_for(device),
            inject_slowdown=options.inject_slowdown,
        )
        processes = experiment.timing.processes
        executor = ReplicatedExecutor(isolated, processes) if processes > 1 else isolated
    else:
        executor = TorchExecutor(
            device,
            experiment.timing,
            seed=experiment.seed,
            telemetry=experiment.telemetry,  # type: ignore[arg-type]
            telemetry_interval_s=experiment.interval_for(device),
            inject_slowdown=options.inject_slowdown,
        )
    folder = writer.folder
    finished: list[Result] = []

    def on_result(index: int, result: Result) -> None:
        writer.append(result)
        finished.append(result)
        display.finished(index, result)

    interrupts = _Interrupts()
    if isinstance(executor, IsolatedExecutor | ReplicatedExecutor):
        interrupts.on_second.append(lambda: executor.close(now=True))
    with interrupts.installed():
        try:
            with SweepDisplay(stdout, len(todo), quiet=options.quiet) as display, interrupts.arming():
                run_sweep(todo, executor.run, on_result, display.started, skipper)
        except KeyboardInterrupt:
            interrupts.signal = interrupts.signal or signal.SIGINT
        finally:
            # Whatever ended the loop (a signal, a full disk, a bug of ours), the run folder is closed and
            # rendered from what was stored before anything propagates.
            if isinstance(executor, IsolatedExecutor | ReplicatedExecutor):
                executor.close(now=interrupts.signal is not None)
            stopped = interrupts.signal
            complete = stopped is None and len(finished) == len(todo)
            writer.close("complete" if complete else "interrupted", utc_now())
            stored, paths = _render_files(folder)
        if not options.quiet:
            # A terminal gets rich tables; a pipe or CI log gets the same tables as plain markdown.
            if stdout.is_terminal:
                stdout.print(comparison_tables(stored.results, run=stored.run))
            else:
                stdout.print(render_markdown(stored.run, stored.results), markup=False, highlight=False)
        sidecar = [folder / "telemetry.jsonl"] if (folder / "telemetry.jsonl").exists() else []
        for path in (folder / "run.json", folder / "results.jsonl", *sidecar, *paths):
            stdout.print(f"wrote {path}", markup=False, highlight=False)
        if stopped:
            name = signal.Signals(stopped).name
            stderr.print(
                f"interrupted by {name}: {len(finished)} of {len(todo)} cases finished and are saved in {folder}",
                markup=False,
            )
            stderr.print(f"resume with: attnbench sweep --resume {folder}", markup=False)
    return SweepOutcome(folder, tuple(stored.results), stopped)
