"""The thread pool of a process that times CPU cases spins between parallel regions, unless the user said otherwise;
a process that only waits on its workers is left as it is; and the run records what its timing processes ran with."""

from __future__ import annotations

import os

import pytest

from attnbench.host.inventory import collect_environment
from attnbench.host.threads import TIMING_THREAD_ENV, timing_env
from attnbench.sweeps.isolated_executor import IsolatedExecutor
from attnbench.timing.executor import ExecutorSettings
from tests.support import quick_policy


@pytest.mark.parametrize(
    ("device", "threads", "environ", "expected"),
    [
        ("cpu", 2, {}, dict(TIMING_THREAD_ENV)),
        ("cpu", None, {"HOME": "/root"}, dict(TIMING_THREAD_ENV)),  # torch's default: one thread per core
        ("cpu", 1, {}, {}),  # one thread: no team to wait for
        ("cuda:0", 2, {}, {}),  # the host threads of a GPU case mostly wait on the device
        ("cpu", 2, {"OMP_WAIT_POLICY": "PASSIVE"}, {}),  # the user's own choice wins
        ("cpu", 2, {"GOMP_SPINCOUNT": "1000"}, {}),
    ],
)
def test_a_cpu_timing_process_spins_unless_the_user_set_the_pool(
    device: str, threads: int | None, environ: dict[str, str], expected: dict[str, str]
) -> None:
    assert timing_env(device, threads, environ) == expected


def test_an_isolated_cpu_worker_starts_with_it_and_the_run_records_it(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [k for k in os.environ if k.startswith(("OMP_", "GOMP_", "KMP_", "MKL_", "DNNL_", "ONEDNN_"))]:
        monkeypatch.delenv(name)
    settings = ExecutorSettings("cpu", quick_policy(), threads=2)
    worker = IsolatedExecutor(settings, {"EXTRA": "1"})
    assert worker.env == {**TIMING_THREAD_ENV, "EXTRA": "1"}
    assert IsolatedExecutor(ExecutorSettings("cpu", quick_policy(), threads=1)).env == {}
    recorded = collect_environment("cpu", timing_env("cpu", 2)).thread_env
    assert recorded.split() == [f"{k}={v}" for k, v in TIMING_THREAD_ENV.items()]
    assert collect_environment("cpu").thread_env == ""  # this process (the parent) set nothing for itself
