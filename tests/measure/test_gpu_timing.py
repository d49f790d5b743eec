"""GPU timing aids: the arithmetic here everywhere, the CUDA paths (flush, graph replay, profile) on a GPU."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.cases import Case, TimingPolicy
from attnbench.results.store import load_run
from attnbench.timing.gpu_timing import (
    PROFILE_MAX_CALL_S,
    DeviceEvent,
    busy_time,
    device_work,
    flush_bytes,
    launch_bound,
    profile_kernels,
    profile_refusal,
)
from tests.support import numbers

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_busy_time_is_the_union_of_intervals() -> None:
    assert busy_time([]) == 0.0
    assert busy_time([(0.0, 1.0), (2.0, 3.0)]) == pytest.approx(2.0)
    assert busy_time([(0.0, 2.0), (1.0, 3.0)]) == pytest.approx(3.0)  # overlap counts once
    assert busy_time([(0.0, 5.0), (1.0, 2.0)]) == pytest.approx(5.0)  # nested
    assert busy_time([(2.0, 3.0), (0.0, 1.0), (0.5, 2.5)]) == pytest.approx(3.0)  # unsorted


def test_launch_bound_cut_is_115_percent_of_busy_time() -> None:
    assert launch_bound(1.16e-3, 1e-3) is True
    assert launch_bound(1.14e-3, 1e-3) is False
    assert launch_bound(1e-3, 0.0) is None  # the profile saw no device work: unknown, not "no"


# ---------------------------------------------------------------- cold cache (issue 12, item 6)


def test_the_cold_flush_writes_four_times_the_l2_and_at_least_256_mib() -> None:
    mib = 2**20
    assert flush_bytes(60 * mib) == 256 * mib  # H200, 60 MiB L2: 4 × 60 = 240 MiB < 256 MiB
    assert flush_bytes(96 * mib) == 384 * mib  # B200-sized L2: 4×
    assert flush_bytes(6 * mib) == 256 * mib  # a small L2 still gets triton's 256 MiB
    assert flush_bytes(0) == 256 * mib


@pytest.fixture
def cuda_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """torch.cuda's events, synchronise and device context, recording the order of what a clock does."""
    calls: list[str] = []

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = 0.0

        def record(self) -> None:
            calls.append("record")
            self.at = float(len(calls))

        def elapsed_time(self, end: Event) -> float:
            return (end.at - self.at) * 1e3

    @contextlib.contextmanager
    def device(_: object) -> Iterator[None]:
        yield

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: calls.append("synchronize"))
    monkeypatch.setattr(torch.cuda, "device", device)
    return calls


def test_a_cold_sample_queues_its_flush_before_the_start_event_with_no_host_wait(cuda_calls: list[str]) -> None:
    from attnbench.timing.clocks import CudaClock

    clock = CudaClock(torch.device("cuda:0"), flush=lambda: cuda_calls.append("flush"))
    clock.time(lambda: cuda_calls.append("call"), 1, 2)
    # As triton's do_bench: the start event fires when the flush ends, the call already queued behind it. A
    # synchronise between them (issue 48, item 5) left the GPU idle, and every cold sample held the host's launch.
    assert cuda_calls == ["synchronize"] + ["flush", "record", "call", "record"] * 2 + ["synchronize"]
    cuda_calls.clear()
    CudaClock(torch.device("cuda:0")).time(lambda: cuda_calls.append("call"), 2, 2)  # warm: no flush, no waits
    sample = ["record", "call", "call", "record"]
    assert cuda_calls == ["synchronize", *sample, *sample, "synchronize"]


def test_serving_calls_are_timed_in_one_block_their_preparation_queued_before_each_start(
    cuda_calls: list[str],
) -> None:
    """A serving call (prefill, verify, capacity's step) is put back before each timed call: that preparation and
    the cold flush are queued before the call's start event, and the block synchronises once, not once per call."""
    from attnbench.timing.clocks import CudaClock
    from attnbench.timing.serving import PreparedClock

    clock = PreparedClock(
        CudaClock(torch.device("cuda:0"), flush=lambda: cuda_calls.append("flush")),
        lambda: cuda_calls.append("prepare"),
    )
    per_sample = clock.time(lambda: cuda_calls.append("call"), 2, 2)
    one = ["prepare", "flush", "record", "call", "record"]
    assert cuda_calls == ["synchronize", *one * 4, "synchronize"]
    assert len(per_sample) == 2 and all(t > 0 for t in per_sample)


def test_the_flush_zeroes_or_only_reads_its_buffer_as_timing_flush_says() -> None:
    """The flush itself is device-agnostic torch: here on CPU tensors; which one runs is the policy's setting."""
    from attnbench.timing.gpu_timing import DeviceFlush

    zero = DeviceFlush(4096, torch.device("cpu"), "zero")
    zero.buffer.fill_(3)
    zero()
    assert int(zero.buffer.abs().sum()) == 0  # overwritten: every line dirtied
    read = DeviceFlush(4096, torch.device("cpu"), "read")
    read.buffer.fill_(3)
    read()
    assert int(read.buffer.min()) == int(read.buffer.max()) == 3  # nothing written
    assert int(read._sink) == 3 * 1024  # and every element was read into the one scalar it writes
    assert TimingPolicy().flush == "zero" and TimingPolicy.from_dict({}).flush == "zero"  # old runs zeroed
    assert "flush" not in TimingPolicy().to_dict()  # so a run from before reads back unchanged
    assert TimingPolicy.from_dict(TimingPolicy(flush="read").to_dict()).flush == "read"


def test_timing_flush_reaches_the_executor_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnbench.timing.torch_executor as executor_module
    from attnbench.timing.torch_executor import TorchExecutor

    made: list[tuple[str, str]] = []
    monkeypatch.setattr(
        executor_module, "l2_flusher", lambda device, kind: made.append((device.type, kind)) or (lambda: None)
    )
    # Only what _clock reads: building a whole executor (its process warm-up probes) is not what is tested.
    ex = object.__new__(TorchExecutor)
    ex.device, ex.policy, ex._clocks = torch.device("cuda", 0), replace(TimingPolicy(), flush="read"), {}
    ex._clock("cold")
    assert made == [("cuda", "read")]


@pytest.mark.gpu
@CUDA
def test_on_a_gpu_a_cold_block_synchronises_twice_and_the_read_flush_writes_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attnbench.timing.clocks import CudaClock
    from attnbench.timing.gpu_timing import l2_flusher

    device = torch.device("cuda", 0)
    flush = l2_flusher(device, "read")
    flush.buffer.fill_(7)
    flushes, syncs = [], []
    real_sync = torch.cuda.synchronize
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: syncs.append(1) or real_sync(*a))
    x = torch.randn(256, 256, device=device)
    samples = CudaClock(device, flush=lambda: flushes.append(1) or flush()).time(lambda: x @ x, 1, 5)
    assert len(flushes) == 5 and len(syncs) == 2 and all(t > 0 for t in samples)
    assert int(flush.buffer.min()) == int(flush.buffer.max()) == 7


# ---------------------------------------------------------------- the profiled call (issue 12, item 7)


def event(activity: str | None, start_us: float, end_us: float, on_device: bool = True) -> DeviceEvent:
    return DeviceEvent(activity, on_device, activity == "gpu_user_annotation", int(start_us * 1e3), int(end_us * 1e3))


def test_only_kernels_copies_and_memsets_count_as_the_calls_device_work() -> None:
    events = [
        event("kernel", 0, 10),
        event("kernel", 5, 20),  # overlaps: counted once in the busy time
        event("gpu_memcpy", 30, 35),
        event("gpu_memset", 40, 41),
        event("gpu_user_annotation", 0, 100),  # a record_function span on the device: not work
        event("cuda_sync", 50, 90),  # a synchronisation span: not work
        event("cuda_runtime", 0, 3, on_device=False),  # the host's launch calls
    ]
    profile = device_work(events)
    assert profile.kernels == 4
    assert profile.busy_s == pytest.approx(26e-6)
    # Older torch without activity types: what is on the device and not an annotation.
    old = [event(None, 0, 10), DeviceEvent(None, True, True, 0, 100_000), event(None, 0, 1, on_device=False)]
    assert device_work(old).kernels == 1


def test_long_calls_are_not_profiled_and_say_why() -> None:
    assert profile_refusal(PROFILE_MAX_CALL_S) is None
    why = profile_refusal(2.0)
    assert why is not None and numbers(why)[0] == 2  # the call's time, against the limit


def test_the_profile_asks_for_cuda_activity_only_with_cupti_teardown(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    seen: dict[str, Any] = {}

    class Record:
        def __init__(self, kind: str) -> None:
            self.kind = kind

        def activity_type(self) -> str:
            return self.kind

        def device_type(self) -> Any:
            return DeviceType.CUDA

        def is_user_annotation(self) -> bool:
            return False

        def start_ns(self) -> int:
            return 0

        def end_ns(self) -> int:
            return 1000

    @contextlib.contextmanager
    def profile(activities: list[Any]) -> Iterator[Any]:
        seen["activities"] = activities
        seen["teardown"] = torch_env()
        results = SimpleNamespace(events=lambda: [Record("kernel"), Record("cuda_runtime")])
        yield SimpleNamespace(profiler=SimpleNamespace(kineto_results=results))

    def torch_env() -> str | None:
        import os

        return os.environ.get("TEARDOWN_CUPTI")

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    monkeypatch.setattr("torch.profiler.profile", profile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    kernels = profile_kernels(lambda: None, torch.device("cuda:0"))
    assert seen == {"activities": [ProfilerActivity.CUDA], "teardown": "1"}
    assert kernels.kernels == 1


def test_an_executor_in_this_process_asks_for_cupti_teardown(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    from attnbench.timing.executor import ExecutorSettings
    from attnbench.timing.torch_executor import TorchExecutor

    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    TorchExecutor(ExecutorSettings("cpu", telemetry="off"))
    assert os.environ["TEARDOWN_CUPTI"] == "1"
    monkeypatch.setenv("TEARDOWN_CUPTI", "0")  # the user's own choice stands
    TorchExecutor(ExecutorSettings("cpu", telemetry="off"))
    assert os.environ["TEARDOWN_CUPTI"] == "0"


def test_cuda_graph_is_refused_on_cpu(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("name: c\ndevice: cpu\nmodels: [lstm]\ngrid: {batch: [1], seq_len: [8]}\nd_model: 16\n")
    setting = "timing.cuda_graph=true"
    result = CliRunner().invoke(app, ["sweep", str(config), "--set", setting, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert "timing.cuda_graph applies to CUDA" in result.output and "hint:" in result.output


@pytest.mark.gpu
@CUDA
class TestOnCuda:
    CASE = Case("vanilla", "forward", "bfloat16", "cuda", 2, 256, 256, 4, 1, False)

    def _run(self, case: Case, **policy: object):  # type: ignore[no-untyped-def]
        from attnbench.timing.executor import ExecutorSettings
        from attnbench.timing.torch_executor import TorchExecutor

        timing = replace(TimingPolicy(max_case_s=1.0, min_time_s=0.05), **policy)  # type: ignore[arg-type]
        return TorchExecutor(ExecutorSettings("cuda", timing, telemetry="off")).run(case)

    def test_profile_counts_kernels_and_classifies_launch_bound(self) -> None:
        result = self._run(self.CASE)
        assert result.ok, result.reason
        assert isinstance(result.extra.get("kernels_per_call"), int) and result.extra["kernels_per_call"] > 0
        assert 0 < float(result.extra["kernel_busy_s"]) < 1  # type: ignore[arg-type]
        assert isinstance(result.extra["launch_bound"], bool)
        # A tiny call at batch 1 is all launch overhead on any modern GPU.
        tiny = self._run(replace(self.CASE, batch=1, seq_len=8, d_model=64, heads=2))
        assert tiny.ok and tiny.extra["launch_bound"] is True

    def test_cold_cache_is_not_faster_than_warm(self) -> None:
        warm = self._run(self.CASE)
        cold = self._run(self.CASE, cache="cold")
        assert warm.ok and cold.ok and warm.measurement and cold.measurement
        assert cold.measurement.calls_per_sample == 1
        assert cold.measurement.median_s > 0.9 * warm.measurement.median_s

    def test_cuda_graph_replays_forward_and_refuses_train(self) -> None:
        graph = self._run(self.CASE, cuda_graph=True)
        assert graph.ok and graph.extra["cuda_graph"] is True
        train = self._run(replace(self.CASE, mode="train"), cuda_graph=True)
        assert train.status == "unsupported" and "forward passes only" in train.reason

    def test_sweep_rows_keep_the_profile(self, tmp_path: Path) -> None:
        config = tmp_path / "g.yaml"
        config.write_text(
            "name: g\ndevice: cuda\nmodels: [lstm, sdpa]\nmodes: [forward]\ndtype: [bfloat16]\n"
            "grid: {batch: [1], seq_len: [64]}\nd_model: 128\nheads: 2\ntiming: {max_case_s: 1}\n"
        )
        result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(tmp_path / "o"), "-q"])
        assert result.exit_code == 0, result.output
        (folder,) = (tmp_path / "o").iterdir()
        for row in load_run(folder).results:
            assert row.ok and "kernels_per_call" in row.extra, row.extra
