"""Telemetry without a GPU: pure summaries on synthetic samples, and whole sessions against a fake pynvml."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

from attnbench.host.sensors import open_telemetry, reduce, telemetry_status
from attnbench.host.sensors.assemble import CpuWindow, GpuWindow, HostCounters, cpu_metrics, gpu_metrics
from attnbench.host.sensors.faults import TelemetryUnavailable
from attnbench.host.sensors.identity import GpuIdentity, nvml_uuid, pci_bus_id
from attnbench.host.sensors.nvml import nvml_handle_for
from attnbench.host.sensors.sampler import Channel, Failure, Sampler
from attnbench.results.telemetry import CPU_METRICS, GPM_METRICS, METRICS, NVML_METRICS, TelemetrySummary
from tests import fake_pynvml
from tests.fake_pynvml import CONSTANTS, FakeGpu, FakeNvml
from tests.support import ROOT, mentions, numbers

UTIL_SAMPLES = CONSTANTS["NVML_GPU_UTILIZATION_SAMPLES"]
POWER_SAMPLES = CONSTANTS["NVML_TOTAL_POWER_SAMPLES"]


def session(fake: FakeNvml, gpu: int = 0, level: str = "basic", seconds: float = 0.2, **kw: Any) -> TelemetrySummary:
    """One window of ``seconds`` on the fake's ``gpu``, identified by UUID as torch would."""
    ident = GpuIdentity("cuda:0", fake.gpus[gpu].uuid, None)
    tel = open_telemetry("cuda:0", level, nvml=lambda: fake, identity=lambda d: ident, **kw)  # type: ignore[arg-type]
    with tel:
        time.sleep(seconds)
    return tel.summary(calls=10, tokens_per_call=1000)


def samples(n: int, window_s: float = 1.0, **readings: Any) -> list[dict[str, Any]]:
    """n polled rows evenly over the window; each reading a constant or a list of n values."""
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"t_s": window_s * i / max(1, n - 1)}
        for name, value in readings.items():
            row[name] = value[i] if isinstance(value, list) else value
        rows.append(row)
    return rows


def covers_every_metric(s: TelemetrySummary) -> None:
    assert set(s.metrics) | set(s.unavailable) == set(METRICS)
    assert not set(s.metrics) & set(s.unavailable)


# ---------------------------------------------------------------- pure: window joining, means, energy, throttle


def test_in_window_drops_samples_outside_the_window() -> None:
    points = [(-0.5, 1.0), (0.0, 2.0), (0.5, 3.0), (1.0, 4.0), (1.01, 5.0)]
    assert reduce.in_window(points, 0.0, 1.0) == [(0.0, 2.0), (0.5, 3.0), (1.0, 4.0)]


def test_gpu_metrics_means_and_maxima_from_polled_samples() -> None:
    rows = samples(
        5,
        gpu_util_pct=[10.0, 20.0, 30.0, 40.0, 50.0],
        mem_util_pct=[5.0, 5.0, 5.0, 5.0, 10.0],
        gpu_mem_used_bytes=[1, 5, 3, 2, 4],
        power_w=[100.0, 200.0, 300.0, 200.0, 100.0],
        sm_clock_mhz=[1800.0, 1700.0, 1900.0, 1800.0, 1800.0],
        mem_clock_mhz=2619.0,
        temp_c=[50.0, 61.0, 55.0, 52.0, 53.0],
        throttle_mask=[0, 0, 0x004, 0, 0x001],
    )
    names = ["gpu_util_pct", "mem_util_pct", "power_w", "sm_clock_mhz", "mem_clock_mhz"]
    unbuffered = dict.fromkeys(names, "nvmlDeviceGetSamples: NVMLError_NotSupported")
    w = GpuWindow(1.0, rows, buffer_failures=unbuffered, energy_mj=(1_000, 201_000), max_sm_clock_mhz=1980.0)
    metrics, unavailable, notes, _ = gpu_metrics(w, tokens=400)
    assert metrics["gpu_util_pct"] == 30.0 and metrics["gpu_util_max_pct"] == 50.0
    assert metrics["mem_util_pct"] == 6.0
    assert metrics["gpu_mem_used_max_bytes"] == 5
    assert metrics["power_w"] == 180.0
    assert metrics["sm_clock_mhz"] == 1800.0 and metrics["sm_clock_min_mhz"] == 1700.0
    assert metrics["mem_clock_mhz"] == 2619.0 and metrics["temp_max_c"] == 61.0
    assert metrics["throttle_reasons"] == "GpuIdle;SwPowerCap"
    assert metrics["sm_clock_drop_pct"] == pytest.approx(100 * (1 - 1800 / 1980))
    assert metrics["throttled"] is True  # SwPowerCap, and the clock 9 % below its maximum
    assert metrics["energy_j"] == 200.0 and metrics["joules_per_token"] == 0.5
    assert unavailable == {m: "not read" for m in (*GPM_METRICS, "gpm_window_s", "gpm_reliable")}
    # Where the readings came from (polled, because the buffer failed so), and why the case counts as throttled.
    assert mentions(notes, "nvmlDeviceGetSamples: NVMLError_NotSupported", *names)
    assert mentions(notes, "SwPowerCap", values=(9.1, 1800, 1980))


def test_nvml_buffered_samples_are_the_readings_and_a_missing_one_is_read_at_the_end() -> None:
    # NVML's utilisation samples at 1/6 s, three inside the window; power sampled faster; no SM-clock sample fell
    # inside this short window, so the one reading taken at its end stands in.
    util = [(0.1, 90.0), (0.27, 70.0), (0.43, 80.0)]
    power = [(0.05 * i, 300.0 + i) for i in range(10)]
    w = GpuWindow(
        0.5,
        samples(5, 0.5, gpu_mem_used_bytes=7, temp_c=50.0, throttle_mask=0),
        buffered={"gpu_util_pct": util, "mem_util_pct": [(0.1, 40.0)], "power_w": power, "mem_clock_mhz": []},
        buffer_clock="boottime",
        util_timestamps_us=(1_100_000, 1_266_666, 1_433_333),
        at_end={"sm_clock_mhz": 1980.0, "mem_clock_mhz": 2619.0},
        max_sm_clock_mhz=1980.0,
    )
    metrics, _, notes, period = gpu_metrics(w, tokens=1)
    assert metrics["gpu_util_pct"] == 80.0 and metrics["gpu_util_max_pct"] == 90.0
    assert metrics["power_w"] == pytest.approx(304.5)
    assert metrics["sm_clock_mhz"] == 1980.0 and metrics["sm_clock_drop_pct"] == 0.0 and metrics["throttled"] is False
    # One note per source: the buffered readings with their sample counts and clock, then those read at the end.
    assert mentions(notes[0], "gpu_util_pct", "mem_util_pct", "power_w", "boottime") and numbers(notes[0]) == [3, 1, 10]
    assert mentions(notes[1], "sm_clock_mhz", "mem_clock_mhz") and "power_w" not in notes[1]
    assert period == pytest.approx(1 / 6, rel=1e-3)


def test_energy_counter_delta_handles_a_wrap_and_refuses_a_reset() -> None:
    assert reduce.counter_delta(2**64 - 500, 1500) == 2000
    assert reduce.energy_from_counter(2**64 - 500, 1500, window_s=1.0) == 2.0
    assert reduce.energy_from_counter(5_000_000, 1_000, window_s=1.0) is None  # went backwards: a reset


def test_energy_from_power_integrates_and_holds_the_edges() -> None:
    # 100 W from 0.0 to 0.5 s, ramp to 300 W at 1.5 s, held to the window end at 2.0 s.
    points = [(0.5, 100.0), (1.5, 300.0)]
    assert reduce.energy_from_power(points, 0.0, 2.0) == pytest.approx(50 + 200 + 150)
    assert reduce.energy_from_power([], 0.0, 1.0) is None


def test_energy_falls_back_to_power_when_the_counter_is_not_supported() -> None:
    w = GpuWindow(2.0, samples(5, 2.0, power_w=250.0), energy_failure="NVMLError_NotSupported")
    metrics, _, notes, _ = gpu_metrics(w, tokens=1000)
    assert metrics["energy_j"] == pytest.approx(500.0)
    assert metrics["joules_per_token"] == pytest.approx(0.5)
    assert any("power × time" in n and "NVMLError_NotSupported" in n for n in notes)


def test_energy_counter_reset_falls_back_and_says_so() -> None:
    w = GpuWindow(1.0, samples(3, power_w=100.0), energy_mj=(9_000_000, 10))
    metrics, _, notes, _ = gpu_metrics(w, tokens=1)
    assert metrics["energy_j"] == pytest.approx(100.0)
    assert any("went backwards" in n for n in notes)


def test_energy_unavailable_when_neither_counter_nor_power() -> None:
    failures = {"power_w": "NVMLError_NotSupported"}
    w = GpuWindow(1.0, samples(3), failures=failures, energy_failure="NVMLError_NotSupported")
    _, unavailable, _, _ = gpu_metrics(w, tokens=1)
    assert "NVMLError_NotSupported" in unavailable["energy_j"]
    assert unavailable["joules_per_token"] == unavailable["energy_j"]


def test_joules_per_token_needs_tokens() -> None:
    _, unavailable, _, _ = gpu_metrics(GpuWindow(1.0, samples(3), energy_mj=(0, 1000)), tokens=0)
    assert unavailable["joules_per_token"] == "no tokens counted"


@pytest.mark.parametrize(
    ("clock", "mask", "throttled"),
    [
        (1980.0, 0x004, False),  # SwPowerCap set while the clock holds at its maximum: an H200 under bf16 load
        (1900.0, 0x004, False),  # 4 % below: within the 5 % an unthrottled board boosts around
        (1800.0, 0x004, True),  # 9 % below, power-capped: throttled
        (1400.0, 0x000, False),  # far below with no reason: idling between launches, not throttling
        (1400.0, 0x001, False),  # GpuIdle says so
        (1400.0, 0x020, True),  # SwThermalSlowdown
        (1400.0, 0x040, True),  # HwThermalSlowdown
        (1400.0, 0x080, True),  # HwPowerBrakeSlowdown
        (1400.0, 0x008, True),  # HwSlowdown
        (1400.0, 0x010 | 0x1000, False),  # SyncBoost, an unknown bit
    ],
)
def test_throttled_only_when_a_power_or_heat_reason_fires_and_the_clock_fell(
    clock: float, mask: int, throttled: bool
) -> None:
    rows = samples(10, sm_clock_mhz=clock, throttle_mask=[0] * 9 + [mask])
    metrics, _, notes, _ = gpu_metrics(GpuWindow(1.0, rows, max_sm_clock_mhz=1980.0), tokens=1)
    assert metrics["throttled"] is throttled
    assert metrics["sm_clock_drop_pct"] == pytest.approx(100 * (1 - clock / 1980))
    if mask == 0x004 and not throttled:
        assert mentions(notes, "SwPowerCap", values=(5,))  # set, but the clock held within 5 % of its maximum


def test_throttle_reason_names_and_unknowns() -> None:
    assert reduce.reasons_seen([0x001, 0x004]) == "GpuIdle;SwPowerCap"
    assert reduce.reasons_seen([0x010 | 0x1000]) == "SyncBoost;0x1000"
    assert reduce.clock_drop_pct([], 1980.0) is None and reduce.clock_drop_pct([2000.0], 1980.0) == 0.0


def test_throttled_is_unknown_without_a_maximum_clock_or_reasons() -> None:
    metrics, unavailable, _, _ = gpu_metrics(GpuWindow(1.0, samples(5, sm_clock_mhz=1400.0, throttle_mask=4)), tokens=1)
    assert unavailable["throttled"] and "throttled" not in metrics
    failures = {"throttle_mask": "NVMLError_NotSupported"}
    w = GpuWindow(1.0, samples(5, sm_clock_mhz=1400.0), failures=failures, max_sm_clock_mhz=1980.0)
    metrics, unavailable, _, _ = gpu_metrics(w, tokens=1)
    assert "throttled" not in metrics and "NVMLError_NotSupported" in unavailable["throttled"]


def test_reliability_short_window_and_few_samples() -> None:
    assert reduce.reliability(1.0, 50, 1 / 6) == (True, [])
    ok, notes = reduce.reliability(0.08, 5, 1 / 6)
    assert not ok and numbers(notes[0])[:2] == [0.08, 0.17]  # the window, and the averaging period it is under
    ok, notes = reduce.reliability(1.0, 2, None)
    assert not ok and "only 2 sample(s)" in notes[0]


def test_driver_gone_voids_every_nvml_metric() -> None:
    w = GpuWindow(1.0, samples(5, power_w=100.0), fatal="NVMLError_GpuIsLost (GPU is lost)")
    metrics, unavailable, _, _ = gpu_metrics(w, tokens=1)
    assert metrics == {}
    assert set(unavailable) == set(NVML_METRICS)
    assert all("NVMLError_GpuIsLost" in r for r in unavailable.values())


def test_cpu_metrics_from_counters() -> None:
    start = HostCounters(10.0, 100.0, [(1.0, 10.0), (2.0, 10.0)])
    end = HostCounters(11.0, 101.0, [(1.5, 11.0), (2.25, 11.0)])
    rows = samples(4, rss_bytes=[10, 30, 20, 5], threads=[1, 4, 2, 2])
    metrics, unavailable = cpu_metrics(CpuWindow(1.0, rows, {}, 4, start, end))
    assert metrics == {"cpu_util_pct": 25.0, "cpu_util_per_core_mean_pct": 37.5, "rss_max_bytes": 30, "threads_max": 4}
    assert unavailable == {}
    _, unavailable = cpu_metrics(CpuWindow(1.0, rows, {"threads": "AccessDenied: no"}, 4, None, None, "NoSuchProcess"))
    assert unavailable == {
        "cpu_util_pct": "NoSuchProcess",
        "cpu_util_per_core_mean_pct": "NoSuchProcess",
        "threads_max": "AccessDenied: no",
    }


# ---------------------------------------------------------------- the summary value


def _summary(raw: tuple[dict[str, Any], ...] = ()) -> TelemetrySummary:
    return TelemetrySummary(
        source="nvml+psutil",
        level="full",
        interval_s=0.02,
        window_s=1.25,
        samples=63,
        reliable=True,
        note="energy_j from the total-energy counter",
        metrics={"gpu_util_pct": 87.5, "throttle_reasons": "SwPowerCap", "throttled": True, "rss_max_bytes": 123},
        unavailable={"power_w": "NVMLError_NotSupported"},
        raw=raw,
    )


@pytest.mark.parametrize("include_raw", [False, True])
def test_summary_round_trips_through_json(include_raw: bool) -> None:
    s = _summary(raw=({"t_s": 0.0, "power_w": 250.5, "throttle_mask": 4}, {"t_s": 0.02, "power_w": None}))
    data = json.loads(json.dumps(s.to_dict(include_raw=include_raw)))
    assert ("raw" in data) is include_raw
    back = TelemetrySummary.from_dict(data)
    assert back == (s if include_raw else _summary())
    assert list(s.to_dict()["metrics"]) == [m for m in METRICS if m in s.metrics]  # CSV order


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (lambda d: d.update(extra=1), "unknown key 'extra'"),
        (lambda d: d.pop("note"), "missing key 'note'"),
        (lambda d: d.update(samples="63"), "samples"),
        (lambda d: d.update(interval_s=math.inf), "interval_s"),
        (lambda d: d.update(level="max"), "unknown telemetry level"),
        (lambda d: d.update(source="dcgm"), "unknown telemetry source"),
        (lambda d: d["metrics"].update(gpu_util_pct=math.nan), "metrics.gpu_util_pct"),
        (lambda d: d["metrics"].update(gpu_util_pct="87"), "metrics.gpu_util_pct"),
        (lambda d: d["metrics"].update(rss_max_bytes=True), "metrics.rss_max_bytes"),
        (lambda d: d["metrics"].update(throttled=1), "metrics.throttled"),
        (lambda d: d["metrics"].update(sm_util=1.0), "unknown key 'sm_util'"),
        (lambda d: d["unavailable"].update(gpu_util_pct="x"), "also present in metrics"),
        (lambda d: d["unavailable"].update(power_w=3), "unavailable.power_w"),
        (lambda d: d.update(raw=[{"t_s": math.nan}]), "raw[0].t_s"),
        (lambda d: d.update(raw=[{"t_s": True}]), "raw[0].t_s"),
        (lambda d: d.update(raw={"t_s": 0.0}), "raw"),
        (lambda d: d.update(metrics=[]), "metrics"),
    ],
)
def test_from_dict_rejects_malformed_input(change: Any, error: str) -> None:
    data = _summary().to_dict(include_raw=True)
    change(data)
    with pytest.raises((ValueError, TypeError, KeyError), match=error.replace("[", r"\[").replace("]", r"\]")):
        TelemetrySummary.from_dict(data)


def test_from_dict_rejects_non_objects() -> None:
    with pytest.raises(ValueError, match="expected an object"):
        TelemetrySummary.from_dict([1, 2])


# ---------------------------------------------------------------- the sampler thread


def test_sampler_drops_a_failing_reading_and_keeps_the_rest() -> None:
    class Busy(Exception):
        pass

    def flaky() -> float:
        raise Busy("counter busy")

    def known(exc: Exception) -> Failure | None:
        return Failure(f"Busy: {exc}") if isinstance(exc, Busy) else None

    sampler = Sampler([Channel("ok", lambda: 1.0, known), Channel("bad", flaky, known)], 0.005)
    sampler.start()
    time.sleep(0.05)
    sampler.stop()
    assert not sampler.running
    assert len(sampler.samples) >= 3 and all(s["ok"] == 1.0 and "bad" not in s for s in sampler.samples)
    assert sampler.failures == {"bad": "Busy: counter busy"}


def test_sampler_fatal_failure_drops_the_whole_group() -> None:
    calls = {"n": 0}

    def dies() -> float:
        calls["n"] += 1
        if calls["n"] > 2:
            raise OSError("gone")
        return 1.0

    def fatal(exc: Exception) -> Failure | None:
        return Failure("gone", fatal=True) if isinstance(exc, OSError) else None

    chans = [Channel("a", dies, fatal, "gpu"), Channel("b", lambda: 2.0, fatal, "gpu"), Channel("c", lambda: 3, fatal)]
    sampler = Sampler(chans, 0.005)
    sampler.start()
    time.sleep(0.05)
    sampler.stop()
    assert sampler.fatal == {"gpu": "gone"} and sampler.failures == {"a": "gone", "b": "gone"}
    assert sampler.samples[-1] == {"t_s": sampler.samples[-1]["t_s"], "c": 3}


def test_sampler_reraises_a_bug_at_stop() -> None:
    def buggy() -> float:
        raise KeyError("typo")

    sampler = Sampler([Channel("x", buggy, lambda exc: None)], 0.005)
    sampler.start()
    with pytest.raises(KeyError, match="typo"):
        sampler.stop()
    assert not sampler.running


# ---------------------------------------------------------------- handle mapping


def test_identity_forms_match_nvml() -> None:
    assert nvml_uuid("5e1f2c3d-0a1b-4c2d-8e3f-000000000001") == "GPU-5e1f2c3d-0a1b-4c2d-8e3f-000000000001"
    assert nvml_uuid("GPU-5E1F2C3D-0A1B-4C2D-8E3F-000000000001") == "GPU-5e1f2c3d-0a1b-4c2d-8e3f-000000000001"
    assert nvml_uuid("not a uuid") is None
    # A MIG slice keeps its own prefix: "GPU-" with its hex would name no device, or the wrong one.
    assert nvml_uuid("MIG-5E1F2C3D-0A1B-4C2D-8E3F-000000000001") == "MIG-5e1f2c3d-0a1b-4c2d-8e3f-000000000001"
    assert pci_bus_id(0, 0x3B, 0) == "00000000:3b:00.0"


def _two_gpus() -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(uuid="GPU-00000000-0000-0000-0000-00000000aaaa", pci_bus_id="00000000:1A:00.0", power_w=100.0),
            FakeGpu(uuid="GPU-00000000-0000-0000-0000-00000000bbbb", pci_bus_id="00000000:3B:00.0", power_w=250.0),
        ]
    )


def test_handle_by_uuid_then_by_pci_bus_id_never_by_index() -> None:
    fake = _two_gpus()
    fake.nvmlInit()
    assert nvml_handle_for("GPU-00000000-0000-0000-0000-00000000bbbb", None, fake).gpu is fake.gpus[1]
    assert nvml_handle_for(None, pci_bus_id(0, 0x3B, 0), fake).gpu is fake.gpus[1]
    # A UUID NVML does not know (say a MIG instance), then the bus id.
    assert nvml_handle_for("GPU-ffffffff-0000-0000-0000-000000000000", "0000:1a:00.0", fake).gpu is fake.gpus[0]
    with pytest.raises(TelemetryUnavailable, match="no NVML device matches"):
        nvml_handle_for("GPU-ffffffff-0000-0000-0000-000000000000", "0000:99:00.0", fake)
    with pytest.raises(TelemetryUnavailable):
        nvml_handle_for(None, None, fake)
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 0


def test_cuda_visible_devices_maps_torch_index_to_the_right_gpu() -> None:
    # CUDA_VISIBLE_DEVICES=1: torch's cuda:0 is NVML's device 1; only its UUID says so.
    fake = _two_gpus()
    s = session(fake, gpu=1, seconds=0.1)
    assert s.metrics["power_w"] == 250.0
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 0


# ---------------------------------------------------------------- sessions against the fake


def test_full_session_on_hopper_reads_everything_and_cleans_up() -> None:
    fake = FakeNvml([FakeGpu(util_period_s=0.05)])
    s = session(fake, level="full", seconds=0.25)
    covers_every_metric(s)
    assert s.source == "nvml+psutil" and s.level == "full" and s.reliable, s.note
    assert s.unavailable == {}
    assert s.metrics["gpu_util_pct"] == 80.0 and s.metrics["power_w"] == 300.0
    assert s.metrics["sm_clock_max_mhz"] == 1980.0 and s.metrics["throttled"] is False
    assert s.metrics["gpm_sm_util_pct"] == 61.5 and s.metrics["gpm_tensor_util_pct"] == 45.0
    # 300 W over the window, from the counter, which brackets the window: by a few µs on a quiet machine, by a few
    # ms when another process holds the core between the counter's read and the window's end.
    assert 300.0 * s.window_s * 0.98 <= s.metrics["energy_j"] <= 300.0 * (s.window_s + 0.05)
    assert s.metrics["joules_per_token"] == pytest.approx(s.metrics["energy_j"] / 10_000)  # type: ignore[operator]
    assert "total-energy counter" in s.note
    assert s.samples >= 3 and len(s.raw) > s.samples  # polled rows, then NVML's buffered samples
    assert fake.init_count == 0 and fake.gpm_live == []  # nvmlShutdown called, GPM samples freed


def test_nvml_samples_before_the_window_are_dropped() -> None:
    fake = FakeNvml([FakeGpu(util_period_s=0.04)])
    busy_from = {"t": math.inf}
    fake.gpus[0].util_pct = lambda t: 90.0 if t >= busy_from["t"] else 5.0  # 2 s of idle history, then busy
    ident = GpuIdentity("cuda:0", fake.gpus[0].uuid, None)
    tel = open_telemetry("cuda:0", nvml=lambda: fake, identity=lambda d: ident)
    busy_from["t"] = fake.now()
    with tel:
        time.sleep(0.2)
    s = tel.summary(calls=1, tokens_per_call=1)
    assert s.metrics["gpu_util_pct"] == 90.0 and s.metrics["gpu_util_max_pct"] == 90.0
    assert mentions(s.note.split("; "), "buffered", "gpu_util_pct")
    nvml_rows = [r for r in s.raw if "nvml_sample_gpu_util_pct" in r]
    assert nvml_rows and all(r["nvml_sample_gpu_util_pct"] == 90 for r in nvml_rows)
    assert all(0 <= r["t_s"] <= s.window_s for r in nvml_rows)  # type: ignore[operator]


POLLED_EVERY_TIME = ("nvmlDeviceGetMemoryInfo", "nvmlDeviceGetTemperature", "nvmlDeviceGetCurrentClocksEventReasons")


def test_what_nvml_buffers_is_read_from_its_buffers_and_the_poll_makes_three_calls() -> None:
    """Utilisation, power and clocks come from nvmlDeviceGetSamples at the window's ends (and a drain every half
    second); the thread beside the timed calls polls only what nothing buffers (issue 12, item 8)."""
    fake = FakeNvml([FakeGpu(util_period_s=0.05)])
    s = session(fake, level="full", seconds=0.3, interval_s=0.02)
    polls = s.samples
    assert polls >= 5
    for name in POLLED_EVERY_TIME:
        assert fake.calls[name] == polls, name
    for name in ("nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo"):
        assert fake.calls[name] == 0, name
    # Five sampling types, each read when the device opens, at both ends of the window and at most once per drain.
    assert fake.calls["nvmlDeviceGetSamples"] <= 5 * 5
    assert s.metrics["power_w"] == 300.0 and s.metrics["sm_clock_mhz"] == 1755.0 and s.metrics["gpu_util_pct"] == 80
    assert "NVML's buffered samples" in s.note and "(timestamps on wall)" in s.note


def test_a_type_nvml_will_not_buffer_is_polled_with_one_call_for_both_utilisations() -> None:
    """MIG has no utilisation samples: then one nvmlDeviceGetUtilizationRates per poll answers GPU and memory
    utilisation together (it used to be called once for each)."""
    unbuffered = {UTIL_SAMPLES, CONSTANTS["NVML_MEMORY_UTILIZATION_SAMPLES"]}
    fake = FakeNvml([FakeGpu(unbuffered=unbuffered, util_pct=55.0, mem_util_pct=25.0)])
    s = session(fake, seconds=0.2, interval_s=0.02)
    assert fake.calls["nvmlDeviceGetUtilizationRates"] == s.samples
    assert s.metrics["gpu_util_pct"] == 55.0 and s.metrics["mem_util_pct"] == 25.0
    assert mentions(
        s.note.split("; "), "nvmlDeviceGetSamples", "NVMLError_NotSupported", "gpu_util_pct", "mem_util_pct"
    )


def test_samples_stamped_on_boottime_are_found_from_an_empty_buffer() -> None:
    """Drivers stamp samples on the epoch or on CLOCK_BOOTTIME. With no sample before the window, the old cursor
    started at the host's epoch time, above every boottime stamp: every sample of the window was lost."""
    fake = FakeNvml([FakeGpu(sample_clock="boottime", history_s=0.0, util_period_s=0.04, util_pct=70.0)])
    s = session(fake, seconds=0.25)
    assert s.metrics["gpu_util_pct"] == 70.0
    assert "timestamps on boottime" in s.note
    rows = [r for r in s.raw if "nvml_sample_gpu_util_pct" in r]
    assert rows and all(0 <= r["t_s"] <= s.window_s + 1e-3 for r in rows)  # type: ignore[operator]


def test_a_window_shorter_than_the_drivers_sampling_period_reads_once_at_its_end() -> None:
    fake = FakeNvml([FakeGpu(sample_period_s=5.0, util_period_s=0.02, power_w=250.0)])
    s = session(fake, seconds=0.1)
    assert s.metrics["power_w"] == 250.0
    notes = s.note.split("; ")
    assert mentions(notes, "power_w, sm_clock_mhz, mem_clock_mhz")  # read once, at the window's end
    assert not mentions(notes, "buffered", "power_w")

    assert mentions(notes, "power_w", values=(1,))  # power_w averages over ~1 s: longer than this window
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1


def _gpm_session(fake: FakeNvml, warmup_s: float, sampling_s: float, mark: bool = True) -> TelemetrySummary:
    ident = GpuIdentity("cuda:0", fake.gpus[0].uuid, None)
    tel = open_telemetry("cuda:0", "full", nvml=lambda: fake, identity=lambda d: ident)
    with tel:
        time.sleep(warmup_s)
        if mark:
            tel.mark_sampling()
        time.sleep(sampling_s)
    return tel.summary(calls=1, tokens_per_call=1)


@pytest.mark.slow
def test_gpm_covers_the_sampling_phase_only_and_says_when_it_is_too_short_to_trust() -> None:
    s = _gpm_session(FakeNvml(), warmup_s=0.3, sampling_s=0.2)
    assert s.metrics["gpm_sm_util_pct"] == 61.5
    assert 0.18 <= s.metrics["gpm_window_s"] < 0.3 <= s.window_s  # type: ignore[operator]
    assert s.metrics["gpm_reliable"] is False
    assert mentions(s.note.split("; "), "GPM", values=(round(s.metrics["gpm_window_s"], 2), 1))  # < 1 s: say so
    unmarked = _gpm_session(FakeNvml(), warmup_s=0.0, sampling_s=0.15, mark=False)
    assert mentions(unmarked.note.split("; "), "GPM", "warm-up")  # the sampling phase was never marked


@pytest.mark.slow
def test_gpm_over_a_second_or_more_is_reliable() -> None:
    s = _gpm_session(FakeNvml(), warmup_s=0.0, sampling_s=1.05)
    assert s.metrics["gpm_reliable"] is True and s.metrics["gpm_window_s"] >= 1.0  # type: ignore[operator]
    assert "quantised" not in s.note


def test_gpm_refuses_a_sampling_phase_under_100_ms() -> None:
    fake = FakeNvml()
    s = _gpm_session(fake, warmup_s=0.2, sampling_s=0.03)
    covers_every_metric(s)
    for name in (*GPM_METRICS, "gpm_window_s", "gpm_reliable"):
        assert mentions(s.unavailable[name], "GPM", values=(100,)), name  # 100 ms between its samples
    assert fake.calls["nvmlGpmMetricsGet"] == 0 and fake.gpm_live == []


def test_gpm_only_at_level_full() -> None:
    s = session(FakeNvml(), level="basic", seconds=0.05)
    covers_every_metric(s)
    assert all(s.unavailable[m].startswith("telemetry level basic") for m in GPM_METRICS)


def test_gpm_unsupported_before_hopper() -> None:
    fake = FakeNvml([FakeGpu(name="NVIDIA A100-SXM4-80GB", compute_capability=(8, 0))])
    s = session(fake, level="full", seconds=0.05)
    for m in GPM_METRICS:
        assert numbers(s.unavailable[m]) == [9.0, 8.0]  # the compute capability GPM needs, and this GPU's
    assert "gpu_util_pct" in s.metrics and fake.calls["nvmlGpmSampleGet"] == 0


def test_gpm_metric_busy_counters_are_reported_per_metric() -> None:
    fake = FakeNvml([FakeGpu(gpm_errors={fake_pynvml.GPM_TENSOR: 19})])  # NVML_ERROR_IN_USE
    s = session(fake, level="full", seconds=0.15)
    assert s.unavailable["gpm_tensor_util_pct"] == "NVMLError_InUse"
    assert s.metrics["gpm_sm_util_pct"] == 61.5


def test_one_metric_not_supported_degrades_only_that_metric() -> None:
    gpu = FakeGpu(not_supported={"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperature"}, unbuffered={POWER_SAMPLES})
    fake = FakeNvml([gpu])
    s = session(fake, seconds=0.25, interval_s=0.02)
    covers_every_metric(s)
    assert s.unavailable["power_w"] == "NVMLError_NotSupported"
    assert s.unavailable["temp_max_c"] == "NVMLError_NotSupported"
    assert "energy_j" in s.metrics and "gpu_util_pct" in s.metrics  # the counter does not need sampled power
    assert fake.calls["nvmlDeviceGetPowerUsage"] == 1  # polled (not buffered), dropped after the first failure


def test_energy_counter_not_supported_uses_power_and_says_so() -> None:
    fake = FakeNvml([FakeGpu(power_w=200.0, not_supported={"nvmlDeviceGetTotalEnergyConsumption"})])
    s = session(fake, seconds=0.15)
    assert s.metrics["energy_j"] == pytest.approx(200.0 * s.window_s, rel=1e-6)
    assert "power × time" in s.note and "NVMLError_NotSupported" in s.note


def test_throttled_session_reports_reasons() -> None:
    fake = FakeNvml([FakeGpu(sm_clock_mhz=1200.0, throttle_mask=0x004 | 0x020)])
    s = session(fake, seconds=0.1)
    assert s.metrics["throttled"] is True
    assert s.metrics["throttle_reasons"] == "SwPowerCap;SwThermalSlowdown"
    assert s.metrics["sm_clock_min_mhz"] == 1200.0


def test_old_driver_falls_back_to_throttle_reasons() -> None:
    fake = FakeNvml([FakeGpu(throttle_mask=0x040)])

    def no_symbol(handle: object) -> int:
        # An older driver exports no such symbol; pynvml raises this when it cannot find the function pointer.
        raise fake.NVMLError_FunctionNotFound()

    fake.nvmlDeviceGetCurrentClocksEventReasons = no_symbol  # type: ignore[method-assign]
    s = session(fake, seconds=0.05)
    assert s.metrics["throttle_reasons"] == "HwThermalSlowdown"
    assert fake.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] > 0


@pytest.mark.parametrize(("code", "name"), [(15, "NVMLError_GpuIsLost"), (9, "NVMLError_DriverNotLoaded")])
def test_driver_gone_mid_run_degrades_without_raising(code: int, name: str) -> None:
    fake = FakeNvml()
    ident = GpuIdentity("cuda:0", fake.gpus[0].uuid, None)
    tel = open_telemetry("cuda:0", "full", nvml=lambda: fake, identity=lambda d: ident)
    with tel:
        time.sleep(0.06)
        fake.lose_gpu(code)
        time.sleep(0.06)
    s = tel.summary(calls=1, tokens_per_call=1)
    covers_every_metric(s)
    assert set(s.unavailable) == set(NVML_METRICS)
    assert all(s.unavailable[m].startswith(f"driver gone mid-run: {name}") for m in NVML_METRICS)
    assert set(CPU_METRICS) <= set(s.metrics)


def test_nvml_init_failure_leaves_cpu_metrics() -> None:
    fake = FakeNvml(init_error=9)
    s = session(fake, seconds=0.05)
    covers_every_metric(s)
    assert s.source == "psutil"
    assert all(mentions(s.unavailable[m], "nvmlInit", "NVMLError_DriverNotLoaded") for m in NVML_METRICS)
    assert set(CPU_METRICS) <= set(s.metrics)


def test_pynvml_missing_makes_every_gpu_metric_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    ident = GpuIdentity("cuda:0", "GPU-00000000-0000-0000-0000-000000000001", None)
    tel = open_telemetry("cuda:0", identity=lambda d: ident)
    with tel:
        time.sleep(0.05)
    s = tel.summary(calls=1, tokens_per_call=1)
    covers_every_metric(s)
    assert all(mentions(s.unavailable[m], "pynvml", "nvidia-ml-py") for m in NVML_METRICS)  # the package to install
    assert set(CPU_METRICS) <= set(s.metrics)
    assert telemetry_status("cpu")["nvml"].startswith("unavailable: pynvml")


def test_fake_injected_through_sys_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    ident = GpuIdentity("cuda:0", fake.gpus[0].uuid, None)
    tel = open_telemetry("cuda:0", identity=lambda d: ident)
    with tel:
        time.sleep(0.05)
    assert tel.summary(calls=1, tokens_per_call=1).metrics["power_w"] == 300.0


def test_device_torch_cannot_identify_is_a_reason_not_a_crash() -> None:
    def no_cuda(device: str) -> GpuIdentity:
        raise TelemetryUnavailable(f"cannot query {device} through torch: Torch not compiled with CUDA enabled")

    tel = open_telemetry("cuda:1", nvml=FakeNvml, identity=no_cuda)
    with tel:
        pass
    s = tel.summary(calls=1, tokens_per_call=1)
    with pytest.raises(TelemetryUnavailable) as raised:
        no_cuda("cuda:1")
    assert s.unavailable["gpu_util_pct"].startswith(str(raised.value))  # the reason, passed on


def test_short_window_is_marked_unreliable() -> None:
    s = session(FakeNvml(), seconds=0.03)
    assert not s.reliable
    assert mentions(s.note.split("; "), "gpu_util_pct", values=(0.17,))  # under NVML's averaging period


def test_level_off_is_a_no_op() -> None:
    before = threading.active_count()
    tel = open_telemetry("cuda:0", "off", nvml=lambda: pytest.fail("NVML touched"))
    with tel:
        assert threading.active_count() == before
    s = tel.summary(calls=1, tokens_per_call=1)
    assert (s.source, s.level, s.samples, dict(s.metrics), dict(s.unavailable)) == ("off", "off", 0, {}, {})
    assert TelemetrySummary.from_dict(s.to_dict()) == s


def test_bad_arguments_and_misuse_raise() -> None:
    with pytest.raises(ValueError, match="cpu, cuda or cuda:N"):
        open_telemetry("tpu")
    with pytest.raises(ValueError, match="level"):
        open_telemetry("cpu", "max")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval_s"):
        open_telemetry("cpu", interval_s=0)
    tel = open_telemetry("cpu")
    with pytest.raises(RuntimeError, match="exited"):
        tel.summary(calls=1, tokens_per_call=1)

    with tel:
        pass
    with pytest.raises(RuntimeError, match="single-use"), tel:
        pass


def test_telemetry_status() -> None:
    fake = FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-00000000-0000-0000-0000-0000000000a1", compute_capability=(8, 6))])

    def ident(uuid: str) -> Any:
        return lambda d: GpuIdentity(d, uuid, None)

    assert telemetry_status("cuda:0", nvml=lambda: fake, identity=ident(fake.gpus[0].uuid)) == {
        "nvml": "available",
        "gpm": "available",
        "psutil": "available",
    }
    old = telemetry_status("cuda:0", nvml=lambda: fake, identity=ident(fake.gpus[1].uuid))
    assert old["gpm"].startswith("unsupported") and numbers(old["gpm"]) == [9.0, 8.6]
    assert telemetry_status("cpu", nvml=lambda: fake)["gpm"] == "unsupported: CPU run"
    broken = telemetry_status("cuda", nvml=lambda: FakeNvml(init_error=12), identity=ident(""))
    assert broken["nvml"].startswith("unavailable") and "NVMLError_LibraryNotFound" in broken["nvml"]
    assert fake.init_count == 0


# ---------------------------------------------------------------- the fake is faithful, the package is light


def test_fake_matches_real_pynvml() -> None:
    real = pytest.importorskip("pynvml")
    fake = FakeNvml()
    for name, value in fake_pynvml.CONSTANTS.items():
        assert getattr(real, name) == value, name
    for name, cls in fake_pynvml.ERROR_CLASSES.items():
        assert getattr(real, name).__mro__[1] is real.NVMLError, name
        assert real.NVMLError(cls().value).__class__.__name__ == name
    api = [n for n in dir(FakeNvml) if n.startswith("nvml")] + ["c_nvmlGpmMetricsGet_t"]
    for name in api:
        assert callable(getattr(real, name)), name
        assert callable(getattr(fake, name)), name
    assert isinstance(fake.NVMLError(3), fake.NVMLError_NotSupported)


def test_importing_telemetry_needs_no_torch_psutil_or_pynvml() -> None:
    code = "import attnbench.host.sensors, sys; print(sorted({'torch', 'pynvml', 'psutil'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_the_clock_nvml_stamps_samples_with_is_found_from_the_newest_one() -> None:
    from attnbench.host.sensors.buffers import clock_domain

    host = {"wall": 1_700_000_000_000_000, "boottime": 86_400_000_000, "monotonic": 86_399_000_000}
    assert clock_domain(1_700_000_000_500_000, host) == "wall"
    assert clock_domain(86_400_200_000, host) == "boottime"  # named first where boottime and monotonic agree
    assert clock_domain(86_399_000_000 - 20_000_000, {"monotonic": 86_399_000_000}) == ""  # too far: unknown
    assert clock_domain(5, {}) == ""
