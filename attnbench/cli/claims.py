"""``attnbench claims RUN``: the article's claims against a stored run (needs no torch)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

import typer

from attnbench.cli.common import OutputOpt, RunArg, handles_errors, print_warnings, stdout, write_or_print


@handles_errors
def claims(
    run: RunArg,
    format: Annotated[Literal["table", "md", "json"], typer.Option("--format", "-f")] = "table",
    output: OutputOpt = None,
) -> None:
    """Check the article's claims against a stored run: claim, figure, measurement, verdict."""
    from attnbench.claims import evaluate_claims
    from attnbench.report.claims_md import claims_table, render_claims_json, render_claims_markdown
    from attnbench.results.store import load_run

    stored = load_run(Path(run))
    print_warnings(stored.warnings)
    report = evaluate_claims(stored.run, stored.results)
    if format == "table" and output in (None, "-"):
        stdout.print(claims_table(report))
        return
    # A table written to a file is the markdown one, as with `report`.
    text = render_claims_json(report) if format == "json" else render_claims_markdown(report)
    write_or_print(text, output, reads=[stored.folder])
