"""The serving questions in every output, on a real committed CPU run (``tests/data/runs/tiny-serving-cpu``: lstm and
sdpa-flash, d_model 16, asked capacity under 32 MiB, prefill in chunks of 0 and 8, verify of 2 drafts keeping 0 or 2,
and 3 packed lengths): summary.csv's serving columns, the capacity table and plot, and report, claims, compare,
history and publish reading them like any other row."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analysis.capacity import capacity_tables
from attnbench.analysis.compare import Policy, compare_paths
from attnbench.analysis.pivot import pivot_tables
from attnbench.analysis.reading import Reading
from attnbench.cli import app
from attnbench.report.markdown import render_markdown
from attnbench.report.plots import missing_matplotlib, render_plots, series
from attnbench.report.rows import render_csv
from attnbench.results.store import StoredRun, load_run
from tests.support import DATA

SERVING_FIXTURE = DATA / "runs" / "tiny-serving-cpu"
runner = CliRunner()


@pytest.fixture(scope="module")
def stored() -> StoredRun:
    return load_run(SERVING_FIXTURE)


@pytest.fixture(scope="module")
def rows(stored: StoredRun) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(render_csv(Reading(stored.run, stored.results)))))


def test_the_fixture_asks_every_question_of_both_sides(stored: StoredRun) -> None:
    assert all(r.ok for r in stored.results)
    assert {(r.case.model, r.case.mode) for r in stored.results} == {
        (m, mode) for m in ("lstm", "sdpa-flash") for mode in ("capacity", "prefill", "verify", "forward")
    }


def test_summary_csv_says_each_rows_question_and_answer(stored: StoredRun, rows: list[dict[str, str]]) -> None:
    for r, row in zip(stored.results, rows, strict=True):
        mode = r.case.mode
        assert (row["prefill_chunk"] != "") == (mode == "prefill")
        assert (row["draft"] != "" and row["accept"] != "") == (mode == "verify")
        assert (row["capacity_batch"] != "") == (row["bytes_per_sequence"] != "") == (mode == "capacity")
        assert (
            (row["verify_ms"] != "")
            == (row["rollback_ms"] != "")
            == (row["rollback_method"] != "")
            == (mode == "verify")
        )
        assert (row["packing"] == "9+16+3") == (row["padded_tokens_per_s"] != "") == (mode == "forward")
        if mode == "capacity":
            batch = int(row["capacity_batch"])
            assert int(row["memory_budget_bytes"]) == 32 * 2**20
            assert float(row["tokens_per_s"]) == pytest.approx(batch / r.median_s, rel=1e-5)
            assert batch * int(row["bytes_per_sequence"]) <= 32 * 2**20
        if mode == "forward":
            assert float(row["tokens_per_s"]) == pytest.approx(28 / r.median_s, rel=1e-5)  # the useful tokens


def test_the_capacity_table_keeps_the_recurrence_and_shrinks_attention(stored: StoredRun) -> None:
    (table,) = capacity_tables(stored.results)
    batches = {c.model: [p.batch or 0 for p in c.points] for c in table.curves}
    assert max(batches["lstm"]) <= 1.1 * min(batches["lstm"])  # its state does not grow with n
    assert batches["sdpa-flash"][-1] <= batches["sdpa-flash"][0] / 5  # a KV cache 16× longer
    page = render_markdown(Reading(stored.run, stored.results))
    assert "## capacity · float32 · cpu · d_model 16 · layers 1 · budget 32 MiB" in page
    assert "serves more tokens/s under the memory budget than" in page


@pytest.mark.skipif(missing_matplotlib() is not None, reason="matplotlib is not installed")
@pytest.mark.slow
def test_the_plots_include_one_capacity_figure(stored: StoredRun) -> None:
    plots = [p for p in render_plots(Reading(stored.run, stored.results)) if p.metric == "capacity"]
    assert len(plots) == 1 and plots[0].filename.startswith("capacity-") and plots[0].png[:4] == b"\x89PNG"


def test_a_speed_up_interval_is_per_token_as_the_speed_up_is(stored: StoredRun) -> None:
    """Capacity rows call with batches of their own (lstm's ~12× attention's at n = 64 here): the speed-up is per
    token, so its interval must be too, or it misses the point it belongs to (a lone one's error bar went negative
    and matplotlib refused every plot of the run)."""
    (capacity,) = [t for t in pivot_tables(stored.results) if t.mode == "capacity"]
    points = [p for s in series(capacity, "speedup") for p in s.values if p.value is not None]
    assert points
    for p in points:
        assert p.low is not None and p.high is not None
        assert p.low <= p.value <= p.high


def test_compare_judges_the_serving_rows_by_their_medians() -> None:
    comparison = compare_paths(SERVING_FIXTURE, SERVING_FIXTURE, Policy())
    assert len(comparison.cases) == 32
    assert {c.verdict for c in comparison.cases} <= {"same", "noisy"}  # a run against itself: nothing moved


@pytest.mark.slow
def test_every_reader_takes_a_serving_run(tmp_path: Path) -> None:
    for fmt in ("md", "csv", "json", "gab", "bmf", "html"):
        out = runner.invoke(app, ["report", str(SERVING_FIXTURE), "-f", fmt, "-o", str(tmp_path / f"r.{fmt}")])
        assert out.exit_code == 0, out.output
    claims = runner.invoke(app, ["claims", str(SERVING_FIXTURE), "-f", "json"])
    assert claims.exit_code == 0, claims.output
    assert json.loads(claims.output)["claims"]  # the article's claims, none of them about a serving row
    for command in (["compare", str(SERVING_FIXTURE), str(SERVING_FIXTURE)], ["history", str(SERVING_FIXTURE)]):
        out = runner.invoke(app, command)
        assert out.exit_code == 0, out.output
    site = runner.invoke(app, ["publish", str(SERVING_FIXTURE), "-o", str(tmp_path / "site")])
    assert site.exit_code == 0, site.output


def test_the_capacity_tables_title_names_no_batch_of_1(stored: StoredRun) -> None:
    """A capacity row's case has batch 1 and times the batch it found: its table and plots said "batch 1"."""
    (capacity,) = [t for t in pivot_tables(stored.results) if t.mode == "capacity"]
    assert "batch 1 " not in capacity.title + " "
    assert {r.extra["capacity_batch"] for r in stored.results if r.case.mode == "capacity"} != {1}


@pytest.mark.parametrize("batch", [0, -1000])
@pytest.mark.parametrize("form", ["table", "md", "html"])
def test_a_stored_capacity_out_of_bounds_is_one_error_line_in_every_report(
    tmp_path: Path, batch: int, form: str
) -> None:
    """Issue 50 §3.5: a stored ``capacity_batch: 0`` divided by zero in report's pivot (a traceback), a negative one
    read as a negative tokens/s: both are a damaged row, refused by key with exit 2."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(DATA / "runs" / "tiny-serving-cpu", run)
    rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    (capacity,) = [r for r in rows if "mode=capacity" in r["key"] and r["case"]["seq_len"] == 16 and "lstm" in r["key"]]
    capacity["extra"]["capacity_batch"] = batch
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["report", str(run), "-f", form])
    assert result.exit_code == 2
    assert "extra.capacity_batch" in result.output
