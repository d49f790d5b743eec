"""Damaged or foreign run folders: ``report`` prints one error line and a hint and exits 2, never a traceback.

Every entry of tests/data/bad_runs is tests/data/runs/tiny-cpu damaged in the one way its name says. The exceptions
load, with a warning naming file and line: a torn last line of results.jsonl (the sweep killed mid-write), a row
repeated exactly (counted once), a lone UTF-16 surrogate in a string (replaced with U+FFFD).

Below the corpus, what cannot be committed as a file: links (to /dev/zero, in a loop, to nothing), named pipes,
a line beyond the length bound.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.errors import EXIT_BAD_INPUT, ResultsError
from attnbench.results.files import MAX_LINE_BYTES, read_lines
from attnbench.results.records import Result, Run
from attnbench.results.store import load_run
from tests.support import DATA, ROOT, mentions

BAD = DATA / "bad_runs"
GOOD = DATA / "runs" / "tiny-cpu"
ENTRIES = sorted(BAD.iterdir())
TORN = "rows-torn-last-line"

# entry → (where the error points, relative to the entry: "" is the entry itself; what the message says)
EXPECTED: dict[str, tuple[str, str]] = {
    "not-a-folder.json": ("", "a file, not a run folder"),
    "run-json-missing": ("", "no run.json in this folder"),  # a folder with only results.jsonl
    "run-json-is-a-directory": ("run.json", "cannot read it (Is a directory)"),
    "run-json-empty": ("run.json", "empty file"),
    "run-json-not-json": ("run.json:1", "not valid JSON: Expecting value"),
    "run-json-truncated": ("run.json:62", "not valid JSON: Unterminated string"),
    "run-json-list": ("run.json", "expected a JSON object, found a list"),
    "run-json-foreign": ("run.json", "no 'schema_version' key (found 'name', 'version'"),
    "run-json-no-schema-version": ("run.json", "no 'schema_version' key"),
    "run-json-schema-version-string": ("run.json", "key 'schema_version': expected a positive integer, found a string"),
    "run-json-schema-version-newer": ("run.json", "schema_version 2 is newer than this attnbench reads (1)"),
    "run-json-no-run-id": ("run.json", "missing key 'run_id'"),
    "run-json-config-not-object": ("run.json", "key 'config': expected an object, found a string"),
    "run-json-timing-string": ("run.json", "key 'timing.min_samples': expected an integer ≥ 0, found a string \"5\""),
    "run-json-environment-list": ("run.json", "key 'environment': expected an object, found a list"),
    "run-json-unknown-state": ("run.json", "key 'state': unknown state \"finished\"; one of: running, complete"),
    "run-json-nan": ("run.json", "NaN is not a JSON number"),
    "run-json-invalid-utf8": ("run.json", "not UTF-8 text: byte 0xe9"),
    "run-json-nul-bytes": ("run.json", "a NUL byte at column 201"),
    "rows-is-a-directory": ("results.jsonl", "cannot read it (Is a directory)"),
    "rows-garbage-middle-line": ("results.jsonl:2", "not valid JSON: Expecting value"),
    "rows-row-is-a-list": ("results.jsonl:2", "not a result row: expected an object, found a list"),
    "rows-foreign-jsonl": ("results.jsonl:1", "not a result row: missing key 'case', 'status'"),
    "rows-missing-case": ("results.jsonl:2", "missing key 'case'"),
    "rows-unknown-status": ("results.jsonl:2", "key 'status': unknown status \"skipped\"; one of: ok, oom"),
    "rows-unknown-model": ("results.jsonl:2", "key 'case.model': unknown model \"transformer-xl\"; one of: lstm"),
    "rows-seq-len-string": ("results.jsonl:2", "key 'case.seq_len': expected a positive integer, found a string"),
    "rows-negative-batch": ("results.jsonl:2", "key 'case.batch': expected a positive integer, found an integer -2"),
    "rows-option-wrong-type": ("results.jsonl:2", "key 'case.options.bidirectional': expected a bool"),
    "rows-samples-string": ("results.jsonl:2", "key 'measurement.samples_s[1]': expected a positive finite number"),
    "rows-samples-negative": ("results.jsonl:2", "key 'measurement.samples_s[0]': expected a positive finite number"),
    "rows-samples-nan": ("results.jsonl:2", "NaN is not a JSON number"),
    "rows-samples-empty": ("results.jsonl:2", "key 'measurement.samples_s': expected at least one sample"),
    "rows-memory-unknown-field": ("results.jsonl:2", "key 'memory': unknown key 'peak_mib'"),
    "rows-invalid-utf8": ("results.jsonl:2", "not UTF-8 text: byte 0xff"),
    "rows-nul-bytes": ("results.jsonl:2", "a NUL byte at column 1"),
    "rows-deeply-nested": ("results.jsonl:2", "not valid JSON: nested too deeply"),
    # A row that contradicts itself, and numbers no measurement has that would overflow the arithmetic.
    "rows-ok-without-measurement": ("results.jsonl:2", "key 'measurement': a row with status \"ok\" must hold"),
    "rows-samples-huge": ("results.jsonl:2", "key 'measurement.samples_s[0]': expected a positive finite number of"),
    "rows-samples-subnormal": ("results.jsonl:2", "samples_s[0]': expected a time per call of at least 1e-12 s"),
    "rows-peak-bytes-huge": ("results.jsonl:2", "key 'memory.peak_bytes': expected an integer ≥ 0 of at most"),
    "rows-seq-len-huge": ("results.jsonl:2", "key 'case.seq_len': expected a positive integer of at most 4194304"),
    "rows-extra-huge": ("results.jsonl:2", "key 'extra.flops': expected a number of at most 4611686018427387904"),
    # Two different rows for one case: which is the measurement? Neither is guessed.
    "rows-duplicate-conflicting": ("results.jsonl:3", "a second row for case model=lstm|mode=forward"),
    TORN: ("results.jsonl:3", "dropped a torn last line"),
    "rows-duplicate-identical": ("results.jsonl:3", "the same row as line 2 (case model=lstm|mode=forward"),
    "rows-lone-surrogate": ("results.jsonl:2", "a lone UTF-16 surrogate (not a character) was replaced with U+FFFD"),
}
LOADS = {TORN, "rows-duplicate-identical", "rows-lone-surrogate"}  # with a warning, not an error
ERRORS = [p for p in ENTRIES if p.name not in LOADS]

runner = CliRunner()


def location(entry: Path) -> str:
    where = EXPECTED[entry.name][0]
    return f"{entry}/{where}" if where else str(entry)


def check_error_output(entry: Path, code: int, stdout: str, stderr: str) -> None:
    lines = stderr.splitlines()
    assert code == EXIT_BAD_INPUT, stderr
    assert lines[0].startswith(f"error: {location(entry)}"), lines[0]
    assert EXPECTED[entry.name][1] in lines[0]
    assert len(lines) == 2 and lines[1].startswith("hint: "), stderr
    assert stdout == ""
    assert "Traceback" not in stderr


def test_the_table_names_every_entry_and_only_those() -> None:
    assert len(ENTRIES) >= 15
    assert sorted(p.name for p in ENTRIES) == sorted(EXPECTED)


@pytest.mark.parametrize("entry", ERRORS, ids=[p.name for p in ERRORS])
def test_report_is_one_error_a_hint_and_exit_2(entry: Path) -> None:
    out = runner.invoke(app, ["report", str(entry), "--format", "md"])
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
    check_error_output(entry, out.exit_code, out.stdout, out.stderr)


@pytest.mark.parametrize("entry", ERRORS, ids=[p.name for p in ERRORS])
def test_load_run_names_the_file_line_and_problem(entry: Path) -> None:
    with pytest.raises(ResultsError) as caught:
        load_run(entry)
    assert caught.value.message.startswith(location(entry))
    assert EXPECTED[entry.name][1] in caught.value.message
    assert caught.value.hint


@pytest.mark.parametrize("fmt", ["md", "csv", "json", "table"])
def test_a_torn_last_line_is_a_warning_and_the_rest_is_reported(fmt: str) -> None:
    out = runner.invoke(app, ["report", str(BAD / TORN), "--format", fmt])
    assert out.exit_code == 0, out.output
    warning = out.stderr.splitlines()[0]
    assert warning.startswith("warning:") and mentions(warning, f"{BAD / TORN}/results.jsonl:3", "torn")
    assert "lstm" in out.stdout and "Traceback" not in out.output
    stored = load_run(BAD / TORN)
    assert [r.case.seq_len for r in stored.results] == [16, 64]


@pytest.mark.parametrize("name", sorted(LOADS))
@pytest.mark.parametrize("fmt", ["md", "csv", "json", "html"])
@pytest.mark.slow
def test_what_loads_with_a_warning_names_file_and_line(name: str, fmt: str) -> None:
    out = runner.invoke(app, ["report", str(BAD / name), "--format", fmt, "-o", "-"])
    assert out.exit_code == 0, out.output
    assert out.stderr.startswith(f"warning: {location(BAD / name)}: {EXPECTED[name][1]}"), out.stderr
    assert "Traceback" not in out.output


def test_a_row_written_twice_is_counted_once_and_shown_once() -> None:
    stored = load_run(BAD / "rows-duplicate-identical")
    assert [r.case.seq_len for r in stored.results] == [16, 64]
    out = runner.invoke(app, ["report", str(BAD / "rows-duplicate-identical"), "--format", "csv"])
    rows = out.stdout.splitlines()[1:]
    assert len(rows) == 2 and sum("seq_len=64" in row for row in rows) == 1


@pytest.mark.slow
def test_a_lone_surrogate_becomes_a_replacement_character_everywhere() -> None:
    (unsupported,) = [r for r in load_run(BAD / "rows-lone-surrogate").results if r.status != "ok"]
    assert unsupported.reason == "needs CUDA \ufffd here"
    for fmt in ("csv", "html", "md", "json", "samples"):
        out = runner.invoke(app, ["report", str(BAD / "rows-lone-surrogate"), "-f", fmt, "-o", "-"])
        assert out.exit_code == 0 and out.exception is None, (fmt, out.output)


@pytest.mark.parametrize("name", ["run-json-foreign", "rows-unknown-model", "rows-deeply-nested", TORN])
@pytest.mark.slow
def test_the_real_command_line(name: str) -> None:
    """A few through a real process: stderr alone, the exit status the shell sees, nothing caught by CliRunner."""
    entry = BAD / name
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "attnbench", "report", str(entry), "--format", "md"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False)
    if name == TORN:
        assert done.returncode == 0, done.stderr
        assert done.stderr.startswith("warning: ") and "Traceback" not in done.stderr
        assert done.stdout.startswith("# attnbench run")
    else:
        check_error_output(entry, done.returncode, done.stdout, done.stderr)


# ------------------------------------------------------------------------- what counts as torn, beyond the corpus
def write_rows(tmp_path: Path, body: bytes) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_bytes((GOOD / "run.json").read_bytes())
    (folder / "results.jsonl").write_bytes(body)
    return folder


def small_rows() -> list[bytes]:
    rows = (GOOD / "results.jsonl").read_bytes().splitlines()
    return [rows[2], rows[16]]  # lstm train n=16 (one sample), sdpa-efficient unsupported


def test_a_last_line_torn_inside_a_utf8_character_is_still_torn(tmp_path: Path) -> None:
    row = json.loads(small_rows()[1])
    row["reason"] = "needs CUDA — EFFICIENT_ATTENTION has no CPU kernel"
    line = json.dumps(row, ensure_ascii=False).encode()
    cut = line.index("—".encode()) + 1  # one byte into the three-byte dash
    stored = load_run(write_rows(tmp_path, small_rows()[0] + b"\n" + line[:cut]))
    assert len(stored.results) == 1 and "torn" in stored.warnings[0]


def test_a_zero_filled_tail_after_a_power_cut_is_torn(tmp_path: Path) -> None:
    stored = load_run(write_rows(tmp_path, small_rows()[0] + b"\n" + b"\0" * 4096))
    assert len(stored.results) == 1 and mentions(stored.warnings[0], "results.jsonl:2", "torn")


def test_a_damaged_last_line_with_its_newline_is_an_error(tmp_path: Path) -> None:
    folder = write_rows(tmp_path, small_rows()[0] + b"\n" + b'{"case": \n')
    with pytest.raises(ResultsError) as caught:
        load_run(folder)
    assert mentions(caught.value.message, "results.jsonl:2", "JSON")


def test_a_complete_but_invalid_last_line_is_an_error_not_a_torn_write(tmp_path: Path) -> None:
    row = json.loads(small_rows()[1])
    row["status"] = "skipped"
    folder = write_rows(tmp_path, small_rows()[0] + b"\n" + json.dumps(row).encode())
    with pytest.raises(ResultsError) as caught:
        load_run(folder)
    assert mentions(
        caught.value.message, "results.jsonl:2", "'status'", "skipped", "too_slow_for_budget"
    )  # and what is allowed


def test_blank_lines_are_skipped_and_numbering_follows_the_file(tmp_path: Path) -> None:
    folder = write_rows(tmp_path, small_rows()[0] + b"\n\n\n" + b"[1]\n")
    with pytest.raises(ResultsError) as caught:
        load_run(folder)
    assert "results.jsonl:4" in caught.value.message  # numbered as the file is, blank lines included


# ------------------------------------------------------------------------- strict, and still exact on good data
def test_every_stored_row_and_the_run_read_back_exactly() -> None:
    for line in (GOOD / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert Result.from_dict(row).to_dict() == row
    run = json.loads((GOOD / "run.json").read_text())
    assert Run.from_dict(run).to_dict() == run


def test_every_committed_case_is_written_back_byte_for_byte() -> None:
    """Every case of every committed run reads back and is written as it was stored, its keys' order included; a
    model its case defines (a hybrid stack here) travels as its family wrote it (``Case.definition``)."""
    defined = 0
    for path in sorted(ROOT.glob("results/**/results.jsonl")):
        for line in path.read_text().splitlines():
            stored = json.loads(line)["case"]
            case = Result.from_dict(json.loads(line)).case
            assert json.dumps(case.to_dict()) == json.dumps(stored), path
            defined += case.definition is not None
    assert defined > 0


# ------------------------------------------------------------------------- what cannot be committed as a file
def limited_report(folder: Path) -> subprocess.CompletedProcess[str]:
    """``report`` in a child process held to 2 GiB of memory and 60 s: what would grow without bound fails there."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "attnbench", "report", str(folder), "--format", "md"]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False, preexec_fn=cap
    )


def run_with_rows(tmp_path: Path, make_rows: str) -> Path:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_bytes((GOOD / "run.json").read_bytes())
    rows = folder / "results.jsonl"
    if make_rows == "dev-zero":
        rows.symlink_to("/dev/zero")
    elif make_rows == "loop":
        rows.symlink_to("results.jsonl")
    elif make_rows == "dangling":
        rows.symlink_to("no-such-file")
    elif make_rows == "fifo":
        os.mkfifo(rows)
    return folder


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("dev-zero", "cannot read it (a character device, not a regular file)"),
        ("loop", "cannot read it (Too many levels of symbolic links)"),
        ("dangling", "cannot read it (No such file or directory)"),
        ("fifo", "cannot read it (a named pipe, not a regular file)"),
    ],
)
@pytest.mark.slow
def test_rows_that_are_not_a_regular_file_are_refused_at_once(tmp_path: Path, kind: str, says: str) -> None:
    folder = run_with_rows(tmp_path, kind)
    done = limited_report(folder)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert done.stderr.startswith(f"error: {folder}/results.jsonl: {says}"), done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.slow
def test_a_line_past_the_bound_is_refused_without_reading_the_rest(tmp_path: Path) -> None:
    folder = run_with_rows(tmp_path, "none")
    with (folder / "results.jsonl").open("wb") as handle:
        handle.write((GOOD / "results.jsonl").read_bytes().splitlines(keepends=True)[0])
        handle.truncate(handle.tell() + 4 * MAX_LINE_BYTES)  # a sparse gigabyte of zeros: nothing on disk
    done = limited_report(folder)
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    error = done.stderr.splitlines()[0]
    assert error.startswith("error:") and mentions(error, f"{folder}/results.jsonl:2", "256 MiB"), done.stderr


def test_the_line_bound_is_exact(tmp_path: Path) -> None:
    path = tmp_path / "lines"
    path.write_bytes(b"a" * 8 + b"\n" + b"b" * 8 + b"\n" + b"c" * 9)
    lines = read_lines(path, "hint", limit=9)
    assert [next(lines), next(lines)] == [(1, b"a" * 8, True), (2, b"b" * 8, True)]
    assert next(lines) == (3, b"c" * 9, False)
    path.write_bytes(b"a" * 10 + b"\n")
    with pytest.raises(ResultsError) as caught:
        list(read_lines(path, "hint", limit=9))
    assert "lines:1" in caught.value.message


def test_no_real_row_comes_near_the_bound() -> None:
    biggest = max(
        len(line)
        for path in [*ROOT.glob("results/**/results.jsonl"), *DATA.glob("runs/**/results.jsonl")]
        for line in path.read_bytes().splitlines()
    )
    assert biggest < MAX_LINE_BYTES // 1000
