"""How attnbench touches the files of a run folder: the one atomic write, the append-only logs, bounded reads, row
JSON and timestamps.

Every file a run folder holds besides the two append-only logs (results.jsonl, telemetry.jsonl) is replaced
whole: run.json, the summaries, the plots, the calibration cache. ``write_atomic`` is the only way they are
written, so a crash, a full disk or a kill -9 leaves the old file or the new one, never a mix; ``AppendLog`` is
the only way the logs grow, one whole line at a time.

A run folder is data anyone can hand us, so nothing here trusts what it finds there:
* writes never follow a symbolic link (``O_NOFOLLOW``) and refuse anything but a regular file, so a planted
  ``.lock`` or ``telemetry.jsonl`` link cannot truncate or append to a file elsewhere;
* reads take regular files only (a link to /dev/zero is refused at once) and are bounded: a file read whole, and
  each line of a log, may hold at most ``MAX_LINE_BYTES``;
* a command's output never lands in a run folder it read (``refuse_input_as_output``), and a file it may replace
  or remove is new, empty or one attnbench wrote (``refuse_foreign``);
* a write that fails is an error naming the file: a ``StorageError`` (exit 74) when the system failed (a full
  disk, a read-only file system, an I/O error), a ``ResultsError`` (exit 2) when the path cannot be used.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from attnbench.core.errors import AttnbenchError, ResultsError, StorageError
from attnbench.core.units import MIB

# The longest line of a log, and the largest file read whole, that a reader accepts: far above any row the writer
# can produce (a row of timing.max_samples' cap, 10 000 000 samples, is about 240 MB; real rows are under 30 KB),
# and low enough that a hostile file cannot make a reader hold gigabytes.
MAX_LINE_BYTES = 256 * MIB

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

# What write_atomic leaves behind when it is killed between creating its temporary file and renaming it.
LEFTOVER = re.compile(r"^\..+\.tmp$")


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def utc_now() -> str:
    """A row's timestamp: UTC, microseconds, ISO 8601."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ------------------------------------------------------------------------------------------------ what a path is
def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    )
    return next((name for test, name in kinds if test(mode)), "not a regular file")


_REPLACE_HINT = "remove it (attnbench writes only regular files it creates itself, never through a link)"

_NOT_REGULAR_HINT = "attnbench reads regular files only (a device or a pipe may never end): restore the sweep's file"

_LONG_LINE_HINT = (
    "no row or file attnbench writes comes near this size, so this one was damaged or is not attnbench's; "
    "remove the line (or the file)"
)


def refuse_special(path: Path) -> None:
    """Raise ``ResultsError`` when ``path`` exists as anything but a regular file (a link included); a path that
    does not exist is fine. Called before a folder's files are written, so a refusal comes before any write."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ResultsError(f"{path}: cannot check it ({exc.strerror or exc})", hint=_REPLACE_HINT) from None
    if not stat.S_ISREG(info.st_mode):
        raise ResultsError(f"{path}: {_kind(info.st_mode)}, not a regular file", hint=_REPLACE_HINT)


# Failures of the system rather than of the input: the disk or quota is full, the file system went read-only or
# failed. These exit EXIT_WRITE_FAILED; anything else (no permission, a missing folder) is bad input.
_SYSTEM_FAILURES = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO, errno.EFBIG})


def refuse_input_as_output(output: Path, reads: Iterable[Path], flag: str = "-o") -> None:
    """An ``AttnbenchError`` when ``output`` is, or leads through a link to, a path inside one of the run folders
    ``reads`` (the command's own input): ``report RUN -o RUN/results.jsonl`` would replace the rows it read."""
    target = output.resolve()
    for folder in reads:
        if target.is_relative_to(folder.resolve()):
            raise AttnbenchError(
                f"{flag} {output}: inside the run folder {folder}, which this command reads",
                hint="write it outside every run folder (a run folder holds only what its sweep wrote)",
            )


def write_failed(path: Path, exc: OSError, hint: str = "") -> ResultsError:
    """The error for a write the system refused, naming the file in the system's words: a ``StorageError`` when
    the system failed (a full disk, a read-only file system, an I/O error), else a ``ResultsError``."""
    message = f"{path}: cannot write it ({exc.strerror or exc})"
    if exc.errno in _SYSTEM_FAILURES:
        full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
        return StorageError(message, hint=hint or ("free some space on that disk" if full else "check the disk"))
    return ResultsError(message, hint=hint or "check that the folder exists and that you may write to it")


def open_for_writing(path: Path, flags: int) -> int:
    """``os.open`` that never follows a link and opens nothing but a regular file (a FIFO would block, a device
    would swallow the data); any refusal is a ``ResultsError`` naming the path."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | _CLOEXEC, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ResultsError(f"{path}: a symbolic link, not a regular file", hint=_REPLACE_HINT) from None
        if exc.errno in (errno.EISDIR, errno.ENXIO):
            kind = "a folder" if exc.errno == errno.EISDIR else "a named pipe or device"
            raise ResultsError(f"{path}: {kind}, not a regular file", hint=_REPLACE_HINT) from None
        raise write_failed(path, exc) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise ResultsError(f"{path}: {_kind(mode)}, not a regular file", hint=_REPLACE_HINT)
    os.set_blocking(fd, True)
    return fd


# ------------------------------------------------------------------------------------------------------- reading
def open_for_reading(path: Path, hint: str) -> BinaryIO:
    """A regular file opened for reading (a link to one is followed); a folder, a device, a pipe, a link loop or
    an unreadable file is a ``ResultsError`` naming the path."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC)
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read it ({exc.strerror or exc})", hint=hint) from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        if stat.S_ISDIR(mode):
            raise ResultsError(f"{path}: cannot read it ({os.strerror(errno.EISDIR)})", hint=hint)
        raise ResultsError(f"{path}: cannot read it ({_kind(mode)}, not a regular file)", hint=_NOT_REGULAR_HINT)
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_bounded(path: Path, hint: str, limit: int = MAX_LINE_BYTES) -> bytes:
    """The bytes of a regular file read whole, refused when it holds more than ``limit``."""
    with open_for_reading(path, hint) as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise ResultsError(f"{path}: cannot read it ({exc.strerror or exc})", hint=hint) from None
    if len(data) > limit:
        raise ResultsError(
            f"{path}: larger than {limit // MIB} MiB, far beyond any file attnbench writes", hint=_LONG_LINE_HINT
        )
    return data


def read_lines(path: Path, hint: str, limit: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes, bool]]:
    """``(line number, bytes without the newline, whether the newline was there)`` for each line of a regular
    file, streamed; a line longer than ``limit`` is a ``ResultsError`` naming it, found without reading on."""
    with open_for_reading(path, hint) as handle:
        number = 0
        while True:
            try:
                raw = handle.readline(limit + 1)
            except OSError as exc:
                raise ResultsError(f"{path}: cannot read it ({exc.strerror or exc})", hint=hint) from None
            if not raw:
                return
            number += 1
            ended = raw.endswith(b"\n")
            if len(raw) - ended > limit:
                raise ResultsError(
                    f"{path}:{number}: a line longer than {limit // MIB} MiB, far beyond any row attnbench writes",
                    hint=_LONG_LINE_HINT,
                )
            yield number, raw[:-1] if ended else raw, ended


# ------------------------------------------------------------------------------------------------------- writing
def refuse_foreign(path: Path, reads: Iterable[Path], *, flag: str, marker: str, what: str, hint: str) -> None:
    """An ``AttnbenchError`` unless ``path`` names a file a command may replace or remove: a new or empty one, or
    one attnbench wrote (``what``: it starts with ``marker``). A folder, a link, a file inside one of the run
    folders ``reads`` or any other file is refused before anything is written, since it must never be someone's."""
    refuse_input_as_output(path, reads, flag)
    try:
        refuse_special(path)
        if not path.exists():
            return
        with open_for_reading(path, hint) as handle:
            head = handle.read(len(marker.encode()))
    except AttnbenchError as exc:
        raise AttnbenchError(f"{flag} {exc.message}", hint=hint) from None
    if head and head != marker.encode():
        raise AttnbenchError(
            f"{flag} {path}: not {what} attnbench wrote, so it is neither replaced nor removed", hint=hint
        )


def fsync_folder(folder: Path) -> None:
    """Make a rename or a new file in ``folder`` durable: the data is fsync'ed with the file, the name with the
    folder (POSIX leaves a rename in the page cache until then)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return  # not a POSIX folder we may open (some network file systems): the rename itself still happened
    try:
        os.fsync(fd)
    except OSError:
        pass  # some file systems refuse fsync on a folder; the data itself was synced
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def reserve_path(path: Path) -> Path:
    return path.with_name(f".{path.name}.reserve.tmp")


def reserve(path: Path, size: int) -> None:
    """Set aside ``size`` bytes of disk for a later ``write_atomic(path, …, reserved=True)``: a file of that size
    beside ``path``, written now while there is room. On a disk that fills up meanwhile the later write reuses
    these blocks, so run.json can still say how the run ended. Best effort: without room now, no reserve."""
    spare = reserve_path(path)
    with suppress(FileNotFoundError):
        os.unlink(spare)
    try:
        fd = open_for_writing(spare, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except (ResultsError, OSError):
        return
    try:
        _write_all(fd, b" " * size)
        os.fsync(fd)
    except OSError:
        with suppress(OSError):
            os.unlink(spare)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: str | bytes, *, reserved: bool = False) -> None:
    """Write ``data`` (text as UTF-8) via a temporary file in the same folder, fsync it, rename it over ``path``
    and fsync the folder, so a reader never sees half a file and a power cut keeps the old one or the new one.

    ``path`` may not exist as anything but a regular file (``ResultsError``: a link is never replaced or written
    through); a write the system refuses is ``write_failed``'s error naming ``path``. With ``reserved``, the space
    ``reserve`` set aside is written into instead of a new temporary file, when it is there."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    refuse_special(path)
    spare = reserve_path(path)
    tmp: str | None = None
    try:
        if reserved and spare.is_file() and not spare.is_symlink():
            fd, tmp = open_for_writing(spare, os.O_WRONLY), str(spare)
        else:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            # mkstemp makes the file owner-only; results are meant to be read by others, as a plain open() allows.
            os.fchmod(fd, 0o666 & ~_UMASK)
            _write_all(fd, payload)
            os.ftruncate(fd, len(payload))  # the reserve may be longer than what it now holds
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_failed(path, exc) from None
        raise
    fsync_folder(path.parent)


def make_subfolder(path: Path) -> Path:
    """A folder inside a run folder (plots/), made if missing. A link there is refused, not followed: what
    attnbench writes into a run folder stays inside it."""
    try:
        os.mkdir(path)
    except FileExistsError:
        pass
    except OSError as exc:
        raise write_failed(path, exc) from None
    mode = os.lstat(path).st_mode
    if not stat.S_ISDIR(mode):
        raise ResultsError(f"{path}: {_kind(mode)}, not a folder", hint=_REPLACE_HINT)
    return path


def write_files(folder: Path, files: Iterable[tuple[str, str | bytes]], subfolders: Iterable[str] = ()) -> list[Path]:
    """Make each of ``subfolders`` inside the run folder ``folder`` (``make_subfolder``: never through a link, so
    nothing is written out of the run folder), then write each ``(name, content)`` into it with ``write_atomic``.
    Returns the paths written, in order."""
    for name in subfolders:
        make_subfolder(folder / name)
    paths: list[Path] = []
    for name, content in files:
        path = folder / name
        write_atomic(path, content)
        paths.append(path)
    return paths


def remove_leftovers(folder: Path) -> list[Path]:
    """Delete the temporary files a killed ``write_atomic`` (or an unused reserve) left in ``folder`` and its
    plots: hidden ``.NAME.….tmp`` regular files only. Returns what it removed."""
    removed: list[Path] = []
    for place in (folder, folder / "plots"):
        if place.is_symlink() or not place.is_dir():
            continue
        for path in place.iterdir():
            if LEFTOVER.match(path.name) and path.is_file() and not path.is_symlink():
                with suppress(FileNotFoundError):
                    path.unlink()
                    removed.append(path)
    return removed


class AppendLog:
    """An append-only log of JSON lines (results.jsonl, telemetry.jsonl): each line written whole and fsync'ed
    before ``append`` returns. A line the disk refuses is taken back (the file is truncated to where it was), so
    the log still ends on a whole line, and ``write_failed``'s error names the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = open_for_writing(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def append(self, line: str) -> None:
        if self._fd is None:
            raise ValueError(f"{self.path} is closed")
        start = os.fstat(self._fd).st_size
        try:
            _write_all(self._fd, (line + "\n").encode("utf-8"))
            os.fsync(self._fd)  # per line: a power cut or kill -9 loses at most the line in flight
        except OSError as exc:
            with suppress(OSError):
                os.ftruncate(self._fd, start)
            raise write_failed(self.path, exc) from None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


# ---------------------------------------------------------------------------------------------------- row JSON
_SURROGATE = re.compile("[\ud800-\udfff]")


def _json_default(value: object) -> object:
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def dumps_line(data: object) -> str:
    """One JSON line as results.jsonl and telemetry.jsonl hold them: compact, UTF-8, and never NaN
    (``allow_nan=False``: a NaN in a row is a bug, and JSON readers elsewhere reject it). A lone surrogate (an
    exception message about a file name that is not UTF-8) becomes U+FFFD: UTF-8 cannot hold it."""
    text = json.dumps(data, allow_nan=False, default=_json_default, ensure_ascii=False)
    return _SURROGATE.sub("\ufffd", text)
