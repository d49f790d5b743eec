"""The stopping rule and warm-up on a seeded fake clock: exact, fast, no wall-clock flakiness."""

from __future__ import annotations

import pytest

from attnbench.cases import TimingPolicy
from attnbench.timing import measure
from tests.fakes import FakeClock, gaussian


def noop() -> None:
    return None


def test_quiet_workload_converges_to_target() -> None:
    clock = FakeClock(gaussian(1e-3, 0.02), seed=1)
    policy = TimingPolicy(target_ci=0.01, min_samples=10, min_time_s=0.05, max_case_s=10.0)
    m = measure(noop, clock, policy)
    assert m.converged and m.stop_reason == "converged"
    assert m.summary.ci_halfwidth_rel <= 0.01
    assert m.median_s == pytest.approx(1e-3, rel=0.01)
    assert len(m.samples_s) >= 10
    assert not any(w.startswith("not converged") for w in m.warnings)


def test_noisy_workload_hits_budget_and_says_so() -> None:
    clock = FakeClock(gaussian(1e-2, 0.5), seed=2)
    policy = TimingPolicy(target_ci=0.001, min_samples=10, max_case_s=0.5)
    m = measure(noop, clock, policy)
    assert not m.converged and m.stop_reason == "budget"
    # The budget bounds the whole case, warm-up included, to within one sample.
    assert clock.now() <= 0.5 + 1e-2 * 3
    assert any(w.startswith("not converged") for w in m.warnings)
    assert any(w.startswith("noisy") for w in m.warnings)


def test_warmup_runs_past_slow_first_calls() -> None:
    # First calls pay for JIT/plans/allocator growth: 20x, 10x, 5x, 2x, then steady.
    factors = [20.0, 10.0, 5.0, 2.0]
    clock = FakeClock(lambda i, rng: 1e-3 * (factors[i] if i < len(factors) else rng.gauss(1.0, 0.01)), seed=3)
    m = measure(noop, clock, TimingPolicy(warmup_min_calls=3))
    assert m.warmup_calls >= len(factors) + 3  # the slow calls, then a settled window
    # No slow warm-up call leaks into the samples.
    assert max(m.samples_s) < 1.5e-3


def test_warmup_bounded_and_recorded_when_it_never_settles() -> None:
    clock = FakeClock(lambda i, rng: 1e-3 if i % 2 else 2e-3, seed=4)  # alternates: never within 10 %
    policy = TimingPolicy(warmup_max_s=0.05, max_case_s=0.2)
    m = measure(noop, clock, policy)
    assert m.warmup_s <= 0.05 + 0.01
    assert any("warm-up did not settle" in w for w in m.warnings)


def test_short_calls_are_grouped_into_longer_samples() -> None:
    clock = FakeClock(gaussian(1e-6, 0.01), seed=5)
    m = measure(noop, clock, TimingPolicy(min_sample_s=1e-4))
    assert 95 <= m.calls_per_sample <= 105  # ≈ min_sample_s / per-call time
    assert m.median_s == pytest.approx(1e-6, rel=0.01)


def test_max_samples_stops_the_loop() -> None:
    clock = FakeClock(gaussian(1e-3, 0.3), seed=6)
    m = measure(noop, clock, TimingPolicy(target_ci=1e-6, min_samples=10, max_samples=40, max_case_s=100))
    assert m.stop_reason == "max_samples"
    assert len(m.samples_s) == 40


def test_min_time_is_respected_even_when_ci_is_met_early() -> None:
    clock = FakeClock(gaussian(1e-3, 0.0001), seed=7)
    m = measure(noop, clock, TimingPolicy(min_time_s=0.5, min_samples=10))
    assert m.converged
    assert sum(m.samples_s) >= 0.5 * 0.9


def test_same_seed_same_measurement() -> None:
    policy = TimingPolicy(max_case_s=0.5)
    a = measure(noop, FakeClock(gaussian(2e-3, 0.1), seed=8), policy)
    b = measure(noop, FakeClock(gaussian(2e-3, 0.1), seed=8), policy)
    assert a == b
