"""One writer per run folder: an exclusive ``flock`` on ``<run>/.lock`` for as long as a sweep writes it.

flock is released by the kernel when the holder dies, so a killed sweep never leaves a stale lock behind. The lock
file is opened without following a link and must be a regular file: a planted ``.lock`` link cannot make a sweep
truncate a file elsewhere.
"""

from __future__ import annotations

import fcntl
import os
import sys
from contextlib import suppress
from pathlib import Path

from attnbench.core.errors import ResultsError
from attnbench.results.files import LEFTOVER, open_for_writing, write_failed

LOCK_FILE = ".lock"


def remove_if_only_lock(folder: Path) -> bool:
    """Remove a run folder that holds nothing but its lock file (and a killed write's temporary files): what a
    sweep leaves when it stops between making the folder and writing run.json. Anything else there stays."""
    try:
        names = os.listdir(folder)
        if not all(name == LOCK_FILE or LEFTOVER.match(name) for name in names):
            return False
        for name in names:
            os.unlink(folder / name)
        os.rmdir(folder)
    except OSError:
        return False  # gone already, or not ours to remove: leave it
    return True


class RunLock:
    def __init__(self, folder: Path) -> None:
        self.path = folder / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> RunLock:
        """Lock the folder or raise ``ResultsError`` naming who holds it; a lock file that is a link, a folder or
        a device, or that cannot be written, is a ``ResultsError`` naming it too."""
        fd = open_for_writing(self.path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode("utf-8", "replace").strip() or "another process"
            os.close(fd)
            raise ResultsError(
                f"{self.path.parent} is being written by another attnbench sweep ({holder})",
                hint="wait for it to finish, or write this sweep to another --out",
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()}: {' '.join(sys.argv)}\n".encode("utf-8", "replace"), 0)
        except OSError as exc:
            self._fd = fd
            self.release()
            raise write_failed(self.path, exc) from None
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            # The file stays (empty): unlinking it while locked would let a waiter lock the old inode and a
            # newcomer a new one, two writers at once.
            with suppress(OSError):  # a full disk: the holder's line stays; the kernel lock below is what counts
                os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
