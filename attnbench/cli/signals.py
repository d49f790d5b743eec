"""Ctrl-C and SIGTERM during a sweep: the first abandons the case in flight and keeps everything finished; the
second leaves at once. Only the CLI installs signal handlers; the library sees a ``KeyboardInterrupt``."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType


class Interrupts:
    """First SIGINT/SIGTERM: abandon what is in flight (KeyboardInterrupt while ``armed``: start-up, or a case being
    measured), else just note it (while a row is stored, the folder closed, the summaries rendered), to be acted on
    at the next ``arm`` or by the caller reading ``signal``. Second: run the ``on_second`` actions (kill a worker that
    may be running), then exit at once with 128 + the signal (the rows on disk are whole lines either way)."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.armed = False
        self.on_second: list[Callable[[], None]] = []

    def handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal is not None:
            for action in self.on_second:
                action()
            os._exit(128 + signum)
        self.signal = signum
        if self.armed:
            raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[Interrupts]:
        previous = {s: signal.signal(s, self.handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield self  # held while the partial summary is written too: a second signal still exits at once
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def arm(self) -> None:
        """From now on a signal abandons what is running; one that came while disarmed does so now."""
        self.armed = True
        if self.signal is not None:
            self.armed = False
            raise KeyboardInterrupt

    def disarm(self) -> None:
        self.armed = False

    @contextmanager
    def arming(self) -> Iterator[None]:
        self.arm()
        try:
            yield
        finally:
            self.disarm()
