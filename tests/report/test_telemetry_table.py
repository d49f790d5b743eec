"""``report --telemetry``: only the columns with a value, a shared note said once, a rich table in a terminal."""

from __future__ import annotations

from dataclasses import replace

from rich.console import Console

from attnbench.report.telemetry import render_telemetry_markdown, telemetry_table
from attnbench.report.terminal import telemetry_renderable
from attnbench.results.records import Result
from attnbench.results.telemetry import TelemetrySummary
from tests.report.test_report import fake
from tests.support import mentions

CPU_NOTE = {name: "CPU run" for name in ("gpu_util_pct", "power_w", "energy_j", "sm_clock_min_mhz")}


def _with(result: Result, unavailable: dict[str, str] | None = None, **metrics: float | int) -> Result:
    summary = TelemetrySummary(
        source="psutil",
        level="basic",
        interval_s=0.1,
        window_s=0.5,
        samples=5,
        reliable=True,
        note="",
        metrics=metrics,
        unavailable=unavailable if unavailable is not None else CPU_NOTE,
    )
    return replace(result, telemetry=summary)


def _cpu_run() -> list[Result]:
    return [
        _with(fake("lstm", 64, 1e-3), cpu_util_pct=98.0, cpu_util_per_core_mean_pct=99.0, rss_max_bytes=2**28),
        _with(fake("sdpa-flash", 64, 5e-4), cpu_util_pct=97.5, cpu_util_per_core_mean_pct=98.0, rss_max_bytes=2**28),
    ]


def test_a_cpu_run_shows_no_gpu_columns_and_its_shared_note_once() -> None:
    table = telemetry_table(_cpu_run())
    assert table.headers == [
        "case",
        "samples",
        "window s",
        "cpu % (process)",
        "cpu % (per core)",
        "rss MiB",
        "reliable",
    ]
    assert table.note.endswith("CPU run")
    text = render_telemetry_markdown(_cpu_run())
    assert "gpu util" not in text and "power W" not in text and "| note" not in text
    assert table.note in text.rstrip().splitlines()[-1]  # said once, under the table


def test_a_column_stays_when_one_case_has_a_value_and_differing_notes_stay_per_row() -> None:
    results = [*_cpu_run(), _with(fake("gru", 64, 1e-3), {}, power_w=250.0)]
    table = telemetry_table(results)
    assert "power W" in table.headers and "note" in table.headers and table.note == ""
    power = table.headers.index("power W")
    assert [row[power] for row in table.rows] == ["", "", "250.0"]


def test_the_terminal_gets_a_rich_table_with_what_every_label_shares_said_once() -> None:
    console = Console(width=120, record=True, color_system=None)
    console.print(telemetry_renderable(_cpu_run()))
    text = console.export_text()
    assert text.startswith("Telemetry per case") and "┃ case" in text
    assert "│ lstm  " in text and "│ sdpa-flash h=4 │" in text
    assert mentions(" ".join(text.split()), "forward float32 b=4 n=64 d=64", "gpu_util_pct")  # what every row shares

    assert "gpu util" not in text and "|" not in text
