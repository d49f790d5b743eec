"""The command line: the only room that prints, exits or handles signals (ARCHITECTURE.md, "cli").

This package builds the typer app and registers each command module's functions on it; the modules never import
``app`` back. Each command is thin: parse typed options (declared once in ``common``), call the library, hand the
result to a renderer. torch is imported only inside the commands that run models, so ``report``, ``compare``,
``claims``, ``validate`` and ``--help`` work on a machine without it.
"""

from __future__ import annotations

import os
from typing import Annotated

import typer

from attnbench.cli import claims, compare, device, history, info, merge, report, submit, sweep
from attnbench.cli.common import state

app = typer.Typer(
    name="attnbench",
    help="Measure recurrent networks against self-attention across sequence lengths, honestly.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.callback()
def main(debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False) -> None:
    state["debug"] = debug


# Registered in the order `attnbench --help` lists them.
for command in (
    sweep.sweep,
    report.report,
    info.validate,
    info.models,
    info.env,
    claims.claims,
    compare.compare,
    history.history,
    merge.merge,
    submit.submit,
    device.calibrate,
    device.selfcheck,
):
    app.command()(command)


def run() -> None:
    """Console-script entry point."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()
