"""The Python API's DataFrames: every summary.csv column, typed; options as columns; the run's identity."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import pandas as pd
import pytest

import attnbench as ab
from attnbench.analysis.reading import Reading
from attnbench.families.catalogue import MODELS
from attnbench.report.frames import OPTION_COLUMNS, OPTION_TYPES, RUN_COLUMNS, frame, samples_frame
from attnbench.report.rows import COLUMN_TYPES, COLUMNS, render_csv
from attnbench.results.store import load_run
from tests.support import FIXTURE

DTYPES = {int: "Int64", float: "float64", bool: "boolean", str: "string"}


@pytest.fixture(scope="module")
def table() -> pd.DataFrame:
    return frame([load_run(FIXTURE)])


def test_every_summary_column_is_there_typed(table: pd.DataFrame) -> None:
    assert list(table.columns) == [*RUN_COLUMNS, *COLUMNS, *OPTION_COLUMNS]
    assert set(COLUMN_TYPES) == set(COLUMNS)  # a column added to the CSV must be given a type
    for column, kind in COLUMN_TYPES.items():
        assert str(table[column].dtype) == DTYPES[kind], column
    assert str(table["started_utc"].dtype).startswith("datetime64") and str(table["started_utc"].dt.tz) == "UTC"
    for name in ("run_id", "git_commit", "label", "device_name"):
        assert str(table[name].dtype) == "string"


def test_the_values_are_the_csvs(table: pd.DataFrame) -> None:
    stored = load_run(FIXTURE)
    rows = list(csv.DictReader(io.StringIO(render_csv(Reading(stored.run, stored.results)))))
    assert len(table) == len(rows) == len(stored.results)
    for (_, got), want in zip(table.iterrows(), rows, strict=True):
        assert got["key"] == want["key"] and got["status"] == want["status"]
        if want["median_ms"]:
            assert got["median_ms"] == pytest.approx(float(want["median_ms"]), rel=1e-5)
        else:
            assert math.isnan(got["median_ms"])
        assert bool(got["causal"]) == (want["causal"] == "True")
        assert got["run_id"] == "20261202-135140-tiny-fixture-cpu"


def test_options_are_columns_of_their_own_type() -> None:
    for spec in MODELS.values():
        for option in spec.options:
            assert OPTION_TYPES[option.name] is option.type, f"{spec.name}.{option.name} changes type"
    from attnbench.core.cases import Case
    from attnbench.results.records import Result

    stored = load_run(FIXTURE)
    lstm = Case("lstm", "forward", "float32", "cpu", 2, 16, 32, None, 1, True, (("bidirectional", True),))
    changed = type(stored)(stored.folder, stored.run, (Result(lstm, "unsupported", "test"),))
    row = frame([changed]).iloc[0]
    assert bool(row["bidirectional"]) and pd.isna(row["scope"])
    assert not set(OPTION_COLUMNS) & set(COLUMNS)  # an option never shadows a CSV column


def test_samples_frame_is_one_row_per_raw_sample() -> None:
    stored = load_run(FIXTURE)
    samples = samples_frame([stored])
    assert len(samples) == sum(len(r.measurement.samples_s) for r in stored.results if r.measurement is not None)
    assert str(samples["seconds"].dtype) == "float64" and str(samples["sample"].dtype) == "Int64"
    first = next(r for r in stored.results if r.measurement is not None)
    assert samples["seconds"].iloc[0] == first.measurement.samples_s[0]  # type: ignore[union-attr]


def test_the_package_api(tmp_path: Path) -> None:
    assert set(ab.__all__) >= {"load_run", "load_runs", "frame", "samples_frame", "history"}
    for name in ab.__all__:
        assert getattr(ab, name) is not None
    runs = ab.load_runs([FIXTURE, FIXTURE])
    assert len(runs) == 2 and ab.load_run(FIXTURE).run.run_id == runs[0].run.run_id
    assert len(ab.frame(runs)) == 2 * len(runs[0].results)
    assert len(ab.frame(FIXTURE)) == len(ab.frame(runs[0]))  # a path, a run or several
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "run.json").write_text("{not json")
    with pytest.raises(ab.load_runs.__globals__["ResultsError"]):
        ab.load_runs([broken])
    with pytest.warns(ab.RunSkipped, match="broken"):
        assert ab.load_runs([broken, FIXTURE], skip_bad=True)[0].run.run_id == runs[0].run.run_id
    with pytest.raises(AttributeError):
        ab.no_such_thing  # noqa: B018


def test_importing_attnbench_stays_cheap() -> None:
    import subprocess
    import sys

    code = "import attnbench, sys; print(sorted(m for m in ('pandas', 'torch', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_parquet_round_trip(tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    from typer.testing import CliRunner

    from attnbench.cli import app

    out = tmp_path / "summary.parquet"
    result = CliRunner().invoke(app, ["report", str(FIXTURE), "-f", "parquet", "-o", str(out)])
    assert result.exit_code == 0, result.output
    back = pd.read_parquet(out)
    assert list(back.columns) == list(frame([load_run(FIXTURE)]).columns) and len(back) == 21
    refused = CliRunner().invoke(app, ["report", str(FIXTURE), "-f", "parquet"])
    assert refused.exit_code == 2 and "-o FILE.parquet" in refused.output


def test_parquet_without_pyarrow_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    from typer.testing import CliRunner

    from attnbench.cli import app

    real = builtins.__import__

    def blocked(name: str, *args: object, **kwargs: object) -> object:
        if name == "pyarrow":
            raise ImportError("no pyarrow", name="pyarrow")
        return real(name, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", blocked)
    result = CliRunner().invoke(app, ["report", str(FIXTURE), "-f", "parquet", "-o", str(tmp_path / "x.parquet")])
    assert result.exit_code == 2 and "pip install pyarrow" in result.output
