"""CPU telemetry for real: psutil on this process while torch multiplies matrices."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from attnbench.host.sensors import open_telemetry
from attnbench.host.sensors.reduce import per_core_mean_pct
from attnbench.results.telemetry import CPU_METRICS, GPM_METRICS, GPU_METRICS, METRICS, TelemetrySummary


def _busy(seconds: float) -> int:
    a = torch.randn(192, 192)
    calls, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)  # tanh keeps the values bounded over many calls
        calls += 1
    return calls


def test_cpu_telemetry_during_matmuls() -> None:
    tel = open_telemetry("cpu")
    with tel:
        # Half a second at the 0.1 s interval: about seven samples, so one the sampler thread loses to the busy
        # thread on a loaded machine (a 0.3 s window read 4 in CI) still leaves the five asserted.
        calls = _busy(0.5)
    s = tel.summary(calls=calls, tokens_per_call=192)

    assert s.source == "psutil" and s.level == "basic"
    assert 0.49 <= s.window_s < 1.5
    assert s.samples >= 5 and s.reliable, s.note
    cpu = s.metrics["cpu_util_pct"]
    assert isinstance(cpu, float) and 0 < cpu <= 100 + 10  # slack: CPU time is counted in 10 ms ticks
    per_core = s.metrics["cpu_util_per_core_mean_pct"]
    assert isinstance(per_core, float) and 0 < per_core <= 100
    rss, threads = s.metrics["rss_max_bytes"], s.metrics["threads_max"]
    assert isinstance(rss, int) and rss > 0
    assert isinstance(threads, int) and threads >= 1
    assert set(s.metrics) == set(CPU_METRICS)
    assert {m: s.unavailable[m] for m in GPU_METRICS + GPM_METRICS} == dict.fromkeys(
        GPU_METRICS + GPM_METRICS, "CPU run"
    )
    assert set(s.metrics) | set(s.unavailable) == set(METRICS)
    assert len(s.raw) == s.samples and all("rss_bytes" in row and "t_s" in row for row in s.raw)
    assert TelemetrySummary.from_dict(s.to_dict(include_raw=True)) == s


def test_sampler_thread_is_gone_after_exit() -> None:
    tel = open_telemetry("cpu", interval_s=0.005)
    with tel:
        assert any(t.name == "attnbench-telemetry" and t.daemon for t in threading.enumerate())
        _busy(0.05)
    assert not any(t.name == "attnbench-telemetry" for t in threading.enumerate())
    assert tel.summary(calls=1, tokens_per_call=1).samples >= 5


def test_workload_error_propagates_and_the_thread_still_stops() -> None:
    tel = open_telemetry("cpu")
    with pytest.raises(ZeroDivisionError, match="the workload failed"), tel:
        raise ZeroDivisionError("the workload failed")
    assert not any(t.name == "attnbench-telemetry" for t in threading.enumerate())
    assert tel.summary(calls=0, tokens_per_call=0).samples >= 2


def test_a_core_idle_through_a_short_window_reads_0_not_a_rounding_below_it() -> None:
    # psutil's busy time is user + system + …, floats: summed at two moments they can differ by -1.8e-08 for a
    # core that did nothing, and a negative share made a row that the results reader refused (merge failed on it).
    busy = 0.1 + 0.2 + 0.3
    start = [(busy, 10.0), (5.0, 10.0)]
    end = [(0.3 + 0.2 + 0.1 - 1e-9, 10.01), (5.01, 10.01)]
    assert per_core_mean_pct(start, end) == pytest.approx(50.0)
    assert per_core_mean_pct([(0.0, 1.0)], [(2.0, 2.0)]) == 100.0  # busy past the clock's tick: held to 100
