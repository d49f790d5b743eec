"""One isolated worker per device (measure.pool): every case once, one writer, failures as rows, stops that keep
what finished. Driven on CPU with `cpu,cpu` workers; CUDA is faked only where torch.cuda is asked about devices."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.errors import DeviceError
from attnbench.results.records import Result
from attnbench.results.store import load_run
from attnbench.sweeps.events import QuietListener
from attnbench.sweeps.pool import DevicesFailedError, WorkerPool, resolve_devices, worker_placement
from attnbench.sweeps.runner import SweepRequest, open_sweep
from attnbench.timing.executor import ExecutorSettings
from tests.support import mentions, quick_policy, tiny_case, tiny_config

# Roomy budget, loose target: these tests are about who writes which row, and on a loaded machine three samples
# must still fit in the budget (else a row is too_slow_for_budget, issue 17).
QUICK = quick_policy(min_samples=3, min_time_s=0.01, max_case_s=2.0, warmup_max_s=0.05, target_ci=0.5)
# Cannot end early (see tests/e2e/test_resilience.py): a worker killed a second in is killed mid-case.
SLOW = quick_policy(
    min_samples=3,
    min_time_s=1.5,  # the other cases run this long too: 3 s made the killed-worker test 9 s
    max_case_s=2.0,
    warmup_max_s=0.05,
    target_ci=1e-6,
    max_samples=10**7,
)


def settings(policy: TimingPolicy = QUICK) -> ExecutorSettings:
    return ExecutorSettings("cpu", policy, seed=0, threads=1, timeout_s=60)


def cases(n: int) -> list[Case]:
    return [tiny_case("lstm", batch=1, seq_len=8 * (i + 1)) for i in range(n)]


class Listener(QuietListener):
    """A SweepListener that notes which thread tells it what."""

    def __init__(self) -> None:
        self.finished_rows: list[Result] = []
        self.warnings: list[str] = []
        self.threads: set[int] = set()

    def started(self, index: int, case: Case) -> None:
        self.threads.add(threading.get_ident())

    def finished(self, index: int, result: Result) -> None:
        self.threads.add(threading.get_ident())
        self.finished_rows.append(result)

    def warning(self, text: str) -> None:
        self.warnings.append(text)


@pytest.mark.slow
def test_two_cpu_workers_write_every_case_once_from_one_writer(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config(models=["lstm", "gru", "sdpa-flash"], timing=dict(QUICK.to_dict())))
    listener = Listener()
    with open_sweep(SweepRequest(config, None, tmp_path / "out", devices="cpu,cpu")) as sweep:
        assert sweep.plan.devices == ("cpu", "cpu") and sweep.plan.isolate
        assert any("2 CPU workers share" in w for w in sweep.warnings)
        rows = sweep.run(listener)
        folder = sweep.folder
    stored = load_run(folder)
    keys = [r.case.key for r in stored.results]
    assert sorted(keys) == sorted(c.key for c in sweep.plan.cases) and len(set(keys)) == len(keys) == 6
    # ok; or, where 2 workers beside a test worker on 2 cores slowed a call past its budget, too_slow_for_budget
    assert stored.run.state == "complete" and {r.status for r in stored.results} <= {"ok", "too_slow_for_budget"}
    assert {r.case.device for r in stored.results} == {"cpu"}
    assert listener.threads == {threading.get_ident()}  # rows appended and shown from this thread only
    assert [r.case.key for r in listener.finished_rows] == [r.case.key for r in rows] == keys


@pytest.mark.slow
def test_a_killed_worker_mid_case_becomes_a_row_and_the_sweep_finishes() -> None:
    pool = WorkerPool(settings(SLOW), ["cpu", "cpu"])
    victim = pool.workers[0].isolated
    victim.start()  # ready before the sweep starts, so the kill lands inside its first case, not its start-up
    pid = victim.worker_pid
    assert pid is not None
    # The first case goes to the first idle worker, and takes at least 1.5 s: a second in, it is mid-case.
    killer = threading.Timer(1.0, os.kill, (pid, signal.SIGKILL))
    rows: list[Result] = []
    try:
        killer.start()
        pool.run(cases(3), lambda i, r: rows.append(r))
    finally:
        killer.join()
        pool.close()
    assert sorted(r.case.seq_len for r in rows) == [8, 16, 24]  # every case once, the killed one included
    crashed = [r for r in rows if r.status == "crashed"]
    assert len(crashed) == 1 and crashed[0].case.seq_len == 8
    assert mentions(crashed[0].reason, "SIGKILL", "OOM")  # the signal, and what usually sends it
    assert sum(r.ok for r in rows) == 2
    assert victim.workers_started == 2  # the device was not retired: its next case got a fresh worker
    assert not pool.retired


@pytest.mark.slow
def test_a_device_whose_worker_cannot_start_is_retired_and_the_others_go_on(monkeypatch: pytest.MonkeyPatch) -> None:
    # A GPU that is not there: CUDA_VISIBLE_DEVICES names no device, so CUDA cannot initialise in that worker.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "no-such-gpu")
    pool = WorkerPool(settings(), ["cuda:0", "cpu"])
    rows: list[Result] = []
    warnings: list[str] = []
    try:
        pool.run(cases(4), lambda i, r: rows.append(r), on_warning=warnings.append)
    finally:
        pool.close()
    assert sorted(r.case.seq_len for r in rows) == [8, 16, 24, 32]
    (lost,) = [r for r in rows if not r.ok]
    assert lost.status == "crashed" and lost.case.device == "cuda:0"
    assert mentions(lost.reason, "cuda:0", "CUDA_VISIBLE_DEVICES=no-such-gpu")  # the device retired, and why
    assert all(r.case.device == "cpu" for r in rows if r.ok)
    assert list(pool.retired) == ["cuda:0"] and "cuda:0 retired" in warnings[0] and "1 device(s) go on" in warnings[0]


@pytest.mark.slow
def test_when_every_device_is_retired_the_pool_stops_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "no-such-gpu")
    pool = WorkerPool(settings(), ["cuda:0"])
    rows: list[Result] = []
    try:
        with pytest.raises(DevicesFailedError) as caught:
            pool.run(cases(3), lambda i, r: rows.append(r))
    finally:
        pool.close()
    assert mentions(caught.value.message, "cuda:0", values=(2,))  # the device, and the 2 cases left
    assert [r.status for r in rows] == ["crashed"] and caught.value.exit_code == 1


@pytest.mark.slow
def test_an_interrupt_keeps_the_finished_rows_and_kills_every_worker() -> None:
    pool = WorkerPool(settings(SLOW), ["cpu", "cpu"])
    rows: list[Result] = []

    def stop_after_first(index: int, result: Result) -> None:
        rows.append(result)
        raise KeyboardInterrupt  # what the CLI's signal handler raises

    try:
        with pytest.raises(KeyboardInterrupt):
            pool.run(cases(3), stop_after_first)
        pids = [w.isolated.worker_pid for w in pool.workers]
    finally:
        pool.close(now=True)
    assert len(rows) >= 1 and rows[0].ok
    assert all(w.thread is not None and not w.thread.is_alive() for w in pool.workers)
    for pid in pids:
        assert pid is None or not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


@pytest.mark.slow
def test_replicates_of_a_case_stay_on_one_device() -> None:
    pool = WorkerPool(settings(TimingPolicy(**{**QUICK.to_dict(), "processes": 2})), ["cpu", "cpu"])  # type: ignore[arg-type]
    rows: list[Result] = []
    try:
        pool.run(cases(2), lambda i, r: rows.append(r))
    finally:
        pool.close()
    assert all(r.ok and r.measurement is not None and len(r.measurement.replicate_medians_s) == 2 for r in rows)
    # Each worker ran its cases' replicates in fresh processes of its own: two cases, two replicates each.
    assert sum(w.isolated.workers_started for w in pool.workers) == 4


# ------------------------------------------------------------------------------------------- which devices


@pytest.fixture
def two_gpus(monkeypatch: pytest.MonkeyPatch) -> dict[int, SimpleNamespace]:
    """torch.cuda as a machine with two GPUs shows it (only what device resolution asks)."""
    props = {
        0: SimpleNamespace(name="NVIDIA H100", total_memory=80 * 2**30, major=9, minor=0),
        1: SimpleNamespace(name="NVIDIA H100", total_memory=80 * 2**30, major=9, minor=0),
    }
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(props))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props[i])
    return props


def test_all_means_every_visible_gpu(two_gpus: dict[int, SimpleNamespace]) -> None:
    assert resolve_devices("all").devices == ("cuda:0", "cuda:1")
    assert resolve_devices("cuda:1, cuda:0").devices == ("cuda:1", "cuda:0")


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("cpu,cuda:0", "mixes cpu and cuda"),
        ("cuda:0,cuda:0", "cuda:0 named twice"),
        ("cuda:0,cuda:7", "'cuda:7' does not exist: 2 CUDA device(s) visible"),
        ("cuda", "'cuda' is not a device a worker can be pinned to"),
        ("auto", "'auto' is not a device"),
        ("tpu:0", "'tpu:0' is not a device"),
        ("cuda:0,", "an empty device name"),
    ],
)
def test_bad_device_lists_are_refused(two_gpus: dict[int, SimpleNamespace], text: str, problem: str) -> None:
    with pytest.raises(DeviceError) as caught:
        resolve_devices(text)
    assert problem in caught.value.message and caught.value.hint


def test_gpus_of_different_models_need_allow_mixed_devices(two_gpus: dict[int, SimpleNamespace]) -> None:
    two_gpus[1] = SimpleNamespace(name="NVIDIA A100", total_memory=40 * 2**30, major=8, minor=0)
    with pytest.raises(DeviceError, match="the GPUs differ") as caught:
        resolve_devices("all")
    assert "--allow-mixed-devices" in caught.value.hint
    mixed = resolve_devices("all", allow_mixed=True)
    assert mixed.devices == ("cuda:0", "cuda:1") and "NVIDIA A100" in mixed.warnings[0]


def test_without_cuda_all_is_refused_with_a_hint() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(DeviceError) as caught:
        resolve_devices("all")
    assert mentions(caught.value.message, "--devices", "all")

    assert "cpu,cpu" in caught.value.hint


def test_a_worker_sees_its_gpu_as_cuda_0(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert worker_placement("cuda:3") == ("cuda:0", {"CUDA_VISIBLE_DEVICES": "3"})
    assert worker_placement("cpu") == ("cpu", {})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4, GPU-abc")  # the parent's own view: its cuda:1 is GPU-abc
    assert worker_placement("cuda:1") == ("cuda:0", {"CUDA_VISIBLE_DEVICES": "GPU-abc"})
    with pytest.raises(DeviceError, match="lists only 2 device"):
        worker_placement("cuda:2")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_pool_of_every_gpu_pins_one_worker_to_each() -> None:
    devices = resolve_devices("all").devices
    pool = WorkerPool(ExecutorSettings("cuda:0", QUICK, seed=0, timeout_s=120), devices)
    rows: list[Result] = []
    try:
        pool.run(
            [tiny_case("sdpa", device="cuda:0", seq_len=64 * (i + 1)) for i in range(2 * len(devices))],
            lambda i, r: rows.append(r),
        )
    finally:
        pool.close()
    assert all(r.ok for r in rows), [r.reason for r in rows]
    assert {r.case.device for r in rows} <= set(devices) and not pool.retired
