"""The loop at the heart of a sweep: cases in, results out, one at a time (ARCHITECTURE.md, "The flow").

A plain function of (cases, execute, callbacks) so that a launcher can hand it any subset of cases. It knows
nothing of torch, files or the console: ``execute`` measures, ``on_result`` stores and shows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from attnbench.core.cases import Case
from attnbench.results.records import Result


class OomSkipper:
    """Once a model runs out of memory at length n, its longer lengths (same everything else) would too:
    record them as ``oom`` without spending minutes, or a poisoned device, finding that out.

    With ``tied_batch`` (a constant-tokens grid, where batch shrinks as seq_len grows) batch is left out of
    "everything else": batch × seq_len is fixed, so attention's score memory, ∝ batch · seq_len², still grows.
    """

    def __init__(self, *, tied_batch: bool = False, seen: Iterable[Result] = ()) -> None:
        self.tied_batch = tied_batch
        self._smallest_oom: dict[Case, int] = {}
        for result in seen:
            self.record(result)

    def _family(self, case: Case) -> Case:
        # The kind of device, not its index: rows of a --devices sweep say which GPU of a set of equals ran them.
        device = case.device.split(":")[0]
        return dataclasses.replace(case, seq_len=0, batch=0 if self.tied_batch else case.batch, device=device)

    def record(self, result: Result) -> None:
        if result.status == "oom" and not result.extra.get("skipped"):
            family = self._family(result.case)
            n = self._smallest_oom.get(family)
            self._smallest_oom[family] = result.case.seq_len if n is None else min(n, result.case.seq_len)

    def skip(self, case: Case) -> Result | None:
        n = self._smallest_oom.get(self._family(case))
        if n is None or case.seq_len <= n:
            return None
        return Result(
            case, "oom", f"skipped after a smaller case ran out of memory (seq_len {n})", extra={"skipped": True}
        )


def run_cases(
    cases: Sequence[Case],
    execute: Callable[[Case], Result],
    on_result: Callable[[int, Result], None],
    on_start: Callable[[int, Case], None] | None = None,
    skipper: OomSkipper | None = None,
) -> list[Result]:
    """Run every case in order. ``on_result`` is called as each case ends, before the next begins, so a
    crash or Ctrl-C later loses nothing already finished."""
    results: list[Result] = []
    for index, case in enumerate(cases):
        if on_start is not None:
            on_start(index, case)
        result = skipper.skip(case) if skipper is not None else None
        if result is None:
            result = execute(case)
        if skipper is not None:
            skipper.record(result)
        results.append(result)
        on_result(index, result)
    return results
