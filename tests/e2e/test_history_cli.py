"""attnbench history: every format, plots, bad input, and a sweep that records the code it benchmarked."""

from __future__ import annotations

import csv
import io
import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.report.plots import missing_matplotlib
from tests.support import mentions, synthetic_runs, tiny_config

runner = CliRunner()
STEPPED = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"


@pytest.fixture(scope="module")
def history_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("history")
    synthetic_runs(folder, [1.0] * 7 + [1.1] * 5, only=STEPPED)
    return folder


@pytest.mark.slow
def test_the_table_names_the_step(history_folder: Path) -> None:
    result = runner.invoke(app, ["history", str(history_folder)])
    assert result.exit_code == 0, result.output
    assert mentions(result.output.splitlines(), "median", values=(12, 21, 1))  # runs, cases, the metric, 1 step
    assert "lstm forward float32 b=2 n=64 d=32" in result.output and "slower" in result.output


@pytest.mark.slow
def test_the_trend_shows_as_many_runs_as_the_terminal_holds_and_every_case_label(history_folder: Path) -> None:
    """At 80 columns, 12 runs would squeeze the case column to nothing: the table keeps the newest runs that fit."""
    from rich.console import Console

    from attnbench.api import history
    from attnbench.report.history_md import history_tables

    console = Console(width=80, record=True, color_system=None)
    console.print(history_tables(history(history_folder)))
    trend = console.export_text().split("trend (runs in history order)", 1)[1]
    assert trend.startswith(": the newest ") and "of 12 runs" in trend
    assert "gru forward float32" in trend and "vanilla train float32" in trend
    table = [line for line in trend.splitlines() if line[:1] in "┏┃┡│└"]
    assert table and max(len(line) for line in table) <= 80


def test_markdown_lists_runs_segments_steps_and_trend(history_folder: Path) -> None:
    result = runner.invoke(app, ["history", str(history_folder), "-f", "md"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    for heading in ("# attnbench history — median time per call", "## Step changes", "## Trend", "## Notes"):
        assert heading in text
    steps = text.split("## Step changes")[1].split("## Trend")[0]
    (step,) = [line for line in steps.splitlines() if line.startswith("| lstm forward float32 b=2 n=64")]
    assert "| 8 (synthetic-007) |" in step and "slower" in step


def test_csv_is_long_form_with_the_step_on_its_run(history_folder: Path) -> None:
    result = runner.invoke(app, ["history", str(history_folder), "-f", "csv", "--case", "*lstm forward*"])
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert {r["label"] for r in rows} == {"lstm forward float32 b=2 n=16 d=32", "lstm forward float32 b=2 n=64 d=32"}
    stepped = [r for r in rows if r["key"].startswith(STEPPED) and r["step_change"]]
    assert [r["run"] for r in stepped] == ["8"]
    assert 0.05 < float(stepped[0]["step_change"]) < 0.15


@pytest.mark.skipif(missing_matplotlib() is not None, reason="needs matplotlib")
@pytest.mark.slow
def test_plots_and_html(history_folder: Path, tmp_path: Path) -> None:
    plots, page = tmp_path / "plots", tmp_path / "h.html"
    result = runner.invoke(app, ["history", str(history_folder), "--plots", str(plots), "-f", "html", "-o", str(page)])
    assert result.exit_code == 0, result.output
    pngs = sorted(plots.glob("*.png"))
    assert [p.name for p in pngs] == ["history-median-1.png", "history-median-2.png"]  # 16 timed cases, 12 a page
    text = page.read_text()
    assert text.count("data:image/png;base64,") == 2 and "Step changes" in text


@pytest.mark.slow
def test_bad_input(history_folder: Path, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["history", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "error:" in missing.output
    empty = tmp_path / "empty"
    empty.mkdir()
    assert runner.invoke(app, ["history", str(empty)]).exit_code == 2
    nothing = runner.invoke(app, ["history", str(history_folder), "--case", "nothing*"])
    assert nothing.exit_code == 2 and nothing.output.count("error:") == 1 and "nothing*" in nothing.output

    metric = runner.invoke(app, ["history", str(history_folder), "--metric", "speed"])
    assert metric.exit_code == 2
    change = runner.invoke(app, ["history", str(history_folder), "--min-change", "lots"])
    assert change.exit_code == 2 and "--min-change" in change.output


def test_a_corrupt_run_is_an_error_unless_skipped(history_folder: Path, tmp_path: Path) -> None:
    broken = tmp_path / "runs"
    synthetic_runs(broken, [1.0] * 4)
    (broken / "run-002" / "run.json").write_text("{damaged")
    refused = runner.invoke(app, ["history", str(broken)])
    assert refused.exit_code == 2 and "run-002/run.json" in refused.output
    skipped = runner.invoke(app, ["history", str(broken), "--skip-bad", "-f", "md"])
    assert skipped.exit_code == 0, skipped.output
    assert "warning: skipped" in skipped.stderr and "3 runs" in skipped.stdout


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return out.stdout.strip()


@pytest.mark.slow
def test_a_sweep_records_the_checkout_it_ran_in_and_its_label(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "feature")
    (repo / "tiny.yaml").write_text(tiny_config(models=["lstm"], grid={"batch": [1], "seq_len": [8]}))
    git(repo, "add", "tiny.yaml")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    commit = git(repo, "rev-parse", "HEAD")
    monkeypatch.chdir(repo)
    result = runner.invoke(app, ["sweep", "tiny.yaml", "--out", str(tmp_path / "out"), "-q", "--label", "nightly"])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "out").iterdir()
    run = json.loads((folder / "run.json").read_text())
    assert run["code"] == {"commit": commit, "dirty": False, "branch": "feature"} and run["label"] == "nightly"
    (repo / "tiny.yaml").write_text(tiny_config(models=["lstm"], grid={"batch": [1], "seq_len": [16]}))
    result = runner.invoke(app, ["sweep", "tiny.yaml", "--out", str(tmp_path / "dirty"), "-q"])
    (folder,) = (tmp_path / "dirty").iterdir()
    run = json.loads((folder / "run.json").read_text())
    assert run["code"]["dirty"] is True and "label" not in run
    monkeypatch.chdir(tmp_path)  # not a checkout
    (tmp_path / "tiny.yaml").write_text((repo / "tiny.yaml").read_text())
    result = runner.invoke(app, ["sweep", "tiny.yaml", "--out", str(tmp_path / "plain"), "-q"])
    (folder,) = (tmp_path / "plain").iterdir()
    assert "code" not in json.loads((folder / "run.json").read_text())


def test_gbps_reads_the_bytes_a_row_stores(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    for run in synthetic_runs(folder, [1.0] * 4):
        rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line]
        for row in rows:
            if row["key"].startswith(STEPPED):
                row.setdefault("extra", {})["bytes_moved"] = 10**9
        (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["history", str(folder), "--metric", "gbps", "-f", "csv"])
    assert result.exit_code == 0, result.output
    rows = [r for r in csv.DictReader(io.StringIO(result.stdout)) if r["value"]]
    assert {r["key"] for r in rows} == {r["key"] for r in rows if r["key"].startswith(STEPPED)} and len(rows) == 4
    from attnbench.api import load_runs

    stored = load_runs([folder])[0]
    (row,) = [r for r in stored.results if r.case.key.startswith(STEPPED)]
    assert float(rows[0]["value"]) == pytest.approx(10**9 / row.timing.summary.median)
