"""Decode rows in every output, on a real committed CPU decode run (``tests/data/runs/tiny-decode-cpu``): the
tables, summary.csv, the plots, html, the dashboard exports, compare and resume treat them like any other row."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analysis.compare import Policy, compare_paths
from attnbench.analysis.pivot import pivot_tables
from attnbench.analysis.reading import Reading
from attnbench.cli import app
from attnbench.families.extras import family_columns
from attnbench.report.exports import BMF_STATE, BMF_THROUGHPUT, bmf_document, gab_entries
from attnbench.report.html import render_html
from attnbench.report.plots import missing_matplotlib, render_plots, series
from attnbench.report.rows import COLUMNS, render_csv
from attnbench.results.store import StoredRun, load_run
from tests.support import DECODE_FIXTURE

runner = CliRunner()
MODELS = ["lstm", "mingru", "vanilla", "sdpa-flash"]


@pytest.fixture(scope="module")
def stored() -> StoredRun:
    return load_run(DECODE_FIXTURE)


def test_the_fixture_is_a_decode_run(stored: StoredRun) -> None:
    assert {r.case.mode for r in stored.results} == {"decode"} and all(r.ok for r in stored.results)
    (table,) = pivot_tables(stored.results)
    assert table.decode and table.seq_lens == (64, 256, 1024, 4096) and [label for label, _ in table.rows] == MODELS


def test_summary_csv_adds_the_state_columns_at_the_end(stored: StoredRun) -> None:
    state = COLUMNS.index("state_bytes")
    assert COLUMNS[state : state + 3] == ("state_bytes", "state_mem_bytes", "state_mem_method")
    # Columns are only ever appended: the bandwidth columns came after kind and source, the cache and the roofline's
    # prediction after them, the serving questions' after those (issue 41), the numerical check's (issue 50), the
    # kept dtypes and their error (issue 52), mode prefix's (issue 52 item 3), the families' columns last.
    kept = COLUMNS[COLUMNS.index("check_tol") + 1 : COLUMNS.index("hybrid_pages") + 1]
    assert kept == ("kv_dtype", "state_dtype", "kept_error_max", "kept_error_mean", "page_tokens", "hybrid_pages")
    every = COLUMNS[: COLUMNS.index("check_tol") + 1]
    assert every[-5:] == ("padded_tokens_per_s", "check_status", "check_max_abs_err", "check_rel_err", "check_tol")
    prefix = COLUMNS[len(every) + len(kept) : COLUMNS.index("independent_held_bytes") + 1]  # mode prefix's, after
    assert prefix[:3] == ("prefix_tokens", "requests", "checkpoint_every") and len(prefix) == 8
    assert COLUMNS[len(every) + len(kept) + len(prefix) :] == tuple(spec.name for spec, _ in family_columns())
    assert {"heads_kv", "window", "rnn_path", "sdpa_kernel"} <= set(COLUMNS[len(every) :])
    generic = every[:-4]
    serving = generic[generic.index("measured_over_predicted") + 1 :]
    assert serving[:4] == ("prefill_chunk", "draft", "accept", "packing")
    assert {"capacity_batch", "bytes_per_sequence", "padded_tokens_per_s"} <= set(serving)
    roofline = generic[: -len(serving)]
    assert roofline[-4:] == ("cache", "predicted_ms", "predicted_bound", "measured_over_predicted")
    assert roofline[-14:-4] == (
        "contended",
        "contention",
        "kind",
        "source",
        "bytes_moved",
        "bytes_formula",
        "gbps",
        "pct_of_peak_bw",
        "peak_bw_source",
        "arithmetic_intensity",
    )
    rows = list(csv.DictReader(io.StringIO(render_csv(Reading(stored.run, stored.results)))))
    for r, row in zip(stored.results, rows, strict=True):
        assert int(row["state_bytes"]) == r.state_bytes and int(row["state_mem_bytes"]) == r.state_mem_bytes
        assert row["state_mem_method"] == "resident-pages"
        assert float(row["tokens_per_s"]) == pytest.approx(r.case.batch / r.median_s, rel=1e-5)
    kv = [int(row["state_bytes"]) for row in rows if row["model"] == "vanilla"]
    assert kv == [2 * 2 * (n + 1) * 64 * 4 for n in (64, 256, 1024, 4096)]  # K and V, batch 2, n + 1, d_model


def test_memory_plot_series_are_the_state_computed_and_measured(stored: StoredRun) -> None:
    (table,) = pivot_tables(stored.results)
    lines = series(table, "memory")
    assert [s.label for s in lines] == [x for m in MODELS for x in (m, f"{m} (measured)")]
    rows = dict(table.rows)
    for s in lines:
        row = s.row or s.label
        for p in s.values:
            r = rows[row][p.n].result
            assert p.value == (r.state_mem_bytes if s.measured else r.state_bytes)
    measured = {s.row: s for s in lines if s.measured}
    # h and c (1 KiB) read the two pages they sit in at every n; the KV cache its own pages
    assert {p.value for p in measured["lstm"].values} == {8192.0} and len(measured["vanilla"].values) == 4


@pytest.mark.skipif(missing_matplotlib() is not None, reason="matplotlib is not installed")
@pytest.mark.slow
def test_decode_plots_and_html(stored: StoredRun) -> None:
    plots = render_plots(Reading(stored.run, stored.results))
    assert [p.metric for p in plots] == ["latency", "memory", "throughput", "speedup"]
    assert len({p.title for p in plots}) == len(plots)  # each plot its own title
    page = render_html(Reading(stored.run, stored.results), plots=plots)
    # The decode tables: per-token time, then the state as computed / measured bytes, not a call's peak memory.
    assert re.search(r'<td class="num"[^>]*>[^<]*B / [^<]*B</td>', page)
    assert "Peak memory of one call" not in page


def test_dashboard_exports_carry_the_state(stored: StoredRun) -> None:
    document = bmf_document(stored.results)
    for r in stored.results:
        measures = document[r.case.key]
        assert measures[BMF_STATE]["value"] == r.state_mem_bytes
        assert measures[BMF_THROUGHPUT]["value"] == pytest.approx(r.case.batch / r.median_s, rel=1e-5)
    names = [e["name"] for e in gab_entries(stored.results)]
    assert sum(name.endswith("|metric=state_memory") for name in names) == len(stored.results)
    assert all("mode=decode" in name for name in names)


def test_compare_reads_decode_rows_like_any_other(stored: StoredRun) -> None:
    comparison = compare_paths(DECODE_FIXTURE, DECODE_FIXTURE, Policy())
    assert len(comparison.cases) == len(stored.results)
    assert {c.verdict for c in comparison.cases} <= {"same", "noisy"}  # a run against itself: nothing moved


def test_report_formats_and_claims_on_the_stored_run(tmp_path: Path) -> None:
    for fmt in ("md", "csv", "json", "gab", "bmf"):
        out = runner.invoke(app, ["report", str(DECODE_FIXTURE), "-f", fmt])
        assert out.exit_code == 0, out.output
    claims = runner.invoke(app, ["claims", str(DECODE_FIXTURE), "-f", "json"])
    assert claims.exit_code == 0, claims.output
    ids = [c["claim_id"] for c in json.loads(claims.output)["claims"] if "decode" in c["claim"]]
    assert ids == ["1a", "1a", "1b", "1b", "1d", "1d"]


@pytest.mark.slow
def test_resume_runs_only_the_missing_decode_rows(tmp_path: Path) -> None:
    folder = tmp_path / DECODE_FIXTURE.name
    shutil.copytree(DECODE_FIXTURE, folder)
    lines = (folder / "results.jsonl").read_text().splitlines(keepends=True)
    (folder / "results.jsonl").write_text("".join(lines[:-2]))  # sdpa-flash at 1024 and 4096 never finished
    run = json.loads((folder / "run.json").read_text())
    run["state"] = "interrupted"
    # The fixture was recorded with one torch build; a resume here must find this machine's (CI installs another).
    run["environment"] = {**run["environment"], **_this_machine(run["environment"])}
    (folder / "run.json").write_text(json.dumps(run))
    out = runner.invoke(app, ["sweep", "--resume", str(folder), "-q", "--no-isolate"])
    assert out.exit_code == 0, out.output
    results = load_run(folder).results
    assert [r.case.key for r in results] == [r.case.key for r in load_run(DECODE_FIXTURE).results]
    assert all(r.ok and r.state_bytes for r in results[-2:])


def _this_machine(stored: dict[str, object]) -> dict[str, object]:
    """The fields a resume compares, as this machine reports them (threads as the run had them)."""
    from attnbench.host.inventory import collect_environment

    now = collect_environment("cpu").to_dict()
    return {k: v for k, v in now.items() if k != "torch_threads" and k in stored}
