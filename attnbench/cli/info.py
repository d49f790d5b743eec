"""``validate``, ``schema``, ``models`` and ``env``: what a config expands to, the schema editors check configs
against, which models run here, what a run would record. Each prints a table for a person or, with
``--format json``, one JSON document on stdout for a script (errors stay on stderr)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.cli.common import (
    DeviceOpt,
    FormatOpt,
    OutputOpt,
    SetOpt,
    handles_errors,
    print_error,
    print_json,
    state,
    stdout,
    write_or_print,
)
from attnbench.core.errors import EXIT_BAD_INPUT, AttnbenchError
from attnbench.core.units import format_bytes


@handles_errors
def validate(
    configs: Annotated[
        list[Path],
        typer.Argument(help="YAML experiments to check; a folder means every *.yaml in it.", show_default=False),
    ],
    overrides: SetOpt = None,
    format: Annotated[
        Literal["table", "json"],
        typer.Option("--format", "-f", help="table: one line per config; json: a list, one object per config."),
    ] = "table",
) -> None:
    """Check configs without running them: one line each, ok with the number of cases, or the error and a hint;
    exit 2 if any failed."""
    from attnbench.config.experiment import load_experiment
    from attnbench.host.memory import check_budget

    paths = _config_files(configs)
    failed = 0
    verdicts: list[dict[str, Any]] = []
    for path in paths:
        try:
            experiment = load_experiment(path, tuple(overrides or ()))
            if "capacity" in experiment.axes.modes:  # a budget this machine cannot hold (a CPU's, torch-free)
                check_budget(experiment.resolved.get("memory_budget"), experiment.device, str(path))
        except AttnbenchError as exc:
            if state["debug"]:
                raise
            if format == "table":
                print_error(exc.message, exc.hint)
            verdicts.append({"config": str(path), "ok": False, "error": exc.message, "hint": exc.hint})
            failed += 1
            continue
        cases = experiment.cases(experiment.device)
        models = sorted({c.model for c in cases})
        verdicts.append(
            {"config": str(path), "ok": True, "cases": len(cases), "models": models, "sha256": experiment.sha256}
        )
        if format == "table":
            stdout.print(
                f"ok: {path} → {len(cases)} cases ({', '.join(models)}), sha256 {experiment.sha256[:12]}",
                markup=False,
                highlight=False,
            )
    if format == "json":
        print_json(verdicts)
    elif len(paths) > 1:
        stdout.print(f"{len(paths)} configs: {len(paths) - failed} ok, {failed} failed", markup=False)
    if failed:
        raise typer.Exit(EXIT_BAD_INPUT)


def _config_files(given: list[Path]) -> list[Path]:
    """The files to validate, in the order given; a folder stands for its *.yaml and *.yml files, sorted."""
    paths: list[Path] = []
    for path in given:
        if path.is_dir():
            inside = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
            if not inside:
                raise AttnbenchError(
                    f"{path}: no *.yaml files in this folder", hint="give config files or a folder of them"
                )
            paths += inside
        else:
            paths.append(path)
    return paths


@handles_errors
def schema(output: OutputOpt = None) -> None:
    """Print the JSON Schema of a config, for editors: with a '# yaml-language-server: $schema=FILE' line at its top,
    a config gets completion, key descriptions and marks on a wrong key as it is typed."""
    from attnbench.config.schema import render_schema

    write_or_print(render_schema(), output)


@handles_errors
def models(
    config: Annotated[
        Path | None,
        typer.Argument(help="A config whose own models (hybrid stacks) to list too.", show_default=False),
    ] = None,
    device: DeviceOpt = None,
    dtype: Annotated[str, typer.Option("--dtype", help="dtype to probe with.")] = "float32",
    format: FormatOpt = "table",
) -> None:
    """List every model, built-in and installed plugin (and CONFIG's hybrid stacks), whether it runs on this device
    (and why not), and its options."""
    from attnbench.config.users import installed_plugins, user_spec
    from attnbench.core.cases import DTYPES
    from attnbench.families.catalogue import MODELS, option_summary
    from attnbench.families.registry import availability
    from attnbench.host.devices import resolve_device

    if dtype not in DTYPES:
        raise AttnbenchError(f"--dtype: unknown dtype {dtype!r}", hint=f"one of: {', '.join(DTYPES)}")
    resolved = resolve_device(device or "auto")
    status = availability(resolved, dtype)
    stacks = _config_stacks(config, resolved, dtype)
    if format == "json":
        listing = _models_json(resolved, dtype, status)
        listing["models"] += [stack for stack, _ in stacks]
        print_json(listing)
        return
    table = Table(title=f"models on {resolved} ({dtype})", title_justify="left")
    for column in ("model", "kind", "family", "source", "status", "what it is", "options (default, values)"):
        table.add_column(column)
    for name, spec in MODELS.items():
        reason = status[name]
        table.add_row(
            name,
            spec.kind,
            spec.family,
            spec.source,
            "[green]available[/]" if reason is None else f"[red]unavailable[/]: {escape(reason)}",
            escape(spec.summary),
            escape(option_summary(spec)),
        )
    for plugin in installed_plugins():
        loaded = plugin.plugin
        options = "" if loaded is None else option_summary(user_spec(plugin.name, loaded))
        table.add_row(
            escape(plugin.name),
            "" if loaded is None else loaded.kind,
            "user",
            escape(plugin.source),
            "[yellow]plugin[/]: built by its factory when swept"
            if loaded is not None
            else f"[red]does not load[/]: {escape(plugin.problem)}",
            escape(f"{loaded.summary} ({loaded.factory})" if loaded is not None else plugin.value),
            escape(options),
        )
    for stack, options in stacks:
        table.add_row(
            escape(stack["name"]),
            stack["kind"],
            "hybrid",
            "config",
            "[green]available[/]" if stack["reason"] is None else f"[red]unavailable[/]: {escape(stack['reason'])}",
            escape(stack["summary"]),
            escape(options),
        )
    stdout.print(table)


def _config_stacks(config: Path | None, device: str, dtype: str) -> list[tuple[dict[str, Any], str]]:
    """The hybrid stacks ``config`` defines, as ``models --format json`` lists a model, with its options' line;
    whether one runs here is its first case's probe, in ``dtype``."""
    if config is None:
        return []
    from dataclasses import replace

    from attnbench.config.experiment import load_experiment
    from attnbench.families.catalogue import HYBRID, option_summary
    from attnbench.families.registry import probe

    experiment = load_experiment(config)
    first = {c.model: c for c in reversed(experiment.cases(device)) if c.hybrid is not None}
    out = []
    for name, case in first.items():
        assert case.hybrid is not None
        spec = HYBRID.spec(case)
        entry = {
            "name": name,
            "kind": case.hybrid.kind,
            "family": "hybrid",
            "source": "config",
            "available": (reason := probe(replace(case, dtype=dtype), device)) is None,
            "reason": reason,
            "summary": spec.summary,
            "pattern": list(case.hybrid.pattern),
            "options": {o.name: {"default": o.default, "allowed": o.allowed(), "help": o.help} for o in spec.options},
        }
        out.append((entry, option_summary(spec)))
    return out


def _models_json(device: str, dtype: str, status: dict[str, str | None]) -> dict[str, Any]:
    """What ``models`` shows, as data: each model with its options (default and what else it takes)."""
    from attnbench.config.users import installed_plugins
    from attnbench.families.catalogue import MODELS
    from attnbench.families.plugins import plugin_options

    models: list[dict[str, Any]] = []
    for name, spec in MODELS.items():
        models.append(
            {
                "name": name,
                "kind": spec.kind,
                "family": spec.family,
                "source": spec.source,
                "available": status[name] is None,
                "reason": status[name],
                "summary": spec.summary,
                "options": {
                    o.name: {"default": o.default, "allowed": o.allowed(), "help": o.help}
                    for o in spec.options
                    if o.name != "preset"  # set by the config's presets key, never by hand
                },
            }
        )
    for plugin in installed_plugins():
        loaded = plugin.plugin
        models.append(
            {
                "name": plugin.name,
                "kind": None if loaded is None else loaded.kind,
                "family": "user",
                "source": plugin.source,
                "available": None,  # built by its factory when swept: nothing to probe before
                "reason": plugin.problem or None,
                "summary": plugin.value if loaded is None else loaded.summary,
                "factory": None if loaded is None else loaded.factory,
                "options": {}
                if loaded is None
                else {
                    o.name: {"default": o.default, "allowed": o.allowed(), "help": o.help}
                    for o in plugin_options(loaded)
                },
            }
        )
    return {"device": device, "dtype": dtype, "models": models}


@handles_errors
def env(device: DeviceOpt = None, format: FormatOpt = "table") -> None:
    """Print the environment a run here would record."""
    from attnbench.host.busy import busy_now, logical_cores
    from attnbench.host.devices import resolve_device, resolve_threads, threads_handed_back
    from attnbench.host.inventory import collect_environment
    from attnbench.host.sensors import telemetry_status

    resolved = resolve_device(device or "auto")
    with threads_handed_back(resolve_threads(None, resolved)):  # the count a sweep with the default runs with
        environment = collect_environment(resolved)
    # What a sweep started now would share the machine with (the same check a sweep makes before its first case).
    now = busy_now(resolved, environment.torch_threads or logical_cores())
    if format == "json":
        # run.json's own keys and values (bytes stay bytes), then what only `env` says.
        print_json(
            {
                "environment": environment.to_dict(),
                "telemetry": telemetry_status(resolved),
                "load": {"now": now.evidence or None, "busy": now.contended, "reasons": list(now.reasons)},
            }
        )
        return
    table = Table(show_header=False, box=None)
    for key, value in environment.to_dict().items():
        if key.endswith("_bytes"):
            # Sizes for a person to read; run.json keeps the bytes.
            key, value = key.removesuffix("_bytes"), format_bytes(value) if isinstance(value, int) else value
        table.add_row(key, "" if value is None else escape(str(value)))
    for key, value in telemetry_status(resolved).items():
        table.add_row(f"telemetry.{key}", escape(value))
    table.add_row("load.now", escape(now.evidence or "unknown"))
    table.add_row("load.busy", "[yellow]yes[/]: " + escape("; ".join(now.reasons)) if now.contended else "no")
    stdout.print(table)
