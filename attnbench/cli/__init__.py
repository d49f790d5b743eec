"""The command line: the only room that prints, exits or handles signals (ARCHITECTURE.md, "cli").

This package builds the typer app and registers each command module's functions on it; the modules never import
``app`` back. Each command is thin: parse typed options (declared once in ``common``), call the library, hand the
result to a renderer. torch is imported only inside the commands that run models, so ``report``, ``compare``,
``claims``, ``validate``, ``schema``, ``sweep --dry-run`` and ``--help`` work on a machine without it.
"""

from __future__ import annotations

import os
import signal
from typing import Annotated

import typer

from attnbench.cli import ab, claims, compare, device, history, info, merge, publish, report, submit, sweep
from attnbench.cli.common import Command, Group, interrupted, state, stdout

app = typer.Typer(
    name="attnbench",
    cls=Group,
    help="Measure recurrent networks against self-attention across sequence lengths, honestly.",
    no_args_is_help=True,
    # --install-completion and --show-completion (bash, zsh, fish, PowerShell), as typer writes them.
    add_completion=True,
    pretty_exceptions_enable=False,
)


def version() -> str:
    """attnbench's version as installed: the same figure every run.json records (``environment.attnbench``)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("attnbench")
    except PackageNotFoundError:  # run from a source tree that was never installed: what run.json says then too
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        stdout.print(f"attnbench {version()}", markup=False, highlight=False)
        raise typer.Exit()


@app.callback()
def main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    show_version: Annotated[
        bool,
        typer.Option("--version", help="Print attnbench's version and exit.", callback=_print_version, is_eager=True),
    ] = False,
) -> None:
    state["debug"] = debug
    state["interrupt_said"] = False


# Registered in the order `attnbench --help` lists them.
for command in (
    sweep.sweep,
    report.report,
    info.validate,
    info.schema,
    info.models,
    info.env,
    claims.claims,
    compare.compare,
    ab.ab,
    history.history,
    publish.publish,
    merge.merge,
    submit.submit,
    device.calibrate,
    device.selfcheck,
):
    app.command(cls=Command)(command)


def run() -> None:
    """Console-script entry point (through ``attnbench.__main__.main``)."""
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    try:
        app()
    except SystemExit as exc:
        # typer turns a Ctrl-C outside any command (while it parses, or imports what it parses with) into a
        # silent exit 130; say so in the one line every other interrupt gets.
        if exc.code == 128 + signal.SIGINT and not state["interrupt_said"]:
            interrupted(signal.SIGINT, "stopped while starting")
        raise
