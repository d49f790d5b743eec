"""The CPU memory method against allocations of known size, and the issue's n×n test on real models."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from attnbench.core.cases import Case
from attnbench.core.units import MIB
from attnbench.host.memory import RssPeak
from tests.support import ROOT, quick_policy

pytestmark = pytest.mark.skipif(not RssPeak.probe().available, reason=RssPeak.probe().reason or "no procfs")


def peaks_in_a_fresh_process(*mibs: int) -> list[int]:
    """Allocate and free float32 tensors of these sizes one after the other in a fresh Python, each between
    ``start()`` and ``peak_bytes()``, and return the peaks. Fresh, as a sweep's worker is: in a process that has
    run hundreds of tests, glibc's dynamic mmap threshold and heap state differ from any worker's."""
    code = (
        "import sys, torch\n"
        "from attnbench.host.memory import RssPeak\n"
        "meter = RssPeak()\n"
        "for mib in map(int, sys.argv[1:]):\n"
        "    meter.start()\n"
        "    x = torch.ones(mib * 2**20 // 4)  # float32: touched pages, so resident\n"
        "    del x\n"
        "    print(meter.peak_bytes())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, *map(str, mibs)], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    return [int(line) for line in out.stdout.split()]


@pytest.mark.slow
def test_rss_peak_sees_tensors_of_known_size_and_resets_between_measurements() -> None:
    # One fresh process for all (each costs a torch import): every size is a fresh allocation, since each freed
    # tensor went back to the OS. The last, small one after the biggest is the reset: its reading is itself alone.
    sizes = [8, 64, 256, 8]
    peaks = peaks_in_a_fresh_process(*sizes)
    assert len(peaks) == len(sizes)
    for mib, peak in zip(sizes, peaks, strict=True):
        assert peak == pytest.approx(mib * MIB, rel=0.05, abs=2 * MIB), (mib, peaks)


@pytest.mark.slow
def test_vanilla_materialises_scores_and_flash_does_not() -> None:
    """At n=1024, vanilla's peak exceeds one n×n score matrix per head×batch; sdpa-flash stays well below."""
    from attnbench.timing.executor import ExecutorSettings
    from attnbench.timing.torch_executor import TorchExecutor

    batch, heads, n = 2, 4, 1024
    scores_bytes = batch * heads * n * n * 4  # float32
    # A roomy budget and a loose target: the test reads the memory pass, and on a loaded machine three samples of
    # vanilla at n=1024 must still fit (else the row is too_slow_for_budget, issue 17).
    policy = quick_policy(min_samples=3, max_case_s=5.0, min_time_s=0.0, warmup_max_s=0.1, target_ci=0.5)
    executor = TorchExecutor(ExecutorSettings("cpu", policy, threads=1))
    peaks = {}
    for model in ("vanilla", "sdpa-flash"):
        case = Case(model, "forward", "float32", "cpu", batch, n, 64, heads, 1, False)
        result = executor.run(case)
        assert result.ok, result.reason
        assert result.memory is not None and result.memory.method == "rss-hwm"
        peaks[model] = result.memory.peak_bytes
    assert peaks["vanilla"] > scores_bytes
    assert peaks["sdpa-flash"] < scores_bytes / 4


def test_resident_pages_count_the_pages_a_tensor_touches() -> None:
    import torch

    from attnbench.host.memory import ResidentPages

    pages = ResidentPages()
    if not pages.available:
        pytest.skip("no mincore here")
    touched = torch.ones(2 * MIB // 4)  # 2 MiB, every page written
    storage = touched.untyped_storage()
    span = (storage.data_ptr(), storage.nbytes())
    assert 2 * MIB <= pages.bytes_of([span]) <= 2 * MIB + 2 * pages.page  # its pages, the ends maybe shared
    assert pages.bytes_of([span, span]) == pages.bytes_of([span])  # a page counts once
    untouched = torch.empty(64 * MIB // 4)  # mmapped and never written: nothing resident yet
    blank = untouched.untyped_storage()
    assert pages.bytes_of([(blank.data_ptr(), blank.nbytes())]) <= 2 * pages.page
    small = torch.zeros(8)  # 32 bytes: the page it sits in
    assert pages.bytes_of([(small.untyped_storage().data_ptr(), 32)]) == pages.page
