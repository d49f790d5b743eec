"""Result rows, run metadata and the run folder on disk (DESIGN §3, §4). Layer 3, no torch.

Schema history (``SCHEMA_VERSION``):
  1 — first version: run.json (``Run``) + results.jsonl (one ``Result`` per line).
      Keys added since, all optional and absent when empty, so older files read back unchanged: run.json
      ``calibration``; measurement ``warmup_moved``, ``replicate_medians_s``, ``injected_delay_s``. A reader older
      than a key refuses a file that carries it (unknown keys are errors), with the hint to upgrade.
Readers accept every version listed here and refuse newer ones with a hint to upgrade. They trust nothing else
either: every field is checked (``attnbench.checks``) and a bad one is a ``ResultsError`` naming file, line and key.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO

from attnbench import checks
from attnbench.calibration import Calibration
from attnbench.cases import Case, TimingPolicy
from attnbench.catalogue import DTYPES, MODEL_NAMES, MODELS, MODES, RESOLVED_DEVICE
from attnbench.checks import FieldError
from attnbench.errors import ResultsError
from attnbench.measurement import Measurement
from attnbench.telemetry.summary import TelemetrySummary

SCHEMA_VERSION = 1
RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"
TELEMETRY_FILE = "telemetry.jsonl"  # raw telemetry samples, one line per case (key, started_utc, samples)

Status = Literal["ok", "oom", "unsupported", "error", "timeout", "crashed"]
STATUSES: tuple[Status, ...] = ("ok", "oom", "unsupported", "error", "timeout", "crashed")
# Statuses that make `sweep` exit 1: the case broke, rather than the hardware saying no.
FAILED: frozenset[str] = frozenset({"error", "timeout", "crashed"})

RunState = Literal["running", "complete", "interrupted"]
RUN_STATES: tuple[RunState, ...] = ("running", "complete", "interrupted")
MEMORY_METHODS: tuple[str, ...] = ("cuda-allocator", "rss-hwm", "unavailable")

Extra = Mapping[str, str | int | float | bool | None]


@dataclass(frozen=True)
class Memory:
    """Peak memory of one call above the post-setup baseline, and how it was measured."""

    peak_bytes: int | None
    method: str  # one of MEMORY_METHODS
    note: str = ""

    @classmethod
    def from_dict(cls, data: object) -> Memory:
        m = checks.record(data, "", ("peak_bytes", "method"), ("note",))
        peak = m["peak_bytes"]
        return cls(
            peak_bytes=None if peak is None else checks.integer(peak, "peak_bytes", minimum=0),
            method=checks.choice(m["method"], "method", MEMORY_METHODS, "memory method"),
            note=checks.text(m.get("note", ""), "note"),
        )


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
    telemetry: TelemetrySummary | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def tokens_per_s(self) -> float | None:
        if self.measurement is None or self.measurement.median_s <= 0:
            return None
        return self.case.tokens / self.measurement.median_s

    def to_dict(self, *, include_raw: bool = False) -> dict[str, Any]:
        """``include_raw`` keeps the raw telemetry samples (for a worker's pipe); results.jsonl leaves them to
        the telemetry sidecar."""
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
            # Absent rather than null when there is none, so rows from before telemetry read back unchanged.
            **({} if self.telemetry is None else {"telemetry": self.telemetry.to_dict(include_raw=include_raw)}),
        }

    @classmethod
    def from_dict(cls, data: object) -> Result:
        """Read ``to_dict``'s output back; anything else raises ``checks.FieldError`` naming the key."""
        r = checks.record(data, "", ("case", "status"), _RESULT_OPTIONAL)
        case = checks.nested("case", _case_from_dict, r["case"])
        if "key" in r:
            checks.text(r["key"], "key")  # derived from the case (Case.key) and recomputed from it, never trusted
        timed, memory, parameters = r.get("measurement"), r.get("memory"), r.get("parameters")
        telemetry = r.get("telemetry")
        return cls(
            case=case,
            status=checks.choice(r["status"], "status", STATUSES, "status"),  # type: ignore[arg-type]
            reason=checks.text(r.get("reason", ""), "reason"),
            measurement=None if timed is None else checks.nested("measurement", Measurement.from_dict, timed),
            memory=None if memory is None else checks.nested("memory", Memory.from_dict, memory),
            parameters=None if parameters is None else checks.integer(parameters, "parameters", minimum=0),
            started_utc=checks.text(r.get("started_utc", ""), "started_utc"),
            duration_s=checks.number(r.get("duration_s", 0.0), "duration_s"),
            extra=_extra(r.get("extra", {})),
            telemetry=None if telemetry is None else checks.nested("telemetry", TelemetrySummary.from_dict, telemetry),
        )


_RESULT_OPTIONAL = (
    "key",
    "reason",
    "measurement",
    "memory",
    "parameters",
    "started_utc",
    "duration_s",
    "extra",
    "telemetry",
)
_CASE_REQUIRED = ("model", "mode", "dtype", "device", "batch", "seq_len", "d_model", "heads", "layers", "causal")


def _case_from_dict(data: object) -> Case:
    """``Case.from_dict`` after checking every field against the catalogue, so a bad row never reaches it."""
    c = checks.record(data, "", _CASE_REQUIRED, ("options",))
    model = checks.choice(c["model"], "model", MODEL_NAMES, "model")
    checks.choice(c["mode"], "mode", MODES, "mode")
    checks.choice(c["dtype"], "dtype", DTYPES, "dtype")
    if not RESOLVED_DEVICE.fullmatch(checks.text(c["device"], "device")):
        raise checks.expected("device", "cpu, cuda or cuda:N", c["device"])
    for name in ("batch", "seq_len", "d_model", "layers"):
        checks.integer(c[name], name)
    if c["heads"] is not None:
        checks.integer(c["heads"], "heads")
    checks.flag(c["causal"], "causal")
    kinds = {o.name: o.type for o in MODELS[model].options}
    for name, value in checks.record(c.get("options", {}), "options", (), kinds).items():
        kind = kinds[name]
        fits = kind is bool if isinstance(value, bool) else isinstance(value, int | float if kind is float else kind)
        if not fits:
            raise checks.expected(checks.path("options", name), f"a {kind.__name__} ({model}'s option)", value)
    return Case.from_dict(c)


def _extra(data: object) -> dict[str, str | int | float | bool | None]:
    if not isinstance(data, dict):
        raise checks.expected("extra", "an object", data)
    for name, value in data.items():
        if value is not None and not isinstance(value, str | int | float | bool):
            raise checks.expected(checks.path("extra", name), "a string, number, boolean or null", value)
    return dict(data)


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
    state: RunState = "running"
    finished_utc: str = ""
    schema_version: int = SCHEMA_VERSION
    # The device's measured ceilings (attnbench calibrate), cached per machine when the sweep started; None when
    # there was none. Optional and absent when None, so runs written before it read back unchanged.
    calibration: Calibration | None = None

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
            **({} if self.calibration is None else {"calibration": self.calibration.to_dict()}),
        }

    @classmethod
    def from_dict(cls, data: object) -> Run:
        """Read ``to_dict``'s output back; anything else raises ``checks.FieldError`` naming the key."""
        d = checks.record(data, "", _RUN_REQUIRED, _RUN_OPTIONAL)
        version = checks.integer(d["schema_version"], "schema_version")
        if version > SCHEMA_VERSION:
            raise FieldError("schema_version", f"{version} is newer than this attnbench reads ({SCHEMA_VERSION})")
        run_id = checks.text(d["run_id"], "run_id")
        if not run_id:
            raise checks.expected("run_id", "a non-empty string", run_id)
        config = d["config"]
        if not isinstance(config, dict):
            raise checks.expected("config", "an object", config)
        environment = d.get("environment", {})
        if not isinstance(environment, dict):
            raise checks.expected("environment", "an object", environment)
        calibration = d.get("calibration")
        return cls(
            run_id=run_id,
            created_utc=checks.text(d["created_utc"], "created_utc"),
            config_source=checks.text(d.get("config_source", ""), "config_source"),
            config=dict(config),
            config_sha256=checks.text(d["config_sha256"], "config_sha256"),
            timing=checks.nested("timing", _timing_from_dict, d.get("timing", {})),
            environment=dict(environment),
            command=tuple(checks.items(d.get("command", []), "command", checks.text)),
            state=checks.choice(d.get("state", "running"), "state", RUN_STATES, "state"),  # type: ignore[arg-type]
            finished_utc=checks.text(d.get("finished_utc", ""), "finished_utc"),
            schema_version=version,
            calibration=None
            if calibration is None
            else checks.nested("calibration", Calibration.from_dict, calibration),
        )


_RUN_REQUIRED = ("schema_version", "run_id", "created_utc", "config_sha256", "config")
_RUN_OPTIONAL = ("finished_utc", "state", "command", "config_source", "timing", "environment", "calibration")


def _timing_from_dict(data: object) -> TimingPolicy:
    """``TimingPolicy.from_dict`` after checking each field's type; a field left out takes the default."""
    defaults = TimingPolicy()
    names = list(TimingPolicy.__dataclass_fields__)
    t = checks.record(data, "", (), names)
    for name, value in t.items():
        default = getattr(defaults, name)
        if isinstance(default, bool):
            checks.flag(value, name)
        elif isinstance(default, str):
            checks.choice(value, name, ("warm", "cold"), "cache policy")
        elif isinstance(default, int):
            checks.integer(value, name, minimum=0)
        else:
            checks.number(value, name)
    return TimingPolicy.from_dict(t)


def _read_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _read_umask()


def utc_now() -> str:
    """A row's timestamp: UTC, microseconds, ISO 8601."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file and rename, so a reader never sees half a file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes the file owner-only; results are meant to be read by others, as a plain open() would allow.
        os.fchmod(fd, 0o666 & ~_UMASK)
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
            self._telemetry.write(_dumps(sidecar) + "\n")
            self._telemetry.flush()
            os.fsync(self._telemetry.fileno())  # durable before the row: a row never points at lost samples
        self._rows.write(_dumps(result.to_dict()) + "\n")
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
        raise ResultsError(f"{path}: {NOT_A_RUN}expected a JSON object, found {checks.found(data)}", hint=RUN_HINT)
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


def rewrite_rows(folder: Path, keep: Callable[[Result], bool]) -> None:
    """Rewrite results.jsonl with the rows ``keep`` accepts, each byte for byte, every one ending in a newline,
    and without a torn last line, so that appending after a resume starts on a fresh line. Atomic."""
    path = Path(folder) / RESULTS_FILE
    rows, _ = _parse_rows(path)
    kept = b"".join(raw + b"\n" for raw, result in rows if keep(result))
    write_atomic(path, kept.decode("utf-8"))
