from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.errors import ResultsError
from attnbench.results.measurement import Measurement
from attnbench.results.records import Memory, Result, Run
from attnbench.results.store import RunWriter, load_run


def make_run(run_id: str = "20260101-000000-test-cpu") -> Run:
    return Run(
        run_id=run_id,
        created_utc="2026-01-01T00:00:00Z",
        config_source="test.yaml",
        config={"name": "test"},
        config_sha256="0" * 64,
        timing=TimingPolicy(),
        environment={"device": "cpu", "device_type": "cpu", "torch": "2.13.0"},
    )


def make_result(seq_len: int = 64, status: str = "ok", model: str = "lstm") -> Result:
    heads = None if model in ("lstm", "gru") else 4
    case = Case(model, "forward", "float32", "cpu", 2, seq_len, 32, heads, 1, True)
    if status != "ok":
        return Result(case, status, reason="out of memory")  # type: ignore[arg-type]
    m = Measurement((1e-3, 1.1e-3, 0.9e-3) * 4, 1, 3, 0.01, True, "converged", 0.01)
    return Result(
        case, "ok", measurement=m, memory=Memory(1 << 20, "rss-hwm"), parameters=100, extra={"torch_threads": 2}
    )


def test_round_trip(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "run", make_run())
    rows = [make_result(64), make_result(128, "oom")]
    for row in rows:
        writer.append(row)
    writer.close("complete", "2026-01-01T00:01:00Z")
    stored = load_run(tmp_path / "run")
    assert stored.results == tuple(rows)
    assert stored.run.state == "complete"
    assert stored.warnings == ()


def test_run_json_exists_before_any_row(tmp_path: Path) -> None:
    RunWriter(tmp_path / "run", make_run())
    assert json.loads((tmp_path / "run" / "run.json").read_text())["state"] == "running"
    assert load_run(tmp_path / "run").results == ()


def test_torn_last_line_is_dropped_with_warning(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "run", make_run())
    writer.append(make_result(64))
    writer.append(make_result(128))
    path = tmp_path / "run" / "results.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # kill -9 mid-write
    stored = load_run(tmp_path / "run")
    assert [r.case.seq_len for r in stored.results] == [64]
    assert len(stored.warnings) == 1 and "torn" in stored.warnings[0]


def test_corrupt_middle_line_is_an_error_naming_the_line(tmp_path: Path) -> None:
    writer = RunWriter(tmp_path / "run", make_run())
    writer.append(make_result(64))
    path = tmp_path / "run" / "results.jsonl"
    path.write_text("{not json\n" + path.read_text())
    with pytest.raises(ResultsError, match=r"results.jsonl:1"):
        load_run(tmp_path / "run")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no run.json"),
        ("[]", "not a readable"),
        ('{"schema_version": 99}', "newer"),
        ("\x00\x01garbage", "not a readable"),
    ],
)
def test_bad_run_files(tmp_path: Path, content: str | None, message: str) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    if content is not None:
        (folder / "run.json").write_text(content)
    with pytest.raises(ResultsError, match=message):
        load_run(folder)


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(ResultsError, match="no such run folder"):
        load_run(tmp_path / "nope")


def test_case_key_is_stable_and_ignores_device_index() -> None:
    a = Case("sdpa-flash", "train", "bfloat16", "cuda:0", 4, 1024, 512, 8, 1, True)
    b = Case("sdpa-flash", "train", "bfloat16", "cuda:1", 4, 1024, 512, 8, 1, True)
    assert a.key == b.key
    assert a.key == (
        "model=sdpa-flash|mode=train|dtype=bfloat16|device=cuda|batch=4|seq_len=1024|d_model=512|"
        "heads=8|layers=1|causal=true"
    )


def test_the_benchmarked_checkout_and_label_round_trip_and_are_checked(tmp_path: Path) -> None:
    from dataclasses import replace

    from attnbench.results.environment import CodeIdentity

    code = CodeIdentity("0123456789abcdef0123456789abcdef01234567", dirty=True, branch=None)
    run = replace(make_run(), code=code, label="nightly")
    assert Run.from_dict(json.loads(json.dumps(run.to_dict()))) == run
    assert run.commit == code.commit and code.short == "0123456789+dirty"
    plain = make_run().to_dict()
    assert "code" not in plain and "label" not in plain  # runs without them read back as before
    for bad, message in (
        ({"commit": "not hex", "dirty": False}, "key 'code.commit'"),
        ({"commit": "abcdef1", "dirty": "yes"}, "key 'code.dirty'"),
    ):
        folder = tmp_path / message.replace(" ", "-").replace("'", "")
        folder.mkdir()
        (folder / "run.json").write_text(json.dumps({**plain, "code": bad}))
        with pytest.raises(ResultsError, match=message):
            load_run(folder)
