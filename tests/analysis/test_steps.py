"""Step detection: a planted step is found where it is, a flat series reports none, at stated rates."""

from __future__ import annotations

import math
import random

import pytest

from attnbench.analysis.steps import fit_steps, noise_between_runs, sigma_from_ci


def series(seed: int, sigma: float, jumps: dict[int, float], n: int = 12) -> list[float]:
    """Run medians: log-normal run-to-run noise of SD ``sigma`` around a level multiplied by 1 + jump at each
    index in ``jumps`` (the first run of the new level)."""
    rng = random.Random(seed * 7919 + int(sigma * 1e4))
    level, out = 1.0, []
    for i in range(n):
        level *= 1 + jumps.get(i, 0.0)
        out.append(2.5e-3 * level * math.exp(rng.gauss(0, sigma)))
    return out


def found(values: list[float | None], **kw: float) -> list[int]:
    return [s.index for s in fit_steps(values, **kw).steps]


@pytest.mark.parametrize("seed", range(5))
def test_a_ten_percent_step_at_run_7_is_found_there(seed: int) -> None:
    (step,) = fit_steps(series(seed, 0.03, {7: 0.10})).steps
    assert step.index == 7 and (step.runs_before, step.runs_after) == (7, 5)
    assert step.low < 0.10 < step.high and step.low < step.change < step.high
    assert step.after / step.before == pytest.approx(1 + step.change)


def test_rates_over_200_seeds_match_what_the_module_states() -> None:
    # Deterministic (fixed seeds); the module docstring quotes 77 % exact and ~5 % false positives at 3 % noise.
    exact = sum(found(series(seed, 0.03, {7: 0.10})) == [7] for seed in range(200)) / 200
    false = sum(bool(found(series(seed, 0.03, {}))) for seed in range(200)) / 200
    assert exact >= 0.70 and false <= 0.11


def test_a_flat_series_reports_nothing() -> None:
    assert found(series(0, 0.05, {})) == []
    assert found([1.0] * 12) == []


def test_two_steps_and_their_directions() -> None:
    first, second = fit_steps(series(0, 0.02, {4: 0.20, 8: -0.15})).steps
    assert (first.index, second.index) == (4, 8)
    assert first.change > 0 > second.change and first.after == pytest.approx(second.before)


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_fewer_than_four_runs_detect_nothing_and_say_so(n: int) -> None:
    fit = fit_steps([1.0, 2.0, 2.0][:n] if n < 3 else [1.0, 2.0, 2.0])
    assert fit.steps == () and fit.too_short and fit.runs == n


def test_a_single_odd_run_is_an_outlier_not_a_step() -> None:
    assert found([1.0, 1.01, 0.99, 1.0, 1.01, 1.3, 0.99, 1.0, 1.01, 0.99]) == []
    assert found([1.0, 1.01, 0.99, 1.0, 1.01, 0.99, 1.0, 1.01, 0.99, 1.5]) == []  # newest run alone: not yet


def test_missing_runs_keep_their_positions() -> None:
    values: list[float | None] = [1.0, 1.01, None, 0.99, float("nan"), 1.0, 1.21, 1.2, 0, 1.19, 1.2]
    (step,) = fit_steps(values).steps
    assert step.index == 6 and step.first_possible == 6
    gap: list[float | None] = [1.0, 1.01, 0.99, 1.0, None, None, 1.21, 1.2, 1.19, 1.2]
    (step,) = fit_steps(gap).steps
    assert step.index == 6 and step.first_possible == 4  # it happened somewhere in the gap


def test_the_noise_comes_from_between_runs_and_is_floored_by_the_runs_own_intervals() -> None:
    values = series(3, 0.03, {})
    fit = fit_steps(values)
    assert fit.sigma_source == "between runs"
    assert fit.sigma == pytest.approx(noise_between_runs([math.log(v) for v in values]))
    wide = fit_steps(values, point_noise_rel=[0.2] * len(values))
    assert wide.sigma_source == "the runs' own intervals" and wide.sigma == pytest.approx(math.log1p(0.2))
    assert fit_steps([1.0] * 12).sigma_source == "floor"


def test_min_effect_hides_real_but_small_steps() -> None:
    values = series(0, 0.005, {6: 0.04})
    assert found(values) == [6]
    assert found(values, min_effect=0.05) == []


def test_sigma_from_ci() -> None:
    assert sigma_from_ci(0.9, 1.1) == pytest.approx(math.expm1(math.log(1.1 / 0.9) / (2 * 1.959964)), rel=1e-6)
    assert sigma_from_ci(0.0, 1.0) is None and sigma_from_ci(1.0, math.inf) is None
