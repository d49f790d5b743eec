"""One reading per rendered run (issue 47 item 1): however many formats are drawn from one run folder — every
``report`` format, the HTML page's plots, the sweep's summaries, plots and terminal tables — the run's peaks and its
pivot tables are derived exactly once, and every renderer takes them from ``analysis.reading.Reading``."""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from attnbench.analysis import pivot
from attnbench.analysis.efficiency import PeakTable
from attnbench.analysis.reading import Reading
from attnbench.cli import app
from attnbench.report.formats import REPORT_FORMATS, RunView
from attnbench.report.markdown import render_markdown
from attnbench.report.plots import missing_matplotlib, plots_or_notice
from attnbench.report.terminal import comparison_tables
from attnbench.results.store import load_run
from tests.support import DATA, FIXTURE

# A whole-sequence run and a serving run (capacity tables, decode): between them every section a renderer draws.
RUNS = [FIXTURE, DATA / "runs" / "tiny-serving-cpu"]


@pytest.fixture
def derived(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[str]]:
    """Counts the calls of ``PeakTable.for_run`` and of ``pivot_tables``, wherever a module holds the latter."""
    calls: Counter[str] = Counter()
    for_run = PeakTable.for_run.__func__  # type: ignore[attr-defined]
    original = pivot.pivot_tables

    def counted_for_run(cls: type[PeakTable], run: object) -> PeakTable:
        calls["for_run"] += 1
        return for_run(cls, run)  # type: ignore[no-any-return]

    def counted_pivot_tables(*args: object, **kwargs: object) -> object:
        calls["pivot_tables"] += 1
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(PeakTable, "for_run", classmethod(counted_for_run))
    # Every module that took the name (from ... import pivot_tables), so a renderer deriving its own is counted.
    for name, module in list(sys.modules.items()):
        if name.startswith("attnbench") and getattr(module, "pivot_tables", None) is original:
            monkeypatch.setattr(module, "pivot_tables", counted_pivot_tables)
    yield calls


def _every_format(view: RunView) -> list[str]:
    """Every report format but parquet drawn from ``view``, as text: the terminal's tables too."""
    out = []
    for name, fmt in REPORT_FORMATS.items():
        for chosen in (fmt, *fmt.by_suffix.values()):
            if chosen.text is not None:
                out.append(chosen.text(view))
            if chosen.terminal is not None:
                console = Console(width=120, record=True, file=None)
                with console.capture() as captured:
                    console.print(chosen.terminal(view))
                out.append(captured.get())
        assert name == "parquet" or fmt.text is not None
    return out


@pytest.mark.parametrize("folder", RUNS, ids=[p.name for p in RUNS])
def test_every_format_of_one_run_derives_its_peaks_and_pivots_once(folder: Path, derived: Counter[str]) -> None:
    view = RunView.of(load_run(folder))
    figures, notice = plots_or_notice(view.reading)  # what `report -f html` draws first
    texts = _every_format(replace(view, figures=tuple(figures), notice=notice or ""))
    assert all(texts) and len(texts) >= 9
    assert derived == Counter(for_run=1, pivot_tables=1)
    assert figures or missing_matplotlib() is not None  # the plots were drawn from the same reading


def test_report_command_derives_once(derived: Counter[str], tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["report", str(FIXTURE), "-f", "html", "-o", str(tmp_path / "page.html")])
    assert result.exit_code == 0, result.output
    assert derived == Counter(for_run=1, pivot_tables=1)


def test_the_sweeps_render_path_derives_once(derived: Counter[str], tmp_path: Path) -> None:
    """summary.csv, summary.md, the plots, then the terminal's tables and the markdown a pipe gets: one reading."""
    from attnbench.cli.sweep import _write_summaries

    folder = tmp_path / "run"
    shutil.copytree(FIXTURE, folder, ignore=shutil.ignore_patterns("plots", "summary.*"))
    reading, paths, problem = _write_summaries(folder, plots=True)
    assert problem is None and {folder / "summary.md", folder / "summary.csv"} <= set(paths)
    assert any(p.suffix == ".png" for p in paths) or missing_matplotlib() is not None
    Console(file=None, width=120).print(comparison_tables(reading))
    assert render_markdown(reading)
    assert derived == Counter(for_run=1, pivot_tables=1)


def test_a_reading_is_a_frozen_value_its_renderers_share() -> None:
    stored = load_run(FIXTURE)
    reading = Reading.of(stored, "vanilla")
    assert reading.tables is reading.tables and reading.peaks is reading.peaks  # derived once, then kept
    assert {t.baseline for t in reading.tables} == {"vanilla"}
    with pytest.raises(AttributeError):
        reading.baseline = None  # type: ignore[misc]


def test_the_claims_hold_every_row_against_peaks_derived_once(derived: Counter[str]) -> None:
    """Claims 1 and 2 hold rows against their peaks (a busy device, % of peak): once per run, not once per row."""
    from tests.claims.test_claims import claims, curve, telemetry

    no_gpm = telemetry(level="basic", gpu_util_pct=99.0)  # without GPM, % of peak says whether the GPU was busy
    rows = [*curve("lstm", 1.0, tele=no_gpm, extra={"flops": 10**9}), *curve("vanilla", 1.0, tele=no_gpm)]
    assert {c.claim_id for c in claims(rows)} >= {"1a", "1b", "2a", "2b"}
    assert derived["for_run"] == 1
