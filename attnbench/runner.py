"""The sweep loop: cases in, results out, one at a time (DESIGN §1, §9).

A plain function of (cases, execute, callbacks) so that a launcher can hand it any subset of cases. It knows
nothing of torch, files or the console: ``execute`` measures, ``on_result`` stores and shows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from attnbench.cases import Case
from attnbench.results import Result


def run_sweep(
    cases: Sequence[Case],
    execute: Callable[[Case], Result],
    on_result: Callable[[int, Result], None],
    on_start: Callable[[int, Case], None] | None = None,
) -> list[Result]:
    """Run every case in order. ``on_result`` is called as each case ends, before the next begins, so a
    crash or Ctrl-C later loses nothing already finished."""
    results: list[Result] = []
    for index, case in enumerate(cases):
        if on_start is not None:
            on_start(index, case)
        result = execute(case)
        results.append(result)
        on_result(index, result)
    return results
