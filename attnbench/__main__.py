"""``python -m attnbench`` and the ``attnbench`` console script.

The command line is imported inside ``main`` so that a Ctrl-C while it loads (typer, rich: a fraction of a second
before any command runs) is one line and exit 130, like a Ctrl-C anywhere else, not a traceback.
"""

from __future__ import annotations

import signal
import sys


def main() -> None:
    try:
        from attnbench.cli import run
    except KeyboardInterrupt:
        sys.stderr.write("interrupted by SIGINT: stopped while starting\n")
        raise SystemExit(130) from None
    try:
        run()
    except KeyboardInterrupt:
        # A Ctrl-C that escaped every command's own handling (one arriving as the process winds down): still the
        # shell's 130, never a traceback. The line has been printed already when a command saw the interrupt.
        from attnbench.cli.common import interrupted, state

        if not state["interrupt_said"]:
            interrupted(signal.SIGINT, "stopped")
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
