"""``attnbench ab``'s verdicts (``analysis.paired``), torch-free: simulated sessions on a machine that moves a case
by a quarter for seconds at a time, as the 2-core VMs of issue 50 do. Unchanged code (A/A) must not read slower,
a 25 % slowdown on one side must, and an interval that straddles the threshold is unclear, not a verdict."""

from __future__ import annotations

import math
import random

import pytest

from attnbench.analysis.paired import (
    MIN_PAIRS,
    MIN_ROUNDS,
    judge_rounds,
    judge_session,
    judge_status,
    median_interval,
    pairs_interval,
    pairs_p,
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


# Fresh worker pairs: 12 rounds, 2 a pair, as ``attnbench ab`` runs by default.
PAIRS = [i // 2 for i in range(12)]


def biased_rounds(rng: random.Random, slowdown: float = 0.0, spread: float = 0.04) -> tuple[list[float], list[float]]:
    """``machine_rounds``, with each worker process reading the case a lasting factor off (log-normal, ``spread``):
    drawn anew for both sides at each fresh worker pair, kept by the pair through its rounds."""
    base, head = machine_rounds(rng, len(PAIRS), slowdown)
    offsets = [(math.exp(rng.gauss(0, spread)), math.exp(rng.gauss(0, spread))) for _ in range(max(PAIRS) + 1)]
    return [b * offsets[p][0] for b, p in zip(base, PAIRS, strict=True)], [
        h * offsets[p][1] for h, p in zip(head, PAIRS, strict=True)
    ]


def pairs_session(rng: random.Random, cases: int, slowdown: float = 0.0) -> int:
    judged = [judge_rounds(f"k{i}", CASE, *biased_rounds(rng, slowdown), THRESHOLD, PAIRS) for i in range(cases)]
    return judge_session(judged, len(PAIRS)).exit_code


def test_a_worker_that_reads_8_percent_slow_is_a_regression_for_one_pair_and_not_over_fresh_pairs() -> None:
    """One worker pair for the whole session keeps one process's offset in every round: the rounds agree on it, and
    a head process 8 % slow is 'slower'. Fresh pairs draw it anew, and the pairs' spread holds it."""
    rounds = [1.0 + 0.002 * (i % 2) for i in range(12)]
    offsets = [1.08, 0.97, 1.01, 0.95, 1.03, 0.96]  # the head worker of each pair, against its base worker
    head = [r * offsets[p] for r, p in zip(rounds, PAIRS, strict=True)]
    assert judge_rounds("k", CASE, [1.0] * 12, [r * 1.08 for r in rounds], THRESHOLD).answer == "slower"
    fresh = judge_rounds("k", CASE, [1.0] * 12, head, THRESHOLD, PAIRS)
    assert fresh.answer == "unclear" and fresh.pair_ratios == pytest.approx([1.001 * o for o in offsets])
    assert fresh.ci_low is not None and fresh.ci_high is not None and fresh.ci_low < 1 < fresh.ci_high
    assert judge_session([fresh], 12).exit_code == EXIT_UNCLEAR


def test_simulated_aa_sessions_with_per_worker_offsets_never_exit_with_a_regression() -> None:
    rng = random.Random(54)
    exits = [pairs_session(rng, cases=8) for _ in range(100)]
    assert exits.count(EXIT_CASE_FAILED) == 0 and set(exits) <= {EXIT_OK, EXIT_UNCLEAR}


def test_simulated_quarter_slowdowns_with_per_worker_offsets_exit_with_a_regression() -> None:
    rng = random.Random(55)
    exits = [pairs_session(rng, cases=8, slowdown=0.25) for _ in range(100)]
    assert exits.count(EXIT_CASE_FAILED) >= 95  # on a machine harsher than the VM, which asks 9 of 10


def test_the_pairs_p_and_the_interval_agree_at_the_threshold() -> None:
    rng = random.Random(56)
    for _ in range(300):
        m = rng.randint(MIN_PAIRS, 10)
        ratios = [math.exp(rng.gauss(rng.uniform(-0.1, 0.2), 0.05)) for _ in range(m)]
        found = pairs_interval(ratios)
        assert found is not None
        _, lo, hi = found
        assert (lo > 1 + THRESHOLD) == (pairs_p(ratios, THRESHOLD, "regressed") <= 0.025)
        assert (hi < 1 - THRESHOLD) == (pairs_p(ratios, THRESHOLD, "improved") <= 0.025)


def test_pairs_are_judged_on_their_medians_and_too_few_are_unclear() -> None:
    # Three rounds a pair (--pair-rounds 3): one odd round (a state change between its two blocks) does not move
    # its pair's median.
    head = [1.3, 1.3, 1.9, 1.3, 1.3, 1.3, 1.3, 0.8, 1.3, 1.3, 1.3, 1.3]
    judged = judge_rounds("k", CASE, [1.0] * 12, head, THRESHOLD, [i // 3 for i in range(12)])
    assert judged.pair_ratios == pytest.approx([1.3] * 4) and judged.answer == "slower"
    assert judged.ratio == pytest.approx(1.3) and judged.to_dict()["worker_pairs"] == 4
    assert judge_session([judged], 12).exit_code == EXIT_CASE_FAILED
    two = judge_rounds("k", CASE, [1.0] * 6, [1.3] * 6, THRESHOLD, [0, 0, 0, 1, 1, 1])
    assert two.answer == "unclear" and two.ci_low is None and two.ratio == pytest.approx(1.3)


def test_a_lone_marginal_pair_slowdown_is_held_by_the_false_discovery_control() -> None:
    # Pairs' ratios 1.06-1.13: p ≈ 0.6 %, slower alone, not among 20 cases (2.5 % / 20 = 0.125 %).
    marginal = [r for r in (1.06, 1.13, 1.07, 1.12, 1.08, 1.11) for _ in range(2)]
    alone = judge_rounds("m", CASE, [1.0] * 12, marginal, THRESHOLD, PAIRS)
    assert alone.answer == "slower" and 0.025 / 20 < pairs_p(alone.pair_ratios, THRESHOLD, "regressed") < 0.025
    same = [judge_rounds(f"s{i}", CASE, [1.0] * 12, [1.0] * 12, THRESHOLD, PAIRS) for i in range(19)]
    controlled = judge_session([alone, *same], 12)
    assert controlled.cases[0].answer == "unclear" and controlled.exit_code == EXIT_UNCLEAR
