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
    """Told about each case of a sweep as it starts and ends, and about anything worth a warning."""

    def started(self, index: int, case: Case) -> None: ...

    def finished(self, index: int, result: Result) -> None: ...

    def warning(self, text: str) -> None: ...


class QuietListener:
    """A listener that ignores everything: for scripts and tests that read the run folder afterwards."""

    def started(self, index: int, case: Case) -> None:
        pass

    def finished(self, index: int, result: Result) -> None:
        pass

    def warning(self, text: str) -> None:
        pass
