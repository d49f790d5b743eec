"""Result rows, run metadata and the run folder on disk (DESIGN §3, §4). Layer 3, no torch.

Schema history (``SCHEMA_VERSION``):
  1 — first version: run.json (``Run``) + results.jsonl (one ``Result`` per line).
Readers accept every version listed here and refuse newer ones with a hint to upgrade.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, TextIO

from attnbench.cases import Case, TimingPolicy
from attnbench.errors import ResultsError
from attnbench.measurement import Measurement

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"

Status = Literal["ok", "oom", "unsupported", "error", "timeout", "crashed"]
STATUSES: tuple[Status, ...] = ("ok", "oom", "unsupported", "error", "timeout", "crashed")
# Statuses that make `sweep` exit 1: the case broke, rather than the hardware saying no.
FAILED: frozenset[str] = frozenset({"error", "timeout", "crashed"})

Extra = Mapping[str, str | int | float | bool | None]


@dataclass(frozen=True)
class Memory:
    """Peak memory of one call above the post-setup baseline, and how it was measured."""

    peak_bytes: int | None
    method: str  # "cuda-allocator" | "rss-hwm" | "unavailable"
    note: str = ""


@dataclass(frozen=True)
class Result:
    """One case's outcome. Every non-ok status carries a human ``reason``; nothing is encoded as NaN."""

    case: Case
    status: Status
    reason: str = ""
    measurement: Measurement | None = None
    memory: Memory | None = None
    parameters: int | None = None
    started_utc: str = ""
    duration_s: float = 0.0
    extra: Extra = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def tokens_per_s(self) -> float | None:
        if self.measurement is None or self.measurement.median_s <= 0:
            return None
        return self.case.tokens / self.measurement.median_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "case": self.case.to_dict(),
            "key": self.case.key,
            "status": self.status,
            "reason": self.reason,
            "measurement": None if self.measurement is None else self.measurement.to_dict(),
            "memory": None if self.memory is None else vars(self.memory).copy(),
            "parameters": self.parameters,
            "started_utc": self.started_utc,
            "duration_s": self.duration_s,
            "extra": dict(self.extra),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Result:
        memory = data.get("memory")
        measurement = data.get("measurement")
        status = data["status"]
        if status not in STATUSES:
            raise ValueError(f"unknown status {status!r}")
        return cls(
            case=Case.from_dict(data["case"]),
            status=status,
            reason=str(data.get("reason", "")),
            measurement=None if measurement is None else Measurement.from_dict(measurement),
            memory=None if memory is None else Memory(**memory),
            parameters=data.get("parameters"),
            started_utc=str(data.get("started_utc", "")),
            duration_s=float(data.get("duration_s", 0.0)),
            extra=dict(data.get("extra") or {}),
        )


@dataclass(frozen=True)
class Run:
    """Everything about a run but its rows. ``state`` is "running" until the sweep ends."""

    run_id: str
    created_utc: str
    config_source: str
    config: Mapping[str, Any]
    config_sha256: str
    timing: TimingPolicy
    environment: Mapping[str, Any]
    command: tuple[str, ...] = ()
    state: Literal["running", "complete", "interrupted"] = "running"
    finished_utc: str = ""
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "created_utc": self.created_utc,
            "finished_utc": self.finished_utc,
            "state": self.state,
            "command": list(self.command),
            "config_source": self.config_source,
            "config_sha256": self.config_sha256,
            "config": dict(self.config),
            "timing": self.timing.to_dict(),
            "environment": dict(self.environment),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Run:
        return cls(
            run_id=str(data["run_id"]),
            created_utc=str(data["created_utc"]),
            config_source=str(data.get("config_source", "")),
            config=dict(data["config"]),
            config_sha256=str(data["config_sha256"]),
            timing=TimingPolicy.from_dict(data.get("timing", {})),
            environment=dict(data.get("environment", {})),
            command=tuple(data.get("command", ())),
            state=data.get("state", "running"),
            finished_utc=str(data.get("finished_utc", "")),
            schema_version=int(data["schema_version"]),
        )


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_default(value: object) -> object:
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def _dumps(data: object) -> str:
    # allow_nan=False: a NaN in a row is a bug, and JSON readers elsewhere reject it.
    return json.dumps(data, allow_nan=False, default=_json_default, ensure_ascii=False)


class RunWriter:
    """Owns one run folder while a sweep writes it: run.json first, then one flushed line per result."""

    def __init__(self, folder: Path, run: Run) -> None:
        self.folder = folder
        self.run = run
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / RUN_FILE, json.dumps(run.to_dict(), indent=2) + "\n")
        self._rows: TextIO = (folder / RESULTS_FILE).open("a", encoding="utf-8")

    def append(self, result: Result) -> None:
        self._rows.write(_dumps(result.to_dict()) + "\n")
        self._rows.flush()
        # fsync per case: a power cut or kill -9 loses at most the case in flight.
        os.fsync(self._rows.fileno())

    def close(self, state: Literal["complete", "interrupted"], finished_utc: str) -> None:
        self._rows.close()
        self.run = replace(self.run, state=state, finished_utc=finished_utc)
        write_atomic(self.folder / RUN_FILE, json.dumps(self.run.to_dict(), indent=2) + "\n")


@dataclass(frozen=True)
class StoredRun:
    folder: Path
    run: Run
    results: tuple[Result, ...]
    warnings: tuple[str, ...] = ()


def _iter_lines(path: Path) -> Iterator[tuple[int, str, bool]]:
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    complete_last = text.endswith("\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        is_last = number == len(lines) or (number == len(lines) - 1 and complete_last)
        yield number, line, is_last and not complete_last


def load_run(folder: str | Path) -> StoredRun:
    """Read a run folder. A torn final line (a kill mid-write) is dropped with a warning; anything else that
    does not parse is an error naming the file and line."""
    path = Path(folder)
    run_path = path / RUN_FILE
    if not path.is_dir():
        raise ResultsError(f"{path}: no such run folder", hint="pass a folder written by 'attnbench sweep'")
    if not run_path.is_file():
        raise ResultsError(
            f"{path}: no {RUN_FILE} in this folder",
            hint="pass a folder written by 'attnbench sweep' (results/<run_id>/)",
        )
    try:
        raw = json.loads(run_path.read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError("top level is not an object")
        version = raw.get("schema_version")
        if not isinstance(version, int):
            raise ValueError("no integer schema_version")
        if version > SCHEMA_VERSION:
            raise ResultsError(
                f"{run_path}: schema_version {version} is newer than this attnbench reads ({SCHEMA_VERSION})",
                hint="upgrade attnbench to read this run",
            )
        run = Run.from_dict(raw)
    except ResultsError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise ResultsError(
            f"{run_path}: not a readable attnbench run file ({exc})",
            hint="was it written by 'attnbench sweep'? re-run the sweep if it is damaged",
        ) from None
    rows_path = path / RESULTS_FILE
    results: list[Result] = []
    warnings: list[str] = []
    if rows_path.exists():
        try:
            lines = list(_iter_lines(rows_path))
        except (OSError, UnicodeDecodeError) as exc:
            raise ResultsError(f"{rows_path}: unreadable ({exc})", hint="re-run the sweep") from None
        for number, line, torn in lines:
            try:
                data = json.loads(line)
                results.append(Result.from_dict(data))
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                if torn:
                    warnings.append(f"{rows_path}:{number}: dropped a torn last line (the writer was killed)")
                    continue
                raise ResultsError(
                    f"{rows_path}:{number}: not a valid result row ({exc})",
                    hint="the file is damaged or not an attnbench results file",
                ) from None
    return StoredRun(path, run, tuple(results), tuple(warnings))


def finite_or_none(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None
