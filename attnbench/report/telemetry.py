"""``report RUN --telemetry``: one row per case with what the hardware did during its timed window.

Only the columns some case has a value in are shown (a CPU run has no GPU columns), and a note every case shares
is said once under the table rather than on every row. ``telemetry_table`` decides both; the markdown here and
the rich table in ``report.terminal`` lay out the same table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from tabulate import tabulate

from attnbench.core.text import md_cell, md_text
from attnbench.core.units import format_metric, to_mib
from attnbench.report.rows import telemetry_note
from attnbench.results.records import Result

_HEADERS = [
    "case",
    "samples",
    "window s",
    "cpu % (process)",
    "cpu % (per core)",
    "rss MiB",
    "gpu util % mean/max (time any kernel ran)",
    "power W",
    "energy J",
    "µJ/token",
    "SM MHz min/max",
    "throttled",
    "reliable",
    "note",
]
_ALWAYS = {"case", "samples", "window s", "reliable"}  # shown even when empty: they say there was no telemetry
INTRO = (
    "Sampled in a background thread over each case's timed window (warm-up included). GPU utilisation is NVML's "
    "share of time in which any kernel ran, not how busy the SMs were."
)


def telemetry_rows(results: Sequence[Result]) -> list[list[str]]:
    rows = []
    for r in results:
        t = r.telemetry
        if t is None:
            rows.append([r.case.label, "", "", "", "", "", "", "", "", "", "", "", "", f"no telemetry ({r.status})"])
            continue
        m = t.metrics
        rss = m.get("rss_max_bytes")
        jpt = m.get("joules_per_token")
        util = (
            ""
            if m.get("gpu_util_pct") is None
            else f"{format_metric(m.get('gpu_util_pct'))}/{format_metric(m.get('gpu_util_max_pct'))}"
        )
        clocks = (
            ""
            if m.get("sm_clock_min_mhz") is None
            else (f"{format_metric(m.get('sm_clock_min_mhz'), 0)}/{format_metric(m.get('sm_clock_max_mhz'), 0)}")
        )
        rows.append(
            [
                r.case.label,
                str(t.samples),
                f"{t.window_s:.2f}",
                format_metric(m.get("cpu_util_pct")),
                format_metric(m.get("cpu_util_per_core_mean_pct")),
                "" if not isinstance(rss, int) else f"{to_mib(rss):.0f}",
                util,
                format_metric(m.get("power_w")),
                format_metric(m.get("energy_j"), 2),
                "" if not isinstance(jpt, float) else f"{jpt * 1e6:.3g}",
                clocks,
                format_metric(m.get("throttled")),
                "yes" if t.reliable else "no",
                telemetry_note(t),
            ]
        )
    return rows


@dataclass(frozen=True)
class TelemetryTable:
    headers: list[str]
    rows: list[list[str]]
    note: str  # the note every case shares, said once under the table; "" when the cases differ

    def footer(self, shared: str = "") -> str:
        """What the table leaves out: ``shared`` (what every case label has in common) and the shared note."""
        every = "; ".join(part for part in (shared, self.note) if part)
        return (f"Every case: {every}. " if every else "") + "Columns with no value in any case are left out."


def telemetry_table(results: Sequence[Result]) -> TelemetryTable:
    """The rows with only the columns that hold a value somewhere, and a shared note lifted out of them."""
    rows = telemetry_rows(results)
    notes = {row[-1] for row in rows}
    note = notes.pop() if len(notes) == 1 else ""
    keep = [
        i
        for i, header in enumerate(_HEADERS)
        if header in _ALWAYS or ((header != "note" or not note) and any(row[i] for row in rows))
    ]
    return TelemetryTable([_HEADERS[i] for i in keep], [[row[i] for i in keep] for row in rows], note)


def render_telemetry_markdown(results: Sequence[Result]) -> str:
    table = telemetry_table(results)
    # Labels and notes are a stored run's text: no tag, link or code span of their own, no pipe that ends a cell.
    rows = [[md_cell(cell) for cell in row] for row in table.rows]
    text = tabulate(rows, headers=table.headers, tablefmt="github", disable_numparse=True)
    return f"# Telemetry per case\n\n{INTRO}\n\n{text}\n\n{md_text(table.footer())}\n"
