"""``attnbench ab``'s verdicts (``analysis.paired``), torch-free: simulated sessions on a machine that moves a case
by a quarter for seconds at a time, as the 2-core VMs of issue 50 do. Unchanged code (A/A) must not read slower,
a 25 % slowdown on one side must, and an interval that straddles the threshold is unclear, not a verdict."""

from __future__ import annotations

import math
import random

import pytest

from attnbench.analysis.paired import (
    MIN_ROUNDS,
    judge_rounds,
    judge_session,
    judge_status,
    median_interval,
    sign_p,
)
from attnbench.core.errors import EXIT_CASE_FAILED, EXIT_OK, EXIT_UNCLEAR
from tests.support import tiny_case

CASE = tiny_case()
THRESHOLD = 0.05


def machine_rounds(rng: random.Random, rounds: int, slowdown: float = 0.0) -> tuple[list[float], list[float]]:
    """One case's block medians (base, head) in ``rounds`` rounds on a machine in one of two states (×0.93 or
    ×1.25 of the case's time) that persists for a few rounds and changes, now and then, between the two blocks of
    a round; each block adds 2 % of its own noise. The head is slower by ``slowdown``."""
    state = rng.choice((0.93, 1.25))
    base, head = [], []
    for _ in range(rounds):
        if rng.random() < 0.25:
            state = 1.18 / state  # the other state (0.93 ↔ 1.25, near enough)
        first = state
        if rng.random() < 0.1:
            state = 1.18 / state  # the state changed between the round's two blocks
        base.append(1e-3 * first * (1 + rng.gauss(0, 0.02)))
        head.append(1e-3 * state * (1 + rng.gauss(0, 0.02)) * (1 + slowdown))
    return base, head


def session(rng: random.Random, cases: int, rounds: int, slowdown: float = 0.0) -> int:
    judged = [judge_rounds(f"k{i}", CASE, *machine_rounds(rng, rounds, slowdown), THRESHOLD) for i in range(cases)]
    return judge_session(judged, rounds).exit_code


def test_simulated_aa_sessions_never_exit_with_a_regression() -> None:
    rng = random.Random(50)
    exits = [session(rng, cases=8, rounds=12) for _ in range(200)]
    assert exits.count(EXIT_CASE_FAILED) == 0
    assert set(exits) <= {EXIT_OK, EXIT_UNCLEAR}


def test_simulated_sessions_with_a_quarter_slowdown_exit_with_a_regression() -> None:
    rng = random.Random(51)
    exits = [session(rng, cases=8, rounds=12, slowdown=0.25) for _ in range(200)]
    assert exits.count(EXIT_CASE_FAILED) >= 196  # ≥ 98 %: the issue asks 9 of 10 of the real thing


def test_unpaired_the_same_machine_would_fail_aa_often() -> None:
    """Why pairing: the base's rounds against the head's rounds shifted by one (no longer neighbours in time) read
    the machine's state changes as differences, and the interval widens to unclear where the paired one is same."""
    rng = random.Random(52)
    paired = unpaired = 0
    for _ in range(100):
        base, head = machine_rounds(rng, 12)
        paired += judge_rounds("k", CASE, base, head, THRESHOLD).answer == "same"
        unpaired += judge_rounds("k", CASE, base, head[1:] + head[:1], THRESHOLD).answer == "same"
    assert paired >= 90 and unpaired <= paired - 30


def test_the_sign_p_and_the_interval_agree_at_the_threshold() -> None:
    rng = random.Random(53)
    for _ in range(500):
        n = rng.randint(MIN_ROUNDS, 40)
        ratios = [math.exp(rng.gauss(rng.uniform(-0.1, 0.2), 0.05)) for _ in range(n)]
        found = median_interval(ratios)
        assert found is not None
        _, lo, hi = found
        assert (lo > 1 + THRESHOLD) == (sign_p(ratios, THRESHOLD, "regressed") <= 0.025)
        assert (hi < 1 - THRESHOLD) == (sign_p(ratios, THRESHOLD, "improved") <= 0.025)


def test_a_straddling_interval_is_unclear_and_its_own_exit_code() -> None:
    ratios = [1.00, 1.02, 1.04, 1.06, 1.08, 1.10, 1.01, 1.03, 1.05, 1.07, 1.09, 1.11]
    judged = judge_rounds("k", CASE, [1.0] * 12, ratios, THRESHOLD)
    assert judged.answer == "unclear" and judged.ci_low is not None and judged.ci_high is not None
    assert judged.ci_low < 1 + THRESHOLD < judged.ci_high and judged.note
    assert judge_session([judged], 12).exit_code == EXIT_UNCLEAR == 6


def test_too_few_rounds_is_unclear_without_an_interval() -> None:
    judged = judge_rounds("k", CASE, [1.0] * (MIN_ROUNDS - 1), [1.5] * (MIN_ROUNDS - 1), THRESHOLD)
    assert judged.answer == "unclear" and judged.ci_low is None and judged.ratio == pytest.approx(1.5)


@pytest.mark.parametrize(
    ("head", "answer", "code"), [(1.3, "slower", EXIT_CASE_FAILED), (0.7, "faster", EXIT_OK), (1.0, "same", EXIT_OK)]
)
def test_clear_changes_are_called(head: float, answer: str, code: int) -> None:
    judged = judge_rounds("k", CASE, [1.0] * 12, [head * (1 + 0.001 * i) for i in range(12)], THRESHOLD)
    assert judged.answer == answer and judged.ratio == pytest.approx(head, rel=0.01)
    assert judge_session([judged], 12).exit_code == code


def test_a_lone_marginal_slowdown_among_many_cases_is_held_by_the_false_discovery_control() -> None:
    # 2 of 12 rounds at or below the threshold: p = 79/4096 ≈ 1.9 %, slower alone, not among 20 (2.5 % / 20).
    marginal = [1.0, 1.04] + [1.2] * 10
    alone = judge_rounds("m", CASE, [1.0] * 12, marginal, THRESHOLD)
    assert alone.answer == "slower" and sign_p(marginal, THRESHOLD, "regressed") == pytest.approx(79 / 4096)
    same = [judge_rounds(f"s{i}", CASE, [1.0] * 12, [1.0] * 12, THRESHOLD) for i in range(19)]
    controlled = judge_session([alone, *same], 12)
    assert controlled.cases[0].answer == "unclear" and controlled.exit_code == EXIT_UNCLEAR
    assert judge_session([alone], 12).exit_code == EXIT_CASE_FAILED


@pytest.mark.parametrize(
    ("base", "head", "answer"),
    [
        ("ok", "crashed", "slower"),
        ("error", "ok", "faster"),
        ("oom", "oom", "same"),
        ("too_slow_for_budget", "ok", "unclear"),
        ("ok", "too_slow_for_budget", "unclear"),
    ],
)
def test_a_side_that_failed_is_judged_by_status(base: str, head: str, answer: str) -> None:
    judged = judge_status("k", CASE, THRESHOLD, (base, "why" if base != "ok" else ""), (head, ""))
    assert judged.answer == answer and judged.base_status == base and judged.head_status == head
    code = {"slower": EXIT_CASE_FAILED, "unclear": EXIT_UNCLEAR}.get(answer, EXIT_OK)
    assert judge_session([judged], 12).exit_code == code


def test_the_session_answer_and_json_keys() -> None:
    slower = judge_rounds("a", CASE, [1.0] * 12, [1.3] * 12, THRESHOLD)
    same = judge_rounds("b", CASE, [1.0] * 12, [1.0] * 12, THRESHOLD)
    data = judge_session([slower, same], 12).to_dict()
    assert data["answer"] == "slower" and data["exit_code"] == EXIT_CASE_FAILED
    assert data["counts"] == {"slower": 1, "unclear": 0, "faster": 0, "same": 1}
    assert data["cases"][0]["rounds"] == 12 and data["cases"][0]["ratio"] == pytest.approx(1.3)
    assert judge_session([same], 12).answer == "same"
