"""The CPU memory method against allocations of known size, and the issue's n×n test on real models."""

from __future__ import annotations

import pytest
import torch

from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.units import MIB
from attnbench.measure.memory import RssPeak

pytestmark = pytest.mark.skipif(not RssPeak.probe().available, reason=RssPeak.probe().reason or "no procfs")


@pytest.mark.parametrize("mib", [8, 64, 256])
def test_rss_peak_sees_a_tensor_of_known_size(mib: int) -> None:
    meter = RssPeak()
    meter.start()
    x = torch.ones(mib * MIB // 4)  # float32: touched pages, so resident
    del x
    assert meter.peak_bytes() == pytest.approx(mib * MIB, rel=0.05, abs=2 * MIB)


def test_rss_peak_resets_between_measurements() -> None:
    meter = RssPeak()
    meter.start()
    big = torch.ones(128 * MIB // 4)
    del big
    meter.start()
    small = torch.ones(8 * MIB // 4)
    del small
    # Freed pages went back to the OS, so the second reading is the small tensor alone.
    assert meter.peak_bytes() == pytest.approx(8 * MIB, rel=0.05, abs=2 * MIB)


def test_vanilla_materialises_scores_and_flash_does_not() -> None:
    """At n=1024, vanilla's peak exceeds one n×n score matrix per head×batch; sdpa-flash stays well below."""
    from attnbench.measure.executor import ExecutorSettings
    from attnbench.measure.torch_executor import TorchExecutor

    batch, heads, n = 2, 4, 1024
    scores_bytes = batch * heads * n * n * 4  # float32
    policy = TimingPolicy(min_samples=3, max_case_s=0.5, min_time_s=0.0, warmup_max_s=0.1)
    executor = TorchExecutor(ExecutorSettings("cpu", policy))
    peaks = {}
    for model in ("vanilla", "sdpa-flash"):
        case = Case(model, "forward", "float32", "cpu", batch, n, 64, heads, 1, False)
        result = executor.run(case)
        assert result.ok, result.reason
        assert result.memory is not None and result.memory.method == "rss-hwm"
        peaks[model] = result.memory.peak_bytes
    assert peaks["vanilla"] > scores_bytes
    assert peaks["sdpa-flash"] < scores_bytes / 4
