"""What a running sweep shows: a rich progress bar on a terminal, plain parseable lines anywhere else."""

from __future__ import annotations

import dataclasses
import datetime
import statistics
import time
from collections.abc import Callable, Sequence
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    SpinnerColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.text import safe_text
from attnbench.core.units import plural
from attnbench.report.terminal import case_line
from attnbench.results.records import Result

# Before a case has finished, what a case costs beyond its timed window (building the model, probing, the memory
# pass) is unknown; this is assumed, and replaced by the median seen as soon as cases finish.
DEFAULT_OVERHEAD_S = 0.5


def _curve(case: Case) -> Case:
    """A case without its length: the finished cases of the same curve predict the longer ones."""
    return dataclasses.replace(case, seq_len=0)


def eta_s(finished: Sequence[Result], remaining: Sequence[Case], policy: TimingPolicy) -> float:
    """Seconds until the sweep ends, from the cases' budgets and the timings so far (issue 17: a count-based ETA
    said 0:52 at case 2/32 of a run that took 2:22, because the first cases are the short ones).

    A case costs at most its budget: ``timing.processes × (timing.max_case_s + timing.rounds × overhead)``, the
    overhead being the median of what finished cases spent outside their timed window (building, probing, the
    memory pass).
    A remaining case is expected to cost what the longest finished case of its own curve cost (the same model and
    everything but seq_len: a sweep walks each curve to longer lengths, which cost no less), never more than its
    budget; a case of a curve that has not started yet, its budget. So the ETA starts from the budgets and
    comes down as curves turn out cheaper."""
    overheads = [max(0.0, r.duration_s - _window_s(r)) for r in finished if r.duration_s > 0]
    overhead = statistics.median(overheads) if overheads else DEFAULT_OVERHEAD_S
    # timing.rounds splits max_case_s into R visits, each building the case again: R overheads.
    cap = max(1, policy.processes) * (policy.max_case_s + max(1, policy.rounds) * overhead)
    by_curve: dict[Case, float] = {}
    for r in finished:
        key = _curve(r.case)
        by_curve[key] = max(by_curve.get(key, 0.0), r.duration_s)
    return sum(min(cap, by_curve.get(_curve(case), cap)) for case in remaining)


def _window_s(result: Result) -> float:
    """The seconds a row spent in its timed windows (warm-up and samples, every replicate's)."""
    m = result.measurement
    return 0.0 if m is None else m.warmup_s + sum(m.samples_s) * m.calls_per_sample


class _EtaColumn(ProgressColumn):
    """The budget-based ETA the display keeps in the task's fields (rich's own divides by the count), counting
    down while a case runs: ``eta_s`` was the estimate at ``eta_at``, and what the cases in flight are expected to
    cost is spent as they run — but never below ``eta_rest_s``, the cases not yet started, however long the
    current one overruns."""

    def __init__(self, clock: Callable[[], float]) -> None:
        super().__init__()
        self.clock = clock

    def render(self, task: Task) -> Text:
        eta = task.fields.get("eta_s")
        if eta is None:
            return Text("eta -:--:--", style="progress.remaining")
        # SweepDisplay._update_eta sets the three fields together.
        left = max(task.fields["eta_rest_s"], eta - (self.clock() - task.fields["eta_at"]))
        return Text(f"eta {datetime.timedelta(seconds=round(left))}", style="progress.remaining")


class SweepDisplay:
    """Progress over cases with the current case and an ETA from the budgets; a line per finished case. A
    ``SweepListener``."""

    def __init__(
        self,
        console: Console,
        total: int,
        *,
        quiet: bool = False,
        errors: Console | None = None,
        cases: Sequence[Case] = (),
        policy: TimingPolicy | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.errors = errors or console
        self.results: list[Result] = []  # what finished, in order
        self.total = total
        self.quiet = quiet
        self.live = console.is_terminal and not quiet
        self.cases = list(cases)  # what the sweep will run, for the ETA
        self.policy = policy or TimingPolicy()
        self.clock = clock
        self.running: set[str] = set()  # keys of the cases started and not yet finished
        self.round = ""  # "round r of R: " while a sweep runs in rounds (timing.rounds)
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        if self.live:
            self._progress = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                _EtaColumn(clock),
                console=console,
                transient=True,
            )

    def eta_s(self, *, started: bool = True) -> float:
        """Seconds left for the cases not finished; ``started=False`` leaves out the cases in flight."""
        skip = {r.case.key for r in self.results} | (set() if started else self.running)
        return eta_s(self.results, [c for c in self.cases if c.key not in skip], self.policy)

    def _update_eta(self, description: str | None = None) -> None:
        if self._progress is not None and self._task is not None:
            self._progress.update(
                self._task,
                description=description,
                eta_s=self.eta_s(),
                eta_rest_s=self.eta_s(started=False),
                eta_at=self.clock(),
            )

    def __enter__(self) -> SweepDisplay:
        if self._progress is not None:
            self._progress.start()
            self._task = self._progress.add_task("starting", total=self.total)
            self._update_eta()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()

    def round_started(self, number: int, rounds: int) -> None:
        self.round = f"round {number} of {rounds}: "
        if not self.live and not self.quiet:  # a pipe or CI log sees no bar: a line says where the sweep is
            self.console.print(f"{self.round.rstrip(': ')} ({plural(self.total, 'case')})", markup=False)

    def started(self, index: int, case: Case) -> None:
        self.running.add(case.key)
        self._update_eta(description=escape(self.round + safe_text(case.label, lines=False)))

    def measured(self, index: int, result: Result) -> None:
        pass  # shown once stored (finished)

    def finished(self, index: int, result: Result) -> None:
        self.results.append(result)
        self.running.discard(result.case.key)
        # How many have finished, not the case's place: with --devices cases end out of order.
        prefix = f"[{len(self.results)}/{self.total}]"
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, advance=1)
            self._update_eta()
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
