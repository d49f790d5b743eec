"""run.json's shard and merged_from fields, and a run folder written whole (results.merged)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from attnbench.core.errors import ResultsError
from attnbench.core.shards import Shard
from attnbench.results.lock import RunLock
from attnbench.results.merged import publish, staging_folder, telemetry_lines, write_run_folder
from attnbench.results.records import Run, Source
from attnbench.results.store import load_run
from tests.results.test_results import make_result, make_run
from tests.support import mentions


def test_a_shard_and_its_sources_read_back(tmp_path: Path) -> None:
    sources = (Source("a", Shard(0, 2), "node1", "cuda:0", 3), Source("b", None, "node2", "cpu", 0))
    run = replace(make_run(), shard=Shard(1, 2), merged_from=sources)
    again = Run.from_dict(json.loads(json.dumps(run.to_dict())))
    assert again == run
    plain = make_run().to_dict()
    assert "shard" not in plain and "merged_from" not in plain  # absent when empty: older readers are unaffected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"shard": {"index": 2, "count": 2}}, "key 'shard.index': expected an index below count (2)"),
        ({"shard": {"index": 0, "count": 0}}, "key 'shard.count'"),
        ({"shard": {"index": 0}}, "missing key 'count'"),
        ({"shard": "0/2"}, "key 'shard'"),
        ({"merged_from": [{"run_id": "a"}]}, "key 'merged_from[0]'"),
        ({"merged_from": {}}, "key 'merged_from'"),
        (
            {"merged_from": [{"run_id": "a", "shard": None, "hostname": "h", "device": "cpu", "rows": -1}]},
            "merged_from[0].rows",
        ),
    ],
)
def test_a_bad_shard_field_is_located(tmp_path: Path, change: dict[str, object], message: str) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps({**make_run().to_dict(), **change}))
    with pytest.raises(ResultsError, match=r"run\.json") as caught:
        load_run(folder)
    assert message in caught.value.message


def test_a_folder_written_whole_reads_back_and_replaces_an_earlier_one(tmp_path: Path) -> None:
    target = tmp_path / "merged"
    rows = [make_result(64), make_result(128, "oom")]
    line = json.dumps({"key": rows[0].case.key, "started_utc": "", "samples": []})
    staging = staging_folder(target)
    write_run_folder(staging, make_run("merged"), rows, [line])
    publish(staging, target)
    stored = load_run(target)
    assert stored.results == tuple(rows) and not staging.exists()
    assert telemetry_lines(target) == ([(rows[0].case.key, "", line)], [])

    write_run_folder(staging, make_run("merged"), rows[:1], [])
    publish(staging, target)  # an earlier merge is replaced whole
    assert load_run(target).results == (rows[0],) and not (target / "telemetry.jsonl").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["merged"]  # no staging or replaced folder left behind


def test_publishing_over_a_folder_a_sweep_holds_is_refused(tmp_path: Path) -> None:
    target = tmp_path / "merged"
    write_run_folder(target, make_run("merged"), [make_result()], [])
    staging = staging_folder(target)
    write_run_folder(staging, make_run("merged"), [], [])
    lock = RunLock(target).acquire()
    try:
        with pytest.raises(ResultsError) as held:
            publish(staging, target)
        assert mentions(held.value.message, str(target), f"pid {os.getpid()}")  # the folder, and who holds it

    finally:
        lock.release()
    assert load_run(target).results == (make_result(),)


def test_unreadable_telemetry_lines_are_left_out_with_a_warning(tmp_path: Path) -> None:
    (tmp_path / "telemetry.jsonl").write_bytes(b'{"key": "k", "started_utc": "t", "samples": []}\n{"key": 1}\n{torn')
    found, warnings = telemetry_lines(tmp_path)
    assert [(k, s) for k, s, _ in found] == [("k", "t")]
    assert len(warnings) == 2 and all("telemetry.jsonl:" in w for w in warnings)


@pytest.mark.parametrize(
    ("plant", "says"),
    [
        (lambda p: p.symlink_to("/dev/zero"), "a character device, not a regular file"),
        (lambda p: os.mkfifo(p), "a named pipe, not a regular file"),
    ],
    ids=["dev-zero", "fifo"],
)
def test_telemetry_that_is_not_a_regular_file_is_refused_at_once(
    tmp_path: Path, plant: Callable[[Path], None], says: str
) -> None:
    """Read as results.jsonl is (issue 38): before, a link to /dev/zero was read whole until MemoryError and a named
    pipe blocked the merge for ever."""
    plant(tmp_path / "telemetry.jsonl")
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            telemetry_lines(tmp_path)
        except BaseException as exc:
            outcome.append(exc)
        else:
            outcome.append(None)

    reader = threading.Thread(target=read, daemon=True)  # a guard against the old hang, not a timing
    reader.start()
    reader.join(60)
    assert outcome, "telemetry_lines did not return"
    (error,) = outcome
    assert isinstance(error, ResultsError) and says in error.message
