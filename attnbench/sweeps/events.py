"""What measuring code tells the room above it while it works: progress as data, never printed here.

The measure layer never prints, exits or handles signals (that is the CLI's job); it calls these callbacks and
the CLI decides what a person sees.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from attnbench.core.cases import Case
from attnbench.results.records import Result

# One line of progress ("matmul bfloat16 n=4096: 780 TFLOP/s"), for long measurements such as calibrate.
Progress = Callable[[str], None]


class SweepListener(Protocol):
    """Told about each case of a sweep as it starts, when its work is over (``measured``: its row, or with rounds
    a block, is about to be stored), once its row is stored (``finished``), and about anything worth a warning.
    Between ``started`` and ``measured`` a case may be abandoned (the CLI's Ctrl-C); after ``measured`` its row
    must be let land."""

    def started(self, index: int, case: Case) -> None: ...

    def round_started(self, number: int, rounds: int) -> None:
        """Round ``number`` of ``rounds`` begins (timing.rounds > 1; a case's ``started`` comes once a round)."""
        ...

    def measured(self, index: int, result: Result) -> None: ...

    def finished(self, index: int, result: Result) -> None: ...

    def warning(self, text: str) -> None: ...


class QuietListener:
    """A listener that ignores everything: for scripts and tests that read the run folder afterwards."""

    def started(self, index: int, case: Case) -> None:
        pass

    def round_started(self, number: int, rounds: int) -> None:
        pass

    def measured(self, index: int, result: Result) -> None:
        pass

    def finished(self, index: int, result: Result) -> None:
        pass

    def warning(self, text: str) -> None:
        pass
