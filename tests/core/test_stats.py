from __future__ import annotations

import math
import random
import statistics

import pytest

from attnbench.core.stats import median_ci_ranks, summarize


@pytest.mark.parametrize(
    ("n", "ranks"),
    # Tabulated 95 % order-statistic intervals for the median (1-based ranks minus one), e.g. Conover table A3.
    [(6, (0, 5)), (10, (1, 8)), (20, (5, 14)), (50, (17, 32)), (100, (39, 60))],
)
def test_median_ci_ranks_match_tables(n: int, ranks: tuple[int, int]) -> None:
    assert median_ci_ranks(n) == ranks


def test_median_ci_needs_six_samples_at_95_percent() -> None:
    assert median_ci_ranks(5) is None
    assert math.isinf(summarize([1.0, 2.0, 3.0, 4.0, 5.0]).ci_halfwidth_rel)


def test_large_n_normal_approximation_is_continuous_with_exact() -> None:
    lo_exact, _ = median_ci_ranks(1000)
    lo_approx, _ = median_ci_ranks(1001)
    assert abs(lo_exact - lo_approx) <= 2


def test_ci_covers_true_median_about_95_percent_of_the_time() -> None:
    rng = random.Random(1)
    hits = 0
    trials = 2000
    for _ in range(trials):
        # Skewed like timings: a floor plus an exponential tail; the true median is 1 + ln 2.
        samples = [1.0 + rng.expovariate(1.0) for _ in range(30)]
        s = summarize(samples)
        hits += s.ci_low <= 1.0 + math.log(2) <= s.ci_high
    assert 0.93 <= hits / trials <= 0.99


def test_summary_numbers() -> None:
    samples = [5.0, 1.0, 4.0, 2.0, 3.0, 100.0]
    s = summarize(samples)
    assert s.n == 6
    assert s.median == 3.5
    assert s.mean == pytest.approx(statistics.fmean(samples))
    assert s.min == 1.0 and s.max == 100.0
    assert s.outliers == 1  # 100 is beyond Q3 + 1.5 IQR
    assert (s.ci_low, s.ci_high) == (1.0, 100.0)
    assert s.iqr == pytest.approx(s.q3 - s.q1)


def test_summarize_refuses_no_samples() -> None:
    with pytest.raises(ValueError):
        summarize([])
