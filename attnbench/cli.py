"""The command line (DESIGN §5). Only wiring: parse typed options, call the library, hand results to a renderer.

torch is imported only inside the commands that run models, so ``report``, ``validate`` and ``--help`` work on a
machine without it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from functools import wraps
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from attnbench.errors import EXIT_CASE_FAILED, AttnbenchError

app = typer.Typer(
    name="attnbench",
    help="Measure recurrent networks against self-attention across sequence lengths, honestly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# soft_wrap: lines are never folded at 80 columns in a pipe or CI log, so they stay parseable.
# A pipe or CI log has no width; rich would assume 80 columns and fold wide tables (calibrate, selfcheck) into
# unreadable stacks. Such logs are read in wide viewers, so give them 160 unless COLUMNS says otherwise.
_PIPE_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160
stdout = Console(highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
stderr = Console(stderr=True, highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
_state = {"debug": False}

F = TypeVar("F", bound=Callable[..., Any])

ConfigArg = Annotated[
    Path | None, typer.Argument(help="YAML experiment; omit for the built-in default.", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key: key.path=value (YAML value).", show_default=False),
]
DeviceOpt = Annotated[
    str | None, typer.Option("--device", help="auto | cpu | cuda | cuda:N (default: the config's).", show_default=False)
]
RunArg = Annotated[Path, typer.Argument(help="A run folder written by 'attnbench sweep'.")]


def fail(message: str, hint: str = "", code: int = 2) -> typer.Exit:
    """The one way errors reach the user: a red 'error:' line, a 'hint:' line, an exit code."""
    # User text (paths, keys, values) may hold brackets: escape it so rich never reads it as markup.
    stderr.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    if hint:
        stderr.print(f"[yellow]hint:[/] {escape(hint)}", markup=True, soft_wrap=True)
    return typer.Exit(code)


def handles_errors(command: F) -> F:
    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AttnbenchError as exc:
            if _state["debug"]:
                raise
            raise fail(exc.message, exc.hint, exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False) -> None:
    _state["debug"] = debug


def _write_or_print(text: str, output: str | None) -> None:
    if output in (None, "-"):
        sys.stdout.write(text)
        return
    path = Path(output)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise AttnbenchError(f"cannot write {path}: {exc.strerror}", hint="choose another -o path") from None
    stderr.print(f"wrote {path}", markup=False)


@app.command()
@handles_errors
def sweep(
    config: ConfigArg = None,
    device: DeviceOpt = None,
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
    from attnbench.sweep import SweepOptions, run_experiment

    if retry_failed and resume is None:
        raise AttnbenchError("--retry-failed needs --resume RUN", hint="attnbench sweep --resume RUN --retry-failed")
    options = SweepOptions(
        config=config,
        device=device,
        out=out,
        # --telemetry is shorthand for --set telemetry=…: part of the config, so resume checks it too.
        overrides=(*(overrides or ()), *((f"telemetry={telemetry}",) if telemetry else ())),
        dry_run=dry_run,
        quiet=quiet,
        isolate=isolate,
        resume=resume,
        retry_failed=retry_failed,
        force=force,
        inject_slowdown=inject_slowdown,
    )
    outcome = run_experiment(options, stdout, stderr)
    if outcome.interrupted_by is not None:
        raise typer.Exit(128 + outcome.interrupted_by)
    if outcome.failed:
        raise typer.Exit(EXIT_CASE_FAILED)


ReportFormat = Literal["table", "csv", "md", "json", "html", "samples", "gab", "bmf"]


@app.command()
@handles_errors
def report(
    run: RunArg,
    format: Annotated[
        ReportFormat,
        typer.Option(
            "--format",
            "-f",
            help="table, csv, md, json; html (one self-contained page with the plots); samples (every raw sample: "
            "JSON lines, or CSV/Parquet by the -o name); gab, bmf (github-action-benchmark, Bencher JSON).",
        ),
    ] = "table",
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="Model the speed-ups are against.", show_default="first recurrent model"),
    ] = None,
    output: Annotated[str | None, typer.Option("-o", "--output", help="File to write, or - for stdout.")] = None,
    telemetry: Annotated[bool, typer.Option("--telemetry", help="Show the per-case telemetry table.")] = False,
    plots: Annotated[bool, typer.Option("--plots", help="Also write PNG plots (needs matplotlib).")] = False,
    plots_dir: Annotated[
        Path | None,
        typer.Option("--plots-dir", help="Where --plots writes; implies --plots.", show_default="RUN/plots"),
    ] = None,
) -> None:
    """Render a stored run: table, CSV, markdown, JSON, HTML, raw samples or dashboard JSON (needs no torch)."""
    from attnbench.catalogue import MODEL_NAMES
    from attnbench.report.exports import left_out, render_bmf, render_gab
    from attnbench.report.jsonfmt import render_json
    from attnbench.report.markdown import render_markdown
    from attnbench.report.plots import Plot
    from attnbench.report.summary import render_csv
    from attnbench.results import load_run

    if baseline is not None and baseline not in MODEL_NAMES:
        raise AttnbenchError(f"--baseline: unknown model {baseline!r}", hint=f"one of: {', '.join(MODEL_NAMES)}")
    stored = load_run(run)
    for warning in stored.warnings:
        stderr.print(f"[yellow]warning:[/] {escape(warning)}")
    figures: list[Plot] = []
    notice: str | None = None
    if plots or plots_dir is not None or (format == "html" and not telemetry):
        from attnbench.report.plots import plots_or_notice, write_plots

        figures, notice = plots_or_notice(stored.run, stored.results, baseline)
        if notice is not None:
            stderr.print(f"note: {notice}", markup=False)
        elif plots or plots_dir is not None:
            for path in write_plots(figures, plots_dir or stored.folder / "plots"):
                stderr.print(f"wrote {path}", markup=False)
    if telemetry:
        from attnbench.report.telemetry import render_telemetry_markdown

        if format not in ("table", "md"):
            raise AttnbenchError(
                f"--telemetry renders a markdown table, not {format}",
                hint="the raw samples are in telemetry.jsonl; per-case figures are in the csv",
            )

        _write_or_print(render_telemetry_markdown(stored.results), output)
        return
    if format == "table" and output in (None, "-"):
        from attnbench.report.terminal import comparison_tables

        stdout.print(comparison_tables(stored.results, baseline, memory=True, run=stored.run))
        return
    if format in ("gab", "bmf") and left_out(stored.results):
        stderr.print(
            f"note: {left_out(stored.results)} cases without a timing are not in the {format} export", markup=False
        )
    suffix = Path(output).suffix.lower() if output not in (None, "-") else ""
    if format == "samples":
        from attnbench.report.samples import render_samples_csv, render_samples_jsonl, write_samples_parquet

        if suffix == ".parquet":
            assert output is not None
            write_samples_parquet(stored.run, stored.results, Path(output))
            stderr.print(f"wrote {output}", markup=False)
            return
    renderers: dict[str, Callable[[], str]] = {
        "csv": lambda: render_csv(stored.results, stored.run),
        "md": lambda: render_markdown(stored.run, stored.results, baseline),
        "table": lambda: render_markdown(stored.run, stored.results, baseline),
        "json": lambda: render_json(stored.run, stored.results),
        "gab": lambda: render_gab(stored.results),
        "bmf": lambda: render_bmf(stored.results),
    }
    if format == "html":
        from attnbench.report.html import render_html

        renderers["html"] = lambda: render_html(stored.run, stored.results, baseline, figures, notice or "")
    if format == "samples":
        renderers["samples"] = lambda: (render_samples_csv if suffix == ".csv" else render_samples_jsonl)(
            stored.run, stored.results
        )
    _write_or_print(renderers[format](), output)


@app.command()
@handles_errors
def validate(
    config: Annotated[Path, typer.Argument(help="YAML experiment to check.")], overrides: SetOpt = None
) -> None:
    """Check a config without running it; print how many cases it expands to."""
    from attnbench.config import load_experiment

    experiment = load_experiment(config, tuple(overrides or ()))
    cases = experiment.cases(experiment.device)
    models = sorted({c.model for c in cases})
    stdout.print(f"ok: {config} → {len(cases)} cases ({', '.join(models)}), sha256 {experiment.sha256[:12]}")


@app.command()
@handles_errors
def models(
    device: DeviceOpt = None, dtype: Annotated[str, typer.Option("--dtype", help="dtype to probe with.")] = "float32"
) -> None:
    """List every model and whether it runs on this device (and why not)."""
    from attnbench.catalogue import DTYPES, MODELS
    from attnbench.devices import resolve_device
    from attnbench.models import availability

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


@app.command()
@handles_errors
def env(device: DeviceOpt = None) -> None:
    """Print the environment a run here would record."""
    from attnbench.devices import resolve_device
    from attnbench.environment import collect_environment
    from attnbench.telemetry import telemetry_status

    resolved = resolve_device(device or "auto")
    environment = collect_environment(resolved)
    table = Table(show_header=False, box=None)
    for key, value in environment.to_dict().items():
        table.add_row(key, "" if value is None else escape(str(value)))
    for key, value in telemetry_status(resolved).items():
        table.add_row(f"telemetry.{key}", escape(value))
    stdout.print(table)


def run() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()


# Commands that live in their own modules register themselves on ``app`` when imported. Imported last because
# they use ``app``, ``handles_errors`` and ``fail`` from above; each keeps torch out of its module top level.
from attnbench import cli_claims, cli_compare, cli_device  # noqa: E402, F401
