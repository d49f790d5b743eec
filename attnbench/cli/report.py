"""``attnbench report RUN``: a stored run as a table, CSV, markdown, JSON, HTML, raw samples or dashboard JSON.

Needs no torch: every renderer reads the run folder alone.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Literal

import typer

from attnbench.cli.common import (
    OutputOpt,
    RunArg,
    handles_errors,
    print_warnings,
    refuse_input_as_output,
    stderr,
    stdout,
    write_or_print,
)
from attnbench.core.errors import AttnbenchError
from attnbench.core.units import plural

ReportFormat = Literal["table", "csv", "md", "json", "html", "samples", "gab", "bmf", "parquet"]


@handles_errors
def report(
    run: RunArg,
    format: Annotated[
        ReportFormat,
        typer.Option(
            "--format",
            "-f",
            help="table, csv, md, json; parquet (the summary frame: every csv column typed, options as columns; "
            "needs pyarrow and -o FILE); html (one self-contained page with the plots); samples (every raw sample: "
            "JSON lines, or CSV/Parquet by the -o name); gab, bmf (github-action-benchmark, Bencher JSON).",
        ),
    ] = "table",
    baseline: Annotated[
        str | None,
        typer.Option("--baseline", help="Model the speed-ups are against.", show_default="first recurrent model"),
    ] = None,
    output: OutputOpt = None,
    telemetry: Annotated[bool, typer.Option("--telemetry", help="Show the per-case telemetry table.")] = False,
    plots: Annotated[bool, typer.Option("--plots", help="Also write PNG plots (needs matplotlib).")] = False,
    plots_dir: Annotated[
        Path | None,
        typer.Option("--plots-dir", help="Where --plots writes; implies --plots.", show_default="RUN/plots"),
    ] = None,
) -> None:
    """Render a stored run: table, CSV, markdown, JSON, HTML, raw samples or dashboard JSON (needs no torch)."""
    from attnbench.report.exports import left_out, render_bmf, render_gab
    from attnbench.report.jsonfmt import render_json
    from attnbench.report.markdown import render_markdown
    from attnbench.report.plots import Plot
    from attnbench.report.rows import render_csv
    from attnbench.results.store import load_run

    stored = load_run(run)
    models = list(dict.fromkeys(r.case.model for r in stored.results))
    if baseline is not None and baseline not in models:
        raise AttnbenchError(
            f"--baseline: no model {baseline!r} in this run", hint=f"the run's models: {', '.join(models)}"
        )
    print_warnings(stored.warnings)
    figures: list[Plot] = []
    notice: str | None = None
    if plots or plots_dir is not None or (format == "html" and not telemetry):
        from attnbench.report.plots import plots_or_notice, write_plots

        figures, notice = plots_or_notice(stored.run, stored.results, baseline)
        if notice is not None:
            stderr.print(f"note: {notice}", markup=False)
        elif plots or plots_dir is not None:
            for path in write_plots(figures, plots_dir or stored.folder / "plots", in_run=plots_dir is None):
                stderr.print(f"wrote {path}", markup=False)
    if telemetry:
        if format not in ("table", "md"):
            raise AttnbenchError(
                f"--telemetry renders a table (-f table) or markdown (-f md), not {format}",
                hint="the raw samples are in telemetry.jsonl; per-case figures are in the csv",
            )
        if format == "table" and output in (None, "-"):
            from attnbench.report.terminal import telemetry_renderable

            stdout.print(telemetry_renderable(stored.results))
            return
        from attnbench.report.telemetry import render_telemetry_markdown

        write_or_print(render_telemetry_markdown(stored.results), output, reads=[stored.folder])
        return
    if format == "table" and output in (None, "-"):
        from attnbench.report.terminal import comparison_tables

        stdout.print(comparison_tables(stored.results, baseline, memory=True, run=stored.run))
        return
    if format in ("gab", "bmf") and left_out(stored.results):
        stderr.print(
            f"note: {plural(left_out(stored.results), 'case')} without a timing are not in the {format} export",
            markup=False,
        )
    suffix = Path(output).suffix.lower() if output not in (None, "-") else ""
    if format == "parquet" or (format == "samples" and suffix == ".parquet"):
        from attnbench.report.frames import frame, write_parquet, write_samples_parquet

        if output in (None, "-"):
            raise AttnbenchError("--format parquet writes a file, not a terminal", hint="name it: -o FILE.parquet")
        assert output is not None
        refuse_input_as_output(Path(output), [stored.folder])
        if format == "parquet":
            write_parquet(frame([stored]), Path(output), instead="-f csv for the same columns as text")
        else:
            write_samples_parquet(stored.run, stored.results, Path(output))
        stderr.print(f"wrote {output}", markup=False)
        return
    if format == "samples":
        from attnbench.report.samples import render_samples_csv, render_samples_jsonl
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
    write_or_print(renderers[format](), output, reads=[stored.folder])
