"""``validate``, ``models`` and ``env``: what a config expands to, which models run here, what a run would record."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.cli.common import DeviceOpt, SetOpt, handles_errors, stdout
from attnbench.core.errors import AttnbenchError


@handles_errors
def validate(
    config: Annotated[Path, typer.Argument(help="YAML experiment to check.")], overrides: SetOpt = None
) -> None:
    """Check a config without running it; print how many cases it expands to."""
    from attnbench.config.experiment import load_experiment

    experiment = load_experiment(config, tuple(overrides or ()))
    cases = experiment.cases(experiment.device)
    models = sorted({c.model for c in cases})
    stdout.print(f"ok: {config} → {len(cases)} cases ({', '.join(models)}), sha256 {experiment.sha256[:12]}")


@handles_errors
def models(
    device: DeviceOpt = None, dtype: Annotated[str, typer.Option("--dtype", help="dtype to probe with.")] = "float32"
) -> None:
    """List every model and whether it runs on this device (and why not)."""
    from attnbench.core.catalogue import DTYPES, MODELS
    from attnbench.measure.devices import resolve_device
    from attnbench.measure.models import availability

    if dtype not in DTYPES:
        raise AttnbenchError(f"--dtype: unknown dtype {dtype!r}", hint=f"one of: {', '.join(DTYPES)}")
    resolved = resolve_device(device or "auto")
    status = availability(resolved, dtype)
    table = Table(title=f"models on {resolved} ({dtype})", title_justify="left")
    for column in ("model", "family", "status", "what it is"):
        table.add_column(column)
    for name, spec in MODELS.items():
        reason = status[name]
        table.add_row(
            name,
            spec.family,
            "[green]available[/]" if reason is None else f"[red]unavailable[/]: {reason}",
            spec.summary,
        )
    stdout.print(table)


@handles_errors
def env(device: DeviceOpt = None) -> None:
    """Print the environment a run here would record."""
    from attnbench.measure.contention import busy_now, logical_cores
    from attnbench.measure.devices import resolve_device
    from attnbench.measure.environment import collect_environment
    from attnbench.measure.telemetry import telemetry_status

    resolved = resolve_device(device or "auto")
    environment = collect_environment(resolved)
    table = Table(show_header=False, box=None)
    for key, value in environment.to_dict().items():
        table.add_row(key, "" if value is None else escape(str(value)))
    for key, value in telemetry_status(resolved).items():
        table.add_row(f"telemetry.{key}", escape(value))
    # What a sweep started now would share the machine with (the same check a sweep makes before its first case).
    now = busy_now(resolved, environment.torch_threads or logical_cores())
    table.add_row("load.now", escape(now.evidence or "unknown"))
    table.add_row("load.busy", "[yellow]yes[/]: " + escape("; ".join(now.reasons)) if now.contended else "no")
    stdout.print(table)
