"""Contention per case (issue 17, items 1–3): real busy loops for the CPU rules, the fake pynvml for the GPU ones,
and what a contended row does to the report and to ``compare``. Behaviour, never timing: a hog on the case's own
core must be seen; the figures of a quiet machine are built by hand, since this machine is shared."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import pytest
from typer.testing import CliRunner

from attnbench.analysis.compare import Comparison, Policy, Side, compare_case
from attnbench.analysis.reading import Reading
from attnbench.analysis.scaling import LEFT_OUT
from attnbench.cli import app
from attnbench.core.cases import TimingPolicy
from attnbench.host.busy import (
    ContentionWatch,
    CpuCounters,
    GpuReading,
    busy_now,
    judge,
    read_gpu,
    wait_for_idle,
)
from attnbench.report.compare_md import contended_lines
from attnbench.report.markdown import render_markdown
from attnbench.report.rows import summary_row
from attnbench.results.contention import Contention
from attnbench.results.fields import FieldError
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result, Run
from attnbench.sweeps.runner import busy_warning
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.support import ROOT, mentions, numbers, tiny_case

runner = CliRunner()
HOG = "while True: pass"


@contextmanager
def hog(core: int | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A Python busy loop in its own process, pinned to ``core`` when given: a real one-core CPU hog."""
    proc = subprocess.Popen([sys.executable, "-c", HOG])
    try:
        if core is not None:
            os.sched_setaffinity(proc.pid, {core})
        yield proc
    finally:
        proc.kill()
        proc.wait()


def counters(at: float, own: float, busy: float | None, total: float | None = None, **kw: float | None) -> CpuCounters:
    fields: dict[str, float | None] = {"steal_s": 0.0, "run_wait_s": 0.0, "load": 0.5, **kw}
    return CpuCounters(at, own, busy, total if total is not None else (None if busy is None else 2 * at), **fields)  # type: ignore[arg-type]


def test_a_quiet_window_is_not_contended() -> None:
    # 1 s, this process used 1.9 cores of 2, the machine 1.95: others 0.05 cores, no wait, no steal.
    c = judge(counters(0, 0, 0), counters(1, 1.9, 1.95), threads=2, cores=2)
    assert not c.contended and c.reasons == ()
    assert c.others_cores == pytest.approx(0.05) and c.cpu_share == pytest.approx(1.9)


@pytest.mark.parametrize(
    ("threads", "cores", "others", "contended"),
    [
        (2, 2, 1.0, True),  # a one-core hog beside a two-thread case on two cores
        (1, 8, 1.0, False),  # the same hog beside one thread on eight cores leaves plenty free
        (8, 8, 0.4, False),  # a little background is within the slack
        (4, 8, 4.6, True),
    ],
)
def test_other_processes_count_against_the_cores_the_case_leaves_free(
    threads: int, cores: int, others: float, contended: bool
) -> None:
    own = 0.5
    c = judge(counters(0, 0, 0, 0), counters(1, own, own + others, cores), threads=threads, cores=cores)
    assert c.contended is contended
    assert c.others_cores == pytest.approx(others)
    if contended:
        assert f"kept {others:.1f} of {cores} cores busy" in c.reasons[0]


def test_steal_and_run_queue_wait_each_make_a_case_contended() -> None:
    stolen = judge(counters(0, 0, 0, 0, steal_s=0), counters(1, 1, 1, 2, steal_s=0.2), threads=1, cores=2)
    assert stolen.contended and stolen.steal_pct == pytest.approx(10) and "stole 10 %" in stolen.reasons[0]
    waited = judge(counters(0, 0, 0, run_wait_s=0), counters(1, 1, 1, run_wait_s=0.3), threads=1, cores=2)
    assert waited.contended and waited.run_wait_pct == pytest.approx(30)
    # The pre-sweep check sleeps: its own threads' waiting means nothing, and is not looked at.
    idle = judge(counters(0, 0, 0, run_wait_s=0), counters(1, 0, 0, run_wait_s=0.3), 1, 2, own_busy=False)
    assert not idle.contended and idle.run_wait_pct is None and idle.cpu_share is None


def test_missing_counters_are_none_not_errors() -> None:
    none = CpuCounters(0, 0, None, None, None, None, None)
    c = judge(none, replace(none, at_s=1, process_cpu_s=1), threads=2, cores=2)
    assert not c.contended and c.others_cores is None and c.steal_pct is None and c.run_wait_pct is None


HW_THERMAL, IDLE, SW_POWER_CAP = 0x040, 0x001, 0x004


def test_gpu_rules_other_processes_and_a_clock_below_the_application_clock() -> None:
    nvml = FakeNvml(
        [FakeGpu(processes=[os.getpid(), 4242], sm_clock_mhz=1200, app_sm_clock_mhz=1980, throttle_mask=HW_THERMAL)]
    )
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    reading = read_gpu(nvml, handle)
    assert reading == GpuReading(others=1, sm_clock_mhz=1200, app_clock_mhz=1980, events=("hw_thermal_slowdown",))
    c = judge(counters(0, 0, 0), counters(1, 1, 1), threads=1, cores=2, gpu=reading)
    assert c.contended and c.gpu_processes == 1
    assert mentions(c.reasons, "GPU", values=(1,))  # 1 other process on it
    assert mentions(c.reasons, "hw_thermal_slowdown", values=(1200, 1980))  # the clock, below the application's
    assert c.clock_events == ("hw_thermal_slowdown",) and "(hw_thermal_slowdown)" in c.evidence
    # In a container NVML lists host pids, so ours is not among them: one of the listed is taken to be ours.
    nvml.gpus[0].processes = [101, 102]
    nvml.gpus[0].sm_clock_mhz = 1980
    assert read_gpu(nvml, handle).others == 1
    nvml.gpus[0].processes = [os.getpid()]
    quiet = judge(counters(0, 0, 0), counters(1, 1, 1), 1, 2, gpu=read_gpu(nvml, handle))
    assert not quiet.contended and quiet.gpu_processes == 0
    # What NVML refuses stays unknown.
    nvml.gpus[0].not_supported = {"nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetClock"}
    assert read_gpu(nvml, handle) == GpuReading(
        others=None, sm_clock_mhz=1980, app_clock_mhz=None, events=("hw_thermal_slowdown",)
    )


@pytest.mark.parametrize(
    ("mask", "contended"),
    [(IDLE, False), (SW_POWER_CAP, False), (IDLE | SW_POWER_CAP, False), (0, False), (HW_THERMAL, True)],
)
def test_a_low_clock_counts_only_for_a_reason_other_than_idle_or_the_power_cap(mask: int, contended: bool) -> None:
    """An H200 idles at 345 MHz and boosts to ~1980: a launch-bound or power-capped case reads far below the
    application clock with nobody else on the GPU. Contended rows make claims inconclusive, so only a reason the
    case does not cause itself counts."""
    nvml = FakeNvml([FakeGpu(processes=[os.getpid()], sm_clock_mhz=700, app_sm_clock_mhz=1980, throttle_mask=mask)])
    nvml.nvmlInit()
    reading = read_gpu(nvml, nvml.nvmlDeviceGetHandleByIndex(0))
    c = judge(counters(0, 0, 0), counters(1, 1, 1), threads=1, cores=2, gpu=reading)
    assert c.contended is contended
    assert c.sm_clock_mhz == 700  # recorded either way
    unknown = judge(counters(0, 0, 0), counters(1, 1, 1), 1, 2, gpu=replace(reading, events=None))
    assert not unknown.contended  # an old driver without the reasons: the clock is recorded, not judged


def test_a_real_busy_loop_is_seen_by_the_pre_sweep_check() -> None:
    with hog():
        c = busy_now("cpu", threads=len(os.sched_getaffinity(0)), seconds=0.5, nvml=None)
    assert c.contended
    assert c.others_cores is not None and c.others_cores >= 0.5
    assert "other processes kept" in c.reasons[0]
    warning = busy_warning(c, 0)
    assert "the machine is busy" in warning and "--wait-idle SECONDS" in warning


@pytest.mark.slow
def test_waiting_for_idle_gives_up_when_time_is_up_and_says_so_while_it_waits() -> None:
    heard: list[float] = []
    with hog():
        threads = len(os.sched_getaffinity(0))
        c = wait_for_idle("cpu", threads, 1.0, on_busy=lambda busy, left: heard.append(left), nvml=None)
    assert c.contended and heard and all(left <= 1.0 for left in heard)


_PINNED = """
import json, os, subprocess, sys
from attnbench.host.busy import ContentionWatch
core = min(os.sched_getaffinity(0))
os.sched_setaffinity(0, {core})
hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
os.sched_setaffinity(hog.pid, {core})
try:
    with ContentionWatch("cpu", 1, nvml=None) as watch:
        x = 0
        for i in range(3_000_000):
            x += i
    print(json.dumps(watch.result().to_dict()))
finally:
    hog.kill()
"""


def test_a_case_sharing_its_core_with_a_busy_loop_is_marked_contended() -> None:
    """The timed window of a process pinned to one core, with a busy loop pinned to the same core: the process's
    threads wait for the CPU, which the run-queue rule sees whatever else the machine is doing."""
    if not os.path.exists("/proc/self/task"):
        pytest.skip("run-queue wait needs Linux schedstat")
    out = subprocess.run([sys.executable, "-c", _PINNED], capture_output=True, text=True, cwd=ROOT, check=True)
    c = Contention.from_dict(json.loads(out.stdout))
    assert c.contended, c
    assert c.logical_cores == 1 and c.threads == 1
    assert c.run_wait_pct is not None and c.run_wait_pct >= 10
    assert any("waited for a CPU" in r for r in c.reasons)


def test_the_watch_reads_nvml_outside_the_window_and_closes_it() -> None:
    nvml = FakeNvml([FakeGpu(processes=[999_999])])
    watch = ContentionWatch("cuda:0", 1, nvml=lambda: nvml)
    assert watch._gpu.nvml is None  # torch cannot name the device here, so the GPU rules are skipped, not an error
    with watch:
        pass
    assert (watch.done and not watch.result().contended) or watch.result().reasons


def test_contention_round_trips_and_bad_fields_are_named() -> None:
    c = Contention(True, ("x",), 1.5, threads=2, logical_cores=2, cpu_share=1.2, others_cores=1.0, gpu_processes=1)
    assert Contention.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    with pytest.raises(FieldError, match="others_cores"):
        Contention.from_dict({**c.to_dict(), "others_cores": -1})
    with pytest.raises(FieldError, match="unknown key"):
        Contention.from_dict({**c.to_dict(), "busy": True})


def _row(contended: bool, median: float = 1e-3) -> Result:
    samples = tuple(median * (1 + 0.001 * (i % 5)) for i in range(50))
    m = Measurement(samples, 1, 3, 0.0, True, "converged", 0.01)
    reasons = ("other processes kept 1.0 of 2 cores busy",) if contended else ()
    return Result(tiny_case(), "ok", measurement=m, contention=Contention(contended, reasons, 1.0, threads=2))


def test_a_contended_row_is_flagged_stored_and_exported() -> None:
    row = _row(True)
    assert row.contended and not _row(False).contended
    back = Result.from_dict(json.loads(json.dumps(row.to_dict())))
    assert back == row
    csv = summary_row(row)
    assert csv["contended"] is True and "other processes kept" in csv["contention"]
    # A row from before the watch reads back without it.
    old = row.to_dict()
    del old["contention"]
    assert Result.from_dict(old).contention is None and not Result.from_dict(old).contended


def test_the_report_headlines_contended_cases_and_marks_their_cells() -> None:
    run = Run("r", "2026-12-03T00:00:00Z", "tiny.yaml", {}, "0" * 64, TimingPolicy(), {})
    busy = replace(_row(True), case=tiny_case(seq_len=32))
    text = render_markdown(Reading(run, [_row(False), busy]))
    lines = text.splitlines()
    # A bold headline (1 of 2 cases, their cells marked !), the fit that left n=32 out, and the watch's reason.
    assert mentions([line for line in lines if line.startswith("**")], "!", values=(1, 2))
    assert mentions(lines, LEFT_OUT, values=(1, 2, 32))
    assert busy.contention is not None and busy.contention.reasons[0] in text
    table = text.split("## ")[1]
    assert "| !" in table and table.count("!") == 1  # the busy cell, not the quiet one
    assert "ran on a busy machine" not in render_markdown(Reading(run, [_row(False)]))


def test_a_case_too_slow_for_its_budget_on_a_busy_machine_is_no_regression() -> None:
    """In the loaded A/A runs a case flipped between ok and too_slow_for_budget as the neighbours' load came and
    went: how many samples fit in a budget is a timing too, so contention withholds that verdict as well."""
    slow = replace(_row(True), status="too_slow_for_budget", reason="too slow for the budget: …")
    got = compare_case("k", [_row(False)], [slow], Policy())
    assert (got.verdict, got.evidence, got.contended) == ("noisy", "status", ("current",))
    back = compare_case("k", [slow], [_row(False)], Policy())
    assert back.verdict == "noisy" and back.contended == ("base",)
    quiet = replace(slow, contention=Contention(False, (), 1.0))
    # Quiet too: a budget flip is never a regression (issue 51), only noisy, whatever the machine did.
    assert compare_case("k", [_row(False)], [quiet], Policy()).verdict == "noisy"
    assert slow.contended and not slow.is_timed


def test_compare_never_concludes_from_contended_evidence() -> None:
    # Twice as slow, but the current side was timed on a busy machine: noisy (contended), not regressed. The floor
    # is a measured machine's, so the clean pair's doubling is beyond it (compare's unmeasured default is ×2).
    measured = Policy(noise_floor=0.04)
    got = compare_case("k", [_row(False)], [_row(True, median=2e-3)], measured)
    assert got.verdict == "noisy" and got.contended == ("current",)
    assert got.verdict_text.startswith("noisy") and "current" in got.verdict_text and "busy machine" in got.note
    both = compare_case("k", [_row(True)], [_row(True)], measured)
    assert both.verdict == "noisy" and both.contended == ("base", "current")
    clean = compare_case("k", [_row(False)], [_row(False, median=2e-3)], measured)
    assert clean.verdict == "regressed" and clean.contended == ()
    comparison = Comparison(Side(ROOT, ()), Side(ROOT, ()), Policy(), (got, both, clean))
    assert not comparison.regressed or comparison.of("regressed") == (clean,)
    assert numbers(contended_lines(comparison)[1]) == [2, 1, 2]  # 2 cases: 1 contended on the base side, 2 current


def test_a_folder_of_runs_is_judged_without_its_contended_runs_when_enough_remain() -> None:
    # Five runs a side, one contended on each, 20 % slower everywhere: the eight quiet runs carry the verdict.
    spread = (0.98, 1.0, 1.02, 0.99)
    base = [_row(True, median=1e-3), *(_row(False, median=1e-3 * f) for f in spread)]
    current = [*(_row(False, median=1.2e-3 * f) for f in spread), _row(True, median=5e-3)]
    got = compare_case("k", base, current, Policy())
    assert (got.verdict, got.evidence, got.contended, got.left_out) == ("regressed", "processes", (), (1, 1))
    assert (got.base_n, got.current_n) == (4, 4) and got.ratio == pytest.approx(1.2)  # the 5 ms run left out
    assert mentions(got.note, values=(1, 5))  # 1 of 5 runs left out on each side
    comparison = Comparison(Side(ROOT, ()), Side(ROOT, ()), Policy(), (got,))
    assert numbers(contended_lines(comparison)[1]) == [1, 2]  # 1 case, 2 contended runs left out

    # Too few quiet runs to make an interval (one a side): no verdict, as with a single contended run.
    few = compare_case("k", base[:2], [current[0], current[-1]], Policy())
    assert few.verdict == "noisy" and few.contended == ("base", "current") and few.left_out == (0, 0)
    # Every run of a side contended: nothing to judge on.
    none_quiet = compare_case("k", [_row(True), _row(True)], current, Policy())
    assert none_quiet.verdict == "noisy" and none_quiet.contended == ("base", "current")


def test_sweep_help_and_env_show_the_busy_check() -> None:
    out = runner.invoke(app, ["sweep", "--help"])
    assert "--wait-idle" in out.output
    env = runner.invoke(app, ["env", "--device", "cpu"])
    assert env.exit_code == 0, env.output
    assert "load.now" in env.output and "load.busy" in env.output
