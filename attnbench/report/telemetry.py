"""``report RUN --telemetry``: one row per case with what the hardware did during its timed window."""

from __future__ import annotations

from collections.abc import Sequence

from tabulate import tabulate

from attnbench.core.units import to_mib
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


def _num(value: object, digits: int = 1) -> str:
    return "" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


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
            "" if m.get("gpu_util_pct") is None else f"{_num(m.get('gpu_util_pct'))}/{_num(m.get('gpu_util_max_pct'))}"
        )
        clocks = (
            ""
            if m.get("sm_clock_min_mhz") is None
            else (f"{_num(m.get('sm_clock_min_mhz'), 0)}/{_num(m.get('sm_clock_max_mhz'), 0)}")
        )
        rows.append(
            [
                r.case.label,
                str(t.samples),
                f"{t.window_s:.2f}",
                _num(m.get("cpu_util_pct")),
                _num(m.get("cpu_util_per_core_mean_pct")),
                "" if not isinstance(rss, int) else f"{to_mib(rss):.0f}",
                util,
                _num(m.get("power_w")),
                _num(m.get("energy_j"), 2),
                "" if not isinstance(jpt, float) else f"{jpt * 1e6:.3g}",
                clocks,
                _num(m.get("throttled")),
                "yes" if t.reliable else "no",
                telemetry_note(t),
            ]
        )
    return rows


def render_telemetry_markdown(results: Sequence[Result]) -> str:
    text = tabulate(telemetry_rows(results), headers=_HEADERS, tablefmt="github", disable_numparse=True)
    return (
        "# Telemetry per case\n\nSampled in a background thread over each case's timed window (warm-up "
        "included). GPU utilisation is NVML's share of time in which any kernel ran, not how busy the SMs were.\n\n"
        + text
        + "\n"
    )
