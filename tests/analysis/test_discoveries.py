"""False discoveries across a comparison's cases (``case_compare.control_discoveries``): a comparison of many cases
of unchanged code calls a false change no more often than a comparison of one, and a change of everything is still
caught case by case."""

from __future__ import annotations

import json
import math
import random
from dataclasses import replace
from pathlib import Path
from statistics import NormalDist

import pytest

from attnbench.analysis import case_compare
from attnbench.analysis.case_compare import (
    DISCOVERY_RATE,
    CaseComparison,
    Policy,
    change_p,
    control_discoveries,
    ratio_verdict,
)
from tests.analysis.test_compare import case

Z975 = 1.959963984540054


def timed(ratio: float, half: float, threshold: float = 0.05, key: str = "k") -> CaseComparison:
    """A case timed one process a side: ``ratio`` with a 95 % interval ``half`` wide either side on the log scale."""
    lo, hi = ratio * math.exp(-half), ratio * math.exp(half)
    verdict = ratio_verdict(lo, hi, threshold)
    return CaseComparison(key, case(), verdict, "samples", threshold, "ok", "ok", 1.0, ratio, ratio, lo, hi, 20, 20)


def test_the_p_is_the_intervals_own_at_the_threshold() -> None:
    at = timed(1.05 * math.exp(0.1), 0.1)  # the interval's low end touches 1.05
    assert change_p(at, "regressed") == pytest.approx(DISCOVERY_RATE) == pytest.approx(0.025)
    beyond = timed(1.05 * math.exp(0.2), 0.1)
    assert change_p(beyond, "regressed") == pytest.approx(1 - NormalDist().cdf(2 * Z975))  # twice as far out
    assert change_p(timed(0.9, 0.05), "improved") < DISCOVERY_RATE < change_p(timed(0.97, 0.05), "improved")  # type: ignore[operator]
    untimed = CaseComparison("k", case(), "new", "none", 0.05)
    assert change_p(untimed, "regressed") is None
    assert change_p(replace(beyond, contended=("base",)), "regressed") is None


def test_one_case_keeps_its_own_verdict() -> None:
    lone = timed(1.21, 0.128)  # issue 38's A/A pair: lstm forward 6.65 → 8.04 ms, floor ±13.3 %
    assert lone.verdict == "regressed"
    assert control_discoveries([lone])[0].verdict == "regressed"


def test_a_lone_marginal_change_among_eight_is_not_called() -> None:
    cases = [timed(1.21, 0.128, key="lstm")] + [
        timed(1 + d, 0.128, key=f"c{i}") for i, d in enumerate((-0.06, -0.03, 0, 0.01, 0.02, 0.04, 0.08))
    ]
    judged = control_discoveries(cases)
    assert [c.verdict for c in cases].count("regressed") == 1
    assert [c.verdict for c in judged].count("regressed") == 0 and judged[0].verdict == "noisy"
    assert judged[0].ratio == cases[0].ratio and judged[0].ci_low == cases[0].ci_low  # the numbers stay
    assert judged[1:] == tuple(cases[1:])


def test_a_lone_clear_change_among_eight_is_still_called() -> None:
    cases = [timed(1.6, 0.128, key="lstm")] + [timed(1.0, 0.128, key=f"c{i}") for i in range(7)]
    assert change_p(cases[0], "regressed") < DISCOVERY_RATE / 8  # type: ignore[operator]
    assert control_discoveries(cases)[0].verdict == "regressed"


def test_a_slowdown_of_everything_keeps_every_call() -> None:
    # issue 38's power check: +25 % on every case, floor ±13.3 %: each case alone regressed at p ≈ 0.004.
    cases = [timed(1.25 + 0.01 * i, 0.13, key=f"c{i}") for i in range(8)]
    assert all(c.verdict == "regressed" for c in cases)
    assert control_discoveries(cases) == tuple(cases)


def test_improvements_are_held_the_same_way() -> None:
    cases = [timed(0.83, 0.128, key="fast")] + [timed(1.0, 0.128, key=f"c{i}") for i in range(7)]
    assert cases[0].verdict == "improved" and control_discoveries(cases)[0].verdict == "noisy"


@pytest.mark.parametrize("k", [8, 80])
def test_unchanged_code_fails_no_more_often_with_more_cases(k: int) -> None:
    """Simulated A/A comparisons at threshold 0 (no margin, the hardest case): each case's log ratio is normal with
    the spread its interval claims. Case by case, a comparison fails about 1 − 0.975^k of the time; with the
    control, about 2.5 % whatever k."""
    rng = random.Random(k)
    sigma, trials = 0.05, 400
    raw = held = 0
    for _ in range(trials):
        cases = [timed(math.exp(rng.gauss(0, sigma)), Z975 * sigma, threshold=0.0, key=f"c{i}") for i in range(k)]
        raw += any(c.verdict == "regressed" for c in cases)
        held += any(c.verdict == "regressed" for c in control_discoveries(cases))
    assert raw / trials > 1 - 0.975**k - 0.06  # 8 cases: ~18 %; 80: ~87 %
    assert held / trials < 0.05


def test_compare_applies_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """``compare_sides`` goes through the control, with every case of the comparison, and keeps its calls."""
    from attnbench.analysis import compare
    from tests.analysis.test_compare import BASE, CURRENT, MEASURED

    seen: list[int] = []
    real = case_compare.control_discoveries

    def spy(cases: list[CaseComparison]) -> tuple[CaseComparison, ...]:
        seen.append(len(cases))
        return real(cases)

    monkeypatch.setattr(compare, "control_discoveries", spy)
    judged = compare.compare_paths(BASE, CURRENT, Policy(noise_floor=MEASURED))
    assert seen == [len(judged.cases)] and len(judged.cases) > 8
    assert judged.regressed  # the fixture's 25 % slowdown and its OOM still fail it


def processes(ratio: float, half: float, n: int = 2, key: str = "k") -> CaseComparison:
    """A case timed in ``n`` processes a side: a Student t interval on 2n − 2 degrees of freedom."""
    lo, hi = ratio * math.exp(-half), ratio * math.exp(half)
    verdict = ratio_verdict(lo, hi, 0.05)
    return CaseComparison(key, case(), verdict, "processes", 0.05, "ok", "ok", 1.0, ratio, ratio, lo, hi, n, n)


def test_a_student_t_interval_gives_a_student_t_p() -> None:
    from scipy.stats import t

    from attnbench.core.stats import student_t_975

    c = processes(1.05 * math.exp(0.1395), 0.1)  # 1.395 half-widths beyond the threshold, two processes a side
    assert c.verdict == "regressed"
    assert change_p(c, "regressed") == pytest.approx(t.sf(student_t_975(2) * 1.395, 2))  # ≈ 0.013, not normal's
    assert change_p(processes(1.05 * math.exp(0.1), 0.1), "regressed") == pytest.approx(DISCOVERY_RATE, rel=0.01)
    others = [processes(1.0, 0.1, key=f"c{i}") for i in range(7)]
    assert control_discoveries([c, *others])[0].verdict == "noisy"  # 0.013 > 2.5 % / 8


def test_edges_zero_width_no_cases_and_a_threshold_of_everything() -> None:
    assert control_discoveries([]) == ()
    fixed = replace(timed(1.3, 0.1), ci_low=1.3, ci_high=1.3)  # a peak read once a side: certain
    assert change_p(fixed, "regressed") == 0.0 and change_p(fixed, "improved") == 1.0
    assert change_p(timed(0.01, 0.1, threshold=1.0), "improved") == 1.0  # nothing is 100 % faster


def test_a_gates_calls_are_held_per_metric() -> None:
    from attnbench.analysis.gates import MetricVerdict, control_gates, judge

    def rate(ratio: float, key: str) -> MetricVerdict:  # tokens/s, lower is worse, a normal interval ±0.128
        lo, hi = ratio * math.exp(-0.128), ratio * math.exp(0.128)
        verdict = judge(lo, hi, 0.05, higher_is_worse=False)
        return MetricVerdict("tokens_per_s", key, case(), verdict, 0.05, ratio, lo, hi)

    def peak(ratio: float, key: str) -> MetricVerdict:  # one reading a side: no spread
        verdict = judge(ratio, ratio, 0.1, higher_is_worse=True)
        return MetricVerdict("peak_mem", key, case(), verdict, 0.1, ratio, ratio, ratio)

    gates = [rate(1 / 1.21, "lone"), *(rate(1.0, f"r{i}") for i in range(7)), peak(1.5, "lone"), peak(1.0, "p1")]
    assert [g.verdict for g in gates].count("regressed") == 2
    held = control_gates(gates)
    assert held[0].verdict == "noisy" and held[8].verdict == "regressed"  # the rate's lone call goes, the peak stays
    assert held[1:8] == tuple(gates[1:8])


@pytest.mark.parametrize(("factor", "exit_code"), [(1.21, 0), (1.6, 1)])
def test_compare_exits_on_a_lone_case_only_when_it_holds(tmp_path: Path, factor: float, exit_code: int) -> None:
    """Issue 38's A/A pair end to end: one case of the fixture's ten timed ones 21 % slower at a ±13.3 % floor is
    within what ten cases of unchanged code produce (exit 0); 60 % slower is not (exit 1)."""
    from typer.testing import CliRunner

    from attnbench.cli import app
    from tests.analysis.test_compare import BASE, derive

    run, rows = derive.read_run(BASE)
    slowed = [derive.scaled(r, factor) if derive.ident(r) == ("lstm", "forward", 64) else r for r in rows]
    current = derive.write_run(tmp_path / "current", derive.with_run(run, "current", "c" * 40), slowed)
    out = CliRunner().invoke(app, ["compare", str(BASE), str(current), "--noise-floor", "13.3%", "-f", "json"])
    assert out.exit_code == exit_code, out.output
    (lstm,) = [
        c
        for c in json.loads(out.stdout)["cases"]
        if c["key"].startswith("model=lstm|mode=forward") and "|seq_len=64|" in c["key"]
    ]
    assert lstm["ratio"] == pytest.approx(factor, rel=0.01)
    assert lstm["verdict"] == ("noisy" if exit_code == 0 else "regressed")
