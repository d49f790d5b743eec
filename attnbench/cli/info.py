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
    from attnbench.host.memory import check_budget, check_prefix_states

    paths = _config_files(configs)
    failed = 0
    verdicts: list[dict[str, Any]] = []
    for path in paths:
        try:
            experiment = load_experiment(path, tuple(overrides or ()))
            if "capacity" in experiment.axes.modes:  # a budget this machine cannot hold (a CPU's, torch-free)
                check_budget(experiment.resolved.get("memory_budget"), experiment.device, str(path))
            if "prefix" in experiment.axes.modes and experiment.device.startswith("cpu"):  # states it cannot hold
                check_prefix_states(experiment.cases(experiment.device), experiment.device, str(path))
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
    target: Annotated[
        str | None,
        typer.Argument(
            metavar="[NAME|CONFIG]",
            help="A model's name: that model with every option in full. A config: its hybrid stacks listed too.",
            show_default=False,
        ),
    ] = None,
    device: DeviceOpt = None,
    dtype: Annotated[str, typer.Option("--dtype", help="dtype to probe with.")] = "float32",
    format: FormatOpt = "table",
) -> None:
    """List every model, built-in and installed plugin (and CONFIG's hybrid stacks), one line each: whether it runs
    on this device and its own options; `attnbench models NAME` shows one model's options in full."""
    from attnbench.config.users import installed_plugins
    from attnbench.core.cases import DTYPES
    from attnbench.families.catalogue import MODELS, PUBLISHED
    from attnbench.families.registry import availability
    from attnbench.host.devices import resolve_device

    if dtype not in DTYPES:
        raise AttnbenchError(f"--dtype: unknown dtype {dtype!r}", hint=f"one of: {', '.join(DTYPES)}")
    plugins = {plugin.name: plugin for plugin in installed_plugins()}
    config = None
    if target is not None:
        path = Path(target)
        if path.is_file() or path.suffix in (".yaml", ".yml"):
            config = path  # load_experiment says what is wrong with a config that does not read
        elif target not in MODELS and target not in plugins and target not in PUBLISHED:
            from difflib import get_close_matches

            names = [*MODELS, *plugins, *PUBLISHED]
            near = get_close_matches(target, names, n=3)
            raise AttnbenchError(
                f"models: {target!r} is neither a model nor a config file",
                hint=f"did you mean {', '.join(near)}? " if near else f"a model ({', '.join(names)}) or a config path",
            )
    resolved = resolve_device(device or "auto")
    status = availability(resolved, dtype)
    stacks = _config_stacks(config, resolved, dtype)
    listing = _models_json(resolved, dtype, status)
    listing["models"] += [stack for stack, _ in stacks]
    listing["presets"] = _presets()
    if (target is not None and config is None) or format == "json":
        _print_one_or_json(target if config is None else None, listing, format)
        return
    _print_listing(listing, f"models on {resolved} ({dtype})")


def _print_listing(listing: dict[str, Any], title: str) -> None:
    """Every model one line (its own options; those every built-in takes said once below), then the presets."""
    everyone = _common_options([m for m in listing["models"] if m["source"] == "built-in"])
    rows = []
    for entry in listing["models"]:
        if entry["available"] is None and entry["reason"] is None:
            state_text = "plugin: built by its factory when swept"
        elif entry["available"]:
            state_text = "available"
        else:
            word = "does not load" if entry["available"] is None else "unavailable"
            state_text = f"{word}: {entry['reason']}"
        own = ", ".join(name for name in entry["options"] if name not in everyone)
        rows.append([entry["name"], entry["kind"] or "", entry["family"], entry["source"], state_text,
                     entry["summary"], own])  # fmt: skip
    headers = ["model", "kind", "family", "source", "status", "what it is", "its own options"]
    widths = _one_line_widths(headers, rows, stdout.width)
    table = Table(title=title, title_justify="left")
    for column, width in zip(headers, widths, strict=True):
        table.add_column(column, no_wrap=True, overflow="ellipsis", width=width)
    for row in rows:
        cells = [escape(cell) for cell in row]
        status_cell = row[4]
        colour = "green" if status_cell == "available" else "yellow" if status_cell.startswith("plugin") else "red"
        cells[4] = f"[{colour}]{cells[4]}[/]"
        table.add_row(*cells)
    stdout.print(table)
    stdout.print(_presets_table(listing["presets"], stdout.width))
    if everyone:
        stdout.print(f"Every built-in model also takes {', '.join(sorted(everyone))}.", markup=False)
    stdout.print("`attnbench models NAME` shows a model's options, their defaults and values.", markup=False)


def _one_line_widths(headers: list[str], rows: list[list[str]], total: int, fixed: int = 4) -> list[int]:
    """Column widths that keep every row on one line of a ``total``-wide terminal: the names (the first ``fixed``
    columns) whole, the rest shared in proportion to what they hold, each at least its header, none above it."""
    need = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    room = total - sum(need[:fixed]) - 3 * len(headers) - 1  # each cell's padding and border, and the last border
    flexible = need[fixed:]
    if sum(flexible) <= room:
        return need
    floors = [max(len(headers[fixed + i]), 9) for i in range(len(flexible))]
    spare = max(0, room - sum(floors))
    extra = [n - f for n, f in zip(flexible, floors, strict=True)]
    share = [f + int(spare * e / max(1, sum(extra))) for f, e in zip(floors, extra, strict=True)]
    return need[:fixed] + [min(n, s) for n, s in zip(flexible, share, strict=True)]


def _common_options(entries: list[dict[str, Any]]) -> set[str]:
    """The options every one of ``entries`` takes (the network's: scope, vocab, …): said once under the table."""
    names = [set(entry["options"]) for entry in entries]
    return set.intersection(*names) if names else set()


def _print_one_or_json(target: str | None, listing: dict[str, Any], format: str) -> None:
    """``models NAME`` (a model's options or a preset's source in full) and ``models -f json``."""
    if target is None:
        print_json(listing)
        return
    models = [m for m in listing["models"] if m["name"] == target]
    presets = [p for p in listing["presets"] if p["name"] == target]
    if format == "json":
        print_json({**listing, "models": models, "presets": presets})
    elif models:
        _print_model(models[0])
    else:
        _print_preset(presets[0])


def _print_preset(entry: dict[str, Any]) -> None:
    """One published preset: its source and the config.json fields cited, what is not built, and its mixers."""
    where = "available" if entry["available"] else f"unavailable: {entry['reason']}"
    stdout.print(f"{entry['name']} · preset · d_model {entry['d_model']} · {entry['layers']} layers · {where}",
                 markup=False)  # fmt: skip
    stdout.print(entry["summary"], markup=False)
    stdout.print(f"source: {entry['source']}; fields: {entry['fields']}", markup=False)
    stdout.print(f"not built: {entry['left_out']}", markup=False)
    table = Table(title_justify="left")
    for column in ("mixer", "model", "heads", "layers", "parameters per layer", "options"):
        table.add_column(column, overflow="fold")
    for m in entry["mixers"]:
        count = "?" if m["parameters_per_layer"] is None else f"{m['parameters_per_layer']:,}"
        if m["differs"]:
            count += f" (differs: {m['differs']})"
        options = ", ".join(f"{k}={v}" for k, v in m["options"].items())
        table.add_row(escape(m["label"]), escape(m["model"]), str(m["heads"] or ""), str(m["layers"]), escape(count),
                      escape(options))  # fmt: skip
    stdout.print(table)


def _print_model(entry: dict[str, Any]) -> None:
    """One model: what it is, whether it runs here, and a line per option (default, values, what it does)."""
    if entry["available"] is None:
        where = (
            "plugin: built by its factory when swept"
            if entry["reason"] is None
            else f"does not load: {entry['reason']}"
        )
    else:
        where = "available" if entry["available"] else f"unavailable: {entry['reason']}"
    kind = entry["kind"] or "?"
    stdout.print(f"{entry['name']} · {kind} · family {entry['family']} · {entry['source']} · {where}", markup=False)
    stdout.print(entry["summary"], markup=False)
    table = Table(title_justify="left", show_lines=False)
    for column in ("option", "default", "values", "what it does"):
        table.add_column(column, overflow="fold")
    for name, option in entry["options"].items():
        default = option["default"]
        shown = str(default).lower() if isinstance(default, bool) else str(default)
        table.add_row(escape(name), escape(shown), escape(str(option["allowed"])), escape(str(option["help"])))
    stdout.print(table)


def _presets() -> list[dict[str, Any]]:
    """Every published preset as data: its source and cited fields, and per mixer the model it is built on, how
    many of its layers it is, and one layer's parameters (scope core), or why this release cannot build it."""
    from attnbench.families.catalogue import (
        PRESET_CORE_DEFAULT,
        PUBLISHED,
        family_of,
        published_layer,
        published_problem,
    )

    core = PRESET_CORE_DEFAULT[0]

    out = []
    for name, preset in PUBLISHED.items():
        problem = published_problem(preset, (core,))
        mixers = []
        for mixer in preset.mixers:
            layer = None if problem is not None else published_layer(preset, mixer.label, core)
            mixers.append(
                {
                    "label": mixer.label,
                    "model": mixer.model or core,
                    "heads": mixer.heads,
                    "options": dict(mixer.options),
                    "layers": preset.count(mixer.label),
                    "parameters_per_layer": None if layer is None else family_of(layer).parameters(layer),
                    "differs": mixer.differs or None,
                }
            )
        out.append(
            {
                "name": name,
                "summary": preset.summary,
                "source": preset.source,
                "fields": preset.fields,
                "d_model": preset.d_model,
                "layers": preset.layers,
                "left_out": preset.left_out,
                "available": problem is None,
                "reason": problem,
                "mixers": mixers,
            }
        )
    return out


def _presets_table(presets: list[dict[str, Any]], width: int) -> Table:
    """One line a published preset: its mixers (× layers: one layer's parameters) and its source."""
    table = Table(title="published presets (`attnbench models PRESET` cites its config.json)", title_justify="left")
    rows = []
    for entry in presets:
        mixers = "; ".join(
            f"{m['label']} × {m['layers']}: "
            + ("?" if m["parameters_per_layer"] is None else f"{m['parameters_per_layer']:,}")
            for m in entry["mixers"]
        )
        status = "available" if entry["available"] else f"unavailable: {entry['reason']}"
        rows.append([entry["name"], status, mixers, entry["source"]])
    headers = ["preset", "status", "mixer × layers: parameters per layer", "source"]
    widths = _one_line_widths(headers, rows, width, fixed=1)
    for column, w in zip(headers, widths, strict=True):
        table.add_column(column, no_wrap=True, overflow="ellipsis", width=w)
    for row in rows:
        colour = "green" if row[1] == "available" else "red"
        table.add_row(escape(row[0]), f"[{colour}]{escape(row[1])}[/]", escape(row[2]), escape(row[3]))
    return table


def _config_stacks(config: Path | None, device: str, dtype: str) -> list[tuple[dict[str, Any], str]]:
    """The hybrid stacks ``config`` defines, as ``models --format json`` lists a model, with its options' line;
    whether one runs here is its first case's probe, in ``dtype``."""
    if config is None:
        return []
    from dataclasses import replace

    from attnbench.config.experiment import load_experiment
    from attnbench.families.catalogue import family_of, option_summary
    from attnbench.families.registry import probe

    experiment = load_experiment(config)
    # A stack says what it is (its pattern); a model a user brings is listed by the plugins' own lines.
    first = {c.model: c for c in reversed(experiment.cases(device)) if c.definition and family_of(c).described(c)}
    out = []
    for name, case in first.items():
        family = family_of(case)
        spec = family.spec(case)
        entry = {
            "name": name,
            "kind": spec.kind,
            "family": spec.family,
            "source": "config",
            "available": (reason := probe(replace(case, dtype=dtype), device)) is None,
            "reason": reason,
            "summary": spec.summary,
            **family.described(case),
            "options": {o.name: {"default": o.default, "allowed": o.allowed(), "help": o.help} for o in spec.options},
        }
        out.append((entry, option_summary(spec)))
    return out


def _models_json(device: str, dtype: str, status: dict[str, str | None]) -> dict[str, Any]:
    """What ``models`` shows, as data: each model with its options (default and what else it takes)."""
    from attnbench.config.users import installed_plugins
    from attnbench.families.catalogue import MODELS, USER
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
                "family": USER.name,
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
