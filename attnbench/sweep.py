"""The ``sweep`` command's work: config → cases → executor → run folder → renders (DESIGN §1).

Layer 5 (it drives the torch executor). Every result is appended to results.jsonl the moment it exists; the
summaries are re-rendered from what is stored, so they read exactly what ``attnbench report`` would.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console

from attnbench.config import Experiment, load_experiment
from attnbench.devices import device_slug, resolve_device
from attnbench.errors import AttnbenchError
from attnbench.report.markdown import render_markdown
from attnbench.report.progress import SweepDisplay
from attnbench.report.summary import render_csv
from attnbench.report.terminal import comparison_tables
from attnbench.results import FAILED, Result, Run, RunWriter, write_atomic
from attnbench.runner import run_sweep

_SAFE = re.compile(r"[^a-z0-9._-]+")


@dataclass(frozen=True)
class SweepOptions:
    config: Path | None
    device: str | None
    out: Path
    overrides: tuple[str, ...] = ()
    dry_run: bool = False
    quiet: bool = False


@dataclass(frozen=True)
class SweepOutcome:
    folder: Path | None
    results: tuple[Result, ...]
    interrupted: bool = False

    @property
    def failed(self) -> bool:
        return any(r.status in FAILED for r in self.results)


def _device_type_guess(options: SweepOptions) -> str:
    """Which built-in default fits: the requested device, or what 'auto' finds."""
    if options.device is not None:
        return resolve_device(options.device).split(":")[0]
    return resolve_device("auto").split(":")[0]


def _new_run_folder(out: Path, experiment: Experiment, device: str, now: datetime) -> Path:
    # The name comes from the config: keep it to a safe slug so it cannot climb out of --out.
    stem = f"{now:%Y%m%d-%H%M%S}-{_SAFE.sub('-', experiment.name.lower())}-{device_slug(device)}"
    folder, n = out / stem, 1
    while folder.exists():
        n += 1
        folder = out / f"{stem}-{n}"
    return folder


def _render_files(folder: Path, run: Run, results: list[Result]) -> list[Path]:
    paths = [folder / "summary.csv", folder / "summary.md"]
    write_atomic(paths[0], render_csv(results))
    write_atomic(paths[1], render_markdown(run, results))
    return paths


def run_experiment(options: SweepOptions, stdout: Console, stderr: Console) -> SweepOutcome:
    import torch

    from attnbench.environment import collect_environment
    from attnbench.executor import TorchExecutor, utc_now

    device_type = _device_type_guess(options) if options.config is None else "cpu"
    experiment = load_experiment(options.config, options.overrides, device_type=device_type)
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
    now = datetime.now(UTC)
    folder = _new_run_folder(options.out, experiment, device, now)
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
    try:
        writer = RunWriter(folder, run)
    except OSError as exc:
        raise AttnbenchError(
            f"--out: cannot create {folder}: {exc.strerror}", hint="choose a writable folder with --out"
        ) from None
    if not options.quiet:
        stdout.print(
            f"attnbench: {len(cases)} cases from {experiment.source} on {device} "
            f"({environment.gpu_name or environment.cpu_model}, torch {environment.torch}, "
            f"{environment.torch_threads} threads) → {folder}",
            markup=False,
            highlight=False,
        )
    executor = TorchExecutor(device, experiment.timing, seed=experiment.seed)
    results: list[Result] = []

    def on_result(index: int, result: Result) -> None:
        writer.append(result)
        results.append(result)
        display.finished(index, result)

    interrupted = False
    with SweepDisplay(stdout, len(cases), quiet=options.quiet) as display:
        try:
            run_sweep(cases, executor.run, on_result, display.started)
        except KeyboardInterrupt:
            interrupted = True
    writer.close("interrupted" if interrupted else "complete", utc_now())
    paths = _render_files(folder, writer.run, results)
    if not options.quiet:
        # A terminal gets rich tables; a pipe or CI log gets the same tables as plain markdown.
        if stdout.is_terminal:
            stdout.print(comparison_tables(results))
        else:
            stdout.print(render_markdown(writer.run, results), markup=False, highlight=False)
    for path in (folder / "run.json", folder / "results.jsonl", *paths):
        stdout.print(f"wrote {path}", markup=False, highlight=False)
    if interrupted:
        stderr.print(
            f"interrupted: {len(results)} of {len(cases)} cases finished and are saved in {folder}", markup=False
        )
    return SweepOutcome(folder, tuple(results), interrupted)
