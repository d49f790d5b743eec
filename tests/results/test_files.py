"""results.files and results.lock on hostile folders: no write through a link, no write into anything but a regular
file, a full disk named, a half-written line taken back. A real tmpfs makes the full disk where mounting is allowed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from attnbench.core.errors import EXIT_WRITE_FAILED, ResultsError, StorageError
from attnbench.results.files import AppendLog, dumps_line, remove_leftovers, reserve, reserve_path, write_atomic
from attnbench.results.lock import RunLock, remove_if_only_lock
from attnbench.results.records import Result
from attnbench.results.store import RunWriter, load_run
from tests.results.test_results import make_run
from tests.support import fill_disk, mentions, small_disk, tiny_case

VICTIM_TEXT = "precious\n"


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM_TEXT)
    return path


def planted(folder: Path, name: str, target: Path) -> Path:
    folder.mkdir(exist_ok=True)
    link = folder / name
    link.symlink_to(target)
    return link


# ------------------------------------------------------------------------------------------------ links
def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path, victim: Path) -> None:
    planted(tmp_path / "run", ".lock", victim)
    with pytest.raises(ResultsError) as caught:
        RunLock(tmp_path / "run").acquire()
    assert mentions(caught.value.message, "run/.lock", "link") and victim.read_text() == VICTIM_TEXT


def test_an_append_log_that_is_a_link_is_refused_and_its_target_untouched(tmp_path: Path, victim: Path) -> None:
    link = planted(tmp_path / "run", "telemetry.jsonl", victim)
    with pytest.raises(ResultsError) as caught:
        AppendLog(link)
    assert mentions(caught.value.message, "telemetry.jsonl", "link") and victim.read_text() == VICTIM_TEXT


@pytest.mark.parametrize("name", ["run.json", "results.jsonl", "telemetry.jsonl", "summary.csv", "summary.md"])
def test_a_run_writer_refuses_a_planted_link_before_writing_anything(tmp_path: Path, victim: Path, name: str) -> None:
    folder = tmp_path / "run"
    planted(folder, name, victim)
    with pytest.raises(ResultsError) as caught:
        RunWriter(folder, make_run())
    assert mentions(caught.value.message, f"run/{name}", "link") and victim.read_text() == VICTIM_TEXT
    assert sorted(p.name for p in folder.iterdir()) == [name]


def test_write_atomic_never_replaces_a_link_or_a_folder(tmp_path: Path, victim: Path) -> None:
    link = planted(tmp_path, "summary.csv", victim)
    with pytest.raises(ResultsError, match="a symbolic link"):
        write_atomic(link, "new")
    (tmp_path / "summary.md").mkdir()
    with pytest.raises(ResultsError) as caught:
        write_atomic(tmp_path / "summary.md", "new")
    assert mentions(caught.value.message, "summary.md", "folder")
    assert link.is_symlink() and victim.read_text() == VICTIM_TEXT
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.csv", "summary.md", "victim.txt"]


# ---------------------------------------------------------------------------------------- not a regular file
def test_a_lock_that_is_a_folder_or_a_pipe_is_a_located_error(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / ".lock").mkdir()
    with pytest.raises(ResultsError) as caught:
        RunLock(tmp_path / "a").acquire()
    assert mentions(caught.value.message, "a/.lock", "folder") and caught.value.hint
    (tmp_path / "b").mkdir()
    os.mkfifo(tmp_path / "b" / ".lock")
    with pytest.raises(ResultsError) as caught:
        RunLock(tmp_path / "b").acquire()
    assert mentions(caught.value.message, "b/.lock", "pipe")


def test_an_append_log_that_is_a_pipe_is_refused_without_blocking(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "results.jsonl")  # opening a pipe to write would wait for a reader forever
    with pytest.raises(ResultsError) as caught:
        AppendLog(tmp_path / "results.jsonl")
    assert mentions(caught.value.message, "results.jsonl", "pipe")


# ------------------------------------------------------------------------------------------------ debris
def test_a_folder_holding_only_its_lock_is_removed_and_any_other_is_kept(tmp_path: Path) -> None:
    only_lock = tmp_path / "a"
    only_lock.mkdir()
    RunLock(only_lock).acquire().release()
    (only_lock / ".run.json.x1y2.tmp").write_text("{")  # a killed write's temporary file is debris too
    assert remove_if_only_lock(only_lock) and not only_lock.exists()
    kept = tmp_path / "b"
    kept.mkdir()
    (kept / ".lock").touch()
    (kept / "run.json").write_text("{}")
    assert not remove_if_only_lock(kept) and (kept / "run.json").exists()


def test_leftover_temporary_files_are_removed_and_nothing_else(tmp_path: Path) -> None:
    (tmp_path / "plots").mkdir()
    debris = [tmp_path / ".summary.csv.abc123.tmp", tmp_path / "plots" / ".latency-x.png.q1.tmp"]
    keep = [tmp_path / "summary.csv", tmp_path / "notes.tmp", tmp_path / ".hidden"]
    for path in [*debris, *keep]:
        path.write_text("x")
    assert sorted(remove_leftovers(tmp_path)) == sorted(debris)
    assert all(p.exists() for p in keep) and not any(p.exists() for p in debris)


# --------------------------------------------------------------------------------------------- text
def test_a_lone_surrogate_in_a_row_is_written_as_a_replacement_character(tmp_path: Path) -> None:
    # An exception about a file name that is not UTF-8 carries one (os.fsdecode's surrogateescape).
    name = os.fsdecode(b"bad-\xff")
    result = Result(tiny_case(), "error", reason=f"OSError: cannot open {name}")
    writer = RunWriter(tmp_path / "run", make_run())
    writer.append(result)
    writer.close("complete", "now")
    (stored,) = load_run(tmp_path / "run").results
    assert stored.reason == "OSError: cannot open bad-\ufffd"
    assert json.loads(dumps_line({"s": "\udcff"})) == {"s": "\ufffd"}


# ------------------------------------------------------------------------------------------- a full disk
def test_a_line_the_full_disk_refuses_is_taken_back_and_named(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "1m") as disk:
        log = AppendLog(disk / "results.jsonl")
        log.append('{"first": 1}')
        fill_disk(disk)
        with pytest.raises(StorageError) as e:
            log.append('{"second": "' + "x" * 65536 + '"}')
        log.close()
        assert mentions(e.value.message, "results.jsonl", "No space left on device")  # the file, and the OS's reason
        assert e.value.exit_code == EXIT_WRITE_FAILED and "free some space" in e.value.hint
        assert (disk / "results.jsonl").read_text() == '{"first": 1}\n'  # whole lines only


def test_the_final_run_json_fits_in_the_space_set_aside_when_the_disk_is_full(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "1m") as disk:
        writer = RunWriter(disk / "run", make_run())
        assert reserve_path(disk / "run" / "run.json").exists()
        filler = fill_disk(disk)
        with pytest.raises(StorageError):
            write_atomic(disk / "run" / "other.json", "{}")  # no room for a new temporary file
        writer.close("interrupted", "2026-12-03T00:00:00.000000Z")  # yet run.json is replaced
        assert load_run(disk / "run").run.state == "interrupted"
        assert not reserve_path(disk / "run" / "run.json").exists()
        filler.unlink()


def test_a_reserve_is_best_effort(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "1m") as disk:
        fill_disk(disk)
        reserve(disk / "run.json", 10_000)  # no room: no reserve, and no error
        assert not reserve_path(disk / "run.json").exists()


def test_a_lock_on_a_full_disk_is_a_located_error(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", "1m") as disk:
        (disk / "run").mkdir()
        fill_disk(disk)
        with pytest.raises(StorageError) as caught:
            RunLock(disk / "run").acquire()
        assert mentions(caught.value.message, "run/.lock", "No space left on device")

        assert remove_if_only_lock(disk / "run")
