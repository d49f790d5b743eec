"""``attnbench compare``: the statistics, the verdict rules, refusal, exit codes, and the golden markdown.

Fixtures: ``tests/data/compare/base`` and ``current`` (built by ``tests/data/compare/derive.py`` from a real run,
with known changes per case); folders of repeated runs and mismatched environments are derived from them here.
"""

from __future__ import annotations

import importlib.util
import json
import math
import random
import statistics
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from typer.testing import CliRunner

from attnbench.analysis.case_compare import _bootstrap_medians, _widen
from attnbench.analysis.compare import (
    DEFAULT_NOISE_FLOOR,
    HARD_KEYS,
    NoBaselineError,
    NotComparableError,
    Policy,
    bootstrap_ratio_ci,
    compare_case,
    compare_paths,
    overall_rule,
    process_ratio_ci,
    runs_for_interval,
)
from attnbench.analysis.thresholds import Thresholds, parse_fraction, parse_threshold
from attnbench.cli import app
from attnbench.cli.compare import read_thresholds
from attnbench.core.cases import Case
from attnbench.core.errors import AttnbenchError
from attnbench.core.stats import student_t_975
from attnbench.report.compare_md import render_compare_markdown
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result
from tests.support import DATA as TEST_DATA
from tests.support import GOLDEN, ROOT, mentions, numbers, tiny_case

DATA = TEST_DATA / "compare"
BASE, CURRENT = DATA / "base", DATA / "current"
runner = CliRunner()


def _derive_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("compare_derive", DATA / "derive.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


derive = _derive_module()


def check_golden(name: str, text: str) -> None:
    import os

    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rerun with UPDATE_GOLDEN=1 if that is intended"


def verdicts(base: Path, current: Path, **policy: Any) -> dict[tuple[str, str, int], str]:
    comparison = compare_paths(base, current, Policy(**policy))
    return {(c.case.model, c.case.mode, c.case.seq_len): c.verdict for c in comparison.cases}


def run_set(folder: Path, factors: list[float], commit: str = derive.BASE_COMMIT, **environment: Any) -> Path:
    """A folder of runs: base's rows with every timing scaled by each factor in turn (one run per factor)."""
    run, rows = derive.read_run(BASE)
    for i, factor in enumerate(factors):
        member = derive.with_run(run, f"20261202-15{commit[0]}00{i}-tiny-fixture-cpu", commit, **environment)
        derive.write_run(folder / member["run_id"], member, [derive.scaled(r, factor) for r in rows])
    return folder


def edited(folder: Path, **environment: Any) -> Path:
    """base, with some environment fields changed."""
    run, rows = derive.read_run(BASE)
    return derive.write_run(folder, derive.with_run(run, "edited", "e" * 40, **environment), rows)


# ---------------------------------------------------------------------------------------------- thresholds


@pytest.mark.parametrize(("text", "value"), [("median:5%", 0.05), ("5%", 0.05), (" median : 12.5 % ", 0.125)])
def test_threshold_language(text: str, value: float) -> None:
    assert parse_threshold(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["mean:5%", "median:0.001", "5", "0%", "median:100%", "median:-5%", ""])
def test_threshold_language_refuses_what_it_cannot_judge(text: str) -> None:
    with pytest.raises(AttnbenchError) as info:
        parse_threshold(text)
    assert "--fail-on" in info.value.message and info.value.hint


def test_threshold_file_per_model(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("default: 4%\nlstm: 8%\ngru: 'median:6%'\n")
    limits = read_thresholds(path)
    assert (limits.for_model("lstm"), limits.for_model("gru"), limits.for_model("vanilla")) == pytest.approx(
        (0.08, 0.06, 0.04)
    )
    assert limits.describe() == "4 %; gru 6 %; lstm 8 %"
    assert read_thresholds(path, "median:3%").default == pytest.approx(0.03)  # the command line wins


@pytest.mark.parametrize(
    ("text", "says"),
    [("lstmm: 5%\n", "unknown model 'lstmm'"), ("- 5%\n", "mapping"), ("lstm: 8\n", "percentage"), ("a: [\n", "YAML")],
)
def test_threshold_file_errors_name_the_file_and_key(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(AttnbenchError) as info:
        read_thresholds(path)
    assert says in info.value.message and str(path) in info.value.message


def test_noise_floor_parsing() -> None:
    assert parse_fraction("3%", "--noise-floor") == pytest.approx(0.03)
    assert parse_fraction("0.1", "--noise-floor") == pytest.approx(0.1)
    assert parse_fraction("0", "--noise-floor") == 0
    for bad in ("x", "-1%", "100%"):
        with pytest.raises(AttnbenchError):
            parse_fraction(bad, "--noise-floor")
    # The default floor (±100 %, a factor of 2) can be given too: a floor is a factor, not a change.
    assert parse_fraction("100%", "--noise-floor", below=10.0) == DEFAULT_NOISE_FLOOR
    assert cli(str(BASE), str(CURRENT), "--noise-floor", "100%").exit_code == 1  # the ok → oom
    assert cli(str(BASE), str(CURRENT), "--noise-floor", "1000%").exit_code == 2


# ---------------------------------------------------------------------------------------------- statistics


@pytest.mark.parametrize("n", [7, 8])
def test_exact_bootstrap_median_matches_resampling(n: int) -> None:
    """The O(1) order-statistic draw has the distribution of the median of n draws with replacement."""
    data = sorted(random.Random(1).lognormvariate(0, 0.3) for _ in range(n))
    fast = _bootstrap_medians(data, random.Random(2), 40_000)
    rng = random.Random(3)
    slow = [statistics.median(rng.choices(data, k=n)) for _ in range(40_000)]
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        a, b = sorted(fast)[int(q * len(fast))], sorted(slow)[int(q * len(slow))]
        assert a == pytest.approx(b, rel=0.02), q
    assert statistics.fmean(fast) == pytest.approx(statistics.fmean(slow), rel=0.005)


def test_bootstrap_is_deterministic_per_case_key() -> None:
    rng = random.Random(0)
    b = [rng.gauss(1.0, 0.05) for _ in range(60)]
    c = [rng.gauss(1.1, 0.05) for _ in range(60)]
    first = bootstrap_ratio_ci(b, c, key="k", confidence=0.95, resamples=500)
    assert first == bootstrap_ratio_ci(b, c, key="k", confidence=0.95, resamples=500)
    assert first != bootstrap_ratio_ci(b, c, key="other", confidence=0.95, resamples=500)
    assert first[0] < 1.1 < first[1]


def test_bootstrap_interval_covers_the_true_ratio() -> None:
    """Two skewed samples of medians 1 and 1.2: the 95 % interval covers 1.2 in about 95 % of trials."""
    rng = random.Random(7)
    hits = 0
    for trial in range(150):
        b = [math.exp(rng.gauss(0, 0.1)) for _ in range(41)]
        c = [1.2 * math.exp(rng.gauss(0, 0.1)) for _ in range(41)]
        lo, hi = bootstrap_ratio_ci(b, c, key=str(trial), confidence=0.95, resamples=400)
        hits += lo <= 1.2 <= hi
    assert 0.88 <= hits / 150 <= 0.995


def test_process_interval_is_student_t_on_log_medians() -> None:
    base, current = [1.0, 1.02, 0.98], [1.10, 1.12, 1.08]
    ratio, lo, hi = process_ratio_ci(base, current)
    lb, lc = [math.log(x) for x in base], [math.log(x) for x in current]
    pooled = (statistics.variance(lb) + statistics.variance(lc)) / 2
    half = student_t_975(4) * math.sqrt(pooled * (1 / 3 + 1 / 3))
    diff = statistics.fmean(lc) - statistics.fmean(lb)
    assert (ratio, lo, hi) == pytest.approx((math.exp(diff), math.exp(diff - half), math.exp(diff + half)))
    # One side with a single process borrows the other side's spread.
    ratio, lo, hi = process_ratio_ci([1.0], current)
    assert lo < ratio < hi


def test_noise_floor_adds_in_quadrature_on_the_log_scale() -> None:
    lo, hi = _widen(1.0, math.exp(-0.03), math.exp(0.04), 0.0)
    assert (lo, hi) == pytest.approx((math.exp(-0.03), math.exp(0.04)))
    lo, hi = _widen(1.0, math.exp(-0.03), math.exp(0.04), math.exp(0.04) - 1)
    assert (math.log(lo), math.log(hi)) == pytest.approx((-0.05, math.hypot(0.04, 0.04)))


# ---------------------------------------------------------------------------------------------- verdicts


def case(model: str = "lstm") -> Case:
    return tiny_case(model, seq_len=64, d_model=32)


def row(status: str = "ok", median: float = 1e-3, n: int = 200, spread: float = 0.002, **fields: Any) -> Result:
    if status != "ok":
        return Result(case(), status, reason=f"{status} here")  # type: ignore[arg-type]
    samples = tuple(median * (1 + spread * math.sin(i)) for i in range(n))
    m = Measurement(samples, 1, 3, 0.0, True, "converged", 0.01, **fields)
    return Result(case(), "ok", measurement=m)


@pytest.mark.parametrize(
    ("factor", "floor", "verdict"),
    [
        (1.00, 0.03, "same"),
        (1.20, 0.03, "regressed"),
        (0.80, 0.03, "improved"),
        (1.04, 0.03, "noisy"),  # might be above 5 % once processes differ by up to 3 %
        (1.04, 0.0, "same"),  # trusting the samples alone, 4 % is inside 5 %
        (1.07, 0.03, "noisy"),  # beyond the threshold, but not beyond it and the floor
        (1.07, 0.0, "regressed"),
    ],
)
def test_effect_must_pass_the_threshold_and_be_significant(factor: float, floor: float, verdict: str) -> None:
    got = compare_case("k", [row()], [row(median=1e-3 * factor)], Policy(noise_floor=floor))
    assert (got.verdict, got.evidence) == (verdict, "samples")
    assert got.ratio == pytest.approx(factor)
    assert got.ci_low is not None and got.ci_high is not None and got.ratio is not None
    assert got.ci_low < got.ratio < got.ci_high


@pytest.mark.parametrize(
    ("base_s", "current_s", "unmeasured", "measured"),
    [
        (3.66e-3, 6.51e-3, "noisy", "regressed"),  # issue 30's A/A pair: one LSTM process read +78 %, unchanged code
        (1.0e-3, 1.25e-3, "noisy", "regressed"),  # an injected 25 %: a verdict needs the machine's floor
        (1.0e-3, 2.5e-3, "regressed", "regressed"),  # gross: a kernel off its fast path fails the build regardless
        (1.0e-3, 0.4e-3, "improved", "improved"),
        (1.0e-3, 1.0e-3, "noisy", "same"),  # "same" needs a floor inside the threshold
    ],
)
def test_one_process_without_a_measured_floor_calls_only_gross_changes(
    base_s: float, current_s: float, unmeasured: str, measured: str
) -> None:
    def judged(policy: Policy) -> str:
        return compare_case("k", [row(median=base_s)], [row(median=current_s)], policy).verdict

    assert judged(Policy()) == unmeasured and DEFAULT_NOISE_FLOOR == 1.0
    assert judged(Policy(noise_floor=0.04)) == measured


def test_per_model_threshold_applies() -> None:
    policy = Policy(thresholds=Thresholds(0.05, {"lstm": 0.25}), noise_floor=0.0)
    assert compare_case("k", [row()], [row(median=1.2e-3)], policy).verdict == "same"


@pytest.mark.parametrize(
    ("base", "current", "verdict"),
    [
        ("ok", "oom", "regressed"),
        ("ok", "unsupported", "regressed"),
        ("ok", "crashed", "regressed"),
        ("oom", "ok", "improved"),
        ("oom", "error", "regressed"),
        ("unsupported", "timeout", "regressed"),
        ("error", "crashed", "same"),
        ("oom", "unsupported", "same"),
        ("oom", "oom", "same"),
        # issue 50: output off its reference, never timed, is a failure of its own
        ("ok", "incorrect", "regressed"),
        ("unsupported", "incorrect", "regressed"),
        ("incorrect", "ok", "improved"),
        ("error", "incorrect", "same"),
    ],
)
def test_status_changes_decide_before_timings(base: str, current: str, verdict: str) -> None:
    got = compare_case("k", [row(base)], [row(current)], Policy())
    assert (got.verdict, got.evidence, got.base_status, got.current_status) == (verdict, "status", base, current)


def test_new_missing_and_too_few_samples() -> None:
    assert compare_case("k", [], [row()], Policy()).verdict == "new"
    assert compare_case("k", [row()], [], Policy()).verdict == "missing"
    few = compare_case("k", [row(n=3)], [row(n=3, median=2e-3)], Policy())
    assert few.verdict == "noisy" and "fewer than 6 samples" in few.note and few.ci_low is None


def test_replicate_medians_are_between_process_evidence() -> None:
    base = row(replicate_medians_s=(1.00e-3, 1.01e-3, 0.99e-3))
    slower = row(median=1.1e-3, replicate_medians_s=(1.10e-3, 1.11e-3, 1.09e-3))
    got = compare_case("k", [base], [slower], Policy())
    assert (got.evidence, got.base_n, got.current_n, got.verdict) == ("processes", 3, 3, "regressed")
    # Processes that disagree by ±10 % cannot show a 10 % change: noisy, whatever the samples inside each say.
    wide = row(replicate_medians_s=(0.9e-3, 1.0e-3, 1.1e-3))
    assert compare_case("k", [wide], [slower], Policy()).verdict == "noisy"


def test_a_flaky_replicate_is_the_sides_status() -> None:
    got = compare_case("k", [row(), row()], [row(), row("crashed")], Policy())
    assert (got.verdict, got.current_status) == ("regressed", "crashed")
    assert "crashed in 1 of 2 runs" in got.note


# ---------------------------------------------------------------------------------------------- the fixtures


# The fixture runs hold one process a side: judged against a floor measured on the machine (here given), as after
# ``attnbench calibrate``; without one the default leaves only gross changes a verdict (test below).
MEASURED = 0.04


def test_fixture_verdicts() -> None:
    got = verdicts(BASE, CURRENT, noise_floor=MEASURED)
    assert got[("lstm", "forward", 64)] == "regressed"  # 25 % slower
    assert got[("sdpa-flash", "train", 16)] == "regressed"  # ok → oom
    assert got[("gru", "forward", 16)] == "improved"  # 25 % faster
    assert got[("vanilla", "forward", 16)] == "noisy"  # 4 % slower: neither inside 5 % nor surely beyond
    assert got[("lstm", "train", 16)] == "noisy"  # one sample
    assert got[("lstm", "forward", 32)] == "new"
    assert got[("sdpa-flash", "train", 64)] == "missing"
    assert got[("sdpa-efficient", "forward", 16)] == "same"  # unsupported on both
    assert got[("vanilla", "forward", 1048576)] == "same"  # oom on both
    assert got[("gru", "forward", 64)] == "same"


def test_a_run_against_itself_has_no_regression() -> None:
    comparison = compare_paths(BASE, BASE, Policy())
    assert not comparison.regressed and comparison.exit_code == 0
    assert {c.verdict for c in comparison.cases} <= {"same", "noisy"}


def test_golden_markdown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the markdown names the paths as given
    base, current = Path("tests/data/compare/base"), Path("tests/data/compare/current")
    comparison = compare_paths(base, current, Policy(noise_floor=MEASURED))
    check_golden("compare-base-current.md", render_compare_markdown(comparison))


def test_golden_markdown_with_processes_and_allowed_mismatch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run_set(tmp_path / "base", [0.99, 1.0, 1.01])
    run_set(tmp_path / "head", [1.089, 1.1, 1.111], derive.CURRENT_COMMIT, torch="2.14.0+cpu")
    policy = Policy(thresholds=Thresholds(0.05, {"lstm": 0.08}), allow_mismatch=frozenset({"torch"}))
    comparison = compare_paths(Path("base"), Path("head"), policy)
    assert {c.evidence for c in comparison.cases} == {"processes", "status"}
    check_golden("compare-processes.md", render_compare_markdown(comparison))


def test_folders_of_runs_are_processes(tmp_path: Path) -> None:
    aa = verdicts(run_set(tmp_path / "a", [0.99, 1.0, 1.01]), run_set(tmp_path / "b", [1.005, 0.995, 1.0]))
    timed = {k: v for k, v in aa.items() if k[2] != 1048576 and k[0] != "sdpa-efficient"}
    assert set(timed.values()) == {"same"}
    slower = verdicts(tmp_path / "a", run_set(tmp_path / "c", [1.09, 1.10, 1.11]))
    assert slower[("lstm", "forward", 64)] == "regressed"


def noisy_set(folder: Path, centre: float, commit: str = derive.BASE_COMMIT) -> Path:
    """A folder of 5 runs of base's rows around ``centre``: each timed case of run i off by 8 % · cos(2π(i + k)/5)
    (k its place among the timed cases), which sums to nothing over a run's cases, plus at most 1 % that moves a
    whole run. Too wide for any one case to see a 10 % change through; the runs as wholes agree to 1 %."""
    run, rows = derive.read_run(BASE)
    timed = [n for n, r in enumerate(rows) if r["status"] == "ok" and r.get("measurement")]
    for i, whole in enumerate((1.0, 1.01, 0.99, 1.005, 0.995)):
        member = derive.with_run(run, f"20261202-15{commit[0]}00{i}-tiny-fixture-cpu", commit)
        off = {n: 0.08 * math.cos(2 * math.pi * (i + k) / 5) for k, n in enumerate(timed)}
        moved = [derive.scaled(r, centre * whole * math.exp(off.get(n, 0.0))) for n, r in enumerate(rows)]
        derive.write_run(folder / member["run_id"], member, moved)
    return folder


def test_every_case_together_catches_what_no_single_case_can(tmp_path: Path) -> None:
    base = noisy_set(tmp_path / "base", 1.0)
    slower = compare_paths(base, noisy_set(tmp_path / "slower", 1.10, derive.CURRENT_COMMIT), Policy())
    timed = [c for c in slower.cases if c.evidence == "processes"]
    assert len(timed) >= 5 and not slower.of("regressed")  # 10 % slower everywhere, yet no case can tell alone
    overall = slower.overall
    assert overall is not None and (overall.base_runs, overall.current_runs, overall.cases) == (5, 5, len(timed))
    assert overall.verdict == "regressed" and overall.ci_low > 1.05 and overall.ci_low < 1.10 < overall.ci_high
    assert slower.regressed and slower.exit_code == 1 and slower.to_dict()["overall"]["verdict"] == "regressed"
    text = render_compare_markdown(slower)
    heading = text.splitlines()[0]
    assert heading.startswith("## ") and "regression" in heading and numbers(heading) == [10.0]  # +10.0 % overall
    # The overall line: how many cases, how many runs a side, the change and its verdict.
    assert mentions(text.splitlines(), "**regressed**", values=(len(timed), 5, 10.0, 8.7, 11.3))
    # Unchanged code with the same noise: never a regression, overall or per case.
    same = compare_paths(base, noisy_set(tmp_path / "again", 1.0, derive.CURRENT_COMMIT), Policy())
    assert same.overall is not None and same.overall.verdict == "same" and not same.regressed
    # One run a side has no runs to score: no overall verdict.
    assert compare_paths(BASE, CURRENT, Policy()).overall is None


def test_the_overall_rule_wants_significance_and_the_estimate_beyond_the_threshold() -> None:
    assert overall_rule(1.07, 1.02, 1.12, 0.05) == "regressed"  # a case would need the whole interval above 1.05
    assert overall_rule(1.03, 1.01, 1.06, 0.05) == "noisy"  # significant, but not by the threshold
    assert overall_rule(1.07, 0.99, 1.15, 0.05) == "noisy"  # beyond the threshold, but not significant
    assert overall_rule(0.93, 0.88, 0.98, 0.05) == "improved"
    assert overall_rule(1.01, 0.97, 1.04, 0.05) == "same"


def test_the_overall_rule_keeps_its_error_rates_over_many_comparisons() -> None:
    """Ten runs a side whose scores spread 6 % (a noisy 2-vCPU VM): unchanged code regresses in at most ~2.5 % of
    comparisons, and a 10 % slowdown is caught in nine of ten, where the whole-interval rule catches a third."""
    rng = random.Random(17)

    def judged(shift: float) -> tuple[str, bool]:
        base = [math.exp(rng.gauss(0.0, 0.06)) for _ in range(10)]
        current = [math.exp(rng.gauss(math.log1p(shift), 0.06)) for _ in range(10)]
        ratio, lo, hi = process_ratio_ci(base, current)
        return overall_rule(ratio, lo, hi, 0.05), lo > 1.05

    trials = 2000
    aa = [judged(0.0)[0] for _ in range(trials)]
    assert aa.count("regressed") / trials < 0.035 and aa.count("improved") / trials < 0.035
    power = [judged(0.10) for _ in range(trials)]
    assert sum(v == "regressed" for v, _ in power) / trials > 0.85
    assert sum(whole for _, whole in power) / trials < 0.5


def test_a_noisy_overall_verdict_says_how_many_runs_would_decide_it(tmp_path: Path) -> None:
    """Three runs a side that differ by 10 % as wholes: no verdict, and the runs a side an interval within the
    threshold would take at that spread, which then holds when simulated."""
    base = run_set(tmp_path / "a", [0.9, 1.0, 1.1])
    noisy = compare_paths(base, run_set(tmp_path / "b", [0.92, 1.02, 1.12], derive.CURRENT_COMMIT), Policy())
    o = noisy.overall
    assert o is not None and o.verdict == "noisy" and 0.09 < o.spread < 0.11
    assert o.runs_needed == runs_for_interval(math.log1p(o.spread), 0.05) and o.runs_needed > 3
    assert noisy.to_dict()["overall"]["runs_needed"] == o.runs_needed
    text = render_compare_markdown(noisy)
    assert mentions(text.splitlines(), values=(o.runs_needed, 5))  # the runs a side a ±5 % interval needs
    # Where the runs agree, no advice: the verdict stands on the runs there are.
    tight = run_set(tmp_path / "c", [0.99, 1.0, 1.01])
    agreed = compare_paths(tight, run_set(tmp_path / "d", [0.995, 1.0, 1.005], derive.CURRENT_COMMIT), Policy())
    assert agreed.overall is not None and agreed.overall.verdict == "same"
    assert "runs a side" not in render_compare_markdown(agreed)


def test_runs_for_an_interval_within_the_threshold() -> None:
    # t(24) · 0.06 · √(2/13) = 0.0486 ≤ ln 1.05 = 0.0488, while t(22) · 0.06 · √(2/12) = 0.0508 is not.
    assert runs_for_interval(0.06, 0.05) == 13
    assert runs_for_interval(0.0, 0.05) == 2 and runs_for_interval(1.0, 0.01, most=50) == 50
    # Simulated at that spread with that many runs, intervals are ±5 % wide on average.
    rng = random.Random(3)
    halves = []
    for _ in range(500):
        base = [math.exp(rng.gauss(0.0, 0.06)) for _ in range(13)]
        current = [math.exp(rng.gauss(0.0, 0.06)) for _ in range(13)]
        _, lo, hi = process_ratio_ci(base, current)
        halves.append(math.log(hi / lo) / 2)
    assert statistics.fmean(halves) == pytest.approx(math.log1p(0.05), rel=0.05)


def timed_at(folder: Path, start: str) -> Path:
    """Time the runs of ``folder`` (in run id order) half a second each, 20 s apart, from ``start`` (HH:MM:SS)."""
    h, m, s = (int(x) for x in start.split(":"))
    for i, member in enumerate(sorted(p for p in folder.iterdir() if (p / "run.json").is_file())):
        data = json.loads((member / "run.json").read_text())
        second = h * 3600 + m * 60 + s + 20 * i
        stamp = f"2026-12-03T{second // 3600:02d}:{second // 60 % 60:02d}:{second % 60:02d}.000000Z"
        data["created_utc"], data["finished_utc"] = stamp, stamp.replace(".000000Z", ".500000Z")
        (member / "run.json").write_text(json.dumps(data))
    return folder


def test_folders_timed_in_separate_windows_are_told_what_their_interval_cannot_show(tmp_path: Path) -> None:
    """A folder's spread is within its window: the machine's drift between the two windows is not in it."""
    base = timed_at(run_set(tmp_path / "a", [0.99, 1.0, 1.01]), "15:00:00")
    later = timed_at(run_set(tmp_path / "b", [1.005, 0.995, 1.0], derive.CURRENT_COMMIT), "15:10:00")
    separate = compare_paths(base, later, Policy()).warnings
    (warning,) = [w for w in separate if "15:10" in w]  # the two windows, each side's
    assert "2026-12-03 15:00" in warning and "2026-12-03 15:10" in warning
    # Alternated (the current's runs fall between the base's): one window, nothing to say.
    interleaved = timed_at(run_set(tmp_path / "c", [1.005, 0.995, 1.0], derive.CURRENT_COMMIT), "15:00:10")
    together = compare_paths(base, interleaved, Policy()).warnings
    assert len(together) == len(separate) - 1 and not [w for w in together if "2026-12-03 15:0" in w]
    # One run a side is judged on its samples and the measured floor, not on a spread: nothing to say either.
    first = min((tmp_path / "a").iterdir())
    one = timed_at(run_set(tmp_path / "d", [1.0]), "16:00:00")
    assert not [w for w in compare_paths(first, one, Policy()).warnings if "separate windows" in w]


def test_json_output_schema() -> None:
    data = compare_paths(BASE, CURRENT, Policy(noise_floor=MEASURED)).to_dict()
    assert data["schema"] == "attnbench.compare/1" and data["regressed"] is True and data["exit_code"] == 1
    assert data["counts"] == {"regressed": 2, "improved": 1, "same": 5, "noisy": 3, "new": 1, "missing": 1}
    assert data["policy"]["noise_floor"] == MEASURED
    one = next(c for c in data["cases"] if c["verdict"] == "improved")
    assert one["case"]["model"] == "gru" and one["ratio"] == pytest.approx(0.75)
    assert one["ci_low"] < 0.75 < one["ci_high"] and one["evidence"] == "samples"
    json.dumps(data, allow_nan=False)


# ---------------------------------------------------------------------------------------------- refusal


@pytest.mark.parametrize(
    ("key", "field", "value"),
    [
        ("gpu_name", "gpu_name", "NVIDIA H100"),
        ("driver_major", "driver", "560.35.03"),
        ("torch", "torch", "2.14.0+cpu"),
        ("torch_cuda", "torch_cuda", "12.4"),
        ("cudnn", "cudnn", "90100"),
        ("torch_threads", "torch_threads", 16),
        ("cpu_model", "cpu_model", "Intel Xeon"),
    ],
)
def test_fingerprint_mismatch_is_refused(tmp_path: Path, key: str, field: str, value: object) -> None:
    other = edited(tmp_path / "other", **{field: value})
    with pytest.raises(NotComparableError) as info:
        compare_paths(BASE, other, Policy())
    assert f"{key}: " in info.value.message and repr(value if field != "driver" else "560") in info.value.message
    assert info.value.exit_code == 3 and f"--allow-mismatch {key}" in info.value.hint
    allowed = compare_paths(BASE, other, Policy(allow_mismatch=frozenset({key})))
    assert [m.key for m in allowed.allowed] == [key]


def test_config_and_dtype_mismatch_is_refused(tmp_path: Path) -> None:
    run, rows = derive.read_run(BASE)
    run["config_sha256"] = "0" * 64
    run["config"]["dtype"] = ["bfloat16"]
    other = derive.write_run(tmp_path / "other", run, rows)
    with pytest.raises(NotComparableError) as info:
        compare_paths(BASE, other, Policy())
    assert mentions(info.value.message.split("; "), "dtypes", "'float32'", "'bfloat16'")  # the key and both values
    assert "config_sha256" in info.value.message
    assert {"dtypes", "config_sha256"} <= set(HARD_KEYS)


def test_runs_of_one_side_must_agree(tmp_path: Path) -> None:
    folder = run_set(tmp_path / "set", [1.0, 1.0])
    first = sorted(folder.iterdir())[1]
    run = json.loads((first / "run.json").read_text())
    run["environment"]["torch"] = "2.14.0+cpu"
    (first / "run.json").write_text(json.dumps(run))
    with pytest.raises(NotComparableError) as info:
        compare_paths(folder, BASE, Policy())
    assert "torch" in info.value.message  # what differs between the runs of one side


def test_missing_or_empty_base_is_no_baseline(tmp_path: Path) -> None:
    with pytest.raises(NoBaselineError) as info:
        compare_paths(tmp_path / "nothing", CURRENT, Policy())
    assert info.value.exit_code == 4 and "results/baselines" in info.value.hint
    (tmp_path / "empty").mkdir()
    with pytest.raises(NoBaselineError, match="holds no run"):
        compare_paths(tmp_path / "empty", CURRENT, Policy())
    run, _ = derive.read_run(BASE)
    with pytest.raises(NoBaselineError, match="no results"):
        compare_paths(derive.write_run(tmp_path / "norows", run, []), CURRENT, Policy())


def test_injected_slowdown_is_a_warning(tmp_path: Path) -> None:
    run, rows = derive.read_run(BASE)
    for r in rows:
        if r["measurement"]:
            r["measurement"]["injected_delay_s"] = 1e-5
    slowed = derive.write_run(tmp_path / "slowed", run, rows)
    comparison = compare_paths(BASE, slowed, Policy())
    assert any("--inject-slowdown" in w for w in comparison.warnings)


# ---------------------------------------------------------------------------------------------- the command


def cli(*args: str) -> Any:
    return runner.invoke(app, ["compare", *args])


def test_cli_exit_0_without_regression() -> None:
    result = cli(str(BASE), str(BASE), "--format", "md")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("## ") and "0 regressed" in result.stdout


def test_cli_exit_1_on_regression_after_writing_the_output(tmp_path: Path) -> None:
    out = tmp_path / "compare.md"
    result = cli(str(BASE), str(CURRENT), "--noise-floor", "4%", "--format", "md", "-o", str(out))
    assert result.exit_code == 1
    heading = out.read_text().splitlines()[0]
    assert heading.startswith("## ") and numbers(heading) == [2]  # written before the exit: 2 cases regressed


def test_cli_thresholds_can_clear_a_regression(tmp_path: Path) -> None:
    limits = tmp_path / "t.yaml"
    limits.write_text("default: 5%\nlstm: 40%\n")
    result = cli(str(BASE), str(CURRENT), "--noise-floor", "4%", "--thresholds", str(limits), "--format", "json")
    data = json.loads(result.output)
    lstm = next(c for c in data["cases"] if c["case"]["model"] == "lstm" and c["case"]["seq_len"] == 64)
    assert lstm["verdict"] == "same" and lstm["threshold"] == pytest.approx(0.40)
    assert result.exit_code == 1  # the oom is still a regression


@pytest.mark.parametrize(
    "args",
    [
        ["--fail-on", "mean:5%"],
        ["--noise-floor", "lots"],
        ["--allow-mismatch", "hostname"],
        ["--thresholds", "no-such-file.yaml"],
        ["--format", "html"],
    ],
)
def test_cli_exit_2_on_bad_flags(args: list[str]) -> None:
    result = cli(str(BASE), str(CURRENT), *args)
    assert result.exit_code == 2
    assert "Traceback" not in result.output


def test_cli_exit_2_on_a_bad_current(tmp_path: Path) -> None:
    assert cli(str(BASE), str(tmp_path / "missing")).exit_code == 2
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "run.json").write_text("{")
    result = cli(str(BASE), str(tmp_path / "broken"))
    assert result.exit_code == 2 and "run.json" in result.output


def test_cli_exit_3_refused_with_both_values(tmp_path: Path) -> None:
    other = edited(tmp_path / "other", gpu_name="NVIDIA H100", torch="2.14.0+cpu")
    result = cli(str(BASE), str(other))
    assert result.exit_code == 3
    said = " ".join(result.output.split())
    assert mentions(said, "gpu_name", "None", "'NVIDIA H100'") and mentions(
        said, "torch", "'2.13.0+cpu'", "'2.14.0+cpu'"
    )
    allowed = cli(str(BASE), str(other), "--allow-mismatch", "gpu_name", "--allow-mismatch", "torch", "-f", "md")
    assert allowed.exit_code == 0, allowed.output
    assert "--allow-mismatch" in allowed.output and "NVIDIA H100" in allowed.output  # what was compared despite


def test_cli_exit_4_without_baseline(tmp_path: Path) -> None:
    result = cli(str(tmp_path / "results" / "baselines" / "gpu"), str(CURRENT))
    assert result.exit_code == 4
    assert "no such run folder" in result.output and "hint:" in result.output


def test_cli_table_and_noise_floor_default() -> None:
    # Neither fixture run recorded a measured floor: the 25 % timings are noisy, the ok → oom still fails.
    result = cli(str(BASE), str(CURRENT))
    assert result.exit_code == 1
    default = {"regressed": 1, "improved": 0, "same": 2, "noisy": 8, "new": 1, "missing": 1}
    assert json.loads(cli(str(BASE), str(CURRENT), "-f", "json").stdout)["counts"] == default
    assert all(f"{count} {verdict}" in result.output for verdict, count in default.items())  # the table says so
    # Said on stderr: the default floor in use (100 %), and how to measure one instead.
    warning = " ".join(result.stderr.split())
    assert mentions(warning, "attnbench calibrate", "timing.processes", values=(100 * DEFAULT_NOISE_FLOOR,))
    measured = cli(str(BASE), str(CURRENT), "--noise-floor", "4%", "-f", "json")
    floor = {"regressed": 2, "improved": 1, "same": 5, "noisy": 3, "new": 1, "missing": 1}
    assert json.loads(measured.stdout)["counts"] == floor
    help_text = " ".join(runner.invoke(app, ["compare", "--help"]).output.split())
    assert f"else {DEFAULT_NOISE_FLOOR:.0%})]" in help_text and "attnbench calibrate" in help_text

    assert all(key in help_text for key in HARD_KEYS)
