"""``report --format html``: one self-contained page with the tables of ``pivot_tables`` and the plots inside."""

from __future__ import annotations

import base64
import re
import sys
from html import escape
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analysis.pivot import pivot_tables
from attnbench.analysis.reading import Reading
from attnbench.cli import app
from attnbench.core.cases import Case
from attnbench.report.capacity_md import bytes_text, point_text
from attnbench.report.html import render_html
from attnbench.report.plots import Plot, render_plots
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result
from attnbench.results.store import StoredRun, load_run
from tests.support import FIXTURE, check_golden, mentions

runner = CliRunner()
DATA_URI = re.compile(r"data:image/png;base64,([A-Za-z0-9+/=]+)")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def stored() -> StoredRun:
    return load_run(FIXTURE)


def normalised(html: str) -> str:
    """The page with each PNG payload replaced by a placeholder, so the golden holds the page, not pixels."""
    return DATA_URI.sub("data:image/png;base64,<PNG>", html)


@pytest.mark.slow
def test_golden_html_with_plots(stored: StoredRun) -> None:
    pytest.importorskip("matplotlib")
    plots = render_plots(Reading(stored.run, stored.results))
    check_golden("tiny-cpu.html", normalised(render_html(Reading(stored.run, stored.results), plots=plots)))


def test_plots_are_embedded_byte_for_byte_under_their_table(stored: StoredRun) -> None:
    fake = [
        Plot("latency", t.title, f"latency-{i}.png", f"Latency {i}", PNG_SIGNATURE + bytes([i]) * 40)
        for i, t in enumerate(pivot_tables(stored.results))
    ]
    page = render_html(Reading(stored.run, stored.results), plots=fake)
    payloads = [base64.b64decode(m) for m in DATA_URI.findall(page)]
    assert payloads == [p.png for p in fake]
    # Each figure sits inside its own table's section, after that table's heading.
    for i, plot in enumerate(fake, start=1):
        section = page.split(f'<section id="table-{i}">', 1)[1].split("</section>", 1)[0]
        assert base64.b64encode(plot.png).decode() in section


@pytest.mark.slow
def test_real_plots_decode_to_pngs(stored: StoredRun) -> None:
    pytest.importorskip("matplotlib")
    page = render_html(Reading(stored.run, stored.results), plots=render_plots(Reading(stored.run, stored.results)))
    payloads = [base64.b64decode(m) for m in DATA_URI.findall(page)]
    assert len(payloads) == 8  # 2 tables x latency, memory, throughput, speed-up
    assert all(p.startswith(PNG_SIGNATURE) for p in payloads)


def test_page_is_self_contained(stored: StoredRun) -> None:
    page = render_html(Reading(stored.run, stored.results))
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert "<style>" in page
    for external in ("<script", "<link", 'src="http', 'href="http', "url(", "@import"):
        assert external not in page


def test_page_has_every_table_its_lines_and_the_failed_cases(stored: StoredRun) -> None:
    page = render_html(Reading(stored.run, stored.results))
    tables = pivot_tables(stored.results)
    for table in tables:
        assert f"<h2>{table.title}</h2>" in page
        for line in table.crossovers:
            assert f"<li>{line}</li>" in page.replace("&#x27;", "'")
        for scaling in table.scaling:
            assert scaling.text in page
    assert page.count('<table class="pivot">') == 2 * len(tables)  # time and memory for each
    assert 'class="baseline"' in page and ">lstm</th>" in page
    assert ">~91.8 µs<" in page  # the noisy marker of the markdown tables
    assert '<span class="speedup faster">(1.39×)</span>' in page
    assert "OOM</td>" in page and "n/a</td>" in page
    assert '<section id="failed">' in page and "needs CUDA" in page
    assert "AMD EPYC" in page and "20261202-135140-tiny-fixture-cpu" in page


def test_user_text_is_escaped(stored: StoredRun) -> None:
    case = Case("vanilla", "forward", "float32", "cpu", 1, 8, 16, 2, 1, False)
    evil = Result(case, "error", reason='<script>alert("x")</script> & more')
    page = render_html(Reading(stored.run, [*stored.results, evil]))
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt; &amp; more" in page


def test_any_mode_renders_including_backward(stored: StoredRun) -> None:
    m = Measurement((1e-3,) * 10, 1, 3, 0.0, True, "converged", 0.01)
    rows = [
        Result(Case(model, "backward", "float32", "cpu", 2, n, 32, heads, 1, heads is None), "ok", measurement=m)
        for model, heads in (("lstm", None), ("sdpa-flash", 4))
        for n in (16, 64)
    ]
    page = render_html(Reading(stored.run, rows))
    assert "<h2>backward · float32 · cpu" in page


def test_note_replaces_plots_when_matplotlib_is_missing(stored: StoredRun) -> None:
    note = "plots skipped: matplotlib is not installed"
    page = render_html(Reading(stored.run, stored.results), plots_note=note)
    assert note in page and "<img" not in page


@pytest.mark.slow
def test_cli_writes_the_page_with_plots(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "run.html"
    result = runner.invoke(app, ["report", str(FIXTURE), "--format", "html", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stderr and "note:" not in result.stderr
    assert len(DATA_URI.findall(out.read_text())) == 8
    assert not (FIXTURE / "plots").exists()  # html embeds its plots; only --plots writes PNG files


def test_cli_html_without_matplotlib_notes_it_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)
    out = tmp_path / "run.html"
    result = runner.invoke(app, ["report", str(FIXTURE), "--format", "html", "-o", str(out)])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if "matplotlib" in line]
    assert len(notes) == 1 and "pip install matplotlib" in notes[0]
    assert "<img" not in out.read_text() and "matplotlib" in out.read_text()  # the page says why it has no plots


def test_checks_section_as_in_the_markdown(stored: StoredRun) -> None:
    rows = []
    for mode, seconds in (("forward", 1e-3), ("backward", 2e-3), ("train", 4e-3)):
        m = Measurement((seconds,) * 10, 1, 3, 0.0, True, "converged", 0.01)
        rows.append(Result(Case("lstm", mode, "float32", "cpu", 2, 16, 32, None, 1, True), "ok", measurement=m))
    page = render_html(Reading(stored.run, rows))
    section = page.split('<section id="checks">', 1)[1].split("</section>", 1)[0]
    assert "flagged:" in section and mentions(section, values=(1.33, 4, 1, 2))  # the ratio, and its three times

    assert '<section id="checks">' not in render_html(Reading(stored.run, stored.results))  # no backward rows, no check


def test_a_run_with_capacity_rows_has_summary_mds_capacity_section_and_its_figure() -> None:
    serving = load_run(FIXTURE.parent / "tiny-serving-cpu")
    reading = Reading(serving.run, serving.results)
    assert reading.capacity
    figure = Plot("capacity", reading.capacity[0].title, "capacity.png", "Capacity", PNG_SIGNATURE + b"c" * 40)
    page = render_html(reading, plots=[figure])
    section = page.split('<section id="capacity-1">', 1)[1].split("</section>", 1)[0]
    table = reading.capacity[0]
    cells = re.findall(r'<td class="num">([^<]*)</td>', section)
    points = [next((p for p in curve.points if p.n == n), None) for curve in table.curves for n in table.seq_lens]
    assert cells == [escape(point_text(p)) for p in points] + [escape(bytes_text(p)) for p in points]
    assert base64.b64encode(figure.png).decode() in section
    assert '<section id="capacity-' not in render_html(Reading(load_run(FIXTURE).run, load_run(FIXTURE).results))
