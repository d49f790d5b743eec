"""What a running sweep shows: a rich progress bar on a terminal, plain parseable lines anywhere else."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from attnbench.core.cases import Case
from attnbench.core.text import safe_text
from attnbench.report.terminal import case_line
from attnbench.results.records import Result


class SweepDisplay:
    """Progress over cases with the current case and an ETA; a line per finished case. A ``SweepListener``."""

    def __init__(self, console: Console, total: int, *, quiet: bool = False, errors: Console | None = None) -> None:
        self.console = console
        self.errors = errors or console
        self.results: list[Result] = []  # what finished, in order
        self.total = total
        self.quiet = quiet
        self.live = console.is_terminal and not quiet
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self.live:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TextColumn("eta"),
                TimeRemainingColumn(),
                console=console,
                transient=True,
            )

    def __enter__(self) -> SweepDisplay:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("starting", total=self.total)
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def started(self, index: int, case: Case) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, description=escape(safe_text(case.label, lines=False)))

    def measured(self, index: int, result: Result) -> None:
        pass  # shown once stored (finished)

    def finished(self, index: int, result: Result) -> None:
        self.results.append(result)
        # How many have finished, not the case's place: with --devices cases end out of order.
        prefix = f"[{len(self.results)}/{self.total}]"
        if self._progress is not None and self._task is not None:
            self._progress.advance(self._task)
            style = (
                "green"
                if result.ok
                else ("yellow" if result.status in ("oom", "unsupported", "too_slow_for_budget") else "red")
            )
            self.console.print(
                f"[dim]{prefix}[/] [{style}]{escape(case_line(result))}[/]",
                markup=True,
                soft_wrap=True,
                highlight=False,
            )
        elif not self.quiet:
            self.console.print(f"{prefix} {case_line(result)}", markup=False, soft_wrap=True, highlight=False)

    def warning(self, text: str) -> None:
        self.errors.print(f"[yellow]warning:[/] {escape(text)}", markup=True, soft_wrap=True, highlight=False)
