"""Plots: the numbers each line draws, the PNGs, the Agg-only drawing, and life without matplotlib."""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analysis.pivot import pivot_tables
from attnbench.analysis.reading import Reading
from attnbench.cli import app
from attnbench.report import plots as plots_module
from attnbench.report.plots import (
    MISSING_NOTICE,
    PlotsUnavailable,
    byte_ticks,
    log_ticks,
    missing_matplotlib,
    ratio_ticks,
    render_plots,
    seq_len_text,
    series,
    write_plots,
    write_run_plots,
)
from attnbench.report.run_files import write_run_files
from attnbench.results.store import StoredRun, load_run
from tests.fakes import FakeExecutors
from tests.support import DATA, FIXTURE, ROOT, mentions, tiny_config

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
runner = CliRunner()
needs_matplotlib = pytest.mark.skipif(missing_matplotlib() is not None, reason="matplotlib is not installed")


@pytest.fixture(scope="module")
def stored() -> StoredRun:
    return load_run(FIXTURE)


@pytest.fixture
def run_copy(tmp_path: Path) -> Path:
    """A writable copy of the fixture run, for what writes into the run folder."""
    folder = tmp_path / FIXTURE.name
    shutil.copytree(FIXTURE, folder)
    return folder


def block_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every ``import matplotlib...`` fail, as on a machine without the extra."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")] + ["matplotlib"]:
        monkeypatch.setitem(sys.modules, name, None)


def png_size(png: bytes) -> tuple[int, int]:
    assert png.startswith(PNG_SIGNATURE) and png[12:16] == b"IHDR"
    width, height = struct.unpack(">II", png[16:24])
    return width, height


# ---------------------------------------------------------------------------------------------------- numbers


def test_latency_series_are_the_medians_with_their_ci_and_the_failures(stored: StoredRun) -> None:
    forward = pivot_tables(stored.results)[0]
    lines = {s.label: s for s in series(forward, "latency")}
    assert list(lines) == ["lstm", "gru", "vanilla", "sdpa-flash", "sdpa-efficient"]
    assert lines["lstm"].is_baseline and not lines["gru"].is_baseline
    by_key = {r.case.key: r for r in stored.results}
    for label, s in lines.items():
        for p in s.values:
            cell = dict(forward.rows)[label][p.n]
            summary = cell.result.measurement.summary  # type: ignore[union-attr]
            assert by_key[cell.result.case.key] is cell.result
            assert p.value == summary.median and p.low == summary.ci_low and p.high == summary.ci_high
            assert p.noisy == cell.noisy
    assert [(p.n, p.status) for p in lines["vanilla"].failures] == [(1048576, "OOM")]
    assert not lines["sdpa-efficient"].values and {p.status for p in lines["sdpa-efficient"].failures} == {"n/a"}


def test_a_single_sample_has_no_interval(stored: StoredRun) -> None:
    train = pivot_tables(stored.results)[1]
    lstm = next(s for s in series(train, "latency") if s.label == "lstm")
    first = lstm.values[0]  # lstm train n=16 stopped after one sample: its CI is unbounded
    assert first.n == 16 and first.low is None and first.high is None


def test_throughput_is_tokens_over_the_median(stored: StoredRun) -> None:
    forward = pivot_tables(stored.results)[0]
    for s in series(forward, "throughput"):
        for p in s.values:
            r = dict(forward.rows)[s.label][p.n].result
            assert r.measurement is not None
            assert p.value == pytest.approx(r.case.batch * p.n / r.measurement.median_s)
            if p.low is not None and p.high is not None:
                assert p.low <= p.value <= p.high


def test_speedup_series_leave_the_baseline_out_and_match_the_table(stored: StoredRun) -> None:
    forward = pivot_tables(stored.results)[0]
    lines = series(forward, "speedup")
    assert "lstm" not in {s.label for s in lines}
    rows = dict(forward.rows)
    for s in lines:
        for p in s.values:
            assert p.value == rows[s.label][p.n].speedup
            assert p.low is not None and p.high is not None and p.low <= p.value <= p.high


def test_speedup_intervals_survive_several_baseline_rows(stored: StoredRun) -> None:
    # The same rows at twice the batch: each speed-up is against the lstm row of its own batch, and its
    # interval must come from that row too (it used to vanish when the baseline had more than one row).
    doubled = [*stored.results, *(replace(r, case=replace(r.case, batch=r.case.batch * 2)) for r in stored.results)]
    forward = pivot_tables(doubled)[0]
    points = [p for s in series(forward, "speedup") for p in s.values if p.value is not None]
    assert points and all(p.low is not None and p.high is not None for p in points)


def test_memory_series_are_the_peaks_in_bytes(stored: StoredRun) -> None:
    forward = pivot_tables(stored.results)[0]
    rows = dict(forward.rows)
    for s in series(forward, "memory"):
        for p in s.values:
            memory = rows[s.label][p.n].result.memory
            assert memory is not None and p.value == memory.peak_bytes


@pytest.mark.parametrize(
    ("n", "text"), [(16, "16"), (1000, "1,000"), (1024, "1k"), (65536, "64k"), (1 << 20, "1M"), (3 << 20, "3M")]
)
def test_seq_len_labels(n: int, text: str) -> None:
    assert seq_len_text(n) == text


def test_ticks_are_round_and_inside_the_range() -> None:
    assert log_ticks(6e-5, 2e-3) == pytest.approx([1e-4, 2e-4, 5e-4, 1e-3, 2e-3])  # 1-2-5: decades give too few
    assert log_ticks(1e-6, 1.0) == pytest.approx([1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0])
    assert len(log_ticks(1e-9, 1e3)) <= 8
    assert byte_ticks(40_000, 300_000) == [65536.0, 131072.0, 262144.0]
    assert ratio_ticks(0.2, 9.0) == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0]
    assert ratio_ticks(1.0, 5000.0) == pytest.approx([1.0, 10.0, 100.0, 1000.0])  # decades over a very wide range
    for low, high in ((3.1, 3.9), (0.9, 1.1), (123.0, 125.0)):
        ticks = log_ticks(low, high)
        assert ticks and all(low <= t <= high for t in ticks)


# ---------------------------------------------------------------------------------------------------- pictures


@needs_matplotlib
@pytest.mark.slow
def test_render_plots_draws_each_metric_for_each_table(stored: StoredRun) -> None:
    plots = render_plots(Reading(stored.run, stored.results))
    stem = "float32-cpu-d-model-32-batch-2-layers-1.png"
    assert [p.filename for p in plots] == [
        f"{metric}-{mode}-{stem}" for mode in ("forward", "train") for metric in plots_module.METRICS
    ]
    tables = [t.title for t in pivot_tables(stored.results)]
    assert [p.group for p in plots] == [t for t in tables for _ in range(4)]
    for p in plots:
        width, height = png_size(p.png)
        assert 800 <= width <= 1600 and 450 <= height <= 1000  # readable, not a poster
    assert render_plots(Reading(stored.run, stored.results)) == plots  # same run, same bytes


@needs_matplotlib
@pytest.mark.slow
def test_one_length_draws_without_a_numpy_warning() -> None:
    """A sweep at one seq_len (tests/data/runs/aa-cpu-one-length, from configs/aa-cpu.yaml) is a zero-width x
    range until the axis is set: drawn in the wrong order, a lone error bar made matplotlib's log transform divide
    by zero and a RuntimeWarning reached the user's terminal."""
    stored = load_run(DATA / "runs" / "aa-cpu-one-length")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        plots = render_plots(Reading(stored.run, stored.results))
    assert {p.metric for p in plots} == set(plots_module.METRICS)


@needs_matplotlib
@pytest.mark.slow
def test_no_speedup_plot_without_a_baseline(stored: StoredRun) -> None:
    attention_only = [r for r in stored.results if r.case.model not in ("lstm", "gru")]
    metrics = {p.metric for p in render_plots(Reading(stored.run, attention_only))}
    assert metrics == {"latency", "memory", "throughput"}


@pytest.mark.slow
def test_drawing_uses_agg_and_never_pyplot() -> None:
    # In a fresh interpreter: pyplot (which picks a GUI backend and can open windows) must never be imported.
    code = (
        "import sys; from attnbench.results.store import load_run; from attnbench.report.plots import render_plots; "
        "from attnbench.analysis.reading import Reading; "
        f"s = load_run({str(FIXTURE)!r}); assert render_plots(Reading(s.run, s.results)); "
        "assert 'matplotlib.pyplot' not in sys.modules, 'pyplot was imported'; print('ok')"
    )
    if missing_matplotlib() is not None:
        pytest.skip("matplotlib is not installed")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "TkAgg"}  # a GUI default must not matter
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@needs_matplotlib
@pytest.mark.slow
def test_write_plots_writes_each_png(stored: StoredRun, tmp_path: Path) -> None:
    plots = render_plots(Reading(stored.run, stored.results))[:2]
    paths = write_plots(plots, tmp_path / "new" / "plots")
    assert [p.name for p in paths] == [p.filename for p in plots]
    assert [p.read_bytes() for p in paths] == [p.png for p in plots]
    assert not [p for p in (tmp_path / "new" / "plots").iterdir() if p.name.startswith(".")]  # no temp files


@needs_matplotlib
@pytest.mark.slow
def test_report_plots_writes_into_the_run_or_plots_dir(run_copy: Path, tmp_path: Path) -> None:
    result = runner.invoke(app, ["report", str(run_copy), "--plots", "--format", "csv", "-o", str(tmp_path / "x")])
    assert result.exit_code == 0, result.output
    written = sorted((run_copy / "plots").glob("*.png"))
    assert len(written) == 8 and all(f"wrote {p}" in result.stderr for p in written)
    elsewhere = tmp_path / "figs"
    result = runner.invoke(app, ["report", str(run_copy), "--plots-dir", str(elsewhere), "-f", "md", "-o", "-"])
    assert result.exit_code == 0 and len(list(elsewhere.glob("*.png"))) == 8  # --plots-dir implies --plots
    assert result.stdout.startswith("# attnbench run")  # and the report itself still goes to stdout


@pytest.mark.slow
def test_unwritable_plots_dir_is_an_error_with_a_hint(tmp_path: Path) -> None:
    if missing_matplotlib() is not None:
        pytest.skip("matplotlib is not installed")
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    result = runner.invoke(app, ["report", str(FIXTURE), "--plots-dir", str(blocker / "plots"), "-f", "csv"])
    assert result.exit_code == 2
    assert "cannot write plots" in result.stderr and "--plots-dir" in result.stderr


# ------------------------------------------------------------------------------------------------ without matplotlib


def test_without_matplotlib_render_raises_and_report_notes_it_once(
    stored: StoredRun, run_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block_matplotlib(monkeypatch)
    assert missing_matplotlib() == MISSING_NOTICE
    with pytest.raises(PlotsUnavailable):
        render_plots(Reading(stored.run, stored.results))
    result = runner.invoke(app, ["report", str(run_copy), "--plots", "-f", "csv", "-o", "-"])
    assert result.exit_code == 0, result.output
    assert result.stderr.strip().splitlines() == [f"note: {MISSING_NOTICE}"]
    assert result.stdout.startswith("model,mode")  # the report itself is unaffected
    assert not (run_copy / "plots").exists()


def test_sweep_render_without_matplotlib_keeps_the_summaries(
    run_copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    block_matplotlib(monkeypatch)
    for name in ("summary.csv", "summary.md"):
        (run_copy / name).unlink()
    _, paths, problem = write_run_files(run_copy)
    assert [p.name for p in paths] == ["summary.csv", "summary.md"] and all(p.exists() for p in paths)
    assert problem == f"note: {MISSING_NOTICE}"
    assert capsys.readouterr().err == ""  # the library says it; only the CLI prints


def test_a_plotting_failure_is_one_warning_line(
    run_copy: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a font went missing")

    monkeypatch.setattr(plots_module, "render_plots", broken)
    _, paths, problem = write_run_files(run_copy)
    assert [p.name for p in paths] == ["summary.csv", "summary.md"]
    assert problem is not None and problem.startswith("warning:") and "RuntimeError: a font went missing" in problem
    assert capsys.readouterr().err == ""
    written, problem = write_run_plots(Reading(load_run(run_copy).run, ()), run_copy / "plots")
    assert written == [] and problem is not None and problem.startswith("warning:")


@needs_matplotlib
@pytest.mark.slow
def test_sweep_render_writes_the_plots(run_copy: Path) -> None:
    _, paths, _ = write_run_files(run_copy)
    pngs = [p for p in paths if p.suffix == ".png"]
    assert len(pngs) == 8 and all(p.parent == run_copy / "plots" and p.read_bytes()[:8] == PNG_SIGNATURE for p in pngs)


TINY = tiny_config(
    "tiny-plots",
    timing={"target_ci": 0.2, "min_samples": 3, "min_time_s": 0.005, "max_case_s": 0.1, "warmup_max_s": 0.02},
)


@pytest.mark.slow  # five sweeps' start-up checks and two of them drawn
def test_attnbench_plots_0_turns_plots_off_for_sweep_and_merge_and_a_flag_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_executors: FakeExecutors
) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)

    def swept(out: str, *flags: str) -> Path:
        result = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / out), "-q", *flags])
        assert result.exit_code == 0, result.output
        (folder,) = (tmp_path / out).iterdir()
        return folder

    monkeypatch.setenv("ATTNBENCH_PLOTS", "0")
    off = swept("off")
    assert (off / "summary.csv").exists() and not (off / "plots").exists()
    assert list((swept("flag", "--plots") / "plots").glob("*.png"))  # the flag over the environment
    merged = runner.invoke(app, ["merge", str(off), "-o", str(tmp_path / "merged"), "-q"])
    assert merged.exit_code == 0, merged.output
    assert (tmp_path / "merged" / "summary.md").exists() and not (tmp_path / "merged" / "plots").exists()
    monkeypatch.setenv("ATTNBENCH_PLOTS", "1")
    assert list((swept("on") / "plots").glob("*.png"))
    assert not (swept("no", "--no-plots") / "plots").exists()
    monkeypatch.setenv("ATTNBENCH_PLOTS", "maybe")
    for command in (
        ["sweep", str(config), "--out", str(tmp_path / "bad")],
        ["merge", str(off), "-o", str(tmp_path / "m2")],
    ):
        bad = runner.invoke(app, command)
        assert bad.exit_code == 2 and bad.stdout == "", bad.output
        error, hint = bad.stderr.splitlines()  # the variable and its value; the values it takes
        assert error.startswith("error:") and mentions(error, "ATTNBENCH_PLOTS", "'maybe'")
        assert hint.startswith("hint:") and mentions(hint, "0", "1", "off", "on")
    assert not (tmp_path / "bad").exists() and not (tmp_path / "m2").exists()  # refused before anything ran
    assert not (swept("flag-over-bad", "--no-plots") / "plots").exists()  # a flag given, the variable is not read


@pytest.mark.slow
def test_sweep_writes_plots_by_default_and_a_failure_keeps_exit_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ATTNBENCH_PLOTS")  # the tests' own switch (tests/conftest.py): a user's shell has none
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    result = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / "ok"), "-q"])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "ok").iterdir()
    if missing_matplotlib() is None:
        pngs = sorted((folder / "plots").glob("*.png"))
        # The speed-up plot needs one speed-up drawn from good evidence: on a busy machine every cell may be
        # contended (issue 17), and then there is none.
        speedups = any(p.name.startswith("speedup-") for p in pngs)
        # The roofline is one per device and dtype (issue 27), of the ok rows timed on a quiet machine: none when
        # the other test worker left every row contended.
        quiet = any(r.ok and not r.contended for r in load_run(folder).results)
        rooflines = sum(p.name.startswith("roofline-") for p in pngs)
        assert rooflines == int(quiet)
        assert len(pngs) == 3 + rooflines + speedups and all(f"wrote {p}" in result.stdout for p in pngs)

    def broken(*args: object, **kwargs: object) -> None:
        raise MemoryError("no room to draw")

    monkeypatch.setattr(plots_module, "render_plots", broken)
    result = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / "broken"), "-q"])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "broken").iterdir()
    assert (folder / "summary.csv").exists() and not (folder / "plots").exists()
    warnings = [line for line in result.stderr.splitlines() if "plots" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning:") and "MemoryError: no room to draw" in warnings[0]

    assert "Traceback" not in result.output


@needs_matplotlib
def test_a_contended_cell_is_drawn_hollow_as_the_legend_says(stored: StoredRun) -> None:
    """Hollow is 'no evidence': noisy (~) or timed on a busy machine (!); a contended cell drew filled (issue 51)."""
    from matplotlib.figure import Figure

    from attnbench.report.plots import HOLLOW_LABEL, _legend, _plot_lines
    from attnbench.results.contention import Contention

    busy = Contention(True, ("another process used the CPU",), 1.0)
    rows = [replace(r, contention=busy) if r.case.model == "gru" else r for r in stored.results]
    forward = pivot_tables(rows)[0]
    gru = next(s for s in series(forward, "latency") if s.label == "gru")
    assert gru.values and all(p.contended and p.hollow for p in gru.values)
    ax = Figure().add_subplot()
    banded, hollow = _plot_lines(ax, [gru], {"gru": 0})
    assert hollow
    open_marks = [line for line in ax.get_lines() if line.get_markerfacecolor() in ("white", "w", (1.0, 1.0, 1.0, 1.0))]
    assert open_marks and list(open_marks[0].get_xdata()) == [p.n for p in gru.values]
    _legend(ax, "latency", banded, hollow, False, None)
    assert HOLLOW_LABEL in [t.get_text() for t in ax.get_legend().get_texts()]
