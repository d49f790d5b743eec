"""The run folder on disk: ``RunWriter`` appends rows as they finish, ``load_run`` reads a folder back.

A folder holds run.json (written first, replaced whole at the end), results.jsonl (one ``Result`` per line,
flushed and fsync'ed per case) and telemetry.jsonl (raw samples, each line durable before the row that refers
to it). A torn last line (a kill mid-write) is dropped with a warning on reading; anything else that does not
parse or check out is a ``ResultsError`` naming file, line and key.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TextIO

from attnbench.core.errors import ResultsError
from attnbench.results import fields
from attnbench.results.fields import FieldError
from attnbench.results.files import dumps_line, write_atomic
from attnbench.results.records import SCHEMA_VERSION, Result, Run

RUN_FILE = "run.json"

RESULTS_FILE = "results.jsonl"

TELEMETRY_FILE = "telemetry.jsonl"  # raw telemetry samples, one line per case (key, started_utc, samples)


class RunWriter:
    """Owns one run folder while a sweep writes it: run.json first, then one flushed line per result."""

    def __init__(self, folder: Path, run: Run) -> None:
        self.folder = folder
        self.run = run
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / RUN_FILE, json.dumps(run.to_dict(), indent=2) + "\n")
        self._rows: TextIO = (folder / RESULTS_FILE).open("a", encoding="utf-8")
        self._telemetry: TextIO | None = None

    def append(self, result: Result) -> None:
        if result.telemetry is not None and result.telemetry.raw:
            # Raw samples first, in their own file: the row that refers to them lands only after they do.
            if self._telemetry is None:
                self._telemetry = (self.folder / TELEMETRY_FILE).open("a", encoding="utf-8")
            sidecar = {
                "key": result.case.key,
                "started_utc": result.started_utc,
                "samples": [dict(s) for s in result.telemetry.raw],
            }
            self._telemetry.write(dumps_line(sidecar) + "\n")
            self._telemetry.flush()
            os.fsync(self._telemetry.fileno())  # durable before the row: a row never points at lost samples
        self._rows.write(dumps_line(result.to_dict()) + "\n")
        self._rows.flush()
        # fsync per case: a power cut or kill -9 loses at most the case in flight.
        os.fsync(self._rows.fileno())

    def close(self, state: Literal["complete", "interrupted"], finished_utc: str) -> None:
        self._rows.close()
        if self._telemetry is not None:
            self._telemetry.close()
        self.run = replace(self.run, state=state, finished_utc=finished_utc)
        write_atomic(self.folder / RUN_FILE, json.dumps(self.run.to_dict(), indent=2) + "\n")


@dataclass(frozen=True)
class StoredRun:
    folder: Path
    run: Run
    results: tuple[Result, ...]
    warnings: tuple[str, ...] = ()


def _reject_constant(name: str) -> float:
    # json.loads would accept NaN and Infinity, which JSON does not have and the writer never emits (allow_nan=False).
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise ValueError(f"{literal} is out of range for a float")
    return value


def _parse_json(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)


def _decode(raw: bytes) -> str:
    """UTF-8 text without NUL bytes (a crash can leave zero-filled blocks behind)."""
    text = raw.decode("utf-8")
    if "\0" in text:
        raise ValueError(f"a NUL byte at column {text.index(chr(0)) + 1} (zero-filled after a crash?)")
    return text


def _problem(exc: Exception) -> str:
    """What was wrong with one file or line, in words; ``exc`` is what decoding and parsing raised."""
    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON: {exc.msg}: column {exc.colno}"
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}"
    if isinstance(exc, RecursionError):
        return "not valid JSON: nested too deeply"
    return str(exc)


def _message(path: Path, exc: Exception, line: int | None = None, what: str = "") -> str:
    """``file[:line]``, the key path where there is one, and the problem; ``what`` names what the file is not."""
    if line is None and isinstance(exc, json.JSONDecodeError):
        line = exc.lineno
    location = str(path) if line is None else f"{path}:{line}"
    if isinstance(exc, FieldError) and exc.key:
        return f"{location}, key '{exc.key}': {exc.problem}"
    return f"{location}: {what}{_problem(exc)}"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ResultsError(
            f"{path}: cannot read it ({exc.strerror or exc})", hint="check that it is a readable file"
        ) from None


NOT_A_RUN = "not a readable attnbench run file: "

RUN_HINT = "run.json is written whole by 'attnbench sweep', so a damaged one was edited or copied; re-run the sweep"

ROWS_HINT = (
    "each line of results.jsonl is one result written by 'attnbench sweep'; a damaged line can be deleted "
    "(that case is then missing) or the sweep re-run"
)


def _load_run_file(path: Path) -> Run:
    raw = _read(path)
    if not raw.strip():
        raise ResultsError(f"{path}: empty file", hint="the sweep died before writing it? re-run the sweep")
    try:
        data = _parse_json(_decode(raw))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ResultsError(_message(path, exc, what=NOT_A_RUN), hint=RUN_HINT) from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: {NOT_A_RUN}expected a JSON object, found {fields.found(data)}", hint=RUN_HINT)
    if "schema_version" not in data:
        keys = ", ".join(repr(k) for k in list(data)[:5]) + (", ..." if len(data) > 5 else "")
        raise ResultsError(
            f"{path}: {NOT_A_RUN}no 'schema_version' key (found {keys or 'no keys'})",
            hint="pass a run folder written by 'attnbench sweep' (results/runs/<run_id>/)",
        )
    version = data["schema_version"]
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise ResultsError(
            f"{path}: schema_version {version} is newer than this attnbench reads ({SCHEMA_VERSION})",
            hint="upgrade attnbench to read this run",
        )
    try:
        return Run.from_dict(data)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ResultsError(_message(path, exc, what=NOT_A_RUN), hint=RUN_HINT) from None


def _load_rows(path: Path) -> tuple[list[Result], list[str]]:
    rows, warnings = _parse_rows(path)
    return [result for _, result in rows], warnings


def _parse_rows(path: Path) -> tuple[list[tuple[bytes, Result]], list[str]]:
    """One ``Result`` per line, with the line's bytes. A last line without its newline that does not parse is a
    write the sweep never finished (kill -9, power cut): it is dropped with a warning. Anything else wrong is an
    error naming the line."""
    if not path.exists():
        return [], []
    lines = _read(path).split(b"\n")
    results: list[tuple[bytes, Result]] = []
    warnings: list[str] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        torn = number == len(lines)  # the text after the last newline: a line the writer did not finish
        try:
            data = _parse_json(_decode(raw))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            if torn:
                warnings.append(f"{path}:{number}: dropped a torn last line (the sweep was killed mid-write)")
                continue
            raise ResultsError(_message(path, exc, number), hint=ROWS_HINT) from None
        try:
            results.append((raw, Result.from_dict(data)))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ResultsError(_message(path, exc, number, what="not a result row: "), hint=ROWS_HINT) from None
    return results, warnings


def load_run(folder: str | Path) -> StoredRun:
    """Read a run folder. A torn final line (a kill mid-write) is dropped with a warning; anything else that
    does not parse or check out is a ``ResultsError`` naming the file (and line) and what is wrong."""
    path = Path(folder)
    if not path.is_dir():
        if path.is_file():
            raise ResultsError(
                f"{path}: a file, not a run folder", hint=f"pass the folder that holds it: {path.parent}"
            )
        raise ResultsError(f"{path}: no such run folder", hint="pass a folder written by 'attnbench sweep'")
    if not (path / RUN_FILE).exists():
        raise ResultsError(
            f"{path}: no {RUN_FILE} in this folder",
            hint="pass a folder written by 'attnbench sweep' (results/runs/<run_id>/)",
        )
    run = _load_run_file(path / RUN_FILE)
    results, warnings = _load_rows(path / RESULTS_FILE)
    return StoredRun(path, run, tuple(results), tuple(warnings))


SKIPPED = "skipped "  # how load_runs' warnings about a run it left out begin


def run_folders(path: str | Path, exclude: Path | None = None) -> list[Path]:
    """``path`` itself when it is a run folder, else the run folders directly inside it (name order, leaving out
    ``exclude``, e.g. a merge's own output): how every command that takes "a run or a folder of runs" reads its
    argument. Empty when there is none."""
    path = Path(path)
    if (path / RUN_FILE).exists() or not path.is_dir():
        return [path]
    inside = sorted(p for p in path.iterdir() if p.is_dir() and (p / RUN_FILE).is_file())
    return [p for p in inside if exclude is None or p.resolve() != exclude.resolve()]


def load_runs(paths: Iterable[str | Path], *, skip_bad: bool = False) -> tuple[list[StoredRun], list[str]]:
    """Every run in ``paths`` (each a run folder or a folder of runs), in the order given, and the warnings
    reading them raised. With ``skip_bad`` a run that does not read is left out with a warning naming it and
    why; otherwise its ``ResultsError`` propagates. A path holding no run at all is an error either way."""
    runs: list[StoredRun] = []
    warnings: list[str] = []
    for given in paths:
        folders = run_folders(given)
        if not folders:
            raise ResultsError(
                f"{given}: holds no run (no {RUN_FILE}, no run folders inside)",
                hint="pass run folders written by 'attnbench sweep', or folders that hold them",
            )
        for folder in folders:
            try:
                stored = load_run(folder)
            except ResultsError as exc:
                if not skip_bad:
                    raise
                warnings.append(f"{SKIPPED}{folder}: {exc.message}")
                continue
            runs.append(stored)
            warnings += stored.warnings
    return runs, warnings


def rewrite_rows(folder: Path, keep: Callable[[Result], bool]) -> None:
    """Rewrite results.jsonl with the rows ``keep`` accepts, each byte for byte, every one ending in a newline,
    and without a torn last line, so that appending after a resume starts on a fresh line. Atomic."""
    path = Path(folder) / RESULTS_FILE
    rows, _ = _parse_rows(path)
    kept = b"".join(raw + b"\n" for raw, result in rows if keep(result))
    write_atomic(path, kept.decode("utf-8"))
