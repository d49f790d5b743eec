"""GB/s, % of the bandwidth peak, arithmetic intensity and the roofline, from stored rows (no torch)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnbench.families.flops import count_parameters
from attnbench.families.state_bytes import state_bytes
from attnbench.families.traffic import bytes_moved
from attnbench.report.plots import render_plots
from attnbench.report.rows import summary_rows
from attnbench.results.calibration import Calibration, CopyBandwidth, MatmulCeiling
from attnbench.results.records import Result, Run
from attnbench.results.store import load_run
from tests.support import DECODE_FIXTURE

COPY = 20e9  # bytes/s, read + written
MATMUL = 1e11  # FLOP/s


def with_traffic(result: Result) -> Result:
    """A stored row as a sweep now writes it: its compulsory bytes beside its FLOPs."""
    counted = bytes_moved(result.case, count_parameters(result.case), state_bytes(result.case))
    assert counted is not None
    return replace(result, extra={**result.extra, "bytes_moved": counted[0], "bytes_formula": counted[1]})


def calibrated(run: Run) -> Run:
    ceiling = MatmulCeiling("float32", MATMUL, 512, ((512, MATMUL),))
    calibration = Calibration(
        "x", "cpu", "Test CPU", "2026-12-04T00:00:00Z", "2.14", 2, (ceiling,), CopyBandwidth(COPY, 2**28)
    )
    return replace(run, calibration=calibration)


@pytest.fixture(scope="module")
def stored() -> tuple[Run, list[Result]]:
    run = load_run(DECODE_FIXTURE)
    return calibrated(run.run), [with_traffic(r) for r in run.results if r.ok]


def test_every_ok_decode_row_gets_its_bandwidth_and_intensity(stored: tuple[Run, list[Result]]) -> None:
    run, results = stored
    for result, row in zip(results, summary_rows(results, run), strict=True):
        moved = result.extra["bytes_moved"]
        assert isinstance(moved, int) and row["bytes_moved"] == moved
        assert row["gbps"] == pytest.approx(moved / result.median_s / 1e9)
        assert row["pct_of_peak_bw"] == pytest.approx(100 * moved / result.median_s / COPY)
        assert row["peak_bw_source"] == "calibrated copy"
        assert row["arithmetic_intensity"] == pytest.approx(int(result.extra["flops"]) / moved)  # type: ignore[arg-type]
    # Decode reads its whole state: a long context moves more bytes, and its intensity falls.
    sdpa = sorted((r.case.seq_len, int(r.extra["bytes_moved"])) for r in results if r.case.model == "vanilla")  # type: ignore[arg-type]
    assert [b for _, b in sdpa] == sorted(b for _, b in sdpa) and sdpa[0][1] < sdpa[-1][1]


def test_without_a_ceiling_the_rate_stays_and_the_percentage_is_empty(stored: tuple[Run, list[Result]]) -> None:
    run, results = stored
    row = summary_rows(results[:1], replace(run, calibration=None))[0]
    assert row["gbps"] is not None and row["pct_of_peak_bw"] is None and row["peak_bw_source"] is None


@pytest.mark.slow
def test_a_roofline_per_device_and_dtype(stored: tuple[Run, list[Result]]) -> None:
    run, results = stored
    roofs = [p for p in render_plots(run, results) if p.metric == "roofline"]
    assert [p.filename for p in roofs] == ["roofline-float32-cpu.png"]
    assert roofs[0].png.startswith(b"\x89PNG")
