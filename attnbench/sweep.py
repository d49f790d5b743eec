"""The ``sweep`` command's work: config → cases → executor → run folder → renders (DESIGN §1).

Layer 5 (it drives the torch executor). Every result is appended to results.jsonl the moment it exists; the
summaries are re-rendered from what is stored, so they read exactly what ``attnbench report`` would. A first
Ctrl-C or SIGTERM abandons the case in flight, keeps everything finished and says how to resume; a second one
exits at once (the rows on disk are whole lines either way).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from rich.console import Console

from attnbench.config import Experiment, load_experiment, load_experiment_text
from attnbench.devices import device_slug, resolve_device
from attnbench.environment import Environment
from attnbench.errors import AttnbenchError, ResultsError
from attnbench.lock import RunLock
from attnbench.report.markdown import render_markdown
from attnbench.report.progress import SweepDisplay
from attnbench.report.summary import render_csv
from attnbench.report.terminal import comparison_tables
from attnbench.results import FAILED, RESULTS_FILE, Result, Run, RunWriter, StoredRun, load_run, write_atomic
from attnbench.runner import OomSkipper, run_sweep

_SAFE = re.compile(r"[^a-z0-9._-]+")


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


@dataclass(frozen=True)
class SweepOutcome:
    folder: Path | None
    results: tuple[Result, ...]
    interrupted_by: int | None = None  # the signal number that stopped the sweep

    @property
    def failed(self) -> bool:
        return any(r.status in FAILED for r in self.results)


class _Interrupts:
    """First SIGINT/SIGTERM: raise KeyboardInterrupt where the sweep is. Second: leave at once."""

    def __init__(self) -> None:
        self.signal: int | None = None

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:
            os._exit(128 + signum)
        self.signal = signum
        raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[_Interrupts]:
        previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self  # held while the partial summary is written too: a second signal still exits at once
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)


def _new_run_folder(out: Path, experiment: Experiment, device: str, now: datetime) -> Path:
    # The name comes from the config: keep it to a safe slug so it cannot climb out of --out.
    stem = f"{now:%Y%m%d-%H%M%S}-{_SAFE.sub('-', experiment.name.lower())}-{device_slug(device)}"
    folder, n = out / stem, 1
    while folder.exists():
        n += 1
        folder = out / f"{stem}-{n}"
    return folder


def _render_files(folder: Path) -> list[Path]:
    stored = load_run(folder)
    paths = [folder / "summary.csv", folder / "summary.md"]
    write_atomic(paths[0], render_csv(stored.results))
    write_atomic(paths[1], render_markdown(stored.run, stored.results))
    return paths


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
        text = yaml.safe_dump(dict(stored.run.config), sort_keys=False)
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
    then = Environment.from_dict(stored.run.environment).fingerprint_fields()
    now = environment.fingerprint_fields()
    if then != now:
        raise ResultsError(
            f"--resume {stored.folder}: this machine differs from the one the run was started on "
            f"({'; '.join(_differences(then, now))})",
            hint="timings from different environments cannot share a run; start a new sweep here",
        )


def _keep_rows(folder: Path, retry_failed: bool) -> None:
    """Rewrite results.jsonl with its whole, kept rows (byte for byte): a torn last line is dropped so the
    next append starts on a fresh line, and with --retry-failed the rows that did not end ok go too."""
    path = folder / RESULTS_FILE
    if not path.exists():
        return
    kept: list[bytes] = []
    for line in path.read_bytes().splitlines(keepends=True):
        try:
            status = json.loads(line)["status"]
        except (ValueError, KeyError, TypeError):
            continue  # load_run has already accepted the file, so this is the torn last line
        if not line.endswith(b"\n"):
            continue
        if status == "ok" or not retry_failed:
            kept.append(line)
    write_atomic(path, b"".join(kept).decode("utf-8"))


def run_experiment(options: SweepOptions, stdout: Console, stderr: Console) -> SweepOutcome:
    import torch

    from attnbench.environment import collect_environment
    from attnbench.executor import utc_now

    stored = load_run(options.resume) if options.resume is not None else None
    if stored is not None:
        experiment = _resume_experiment(options, stored)
        device = resolve_device(options.device or str(stored.run.environment.get("device", "cpu")))
    else:
        device_type = resolve_device(options.device or "auto").split(":")[0] if options.config is None else "cpu"
        experiment = load_experiment(options.config, options.overrides, device_type=device_type, force=options.force)
        device = resolve_device(options.device or experiment.device)
    if experiment.threads is not None:
        torch.set_num_threads(experiment.threads)
    cases = experiment.cases(device)
    if options.dry_run:
        for case in cases:
            stdout.print(case.key, markup=False, highlight=False)
        stdout.print(f"{len(cases)} cases on {device} (dry run: nothing measured)", markup=False)
        return SweepOutcome(None, ())

    environment = collect_environment(device)
    if stored is not None:
        _check_same_environment(stored, environment)
        folder = stored.folder
        done = {r.case.key for r in stored.results if r.ok or not options.retry_failed}
        run = replace(stored.run, state="running", finished_utc="")
    else:
        folder = _new_run_folder(options.out, experiment, device, datetime.now(UTC))
        done = set()
        run = Run(
            run_id=folder.name,
            created_utc=utc_now(),
            config_source=experiment.source,
            config=experiment.resolved,
            config_sha256=experiment.sha256,
            timing=experiment.timing,
            environment=environment.to_dict(),
            command=tuple(sys.argv),
        )
    todo = [case for case in cases if case.key not in done]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        lock = RunLock(folder).acquire()
    except OSError as exc:
        raise AttnbenchError(
            f"--out: cannot create {folder}: {exc.strerror}", hint="choose a writable folder with --out"
        ) from None
    isolate = options.isolate if options.isolate is not None else experiment.isolate_on(device)
    try:
        if stored is not None:
            _keep_rows(folder, options.retry_failed)
        writer = RunWriter(folder, run)
        if not options.quiet:
            what = (
                f"resuming {folder}: {len(todo)} of {len(cases)} cases left"
                if stored
                else (f"{len(cases)} cases from {experiment.source}")
            )
            stdout.print(
                f"attnbench: {what} on {device} ({environment.gpu_name or environment.cpu_model}, "
                f"torch {environment.torch}, {environment.torch_threads} threads"
                f"{', each case in a worker process' if isolate else ''}) → {folder}",
                markup=False,
                highlight=False,
            )
        return _sweep(options, experiment, device, todo, folder, writer, isolate, stdout, stderr)
    finally:
        lock.release()


def _sweep(
    options: SweepOptions,
    experiment: Experiment,
    device: str,
    todo: list[Any],
    folder: Path,
    writer: RunWriter,
    isolate: bool,
    stdout: Console,
    stderr: Console,
) -> SweepOutcome:
    from attnbench.executor import TorchExecutor, utc_now
    from attnbench.isolation import IsolatedExecutor

    executor: TorchExecutor | IsolatedExecutor
    if isolate:
        executor = IsolatedExecutor(
            device, experiment.timing, seed=experiment.seed, threads=experiment.threads, timeout_s=experiment.timeout_s
        )
    else:
        executor = TorchExecutor(device, experiment.timing, seed=experiment.seed)
    results: list[Result] = []

    def on_result(index: int, result: Result) -> None:
        writer.append(result)
        results.append(result)
        display.finished(index, result)

    interrupts = _Interrupts()
    with interrupts.installed(), SweepDisplay(stdout, len(todo), quiet=options.quiet) as display:
        try:
            run_sweep(
                todo,
                executor.run,
                on_result,
                display.started,
                OomSkipper() if experiment.skip_larger_after_oom else None,
            )
        except KeyboardInterrupt:
            interrupts.signal = interrupts.signal or signal.SIGINT
        finally:
            if isinstance(executor, IsolatedExecutor):
                executor.close()
        stopped = interrupts.signal
        writer.close("interrupted" if stopped else "complete", utc_now())
        paths = _render_files(folder)
        stored = load_run(folder)
        if not options.quiet:
            # A terminal gets rich tables; a pipe or CI log gets the same tables as plain markdown.
            if stdout.is_terminal:
                stdout.print(comparison_tables(stored.results))
            else:
                stdout.print(render_markdown(stored.run, stored.results), markup=False, highlight=False)
        for path in (folder / "run.json", folder / "results.jsonl", *paths):
            stdout.print(f"wrote {path}", markup=False, highlight=False)
        if stopped:
            name = signal.Signals(stopped).name
            stderr.print(
                f"interrupted by {name}: {len(results)} of {len(todo)} cases finished and are saved in {folder}",
                markup=False,
            )
            stderr.print(f"resume with: attnbench sweep --resume {folder}", markup=False)
    return SweepOutcome(folder, tuple(stored.results), stopped)
