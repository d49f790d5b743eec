"""GB/s, % of the bandwidth peak, arithmetic intensity and the roofline, from stored rows (no torch)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnbench.analysis.efficiency import PeakTable
from attnbench.analysis.reading import Reading
from attnbench.families.flops import count_parameters
from attnbench.families.state_bytes import state_bytes
from attnbench.families.traffic import bytes_moved
from attnbench.report.plots import render_plots
from attnbench.report.rows import summary_rows
from attnbench.results.calibration import Calibration, CopyBandwidth, MatmulCeiling
from attnbench.results.environment import Environment
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
    env = run.environment  # measured on the run's own machine and stack: another's would be ignored
    fingerprint = Environment.from_dict(env).fingerprint()
    calibration = Calibration(
        fingerprint,
        "cpu",
        env["cpu_model"],
        "2026-12-04T00:00:00Z",
        env["torch"],
        env["torch_threads"],
        (ceiling,),
        CopyBandwidth(COPY, 2**28),
    )
    return replace(run, calibration=calibration)


@pytest.fixture(scope="module")
def stored() -> tuple[Run, list[Result]]:
    run = load_run(DECODE_FIXTURE)
    return calibrated(run.run), [with_traffic(r) for r in run.results if r.ok]


def test_every_ok_decode_row_gets_its_bandwidth_and_intensity(stored: tuple[Run, list[Result]]) -> None:
    run, results = stored
    for result, row in zip(results, summary_rows(results, PeakTable.for_run(run)), strict=True):
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
    row = summary_rows(results[:1], PeakTable.for_run(replace(run, calibration=None)))[0]
    assert row["gbps"] is not None and row["pct_of_peak_bw"] is None and row["peak_bw_source"] is None


@pytest.mark.slow
def test_a_roofline_per_device_and_dtype(stored: tuple[Run, list[Result]]) -> None:
    run, results = stored
    roofs = [p for p in render_plots(Reading(run, results)) if p.metric == "roofline"]
    assert [p.filename for p in roofs] == ["roofline-float32-cpu.png"]
    assert roofs[0].png.startswith(b"\x89PNG")


# ------------------------------------------------------------------------------ the roofline's prediction (issue 40)
def timed_at(result: Result, median_s: float) -> Result:
    """``result`` as if every sample had taken ``median_s``."""
    assert result.measurement is not None
    samples = tuple(median_s for _ in result.measurement.samples_s)
    return replace(result, measurement=replace(result.measurement, samples_s=samples))


def test_every_ok_row_is_predicted_the_longer_of_its_compute_and_memory_time(
    stored: tuple[Run, list[Result]],
) -> None:
    run, results = stored
    for result, row in zip(results, summary_rows(results, PeakTable.for_run(run)), strict=True):
        # the FLOPs its kernels execute where the row says (this fixture's rows predate executed_flops: its flops)
        flops = int(result.extra.get("executed_flops", result.extra["flops"]))  # type: ignore[arg-type]
        moved = int(result.extra["bytes_moved"])  # type: ignore[arg-type]
        predicted = max(flops / MATMUL, moved / COPY)
        assert row["predicted_ms"] == pytest.approx(1e3 * predicted)
        assert row["predicted_bound"] == ("compute" if flops / MATMUL >= moved / COPY else "memory")
        assert row["measured_over_predicted"] == pytest.approx(result.median_s / predicted)
    # Without a ceiling there is nothing to predict with.
    assert summary_rows(results[:1], PeakTable.for_run(replace(run, calibration=None)))[0]["predicted_ms"] is None


def test_rows_faster_than_their_roofline_are_flagged_with_the_likelier_cause(stored: tuple[Run, list[Result]]) -> None:
    from attnbench.analysis.efficiency import prediction_for
    from attnbench.report.cells import run_checks
    from attnbench.report.markdown import render_markdown
    from attnbench.report.roofline import below_roofline

    run, results = stored
    table = PeakTable.for_run(run)
    first = results[0]
    prediction = prediction_for(table, first)
    assert prediction is not None and prediction.bound == "memory"  # a decode step: its bytes set the time
    fast = replace(timed_at(first, prediction.seconds / 2), extra={**first.extra, "cache": "warm"})
    rows = [fast, *results[1:]]
    assert summary_rows([fast], PeakTable.for_run(run))[0]["measured_over_predicted"] == pytest.approx(0.5)
    assert below_roofline(Reading(run, rows), rows) == {fast.case.key: "memory"}
    flagged = run_checks(Reading(run, rows)).below_roofline
    assert len(flagged) == 1 and flagged[0].startswith(fast.case.key) and "memory-bound" in flagged[0]
    markdown = render_markdown(Reading(run, rows))
    assert markdown.index(fast.case.key) > markdown.index("## Checks")
    # A row its prediction calls compute-bound: the FLOP count or the peak is the likelier culprit.
    heavy = replace(first, extra={**first.extra, "executed_flops": 10**15, "flops": 10**15})
    assert below_roofline(Reading(run, [timed_at(heavy, 1e-3)]), [timed_at(heavy, 1e-3)]) == {heavy.case.key: "compute"}


@pytest.mark.slow
def test_the_roofline_rings_a_row_that_beats_its_prediction(
    stored: tuple[Run, list[Result]], monkeypatch: pytest.MonkeyPatch
) -> None:
    from matplotlib.axes import Axes

    from attnbench.analysis.efficiency import prediction_for

    run, results = stored
    prediction = prediction_for(PeakTable.for_run(run), results[0])
    assert prediction is not None
    rings: list[str] = []
    real = Axes.scatter

    def spy(self: Axes, *args: object, **kwargs: object) -> object:
        if kwargs.get("edgecolors") == "#b42318":
            rings.append(str(kwargs["marker"]))
        return real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Axes, "scatter", spy)
    rows = [timed_at(results[0], prediction.seconds / 2), *results[1:]]
    roofs = [p for p in render_plots(Reading(run, rows)) if p.metric == "roofline"]
    assert roofs and rings == ["o"]  # one row, memory-bound: ringed round


def test_an_uncalibrated_roofline_draws_the_runs_best_as_its_ceilings(stored: tuple[Run, list[Result]]) -> None:
    """A CPU run without a calibration drew no roof at all (issue 51): the run's own best stands in, dotted."""
    pytest.importorskip("matplotlib")
    from attnbench.report.roofline import _points, ceilings, roofline_figure

    run, results = stored
    bare = replace(run, calibration=None)
    points = _points(results)
    compute, bandwidth, measured = ceilings(PeakTable.for_run(bare), "float32", points)
    assert measured and compute is not None and bandwidth is not None
    assert compute.flops_per_s == pytest.approx(max(y for _, _, y in points))
    assert bandwidth.bytes_per_s == pytest.approx(max(y / x for _, x, y in points))
    assert all(y <= compute.flops_per_s * (1 + 1e-9) and y <= bandwidth.bytes_per_s * x * (1 + 1e-9)
               for _, x, y in points)  # fmt: skip
    assert ceilings(PeakTable.for_run(run), "float32", points)[2] is False  # calibrated: the calibration's, as before
    fig = roofline_figure(Reading(bare, [r for r, _, _ in points]), "float32", points, {})
    (ax,) = fig.axes
    roofs = [line for line in ax.get_lines() if line.get_linestyle() == ":"]
    assert len(roofs) == 2  # the sloped and the flat roof
    # The footnote sits clear of the x label.
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    label = ax.xaxis.label.get_window_extent(renderer)
    (note,) = [t for t in ax.texts if t.get_text().startswith("run ")]
    assert not label.overlaps(note.get_window_extent(renderer))
