"""The run folder on disk: ``RunWriter`` appends rows as they finish, ``load_run`` reads a folder back.

A folder holds run.json (written first, replaced whole at the end), results.jsonl (one ``Result`` per line,
flushed and fsync'ed per case) and telemetry.jsonl (raw samples, each line durable before the row that refers
to it). A torn last line (a kill mid-write) is dropped with a warning on reading; anything else that does not
parse or check out is a ``ResultsError`` naming file, line and key.

Reading trusts nothing (``results.files``): regular files only, streamed, each line bounded. One case has one row:
a row repeated exactly (a line pasted twice) is counted once with a warning, so the same evidence never counts
twice; two different rows for one case are an error naming both lines. A lone UTF-16 surrogate in a string
(``"\\ud800"``, which no encoder can write out) is replaced with U+FFFD, with a warning.
"""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from attnbench.core.errors import ResultsError
from attnbench.results import fields
from attnbench.results.fields import FieldError
from attnbench.results.files import (
    AppendLog,
    dumps_line,
    read_bounded,
    read_lines,
    refuse_special,
    reserve,
    reserve_path,
    write_atomic,
    write_failed,
)
from attnbench.results.records import SCHEMA_VERSION, Result, Run

RUN_FILE = "run.json"

RESULTS_FILE = "results.jsonl"

TELEMETRY_FILE = "telemetry.jsonl"  # raw telemetry samples, one line per case (key, started_utc, samples)

# timing.rounds: each ok block of a case whose row is not written yet, one ``Result`` a line (raw telemetry included)
# in round order, so an interrupted sweep resumes from the rounds it finished (``load_blocks``; a resume first
# rewrites it with ``rewrite_blocks``). Rows are still results.jsonl's alone.
ROUNDS_FILE = "rounds.jsonl"

# What the report layer renders beside the rows (report.run_files): named here so a sweep can check them first.
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
PLOTS = "plots"
TRACES = "traces"  # a Chrome trace per ok case (sweep --profile), named by the rows that have one


def refuse_special_files(folder: Path) -> None:
    """Refuse a run folder where a file a sweep writes (run.json, the logs, the summaries) is a link, a folder or a
    device, or where plots/ or traces/ is anything but a folder: checked before a sweep writes anything there."""
    for name in (RUN_FILE, RESULTS_FILE, TELEMETRY_FILE, ROUNDS_FILE, SUMMARY_CSV, SUMMARY_MD):
        refuse_special(folder / name)
    for name in (PLOTS, TRACES):
        sub = folder / name
        if sub.is_symlink() or (sub.exists() and not sub.is_dir()):
            raise ResultsError(
                f"{sub}: {'a symbolic link' if sub.is_symlink() else 'a file'}, not a folder",
                hint=f"remove it (attnbench writes {name} only into a folder of its own, never through a link)",
            )


def traces_folder(folder: Path) -> Path:
    """The run folder's traces/, made when missing (refuse_special_files has refused a link in its place)."""
    traces = folder / TRACES
    refuse_special_files(folder)
    try:
        traces.mkdir(exist_ok=True)
    except OSError as exc:
        raise write_failed(traces, exc) from None
    return traces


class RunWriter:
    """Owns one run folder while a sweep writes it: run.json first, then one fsync'ed line per result.

    Nothing is written through a link, or over anything but a regular file: the folder's files are checked before
    the first write, and each log is opened with ``O_NOFOLLOW``. Space for the final run.json is set aside when
    the run starts, so a disk that fills up mid-sweep still lets run.json say the run was interrupted."""

    def __init__(self, folder: Path, run: Run) -> None:
        self.folder = folder
        self.run = run
        folder.mkdir(parents=True, exist_ok=True)
        refuse_special_files(folder)
        text = self._write_run()
        reserve(folder / RUN_FILE, len(text.encode("utf-8")) + _RESERVE_SLACK)
        self._rows = AppendLog(folder / RESULTS_FILE)
        self._telemetry: AppendLog | None = None
        self._blocks: AppendLog | None = None

    def _write_run(self, *, reserved: bool = False) -> str:
        text = json.dumps(self.run.to_dict(), indent=2) + "\n"
        write_atomic(self.folder / RUN_FILE, text, reserved=reserved)
        return text

    def append(self, result: Result) -> None:
        if result.telemetry is not None and result.telemetry.raw:
            # Raw samples first, in their own file: the row that refers to them lands only after they do.
            if self._telemetry is None:
                self._telemetry = AppendLog(self.folder / TELEMETRY_FILE)
            sidecar = {
                "key": result.case.key,
                "started_utc": result.started_utc,
                "samples": [dict(s) for s in result.telemetry.raw],
            }
            self._telemetry.append(dumps_line(sidecar))
        self._rows.append(dumps_line(result.to_dict()))
        trace = result.extra.get("trace")
        if isinstance(trace, str) and trace not in self.run.traces:
            # Listed in the final run.json, whose set-aside space grows with the list so it still fits.
            self.run = replace(self.run, traces=(*self.run.traces, trace))
            reserve(self.folder / RUN_FILE, len(json.dumps(self.run.to_dict(), indent=2)) + _RESERVE_SLACK)
        if result.contended:  # said in the final run.json; the rows say which
            self.run = replace(self.run, contended_cases=(self.run.contended_cases or 0) + 1)

    def append_block(self, block: Result) -> None:
        """Keep one ok round of a case whose row waits for its last round (timing.rounds), durable before the next
        block starts: an interrupted sweep's resume merges it instead of measuring it again."""
        if self._blocks is None:
            self._blocks = AppendLog(self.folder / ROUNDS_FILE)
        # With its raw telemetry, as telemetry.jsonl would hold it: a resumed case's row whose round 1 is this block
        # takes its telemetry from it (merge_replicates), samples and all.
        self._blocks.append(dumps_line(block.to_dict(include_raw=True)))

    def close(self, state: Literal["complete", "interrupted"], finished_utc: str) -> None:
        """Close the logs and replace run.json with its final state (into the space set aside at the start)."""
        self._rows.close()
        for log in (self._telemetry, self._blocks):
            if log is not None:
                log.close()
        self.run = replace(self.run, state=state, finished_utc=finished_utc)
        self._write_run(reserved=True)
        reserve_path(self.folder / RUN_FILE).unlink(missing_ok=True)


# What the final run.json may add to the first (its state and finish time), with room to spare.
_RESERVE_SLACK = 4096


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


# A \uD800…\uDFFF escape: the only way a lone surrogate gets into JSON read as UTF-8 (UTF-8 cannot hold one).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

SURROGATES = "a lone UTF-16 surrogate (not a character) was replaced with U+FFFD"


def _parse_json(text: str) -> tuple[Any, bool]:
    """The JSON value, and whether a lone surrogate in one of its strings was replaced with U+FFFD (printing or
    encoding one raises, so none is let in)."""
    data = json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float)
    if not _SURROGATE_ESCAPE.search(text):
        return data, False
    clean = _without_surrogates(data)
    return clean, clean != data


def _without_surrogates(value: Any) -> Any:
    if isinstance(value, str):
        return _LONE_SURROGATE.sub("\ufffd", value)
    if isinstance(value, list):
        return [_without_surrogates(item) for item in value]
    if isinstance(value, dict):
        return {_without_surrogates(k): _without_surrogates(v) for k, v in value.items()}
    return value


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


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


NOT_A_RUN = "not a readable attnbench run file: "

READ_HINT = "check that it is a readable file, and the path (a link must lead to one)"

RUN_HINT = "run.json is written whole by 'attnbench sweep', so a damaged one was edited or copied; re-run the sweep"

ROWS_HINT = (
    "each line of results.jsonl is one result written by 'attnbench sweep'; a damaged line can be deleted "
    "(that case is then missing) or the sweep re-run"
)


def _load_run_file(path: Path) -> tuple[Run, list[str]]:
    raw = read_bounded(path, READ_HINT)
    if not raw.strip():
        raise ResultsError(f"{path}: empty file", hint="the sweep died before writing it? re-run the sweep")
    try:
        data, replaced = _parse_json(_decode(raw))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise ResultsError(_message(path, exc, what=NOT_A_RUN), hint=RUN_HINT) from None
    warnings = [f"{path}: {SURROGATES}"] if replaced else []
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
        return Run.from_dict(data), warnings
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ResultsError(_message(path, exc, what=NOT_A_RUN), hint=RUN_HINT) from None


@dataclass(frozen=True)
class _Row:
    line: int
    raw: bytes
    result: Result


def _exists(path: Path) -> bool:
    """Whether anything is at ``path``, a link to nothing or a link loop included (a reader must not take
    those for a missing file: they are errors to name)."""
    try:
        os.lstat(path)
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ResultsError(f"{path}: cannot read it ({exc.strerror or exc})", hint=READ_HINT) from None
    return True


def _parse_rows(path: Path) -> tuple[list[_Row], list[str]]:
    """One ``Result`` per line, with the line's bytes, streamed. A last line without its newline that does not
    parse is a write the sweep never finished (kill -9, power cut): it is dropped with a warning. A row that
    repeats an earlier one exactly is counted once, with a warning; a second, different row for the same case is
    an error naming both lines, as is anything else wrong."""
    if not _exists(path):
        return [], []
    rows: list[_Row] = []
    seen: dict[str, _Row] = {}
    warnings: list[str] = []
    for number, raw, ended in read_lines(path, READ_HINT):
        if not raw.strip():
            continue
        try:
            data, replaced = _parse_json(_decode(raw))
        except (UnicodeDecodeError, ValueError, RecursionError) as exc:
            if not ended:  # the text after the last newline: a line the writer did not finish
                warnings.append(f"{path}:{number}: dropped a torn last line (the sweep was killed mid-write)")
                continue
            raise ResultsError(_message(path, exc, number), hint=ROWS_HINT) from None
        try:
            row = _Row(number, raw, Result.from_dict(data))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise ResultsError(_message(path, exc, number, what="not a result row: "), hint=ROWS_HINT) from None
        if replaced:
            warnings.append(f"{path}:{number}: {SURROGATES}")
        key = row.result.case.key
        first = seen.get(key)
        if first is None:
            seen[key] = row
            rows.append(row)
        elif first.result == row.result:
            warnings.append(f"{path}:{number}: the same row as line {first.line} (case {key}); counted once")
        else:
            raise ResultsError(
                f"{path}:{number}: a second row for case {key}, different from the one at line {first.line}",
                hint="a sweep writes one row per case, so one of the two was added by hand or by another tool; "
                "delete the line that does not belong",
            )
    return rows, warnings


def _parse_blocks(path: Path) -> tuple[list[tuple[bytes, Result]], list[str]]:
    """Each ok block of rounds.jsonl with its line's bytes, in file order, and a warning for each line that does
    not read (a torn last line among them)."""
    if not _exists(path):
        return [], []
    blocks: list[tuple[bytes, Result]] = []
    warnings: list[str] = []
    for number, raw, _ in read_lines(path, READ_HINT):
        if not raw.strip():
            continue
        try:
            data, _ = _parse_json(_decode(raw))
            block = Result.from_dict(data)
        except (UnicodeDecodeError, ValueError, RecursionError, KeyError, TypeError, AttributeError) as exc:
            warnings.append(f"{path}:{number}: dropped a block that does not read ({_problem(exc)}); it runs again")
            continue
        if block.ok and block.measurement is not None:
            blocks.append((raw, block))
    return blocks, warnings


def load_blocks(folder: Path) -> tuple[dict[str, list[Result]], list[str]]:
    """The ok blocks rounds.jsonl keeps, by case key in round order, and warnings. It is evidence on the side of
    the rows: a line that does not read is dropped with a warning (that round is measured again), never an error."""
    lines, warnings = _parse_blocks(folder / ROUNDS_FILE)
    blocks: dict[str, list[Result]] = {}
    for _, block in lines:
        blocks.setdefault(block.case.key, []).append(block)
    return blocks, warnings


def rewrite_blocks(folder: Path, keep: Callable[[str], bool]) -> list[str]:
    """Rewrite rounds.jsonl (atomic) with the readable blocks of the case keys ``keep`` accepts, each byte for byte
    and ending in a newline; returns the warnings about the lines dropped as unreadable. A resume does this before
    it appends: the next block starts on a fresh line, not glued onto a torn one, and the blocks of a case that
    had a row (retried: it starts its rounds afresh) or needs none cannot come back as its evidence later."""
    path = Path(folder) / ROUNDS_FILE
    if not _exists(path):
        return []
    lines, warnings = _parse_blocks(path)
    write_atomic(path, b"".join(raw + b"\n" for raw, block in lines if keep(block.case.key)))
    return warnings


def load_run(folder: str | Path) -> StoredRun:
    """Read a run folder. A torn final line (a kill mid-write) is dropped with a warning; anything else that
    does not parse or check out is a ``ResultsError`` naming the file (and line) and what is wrong."""
    path = Path(folder)
    try:
        info = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        raise ResultsError(f"{path}: no such run folder", hint="pass a folder written by 'attnbench sweep'") from None
    except OSError as exc:  # no permission to look, a link loop
        raise ResultsError(
            f"{path}: cannot read it ({exc.strerror or exc})", hint="check the path and the permissions of its folders"
        ) from None
    if not stat.S_ISDIR(info.st_mode):
        raise ResultsError(f"{path}: a file, not a run folder", hint=f"pass the folder that holds it: {path.parent}")
    if not _exists(path / RUN_FILE):
        raise ResultsError(
            f"{path}: no {RUN_FILE} in this folder",
            hint="pass a folder written by 'attnbench sweep' (results/runs/<run_id>/)",
        )
    run, warnings = _load_run_file(path / RUN_FILE)
    rows, row_warnings = _parse_rows(path / RESULTS_FILE)
    return StoredRun(path, run, tuple(row.result for row in rows), (*warnings, *row_warnings))


SKIPPED = "skipped "  # how load_runs' warnings about a run it left out begin


def run_folders(path: str | Path) -> list[Path]:
    """``path`` itself when it is a run folder, else the run folders directly inside it (name order): how every
    command that takes "a run or a folder of runs" reads its argument. Empty when there is none."""
    path = Path(path)
    try:
        if (path / RUN_FILE).exists() or not path.is_dir():
            return [path]
        inside = sorted(p for p in path.iterdir() if p.is_dir() and (p / RUN_FILE).is_file())
    except OSError as exc:  # a folder we may not enter or list
        raise ResultsError(
            f"{path}: cannot read it ({exc.strerror or exc})", hint="check the path and the permissions of its folders"
        ) from None
    return inside


# ``latest`` stands for the newest run folder under the default ``--out`` (``attnbench report latest``): the one
# whose run id, which a sweep starts with its UTC start time (yyyymmdd-hhmmss), is greatest.
LATEST = "latest"
RUNS_DIR = Path("results/runs")
_RUN_ID_TIME = re.compile(r"^\d{8}-\d{6}-")


def latest_run(runs_dir: Path = RUNS_DIR) -> Path:
    """The newest run folder in ``runs_dir``: of the folders holding a run.json whose name starts with a sweep's
    UTC start time, the greatest name (time first; two runs of one second by the rest of the name). Folders named
    by hand (``merge -o my-sweep``) have no time in their name and are never "latest"."""
    try:
        named = sorted(
            p
            for p in runs_dir.iterdir()
            if _RUN_ID_TIME.match(p.name) and p.is_dir() and not p.is_symlink() and (p / RUN_FILE).is_file()
        )
    except FileNotFoundError:
        named = []
    except OSError as exc:
        raise ResultsError(
            f"latest: cannot read {runs_dir} ({exc.strerror or exc})", hint="check its permissions"
        ) from None
    if not named:
        raise ResultsError(
            f"latest: no run folder in {runs_dir}",
            hint=f"'latest' means the newest run a sweep wrote to {runs_dir} (run from the folder you swept in), "
            "or name the run folder",
        )
    return named[-1]


def resolve_run(path: str | Path, runs_dir: Path = RUNS_DIR) -> Path:
    """``path``, or the newest run folder when it is the alias ``latest`` and nothing of that name exists here;
    ``FOLDER/latest`` is the newest run folder a sweep wrote into FOLDER (``sweep --out FOLDER``)."""
    path = Path(path)
    if path.name == LATEST and not path.exists():
        return latest_run(runs_dir if str(path) == LATEST else path.parent)
    return path


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
    without a torn last line or a repeated row, so that appending after a resume starts on a fresh line; and
    telemetry.jsonl with the samples of those rows only. Both atomic."""
    path = Path(folder) / RESULTS_FILE
    rows, _ = _parse_rows(path)
    kept = [row for row in rows if keep(row.result)]
    write_atomic(path, b"".join(row.raw + b"\n" for row in kept))
    _rewrite_telemetry(Path(folder) / TELEMETRY_FILE, {(r.result.case.key, r.result.started_utc) for r in kept})


def _rewrite_telemetry(path: Path, rows: set[tuple[str, str]]) -> None:
    """Keep the telemetry lines of the rows kept: the samples of a row a resume drops (a failed row retried, a torn
    last row) would otherwise stay behind as a second entry for the case."""
    if not _exists(path):
        return
    kept: list[bytes] = []
    dropped = False
    for _, raw, _ in read_lines(path, READ_HINT):
        try:
            entry = json.loads(raw)
            owner = (entry["key"], entry["started_utc"]) if isinstance(entry, dict) else None
        except (ValueError, KeyError, TypeError, RecursionError):
            owner = None  # a torn or foreign line: nothing refers to it
        if owner in rows:
            rows.discard(owner)  # one entry per row
            kept.append(raw + b"\n")
        else:
            dropped = True
    if dropped:
        write_atomic(path, b"".join(kept))
