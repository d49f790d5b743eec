"""``attnbench claims RUN``: the article's claims against a stored run (needs no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape

from attnbench.cli import RunArg, _write_or_print, app, handles_errors, stderr, stdout


@app.command()
@handles_errors
def claims(
    run: RunArg,
    format: Annotated[Literal["table", "md", "json"], typer.Option("--format", "-f")] = "table",
    output: Annotated[str | None, typer.Option("-o", "--output", help="File to write, or - for stdout.")] = None,
) -> None:
    """Check the article's claims against a stored run: claim, figure, measurement, verdict."""
    from attnbench.claims import evaluate_claims
    from attnbench.report.claims_md import claims_table, render_claims_json, render_claims_markdown
    from attnbench.results import load_run

    stored = load_run(Path(run))
    for warning in stored.warnings:
        stderr.print(f"[yellow]warning:[/] {escape(warning)}")
    report = evaluate_claims(stored.run, stored.results)
    if format == "table" and output in (None, "-"):
        stdout.print(claims_table(report))
        return
    # A table written to a file is the markdown one, as with `report`.
    text = render_claims_json(report) if format == "json" else render_claims_markdown(report)
    _write_or_print(text, output)
