"""The sweep's progress display: its ETA comes from the cases' budgets and the timings so far (issue 17, item 7)."""

from __future__ import annotations

import io
from dataclasses import replace

import pytest
from rich.console import Console

from attnbench.cli.progress import DEFAULT_OVERHEAD_S, SweepDisplay, eta_s
from attnbench.core.cases import TimingPolicy
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result
from tests.support import numbers, tiny_case

POLICY = TimingPolicy(max_case_s=2.0)


def done(model: str, n: int, duration_s: float, window_s: float = 0.1) -> Result:
    m = Measurement((window_s / 10,) * 10, 1, 3, 0.0, True, "converged", 0.01)
    return Result(tiny_case(model, seq_len=n), "ok", measurement=m, duration_s=duration_s)


def test_before_any_case_the_eta_is_the_budgets() -> None:
    cases = [tiny_case("lstm", seq_len=n) for n in (16, 64, 256)]
    assert eta_s([], cases, POLICY) == pytest.approx(3 * (2.0 + DEFAULT_OVERHEAD_S))
    assert eta_s([], cases, replace(POLICY, processes=3)) == pytest.approx(9 * (2.0 + DEFAULT_OVERHEAD_S))
    # Rounds share max_case_s, but every visit builds the case again.
    assert eta_s([], cases, replace(POLICY, rounds=2)) == pytest.approx(3 * (2.0 + 2 * DEFAULT_OVERHEAD_S))


def test_a_sweep_in_rounds_says_which_round_it_is_in() -> None:
    cases = [tiny_case("lstm", seq_len=n) for n in (16, 64)]
    log = io.StringIO()
    plain = SweepDisplay(Console(file=log, force_terminal=False, width=120), 2, cases=cases, policy=POLICY)
    with plain:
        plain.round_started(2, 3)
        plain.started(0, cases[0])
    assert numbers(log.getvalue())[:3] == [2, 3, 2]  # round 2 of 3 (2 cases)
    live = SweepDisplay(Console(file=io.StringIO(), force_terminal=True, width=120), 2, cases=cases, policy=POLICY)
    with live:
        live.round_started(1, 3)
        live.started(0, cases[0])
        assert live._progress is not None
        assert numbers(live._progress.tasks[0].description)[:2] == [1, 3]  # the bar's line names the round


def test_a_curve_that_started_cheap_predicts_its_longer_lengths_and_others_keep_their_budget() -> None:
    # Issue 17: at case 2 of 32 a count-based ETA said 0:52 for a run that took 2:22 — the first cases were short.
    finished = [done("lstm", 16, 0.4), done("lstm", 64, 0.6)]  # 0.1 s timed, so 0.3-0.5 s of overhead
    remaining = [tiny_case("lstm", seq_len=256), tiny_case("vanilla", seq_len=16), tiny_case("vanilla", seq_len=64)]
    overhead = 0.4  # the median of 0.3 and 0.5
    assert eta_s(finished, remaining, POLICY) == pytest.approx(0.6 + 2 * (2.0 + overhead))
    # A curve whose cases ran to their budget is never predicted beyond it.
    slow = [done("lstm", 16, 30.0, window_s=2.0)]
    assert eta_s(slow, [tiny_case("lstm", seq_len=64)], POLICY) <= 2.0 + 28.0 + 1e-9


def test_the_display_keeps_the_eta_on_its_task() -> None:
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    cases = [tiny_case("lstm", seq_len=n) for n in (16, 64)]
    display = SweepDisplay(console, 2, cases=cases, policy=POLICY)
    with display:
        assert display._progress is not None and display._task is not None
        task = display._progress.tasks[0]
        assert task.fields["eta_s"] == pytest.approx(2 * (2.0 + DEFAULT_OVERHEAD_S))
        result = done("lstm", 16, 0.5)
        display.finished(0, result)
        assert display._progress.tasks[0].fields["eta_s"] == pytest.approx(0.5)


def test_the_eta_counts_down_while_a_case_runs_but_not_below_the_cases_not_started() -> None:
    now = [100.0]
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    cases = [tiny_case("lstm", seq_len=n) for n in (16, 64)]
    display = SweepDisplay(console, 2, cases=cases, policy=POLICY, clock=lambda: now[0])

    def shown() -> str:
        assert display._progress is not None
        column = display._progress.columns[-1]
        return str(column.render(display._progress.tasks[0]))  # type: ignore[union-attr]

    with display:
        display.started(0, cases[0])
        assert shown() == "eta 0:00:05"  # both cases' budgets: 2 × (2.0 + DEFAULT_OVERHEAD_S)
        now[0] += 1.5
        assert shown() == "eta 0:00:04"  # the running case's share is being spent
        now[0] += 60.0
        assert shown() == "eta 0:00:02"  # it overran: what is left is the case not yet started (2.5 s, rounded)
