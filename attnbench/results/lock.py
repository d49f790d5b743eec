"""One writer per run folder: an exclusive ``flock`` on ``<run>/.lock`` for as long as a sweep writes it.

flock is released by the kernel when the holder dies, so a killed sweep never leaves a stale lock behind.
"""

from __future__ import annotations

import fcntl
import os
import sys
from pathlib import Path
from typing import TextIO

from attnbench.core.errors import ResultsError

LOCK_FILE = ".lock"


class RunLock:
    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self._handle: TextIO | None = None

    def acquire(self) -> RunLock:
        handle = self.path.open("a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise ResultsError(
                f"{self.path.parent} is being written by another attnbench sweep ({holder})",
                hint="wait for it to finish, or write this sweep to another --out",
            ) from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}: {' '.join(sys.argv)}\n")
        handle.flush()
        self._handle = handle
        return self

    def release(self) -> None:
        if self._handle is not None:
            # The file stays (empty): unlinking it while locked would let a waiter lock the old inode and a
            # newcomer a new one, two writers at once.
            self._handle.truncate(0)
            self._handle.flush()
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None
