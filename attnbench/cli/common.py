"""What every command shares: the consoles, the one error path, writing output, warnings, and the options
declared once. The CLI is the only room that prints, exits or handles signals.

Everything printed passes ``core.text.safe_text`` on its way out (the consoles and ``write_or_print`` apply it), so
a control character from a stored run (ESC, BEL, a bidirectional override, in a reason, a run id, a folder name)
reaches the terminal as a visible escape, never as a command to it.
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import typer
from rich.console import Console, ConsoleOptions, RenderableType
from rich.markup import escape
from rich.segment import Segment
from typer.core import TyperCommand, TyperGroup

from attnbench.core.cases import MAX_THREADS
from attnbench.core.errors import AttnbenchError
from attnbench.core.text import safe_text

if TYPE_CHECKING:
    from attnbench.report.formats import Format


class _Sanitized:
    """A renderable whose text passes ``safe_text`` after rich has laid it out (rich's own styles and cursor
    controls are separate segments, untouched), so no cell of a table can smuggle a control sequence out."""

    def __init__(self, renderable: RenderableType) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Segment]:
        for segment in console.render(self.renderable, options):
            if segment.control or not segment.text:
                yield segment
            else:
                yield Segment(safe_text(segment.text), segment.style)


class SafeConsole(Console):
    """A rich console that never writes a control character it did not make itself (``safe_text``)."""

    def print(self, *objects: Any, **options: Any) -> None:
        super().print(*(safe_text(o) if isinstance(o, str) else _Sanitized(o) for o in objects), **options)


# soft_wrap: lines are never folded at 80 columns in a pipe or CI log, so they stay parseable.
# A pipe or CI log has no width; rich would assume 80 columns and fold wide tables (calibrate, selfcheck) into
# unreadable stacks. Such logs are read in wide viewers, so give them 160 unless COLUMNS says otherwise.
_PIPE_WIDTH = None if sys.stdout.isatty() or "COLUMNS" in os.environ else 160
stdout = SafeConsole(highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
stderr = SafeConsole(stderr=True, highlight=False, soft_wrap=True, width=_PIPE_WIDTH)
state = {"debug": False, "interrupt_said": False}

F = TypeVar("F", bound=Callable[..., Any])
V = TypeVar("V")


# ------------------------------------------------------------------------------------------- the command classes
def _no_flag_metavar(params: list[Any]) -> list[Any]:
    """A flag takes no value, so --help must not print one after it (typer writes ``<bool>``)."""
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    """Every command's class (``app.command(cls=Command)``): flags, --help included, show no metavar, and a
    docstring's paragraphs read as paragraphs (rich help would keep the line breaks of the source)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.help:
            paragraphs = inspect.cleandoc(self.help).split("\n\n")
            self.help = "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_metavar(list(super().get_params(ctx)))


class Group(TyperGroup):
    """The app's class: as ``Command``, for the options before the command (--debug, --help)."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _no_flag_metavar(list(super().get_params(ctx)))


# ------------------------------------------------------------------------------------------ options, declared once
ConfigArg = Annotated[
    Path | None, typer.Argument(help="YAML experiment; omit for the built-in default.", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a config key: key.path=value (YAML value).", show_default=False),
]
# A sweep's device defaults to its config's; every other command, which has no config, resolves "auto".
SweepDeviceOpt = Annotated[
    str | None, typer.Option("--device", help="auto | cpu | cuda | cuda:N (default: the config's).", show_default=False)
]
DeviceOpt = Annotated[str | None, typer.Option("--device", help="auto | cpu | cuda | cuda:N.", show_default="auto")]
# The commands that write a run folder draw its plots/ last. ATTNBENCH_PLOTS=0 turns them off for a whole job (a CI
# gate that reads only the rows, a test suite): drawing is most of what such a job spends after its last case.
PLOTS_ENV = "ATTNBENCH_PLOTS"
_PLOTS_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def plots_wanted(flag: bool | None) -> bool:
    """``--plots``/``--no-plots`` when given, else ATTNBENCH_PLOTS, else on. Asked first thing in a command, so a
    bad value stops it before anything runs."""
    if flag is not None:
        return flag
    value = os.environ.get(PLOTS_ENV, "").strip()
    if not value:
        return True
    if value.lower() not in _PLOTS_WORDS:
        raise AttnbenchError(
            f"{PLOTS_ENV}={value!r}: not a yes or no",
            "set it to 0, false, no or off (no plots), or 1, true, yes or on; or unset it (plots drawn)",
        )
    return _PLOTS_WORDS[value.lower()]


PlotsOpt = Annotated[
    bool | None,
    typer.Option(
        "--plots/--no-plots",
        help="Draw plots/ in the run folder (--no-plots: the summaries only; `attnbench report RUN --plots` draws "
        f"them later). Without either flag, {PLOTS_ENV}=0 in the environment turns them off.",
        show_default="on",
    ),
]


def one_run(value: Path | None) -> Path | None:
    """A RUN argument's callback: ``latest`` becomes the newest run folder under results/runs (``store.resolve_run``);
    a callback runs while the command line is parsed, outside ``handles_errors``, so it fails here itself."""
    from attnbench.results.store import resolve_run

    if value is None:
        return None
    try:
        return resolve_run(value)
    except AttnbenchError as exc:
        raise fail(exc.message, exc.hint, exc.exit_code) from None


def runs_alias(values: list[Path] | None) -> list[Path] | None:
    """The same for an argument that takes several runs (history, merge)."""
    return None if values is None else [path for value in values if (path := one_run(value)) is not None]


LATEST_HELP = "'latest': the newest run under results/runs (FOLDER/latest: the newest in FOLDER)."
RunArg = Annotated[
    Path, typer.Argument(help=f"A run folder written by 'attnbench sweep'; {LATEST_HELP}", callback=one_run)
]
OutputOpt = Annotated[str | None, typer.Option("-o", "--output", help="File to write, or - for stdout.")]
# The commands whose only outputs are a table and its data (models, env, validate's lines, calibrate, selfcheck).
FormatOpt = Annotated[
    Literal["table", "json"], typer.Option("--format", "-f", help="table for a person, json for a script.")
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        max=MAX_THREADS,  # the config's own cap (a sweep's 'threads')
        help="torch threads (match a sweep's 'threads').",
        show_default="a sweep's: on a CPU every CPU but one",
    ),
]


# ------------------------------------------------------------------------------------------------- the error path
def print_error(message: str, hint: str = "") -> None:
    """How an error reads: a red 'error:' line and a 'hint:' line, on stderr."""
    # User text (paths, keys, values) may hold brackets: escape it so rich never reads it as markup; and newlines
    # (a stored reason quoted in a message) are escaped, so the error stays one line.
    stderr.print(f"[bold red]error:[/] {escape(safe_text(message, lines=False))}", markup=True, soft_wrap=True)
    if hint:
        stderr.print(f"[yellow]hint:[/] {escape(safe_text(hint, lines=False))}", markup=True, soft_wrap=True)


def fail(message: str, hint: str = "", code: int = 2) -> typer.Exit:
    """The one way errors end a command: the error printed, then the exit code to raise."""
    print_error(message, hint)
    return typer.Exit(code)


def interrupted(signum: int, what: str) -> typer.Exit:
    """One line for a command stopped by a signal, and the shell's exit code for it (128 + the signal)."""
    stderr.print(f"interrupted by {signal.Signals(signum).name}: {what}", markup=False)
    state["interrupt_said"] = True
    return typer.Exit(128 + signum)


def handles_errors(command: F) -> F:
    """Turn the project's own errors into ``fail`` and a Ctrl-C into one line and exit 130; anything else is a bug
    of ours and keeps its traceback."""

    @wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except AttnbenchError as exc:
            if state["debug"]:
                raise
            raise fail(exc.message, exc.hint, exc.exit_code) from None
        except KeyboardInterrupt:
            if state["debug"]:
                raise
            raise interrupted(signal.SIGINT, "stopped before it finished") from None
        except Exception as exc:
            # An extension that catches the KeyboardInterrupt of a Ctrl-C during its import may raise its own
            # error from it (an ImportError "during handling of" it): still an interrupt, not a bug to show.
            if state["debug"] or isinstance(exc, typer.Exit) or not caused_by_interrupt(exc):
                raise
            raise interrupted(signal.SIGINT, "stopped before it finished") from None

    return wrapper  # type: ignore[return-value]


def caused_by_interrupt(exc: BaseException) -> bool:
    """Whether ``exc`` is a KeyboardInterrupt or was raised from one (its cause, or the context it was raised in)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, KeyboardInterrupt):
            return True
        seen.add(id(current))
        current = current.__cause__ or (None if current.__suppress_context__ else current.__context__)
    return False


# ------------------------------------------------------------------------------------------------- output, warnings
def write_or_print(text: str, output: str | None, *, reads: Iterable[Path] = ()) -> None:
    """``text`` to stdout (no ``-o``, or ``-o -``) or to the file ``output``, saying where it went. Either way
    control characters are escaped (``safe_text``: JSON stays valid and means the same, its escapes are JSON's).

    A file is written whole (``results.files.write_atomic``), never through a link nor over anything but a regular
    file, and never inside one of ``reads``, the run folders the command read (``refuse_input_as_output``)."""
    from attnbench.results.files import refuse_input_as_output, write_atomic

    text = safe_text(text)
    if output in (None, "-"):
        sys.stdout.write(text)
        return
    path = Path(output)
    refuse_input_as_output(path, reads)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise AttnbenchError(f"cannot write {path}: {exc.strerror}", hint="choose another -o path") from None
    write_atomic(path, text)
    stderr.print(f"wrote {path}", markup=False)


def print_json(data: Any, output: str | None = None, *, reads: Iterable[Path] = ()) -> None:
    """One JSON document (to stdout, or ``-o FILE``); control characters come out as JSON escapes, like every output."""
    write_or_print(json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False) + "\n", output, reads=reads)


def print_warnings(warnings: Iterable[str]) -> None:
    """Warnings are data about the runs; they go to stderr, after the result, one 'warning:' line each."""
    for warning in warnings:
        stderr.print(f"[yellow]warning:[/] {escape(safe_text(warning, lines=False))}")


def print_wrote(paths: Iterable[Path]) -> None:
    for path in paths:
        stdout.print(f"wrote {path}", markup=False, highlight=False)


def emit(fmt: Format[V], value: V, output: str | None, *, reads: Iterable[Path] = ()) -> None:
    """``value`` in the format ``fmt`` (one of ``report.formats``' registries) where ``-o`` says: a terminal's
    table when there is one and no file is named, a binary file its renderer writes (``-o FILE`` required, never
    inside ``reads``), or text through ``write_or_print``. The format's note, if any, goes to stderr first."""
    from attnbench.results.files import refuse_input_as_output

    fmt = fmt.for_output(output)
    note = fmt.note(value) if fmt.note is not None else None
    if note is not None:
        stderr.print(f"note: {note}", markup=False)
    to_terminal = output in (None, "-")
    if to_terminal and fmt.terminal is not None:
        stdout.print(fmt.terminal(value))
    elif fmt.file is not None:
        if output is None or to_terminal:
            raise AttnbenchError(
                f"--format {fmt.name} writes a file, not a terminal", hint=f"name it: -o FILE.{fmt.name}"
            )
        refuse_input_as_output(Path(output), list(reads))
        fmt.file(value, Path(output))
        stderr.print(f"wrote {output}", markup=False)
    elif fmt.text is not None:
        write_or_print(fmt.text(value), output, reads=reads)
