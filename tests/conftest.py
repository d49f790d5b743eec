from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    # Imported where used: scripts/gpu_check.sh and a test copy this conftest into suites without tests/fakes.py.
    from tests.fakes import FakeExecutors

# Rich decides width and colour from the terminal; pin both so CLI output can be asserted.
os.environ["COLUMNS"] = "160"
os.environ["NO_COLOR"] = "1"
os.environ.setdefault("TERM", "dumb")
# Sweeps, merges and submissions in tests draw no plots (their own switch, ATTNBENCH_PLOTS): drawing was an eighth
# of the suite's time. The tests of plots turn them back on (--plots, or monkeypatch.delenv).
os.environ["ATTNBENCH_PLOTS"] = "0"
# Live sweeps in tests must never pick up (or write) the developer's real calibration cache.
os.environ["ATTNBENCH_CACHE"] = tempfile.mkdtemp(prefix="attnbench-test-cache-")


# The last-level cache the in-process tests' cold samples flush (``timing.clocks.cpu_flusher``), a hardware fact
# faked as NVML is: this VM reports its host's 480 MiB L3, so every cold case allocated 960 MB and every cold sample
# wrote it (~0.1 s), a large share of the suite. 32 MiB is an ordinary server L3, and larger than any state the
# tests decode. Sweeps in subprocesses and tests/measure/test_caches.py (which reads sysfs itself) see the real one.
FAKE_LLC_BYTES = 32 * 2**20


def pytest_configure(config: pytest.Config) -> None:
    if not os.environ.get("ATTNBENCH_TEST_REAL_LLC"):
        from attnbench.timing import clocks

        clocks.last_level_cache_bytes = lambda *args, **kwargs: FAKE_LLC_BYTES  # type: ignore[assignment]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        # Two xdist workers on two cores, each with torch's default of a thread per core: every tiny op's OpenMP
        # team waited on a core the other worker held (test_kept_states' decodes took 3x as long). A sweep sets
        # its own threads from its config (subprocesses inherit nothing from this), so only in-process tests
        # see this; the serial pass, which compares timings, runs outside xdist and keeps torch's default.
        import torch

        torch.set_num_threads(1)
    # Declared here, not in pyproject, so a suite that copies this conftest (tests/e2e/test_gpu_check.py) knows it.
    config.addinivalue_line(
        "markers",
        "compiles(limit_s): compiles with inductor or Triton on a possibly cold cache: runs last in a time-limited "
        "run, under limit_s instead of ATTNBENCH_TEST_TIMEOUT_S",
    )


def pytest_ignore_collect(collection_path: Any, config: pytest.Config) -> bool | None:
    """README's serial pass (``-m serial``) runs two tests: importing all ~120 test modules to deselect the rest
    took it 15-20 s. There, a module that never names the marker is not collected at all."""
    if config.getoption("markexpr", "") != "serial" or collection_path.suffix != ".py":
        return None
    if not collection_path.name.startswith("test_"):
        return None
    return "mark.serial" not in collection_path.read_text(encoding="utf-8", errors="replace")


def compile_heavy(item: Any) -> bool:
    """Whether ``item`` compiles with inductor or Triton on a possibly cold cache: FlexAttention's tests (compiling
    once per length, dynamic=False) and those marked ``compiles``."""
    return "flex" in item.nodeid or item.get_closest_marker("compiles") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[Any]) -> None:
    """The compile-heavy tests last, so a time-limited run reaches every other test before them; with
    ATTNBENCH_COMPILE_HEAVY=none only the others, =only only them (scripts/gpu_check.sh gives each a step)."""
    items.sort(key=compile_heavy)  # stable: the rest keep their order
    which = os.environ.get("ATTNBENCH_COMPILE_HEAVY", "")
    if which in ("none", "only"):
        keep = [item for item in items if compile_heavy(item) == (which == "only")]
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


def time_limit_s(item: Any) -> float:
    """A test's limit in a time-limited run: its ``compiles`` marker's ``limit_s`` (a cold inductor or Triton cache
    compiles for tens of seconds mid-run), else ATTNBENCH_TEST_TIMEOUT_S; 0 (no limit) when that is unset."""
    limit = float(os.environ.get("ATTNBENCH_TEST_TIMEOUT_S", "0") or 0)
    marker = item.get_closest_marker("compiles")
    if limit > 0 and marker is not None:
        return float(marker.kwargs.get("limit_s", marker.args[0] if marker.args else limit))
    return limit


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any) -> Iterator[None]:
    """With ATTNBENCH_TEST_TIMEOUT_S set, a test that runs longer than its limit (``time_limit_s``) fails with that
    reason instead of eating a time-limited run's whole budget (scripts/gpu_check.sh sets it; pytest-timeout is not
    on the GPU machine)."""
    limit = time_limit_s(item)
    if limit <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: object) -> None:
        raise TimeoutError(f"{item.nodeid} ran past its limit of {limit:g} s (ATTNBENCH_TEST_TIMEOUT_S, compiles)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def _torch_threads_handed_back() -> Iterator[None]:
    """An in-process executor given ``threads`` sets torch's count for the whole process: hand it back after each
    test, so that no test finds the count an earlier one left (and a test that checks the hand-back still sees the
    process's own). Looks only at a torch already imported: a torch-free test stays torch-free."""
    torch = sys.modules.get("torch")
    before = torch.get_num_threads() if torch is not None else None
    yield
    torch = sys.modules.get("torch")
    if torch is not None and before is not None and torch.get_num_threads() != before:
        torch.set_num_threads(before)


@pytest.fixture
def fake_executors(monkeypatch: pytest.MonkeyPatch) -> FakeExecutors:
    """Sweeps started in this test (the CLI's included) measure nothing: ``measure.sweep.make_executor``, the seam
    that picks a sweep's executor, builds ``FakeExecutor``s instead. Script outcomes through the value returned."""
    import attnbench.sweeps.runner as sweep
    from tests.fakes import FakeExecutors

    factory = FakeExecutors()
    monkeypatch.setattr(sweep, "make_executor", factory)
    return factory


# The fast tier (README "Development": -m "not slow") stays fast only while a slow test is marked as one.
FAST_TIER_TEST_S = 1.0


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """In a run that leaves the slow tests out, name the tests that took over ``FAST_TIER_TEST_S`` anyway: they
    belong in the slow tier (@pytest.mark.slow), or the fast tier creeps past its 90 s."""
    if "not slow" not in (config.getoption("markexpr") or ""):
        return
    reports = [r for kind in ("passed", "failed") for r in terminalreporter.stats.get(kind, [])]
    slow = sorted(
        {(r.nodeid, r.duration) for r in reports if getattr(r, "when", "") == "call" and r.duration > FAST_TIER_TEST_S},
        key=lambda pair: -pair[1],
    )
    if slow:
        terminalreporter.write_sep("-", f"{len(slow)} tests of the fast tier took over {FAST_TIER_TEST_S:g} s")
        for nodeid, duration in slow:
            terminalreporter.write_line(f"{duration:6.2f}s {nodeid}  (mark it @pytest.mark.slow)")
