"""A run folder written whole rather than row by row: what ``attnbench merge`` leaves behind, with the same
contract as a sweep's folder (ARCHITECTURE.md, "A run folder"), and the telemetry sidecar read back as lines.

The folder is built under a hidden sibling name and put in place by renames, so a reader sees the old merge or
the new one and never half of one; every file in it goes through ``write_atomic``. Torch-free.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from attnbench.results.files import dumps_line, fsync_folder, read_lines, write_atomic
from attnbench.results.lock import RunLock
from attnbench.results.records import Result, Run
from attnbench.results.store import READ_HINT, RESULTS_FILE, RUN_FILE, TELEMETRY_FILE


def staging_folder(target: Path) -> Path:
    """Where the folder for ``target`` is built: beside it, hidden, unique to this process."""
    return target.parent / f".{target.name}.merging-{os.getpid()}"


def write_run_folder(folder: Path, run: Run, results: Sequence[Result], telemetry: Sequence[str]) -> None:
    """run.json, results.jsonl (one row per line, in the order given) and, when there are samples,
    telemetry.jsonl, each written atomically into a fresh ``folder``."""
    folder.mkdir(parents=True)
    write_atomic(folder / RESULTS_FILE, "".join(dumps_line(r.to_dict()) + "\n" for r in results))
    if telemetry:
        write_atomic(folder / TELEMETRY_FILE, "".join(line + "\n" for line in telemetry))
    write_atomic(folder / RUN_FILE, json.dumps(run.to_dict(), indent=2) + "\n")


def publish(staging: Path, target: Path) -> None:
    """Put the folder built at ``staging`` in place of ``target`` (which may exist: an earlier merge, replaced
    whole). Refuses while a sweep holds ``target``'s lock (someone resuming the merged run)."""
    if not target.exists():
        os.rename(staging, target)
        fsync_folder(target.parent)
        return
    lock = RunLock(target).acquire()
    old = target.parent / f".{target.name}.replaced-{os.getpid()}"
    try:
        os.rename(target, old)
        os.rename(staging, target)
    finally:
        lock.release()
    fsync_folder(target.parent)
    shutil.rmtree(old, ignore_errors=True)


def discard(staging: Path) -> None:
    shutil.rmtree(staging, ignore_errors=True)


def telemetry_lines(folder: Path) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The raw-telemetry sidecar of a run folder as ``(key, started_utc, line)``, and a warning for each line
    that does not read (a torn last line, damage): its samples are left out, the row keeps its summary."""
    path = folder / TELEMETRY_FILE
    if not path.exists():
        return [], []
    found: list[tuple[str, str, str]] = []
    warnings: list[str] = []
    # As results.jsonl is read: a regular file only (a link to /dev/zero or a pipe is refused at once), each line
    # bounded, streamed rather than read whole.
    for number, data, _ in read_lines(path, READ_HINT):
        if not data.strip():
            continue
        try:
            line = data.decode("utf-8")
            entry = json.loads(line)
            key, started = entry["key"], entry["started_utc"]
            if not isinstance(key, str) or not isinstance(started, str):
                raise TypeError("key and started_utc must be strings")
        except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
            warnings.append(f"{path}:{number}: left out a telemetry line that does not read ({exc})")
            continue
        found.append((key, started, line))
    return found, warnings
