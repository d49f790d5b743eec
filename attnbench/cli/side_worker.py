"""``PYTHON -m attnbench.cli.side_worker FD``: the process of one side of ``attnbench ab``, run by that side's
interpreter. The worker itself is ``sweeps.side_worker.main``; this runner only turns what it returns into the
process's exit code, as only ``cli`` ends a process."""

from __future__ import annotations

import sys

from attnbench.sweeps.side_worker import main


def run(argv: list[str]) -> None:
    """Serve the socket whose descriptor is ``argv[0]``, then exit with the worker's code (1: it could not start)."""
    sys.exit(main(argv))


if __name__ == "__main__":
    run(sys.argv[1:])
