"""The worker process's side of the pipe: what it sets before torch loads, a dead CUDA context, a hung profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbench.core.cases import TimingPolicy
from attnbench.sweeps import isolated_executor as isolation
from attnbench.sweeps.isolated_executor import IsolatedExecutor
from attnbench.timing.executor import ExecutorSettings
from tests.measure import worker_standins
from tests.support import QUICK_TIMING, mentions, tiny_case

pytestmark = pytest.mark.slow  # real sweeps and worker processes throughout: not in the fast tier

QUICK = TimingPolicy(**QUICK_TIMING)  # type: ignore[arg-type]


def test_the_worker_asks_for_cupti_teardown_before_torch_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = tmp_path / "teardown"
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    monkeypatch.setenv(worker_standins.ENV_RECORD, str(record))
    executor = IsolatedExecutor(
        ExecutorSettings("cpu", QUICK, threads=1, timeout_s=60, telemetry="off"),
        worker_main=worker_standins.recording_import_env,
    )
    try:
        executor.start()
    finally:
        executor.close()
    assert record.read_text() == "1"  # kineto reads it (exactly "1") when a profile starts and stops


def test_a_sticky_cuda_error_keeps_its_reason_and_retires_the_worker() -> None:
    executor = IsolatedExecutor(
        ExecutorSettings("cuda:0", QUICK, threads=1, timeout_s=60, telemetry="off"),
        worker_main=worker_standins.sticky_cuda,
    )
    try:
        first = executor.run(tiny_case(device="cuda:0"))
        # The fault's own report, not "the worker exited with code 1" after empty_cache raised it again.
        assert first.status == "error", first.reason
        assert first.reason == f"RuntimeError: {worker_standins.STICKY}"
        assert executor.worker_pid is None  # retired at once
        second = executor.run(tiny_case(device="cuda:0", seq_len=8))
        assert second.status == "error" and worker_standins.STICKY in second.reason
        assert executor.workers_started == 2  # the next case got a fresh worker
    finally:
        executor.close()


def test_a_profile_that_hangs_costs_the_row_its_kernel_counts_not_its_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "PROFILE_BUDGET_S", 1.0)
    executor = IsolatedExecutor(
        ExecutorSettings("cpu", QUICK, threads=1, timeout_s=60, telemetry="off"),
        worker_main=worker_standins.hung_profile,
    )
    try:
        result = executor.run(tiny_case())
        assert result.ok and result.measurement is not None and result.median_s > 0
        assert mentions(str(result.extra["profile_error"]), values=(1,))  # not finished 1 s after the timing

        assert executor.worker_pid is None
    finally:
        executor.close()


def test_the_real_worker_sends_the_timed_row_then_the_final_one() -> None:
    executor = IsolatedExecutor(ExecutorSettings("cpu", QUICK, threads=1, timeout_s=60, telemetry="off"))
    try:
        ok = executor.run(tiny_case())
        unsupported = executor.run(tiny_case("sdpa-efficient"))  # no timed row: only the final one comes
        again = executor.run(tiny_case(seq_len=8))
        assert ok.ok and unsupported.status == "unsupported" and again.ok
        assert executor.workers_started == 1  # nothing retired it
    finally:
        executor.close()
