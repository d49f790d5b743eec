"""How attnbench writes a file it must never leave half-written: the one atomic-write helper, row JSON, timestamps.

Every file a run folder holds besides the two append-only logs (results.jsonl, telemetry.jsonl) is replaced
whole: run.json, the summaries, the plots, the calibration cache. ``write_atomic`` is the only way they are
written, so a crash, a full disk or a kill -9 leaves the old file or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def utc_now() -> str:
    """A row's timestamp: UTC, microseconds, ISO 8601."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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


def write_atomic(path: Path, data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) via a temporary file in the same folder, fsync it, rename it over ``path``
    and fsync the folder, so a reader never sees half a file and a power cut keeps the old one or the new one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file owner-only; results are meant to be read by others, as a plain open() would allow.
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data.encode("utf-8") if isinstance(data, str) else data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def _json_default(value: object) -> object:
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def dumps_line(data: object) -> str:
    """One JSON line as results.jsonl and telemetry.jsonl hold them: compact, UTF-8, and never NaN
    (``allow_nan=False``: a NaN in a row is a bug, and JSON readers elsewhere reject it)."""
    return json.dumps(data, allow_nan=False, default=_json_default, ensure_ascii=False)
