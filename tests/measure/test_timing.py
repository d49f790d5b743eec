"""The stopping rule and warm-up on a seeded fake clock: exact, fast, no wall-clock flakiness."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from attnbench.core.cases import TimingPolicy
from attnbench.core.stats import student_t_975
from attnbench.results.measurement import MODIFIED_Z_CUT, Measurement
from attnbench.timing.adaptive import RUN_ONCE, TOO_SLOW, measure
from attnbench.timing.clocks import CpuClock
from tests.fakes import FakeClock, gaussian
from tests.support import mentions


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


def test_warmup_audit_moves_slow_first_samples_into_the_warmup() -> None:
    # Calls settle within 10 % quickly but keep speeding up for ~40 more calls (a cache or allocator still
    # growing): the audit must see the first samples run slower than the next ones and move them.
    def durations(i: int, rng: random.Random) -> float:
        return 1e-3 * ((1.30 if i < 45 else 1.0) + rng.gauss(0, 0.003))

    m = measure(noop, FakeClock(durations, seed=11), TimingPolicy(warmup_settle=0.1, min_sample_s=1e-4))
    assert m.warmup_moved >= 30
    assert m.warmup_calls == 3 + m.warmup_moved  # the settled window, then the moved samples
    # Samples move a block at a time, so fewer than one block of slow ones may stay; the median is clean.
    assert sum(x > 1.2e-3 for x in m.samples_s) < 10
    assert m.median_s == pytest.approx(1e-3, rel=0.01)
    assert not any("warm-up audit" in w for w in m.warnings)


def test_warmup_audit_leaves_a_steady_workload_alone() -> None:
    m = measure(noop, FakeClock(gaussian(1e-3, 0.05), seed=12), TimingPolicy())
    assert m.warmup_moved == 0
    assert len(m.samples_s) >= 20  # the audit needs its two blocks before the stopping rule may stop


def test_warmup_audit_gives_up_within_its_budget_and_says_so() -> None:
    # Forever speeding up: every block is slower than the next one, so the audit can never pass.
    clock = FakeClock(lambda i, rng: 1e-3 * (1 + 2.0 / (1 + i / 10)), seed=13)
    m = measure(noop, clock, TimingPolicy(warmup_settle=0.5, warmup_max_s=0.2, max_case_s=2.0))
    assert m.warmup_moved > 0
    assert m.warmup_s <= 0.2 + 0.05
    assert mentions(m.warnings, "audit", values=(TimingPolicy().warmup_audit,))  # the first 10 samples still slow


def test_warmup_audit_can_be_switched_off() -> None:
    def durations(i: int, rng: random.Random) -> float:
        return 1e-3 * (1.3 if i < 45 else 1.0)

    m = measure(noop, FakeClock(durations, seed=14), TimingPolicy(warmup_audit=0, warmup_settle=0.1, min_samples=10))
    assert m.warmup_moved == 0


def test_audit_skipped_when_the_budget_holds_too_few_samples() -> None:
    policy = TimingPolicy(max_case_s=1.0, min_time_s=0.1, min_samples=3)
    m = measure(noop, FakeClock(gaussian(0.1, 0.01), seed=15), policy)
    assert 3 <= len(m.samples_s) < 20
    assert any(w.startswith("warm-up audit skipped") for w in m.warnings)


def test_a_call_too_slow_for_the_budget_is_said_and_not_timed_once() -> None:
    """Issue 17, item 4: a 3 s call under a 1.5 s budget used to give an "ok" row resting on one sample."""
    clock = FakeClock(gaussian(3.0, 0.01), seed=21)
    m = measure(noop, clock, TimingPolicy(max_case_s=1.5, min_samples=10))
    assert m.stop_reason == "too_slow_for_budget" and not m.converged
    assert clock.calls == 1  # one warm-up call, then nothing more: the budget is spent
    assert m.samples_s == pytest.approx((clock.t,))  # the warm-up call, kept as evidence
    said = next(w for w in m.warnings if w.startswith(TOO_SLOW))
    assert "timing.min_samples = 10" in said and "timing.max_case_s = 1.5 s" in said


@pytest.mark.parametrize("seed", range(8))
def test_never_fewer_than_min_samples_while_the_budget_has_room(seed: int) -> None:
    """Whatever the call length and budget: either at least min_samples samples, or too_slow_for_budget; and the
    budget (warm-up and samples) is kept to within one sample."""
    rng = random.Random(seed)
    per_call = 10 ** rng.uniform(-4, 0.5)  # 0.1 ms to 3 s
    policy = TimingPolicy(max_case_s=rng.choice([0.5, 1.5, 3.0, 10.0]), min_samples=rng.choice([3, 10, 20]))
    clock = FakeClock(gaussian(per_call, 0.05), seed=seed)
    m = measure(noop, clock, policy)
    if m.stop_reason == "too_slow_for_budget":
        assert any(w.startswith(TOO_SLOW) for w in m.warnings)
    else:
        assert len(m.samples_s) >= policy.min_samples
    one_sample = max(m.samples_s) * m.calls_per_sample * 1.5
    assert clock.now() <= max(policy.max_case_s, 0) + one_sample


def test_a_cold_first_call_left_in_an_unsettled_warm_up_does_not_end_the_sampling() -> None:
    """A first backward call of 340 ms, then 1 ms calls: the warm-up stops after two calls (its budget spent), and the
    median of those two said a sample takes 170 ms, so the loop ended after one sample with 160 ms of budget left and
    called the row too slow for the budget (a real sdpa-flash train case on CPU did)."""
    clock = FakeClock(lambda i, rng: 0.34 if i == 0 else rng.gauss(1e-3, 1e-5), seed=7)
    policy = TimingPolicy(min_samples=3, max_samples=5, min_time_s=0.001, max_case_s=0.5, warmup_max_s=0.05)
    m = measure(noop, clock, policy)
    assert m.warmup_calls == 2 and any("warm-up did not settle" in w for w in m.warnings)
    assert m.stop_reason != "too_slow_for_budget" and len(m.samples_s) >= policy.min_samples
    assert m.median_s == pytest.approx(1e-3, rel=0.05)


def test_the_warm_up_leaves_half_the_budget_to_the_samples() -> None:
    # Calls that never settle (alternating 1 and 2 ms) would use all of warmup_max_s (2 s) of a 2 s budget.
    clock = FakeClock(lambda i, rng: 1e-3 * (1 + i % 2), seed=3)
    m = measure(noop, clock, TimingPolicy(max_case_s=2.0, warmup_max_s=2.0, min_samples=10, target_ci=1e-6))
    assert m.warmup_s <= 1.0 + 2e-3
    assert len(m.samples_s) >= 10 and m.stop_reason != "too_slow_for_budget"


def test_slow_first_sample_is_flagged_by_its_modified_z_score() -> None:
    # One slow call right after warm-up (index 3 = the first timed sample with ungrouped 1 ms calls).
    def durations(i: int, rng: random.Random) -> float:
        return 5e-3 if i == 3 else 1e-3 * (1 + rng.gauss(0, 0.01))

    m = measure(noop, FakeClock(durations, seed=16), TimingPolicy(warmup_min_calls=3, warmup_audit=0))
    assert m.samples_s[0] == pytest.approx(5e-3)
    assert m.first_sample_mz is not None and m.first_sample_mz > 3.5
    assert mentions(m.warnings, "z-score", values=(MODIFIED_Z_CUT,))  # the score, against its cut

    calm = measure(noop, FakeClock(gaussian(1e-3, 0.01), seed=17), TimingPolicy())
    assert not any(w.startswith("slow first sample") for w in calm.warnings)


def test_injected_slowdown_is_a_fraction_of_the_warmup_time_and_is_recorded() -> None:
    m = measure(noop, FakeClock(gaussian(1e-3, 0.0), seed=18), TimingPolicy(), inject_slowdown=0.1)
    assert m.injected_delay_s == pytest.approx(1e-4)
    # A warm-up cut short by its budget after one slow call: the delay follows the fastest call, not that one.
    slow_first = FakeClock(lambda i, rng: 0.5 if i == 0 else 1e-3, seed=19)
    m = measure(noop, slow_first, TimingPolicy(warmup_max_s=0.6), inject_slowdown=0.1)
    assert m.injected_delay_s == pytest.approx(1e-4)


def test_run_once_is_the_warm_up_then_one_call_alone() -> None:
    clock = FakeClock(gaussian(1e-5, 0.0), seed=20)  # short calls: a sample would group a hundred of them
    sampling: list[int] = []
    m = measure(noop, clock, TimingPolicy(), once=True, on_sampling=lambda: sampling.append(clock.calls))
    assert (len(m.samples_s), m.calls_per_sample, m.stop_reason, m.converged) == (1, 1, "run_once", False)
    assert m.warmup_calls >= 3 and clock.calls == m.warmup_calls + 1 and sampling == [m.warmup_calls]
    assert m.warnings[-1] == RUN_ONCE and m.median_s == pytest.approx(1e-5)


def test_the_timed_wrapper_wraps_the_timed_calls_and_not_the_warm_up() -> None:
    clock = FakeClock(gaussian(1e-3, 0.01), seed=21)
    wrapped: list[int] = []

    def timed(fn: object) -> object:
        assert callable(fn)

        def inner() -> object:
            wrapped.append(clock.calls)
            return fn()

        return inner

    m = measure(noop, clock, TimingPolicy(max_case_s=1.0), timed=timed)  # type: ignore[arg-type]
    assert len(wrapped) == len(m.samples_s) * m.calls_per_sample
    assert min(wrapped) == m.warmup_calls  # the first wrapped call is the first after the warm-up


@pytest.mark.slow
def test_injected_slowdown_really_slows_a_real_call() -> None:
    # Real clock, ratio within one process: a 50 % busy-wait must show as a clearly slower median.
    def work() -> float:
        return sum(i * i for i in range(2000))

    policy = TimingPolicy(max_case_s=0.5, min_time_s=0.05, target_ci=0.05)
    # Interleaved rounds, and minimums rather than medians: other load on a shared machine only ever adds time, so
    # across rounds each side gets its quiet moments, where one measurement after the other may not.
    bases, slows = [], []
    for _ in range(3):
        bases.append(measure(work, CpuClock(), policy))
        slows.append(measure(work, CpuClock(), policy, inject_slowdown=0.5))
    for slowed in slows:
        # Paid inside every timed call, so no sample can be shorter than the busy-wait itself.
        assert slowed.injected_delay_s > 0 and min(slowed.samples_s) >= slowed.injected_delay_s
    fastest_base = min(min(m.samples_s) for m in bases)
    fastest_slowed = min(min(m.samples_s) for m in slows)
    delay = min(m.injected_delay_s for m in slows)
    assert fastest_slowed > fastest_base + 0.5 * delay


def test_replicates_widen_the_ci_to_the_between_process_spread() -> None:
    within = Measurement(
        samples_s=tuple(1e-3 * (1 + 0.001 * (i % 7)) for i in range(200)),
        calls_per_sample=1,
        warmup_calls=3,
        warmup_s=0.01,
        converged=True,
        stop_reason="converged",
        target_ci=0.01,
    )
    assert within.summary.ci_halfwidth_rel < 0.01
    assert within.between_process_rel is None
    replicated = replace(within, replicate_medians_s=(0.9e-3, 1.0e-3, 1.1e-3))
    # t(2) = 4.303; sd = 1e-4; half-width = 4.303e-4 / sqrt(3) ≈ 2.48e-4 around the pooled median.
    half = 4.303 * 1e-4 / 3**0.5
    assert replicated.summary.ci_high == pytest.approx(replicated.within.median + half)
    assert replicated.summary.ci_low == pytest.approx(replicated.within.median - half)
    assert replicated.between_process_rel == pytest.approx(0.1)
    assert Measurement.from_dict(replicated.to_dict()) == replicated
    # Old rows, without the later fields, read back with their defaults.
    assert "replicate_medians_s" not in within.to_dict()
    assert Measurement.from_dict(within.to_dict()) == within


def test_student_t_table_and_its_large_df_expansion() -> None:
    assert student_t_975(1) == pytest.approx(12.706)
    assert student_t_975(30) == pytest.approx(2.042)
    assert student_t_975(40) == pytest.approx(2.021, abs=5e-4)
    assert student_t_975(120) == pytest.approx(1.980, abs=5e-4)


def test_a_short_min_time_is_kept_and_the_rule_is_asked_at_most_a_tenth_of_a_second_apart() -> None:
    # A quiet 1 ms call: the rule could stop at min_time_s = 0.02 s, and it does, instead of sampling to the tenth
    # of a second at which it used to look first.
    policy = TimingPolicy(target_ci=0.05, min_samples=5, min_time_s=0.02, warmup_audit=0, max_case_s=10.0)
    quick = measure(noop, FakeClock(gaussian(1e-3, 0.01), seed=5), policy)
    assert quick.converged and 20 <= len(quick.samples_s) <= 25
    # With the default 0.2 s, blocks stay a tenth of a second: it stops at the first look past min_time_s.
    clock = FakeClock(gaussian(1e-3, 0.01), seed=5)
    usual = measure(noop, clock, replace(policy, min_time_s=0.2))
    assert usual.converged and 200 <= len(usual.samples_s) <= 205


# --------------------------------------------------------------------------------------------- cold cache (issue 40)
def test_a_cold_sample_is_one_call_and_the_budget_pays_for_the_flushes_between_them() -> None:
    """A CPU flush of twice a 32 MB L3 costs ~10 ms against a decode step's 20 µs: blocks sized by the timed calls
    alone asked for 5 000 samples at a time, minutes of flushing past a 1 s budget."""
    clock = FakeClock(gaussian(20e-6, 0.02), seed=7, overhead_s=0.01)
    policy = TimingPolicy(cache="cold", min_samples=10, max_case_s=1.0, warmup_max_s=0.2, min_time_s=0.1)
    m = measure(noop, clock, policy)
    assert m.calls_per_sample == 1
    assert len(m.samples_s) >= 10
    assert clock.now() <= 1.0 + 0.011  # the case's budget, to within one flushed sample
    assert m.median_s == pytest.approx(20e-6, rel=0.05)  # the flushes are not in the samples


def test_a_case_whose_flushes_do_not_fit_the_budget_is_too_slow_not_overrun() -> None:
    clock = FakeClock(gaussian(20e-6, 0.02), seed=8, overhead_s=0.2)
    policy = TimingPolicy(cache="cold", min_samples=10, max_case_s=1.0, warmup_max_s=0.5)
    m = measure(noop, clock, policy)
    assert m.stop_reason == "too_slow_for_budget" and any(w.startswith(TOO_SLOW) for w in m.warnings)
    assert clock.now() <= 1.0 + 0.21


def test_the_cpu_clock_flushes_before_each_sample_outside_its_timing() -> None:
    events: list[str] = []
    clock = CpuClock(flush=lambda: events.append("flush"))
    times = clock.time(lambda: events.append("call"), 1, 3)
    assert events == ["flush", "call"] * 3 and len(times) == 3
    slow_flush = CpuClock(flush=lambda: sum(range(200_000)))
    assert max(slow_flush.time(noop, 1, 3)) < 1e-3  # the flush's milliseconds are not in the sample
