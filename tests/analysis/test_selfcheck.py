"""selfcheck: the per-round ratio, the gate, the table and markdown, and a real quick run on CPU."""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analysis import selfcheck
from attnbench.analysis.selfcheck import OpCheck, Reference, SelfcheckReport, judge, summary_line
from attnbench.cli import app
from attnbench.core.cases import TimingPolicy
from attnbench.core.errors import EXIT_CASE_FAILED, EXIT_INCONCLUSIVE
from attnbench.instrument import agreement as measure_selfcheck
from attnbench.instrument.agreement import ops_for, policy_for
from attnbench.report.selfcheck_md import render_markdown, selfcheck_dict, table_rows
from attnbench.results.selfcheck import DO_BENCH, TIMER, OpTimings, SelfcheckOp, SelfcheckTimings
from tests.support import mentions, numbers

runner = CliRunner()


def loose_policy() -> TimingPolicy:
    """The quick check's policy with its max_case_s (which the budget arithmetic reads), but one that converges
    at once: the tests of rounds and budgets need rounds that end, not medians anyone reads."""
    return replace(policy_for(True), target_ci=0.5, min_samples=3, min_time_s=0.005, warmup_max_s=0.01, warmup_audit=0)


MATMUL = SelfcheckOp("matmul", "float32", size=512)


def check(ours: tuple[float, ...], timer: tuple[float, ...], bench: tuple[float, ...] | None = None) -> OpCheck:
    refs = [Reference(TIMER, timer, ours)]
    if bench is not None:
        refs.append(Reference(DO_BENCH, bench, ours))
    return OpCheck(MATMUL, ours, tuple(refs))


def report(*checks: OpCheck, timers: tuple[str, ...] = (TIMER,)) -> SelfcheckReport:
    return SelfcheckReport(SelfcheckTimings("cpu", "Test CPU", "2.13.0", 2, 3, timers, (), ("a note",)), checks)


def test_ratio_is_the_median_of_per_round_ratios() -> None:
    # Round 2 ran while the machine slowed both timers down 2×: per-round ratios cancel that drift, a ratio of
    # medians would not.
    ref = Reference(TIMER, medians_s=(1e-3, 2e-3, 1e-3), ours_s=(1.01e-3, 2.04e-3, 0.99e-3))
    assert ref.ratios == pytest.approx((1.01, 1.02, 0.99))
    assert ref.ratio == pytest.approx(1.01)
    assert ref.median_s == pytest.approx(1e-3)
    assert ref.gated and not ref.failed


@pytest.mark.parametrize(
    ("ours", "theirs", "gated", "failed"),
    [
        (1.049e-3, 1e-3, True, False),  # within ±5 %
        (1.051e-3, 1e-3, True, True),
        (0.949e-3, 1e-3, True, True),
        (2e-5, 1e-5, False, False),  # 10 µs: shown, not gated, however far off
        (1.2e-4, 1e-4, True, True),  # exactly 100 µs is gated
    ],
)
def test_gate_against_torch_utils_benchmark(ours: float, theirs: float, gated: bool, failed: bool) -> None:
    ref = Reference(TIMER, (theirs,) * 3, (ours,) * 3)
    assert ref.gated is gated and ref.failed is failed


def test_widely_spread_rounds_are_called_noisy() -> None:
    calm = check((1.0e-3, 1.1e-3, 1.0e-3), (1e-3,) * 3)  # spread 10 %
    loud = check((1.0e-3, 1.3e-3, 1.0e-3), (1e-3,) * 3)  # spread 30 %: still passes, but says why to rerun
    assert not calm.references[0].noisy and loud.references[0].noisy and loud.verdict.startswith("inconclusive")
    assert selfcheck.noise_note(report(calm)) is None
    note = selfcheck.noise_note(report(calm, loud))
    assert note is not None and numbers(note)[:2] == [20, 1]  # spread beyond 20 % for 1 gated op
    assert "- " + note in render_markdown(report(loud))
    small = check((1e-5, 3e-5, 1e-5), (1e-5,) * 3)  # not gated: its noise does not matter
    assert selfcheck.noise_note(report(small)) is None


def test_do_bench_gate_is_tighter() -> None:
    ref = Reference(DO_BENCH, (1e-3,) * 3, (1.04e-3,) * 3)
    assert ref.tolerance == 0.03 and ref.failed
    assert not Reference(TIMER, (1e-3,) * 3, (1.04e-3,) * 3).failed


def test_verdicts() -> None:
    # The outcome first, then both times, the difference with its interval, and the tolerance.
    passing = check((1e-3,) * 3, (1e-3,) * 3)
    assert passing.verdict.startswith(passing.outcome) and passing.outcome == "pass"
    assert mentions(passing.verdict, TIMER, "1 ms", values=(0.0,)) and numbers(passing.verdict)[-1] == 5

    assert check((1e-5,) * 3, (2e-5,) * 3).verdict == "not gated (< 100 µs)"
    failing = check((1e-3,) * 3, (1e-3,) * 3, bench=(0.95e-3,) * 3)
    assert failing.outcome == "fail" and failing.verdict.startswith("FAIL")
    assert mentions(failing.verdict, DO_BENCH, "950 µs", values=(5.3, 3))  # +5.3 %, beyond do_bench's ±3 %
    assert OpCheck(MATMUL, skipped="no kernel").verdict == "skipped: no kernel"


def test_gated_on_attnbench_time_not_the_references() -> None:
    # Issue 17: a 15 µs matmul was gated because the reference said 30 µs. attnbench's own time decides.
    fast = check((15.1e-6,) * 5, (30.4e-6,) * 5)
    assert not fast.references[0].gated and fast.outcome == "not gated"
    slow = check((150e-6,) * 5, (30e-6,) * 5)
    assert slow.outcome == "fail" and mentions(slow.verdict, "150 µs", "30 µs", values=(400.0,))


@pytest.mark.parametrize(
    ("ratios", "outcome"),
    [
        ((1.06, 1.07, 1.065, 1.068, 1.062, 1.07, 1.064), "fail"),  # every round beyond +5 %: the interval too
        ((1.01, 0.99, 1.0, 1.02, 0.995, 1.005, 1.0), "pass"),
        # Issue 17: quiet VM, rounds 0.58–1.17: +6.6 % was called a failure. Now it cannot be told apart.
        ((0.58, 1.17, 1.066, 0.9, 1.1, 1.08, 1.05), "inconclusive"),
        ((1.066,), "inconclusive"),  # one round: no interval at all
    ],
)
def test_fail_pass_and_inconclusive_come_from_the_interval_over_rounds(ratios: tuple[float, ...], outcome: str) -> None:
    ours = tuple(1e-3 * r for r in ratios)
    op = check(ours, (1e-3,) * len(ratios))
    assert op.outcome == outcome and op.references[0].outcome == outcome
    expected = {"fail": EXIT_CASE_FAILED, "inconclusive": EXIT_INCONCLUSIVE, "pass": 0}[outcome]
    assert report(op).exit_code == expected
    assert selfcheck.decided(OpTimings(MATMUL, ours, ((TIMER, (1e-3,) * len(ratios)),))) is (outcome != "inconclusive")


@pytest.mark.slow
def test_adaptive_rounds_stop_once_decided_and_never_past_the_budget() -> None:
    import torch

    op = SelfcheckOp("matmul", "float32", size=64)
    policy = loose_policy()
    asked: list[int] = []

    def decided(t: OpTimings) -> bool:
        asked.append(len(t.ours_s))
        return len(t.ours_s) >= 4

    cpu = torch.device("cpu")
    timed = measure_selfcheck._check_op(OpTimings(op), cpu, policy, (2, 6), 0.01, [TIMER], None, decided)
    assert len(timed.ours_s) == 4 and len(dict(timed.references)[TIMER]) == 4
    assert asked == [2, 3, 4]  # asked only once the rounds asked for were done
    capped = measure_selfcheck._check_op(OpTimings(op), cpu, policy, (2, 3), 0.01, [TIMER], None, lambda t: False)
    assert len(capped.ours_s) == 3
    more = measure_selfcheck._check_op(capped, cpu, policy, (5, 5), 0.01, [TIMER], None, None)
    assert more.ours_s[:3] == capped.ours_s and len(more.ours_s) == 5  # rounds continue from those it had


class FakeClock:
    """A monotonic clock that moves ``step`` seconds at every reading: time passes only where code asks for it."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


@pytest.mark.slow
def test_no_round_starts_that_would_not_end_within_its_slice() -> None:
    import torch

    op = SelfcheckOp("matmul", "float32", size=64)
    policy = loose_policy()  # a round takes at most 1 s + 2 × 0.01 s before one has run
    cpu = torch.device("cpu")
    clock = FakeClock(0.25)  # every reading 0.25 s later: a round reads it at its start and end, so "takes" 0.25 s
    none = measure_selfcheck._check_op(OpTimings(op), cpu, policy, (3, 3), 0.01, [TIMER], None, None, 1.0, clock)
    assert none.ours_s == ()  # 1.02 s could not fit before t = 1: not started
    clock = FakeClock(0.25)
    some = measure_selfcheck._check_op(OpTimings(op), cpu, policy, (9, 9), 0.01, [TIMER], None, None, 3.0, clock)
    # The first round needs 1.02 s of room, later ones the 0.25 s the first took: rounds end at 0.75, 1.25, …, 2.75.
    assert len(some.ours_s) == 5


@pytest.mark.slow
def test_the_budget_bounds_the_whole_check_and_says_when_it_ended_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(measure_selfcheck, "policy_for", lambda quick: loose_policy())
    # A round's block is sized from the op's real call time (8 calls when longer than min_run_time): under load an
    # lstm call of 30 ms made its first round look too long for its slice. Fixed here, so the fake clock alone
    # decides what fits.
    monkeypatch.setattr(measure_selfcheck, "block_s_for", lambda call_s, min_run_time: min_run_time)
    clock = FakeClock(0.5)
    # 24 s of readings at 0.5 s: every op's first-pass slice holds three or four rounds (at 20 s, two of them had
    # exactly the two asserted below: no room for one reading more).
    timings = measure_selfcheck.run_selfcheck(
        "cpu", quick=True, rounds=3, decided=lambda t: False, max_rounds=50, budget_s=24.0, now=clock
    )
    # Time passes only at readings here: the few taken after the last round (by the fake clock, 0.5 s each) aside,
    # the rounds end within the budget.
    assert timings.budget_s == 24.0 and timings.elapsed_s is not None and timings.elapsed_s <= 24.0 + 3 * 0.5
    rounds = [(t.op.name, len(t.ours_s), t.skipped, t.cut_short) for t in timings.ops]
    assert all(len(t.ours_s) >= 2 for t in timings.ops), rounds  # every op had its slice of the first pass
    assert all(t.cut_short for t in timings.ops), rounds  # never decided, rounds left: the budget ended them
    # No verdict is asserted: it comes from these real rounds (on a loaded machine, a clear disagreement is FAILED
    # however the budget ended), and what the summary says of a cut-short op is tested on fixed timings below.
    ample = measure_selfcheck.run_selfcheck(
        "cpu", quick=True, rounds=2, decided=lambda t: True, budget_s=1000.0, now=FakeClock(0.5)
    )
    assert [len(t.ours_s) for t in ample.ops] == [2] * len(ample.ops) and not any(t.cut_short for t in ample.ops)


def test_the_summary_says_the_budget_not_the_machine_ended_it() -> None:
    undecided = OpTimings(MATMUL, (0.9e-3, 1.1e-3, 1.05e-3), ((TIMER, (1e-3,) * 3),), cut_short=True)
    timed = SelfcheckTimings("cpu", "Test CPU", "2.13.0", 2, 3, (TIMER,), (undecided,), budget_s=120.0)
    line = selfcheck.summary_line(judge(timed))
    assert mentions(line, "--budget-s", "2 min", values=(1,))  # the budget, not the machine, left 1 of 1 undecided


def test_an_op_the_budget_left_no_round_for_is_undecided_not_a_crash() -> None:
    """The budget can end before an op's first round: the report is still judged, rendered and exits 5."""
    empty = OpTimings(MATMUL, (), ((TIMER, ()),), cut_short=True)
    timed = SelfcheckTimings("cpu", "Test CPU", "2.13.0", 2, 3, (TIMER,), (empty,), budget_s=120.0)
    judged = judge(timed)
    assert [c.outcome for c in judged.checks] == ["inconclusive"] and judged.exit_code == EXIT_INCONCLUSIVE
    assert render_markdown(judged) and table_rows(judged) and summary_line(judged)
    stored = json.loads(json.dumps(selfcheck_dict(judged), allow_nan=False))  # valid JSON: no NaN for the empty op
    assert stored["exit_code"] == EXIT_INCONCLUSIVE and stored["ops"][0]["references"][0]["ratio"] is None


def test_report_failures_and_summary_line() -> None:
    good, bad, small = (
        check((1e-3,) * 3, (1e-3,) * 3),
        check((1.2e-3,) * 3, (1e-3,) * 3),
        check((1e-5,) * 3, (3e-5,) * 3),
    )
    assert report(good, small).failures == []
    assert numbers(summary_line(report(good, small))) == [1]  # 1 gated op (small is not gated)
    assert report(good, bad, small).failures == [bad]
    failed = summary_line(report(good, bad))
    assert numbers(failed)[:2] == [1, 2] and bad.op.name in failed  # 1 of 2 disagree, and which
    assert failed != summary_line(report(good, good))


def test_table_and_markdown() -> None:
    skipped = OpCheck(SelfcheckOp("sdpa-flash", "bfloat16"), skipped="FLASH_ATTENTION: no kernel | here")
    r = report(check((1e-3, 1.01e-3, 1e-3), (1e-3, 1e-3, 1e-3), (1e-3,) * 3), skipped, timers=(TIMER, DO_BENCH))
    header, rows = table_rows(r)
    assert header == [
        "op",
        "shape",
        "dtype",
        "attnbench",
        TIMER,
        f"ratio vs {TIMER} (rounds min–max)",
        DO_BENCH,
        f"ratio vs {DO_BENCH} (rounds min–max)",
        "verdict",
    ]
    assert rows[0] == [
        "matmul",
        "512×512 · 512×512",
        "float32",
        "1 ms",
        "1 ms",
        "1.000 (1.000–1.010)",
        "1 ms",
        "1.000 (1.000–1.010)",
        rows[0][-1],
    ]
    assert rows[0][-1] == r.checks[0].verdict
    assert rows[1][3:-1] == ["—"] * 5 and rows[1][-1].startswith("skipped: ")
    text = render_markdown(r)
    heading = text.splitlines()[0]
    assert heading.startswith("# ") and "cpu" in heading and "Test CPU" in heading
    assert "| " + " | ".join(header) + " |" in text
    assert "no kernel \\| here" in text  # a pipe inside a cell is escaped
    assert "- a note" in text and f"**{summary_line(r)}**" in text


@pytest.mark.parametrize("device_type", ["cpu", "cuda"])
@pytest.mark.parametrize("quick", [False, True])
def test_the_op_list(device_type: str, quick: bool) -> None:
    ops = ops_for(device_type, quick=quick)
    names = {op.name for op in ops}
    assert {"matmul", "sdpa-flash", "lstm"} <= names
    if not quick:
        assert names == {"matmul", "sdpa-flash", "vanilla", "lstm"}
        assert all(sum(op.name == name for op in ops) >= 2 for name in names)  # a few sizes each
    for op in ops:
        assert (op.case is None) == (op.name == "matmul")
        if op.case is not None:
            assert op.case.mode == "forward" and op.case.dtype == op.dtype
            assert op.case.device.startswith(device_type)


def test_policies() -> None:
    from attnbench.core.cases import TimingPolicy

    assert policy_for(False) == replace(TimingPolicy(), max_case_s=2.0)  # a round's most: the budget is shared
    assert policy_for(True).max_case_s == 1.0


def test_the_quick_gpu_list_is_a_verdict_that_fits_a_short_lease() -> None:
    """One op per family, each long enough to be gated (≥ 100 µs) on an H200, and few enough that 3 rounds of
    three timers fit well inside the GPU check's selfcheck step (before: 3 tiny ops, none gated)."""
    from attnbench.core.peaks import vendor_peak
    from attnbench.families.flops import count_flops
    from attnbench.instrument.agreement import QUICK_MAX_CASE_S, QUICK_MIN_RUN_TIME_S, QUICK_ROUNDS

    ops = ops_for("cuda", quick=True)
    assert [op.name for op in ops] == ["matmul", "sdpa-flash", "vanilla", "lstm"]
    h200 = vendor_peak("NVIDIA H200")
    assert h200 is not None
    for op in ops:
        if op.case is None:
            assert op.size is not None and 2 * op.size**3 / h200.flops("bfloat16") >= 100e-6  # type: ignore[operator]
        elif op.name == "lstm":
            assert op.case.seq_len >= 100  # ≥ 100 dependent steps, each more than a µs
        else:
            assert count_flops(op.case).flops / h200.flops(op.dtype) >= 100e-6  # type: ignore[operator]
    # attnbench's cap, torch's min_run_time and do_bench's ~125 ms, per round and op, with room for building.
    worst_s = len(ops) * QUICK_ROUNDS * (QUICK_MAX_CASE_S + QUICK_MIN_RUN_TIME_S + 0.5)
    assert worst_s <= 30


def test_flush_free_do_bench_times_without_its_l2_flush() -> None:
    """do_bench zeroes a 256 MiB buffer its driver hands it before every call; flush-free, the driver hands it an
    empty one for the call's duration, and the method is back afterwards. (triton's own code path, driven by a
    stand-in with do_bench's use of its driver: triton is not installed here.)"""
    import torch

    from attnbench.instrument.agreement import flush_free

    class Driver:
        def get_empty_cache_for_benchmark(self) -> torch.Tensor:
            return torch.empty(256 * 2**20 // 4, dtype=torch.int32)

        def clear_cache(self, cache: torch.Tensor) -> None:
            cache.zero_()

    driver = Driver()
    flushed: list[int] = []

    def do_bench(fn: object, return_mode: str = "mean") -> float:
        cache = driver.get_empty_cache_for_benchmark()
        driver.clear_cache(cache)
        flushed.append(cache.numel() * cache.element_size())
        return 1.5

    timed = flush_free(do_bench, driver, device="cpu")
    assert timed(lambda: None, return_mode="median") == 1.5
    assert flushed == [0]
    assert driver.get_empty_cache_for_benchmark().numel() * 4 == 256 * 2**20  # restored


@pytest.mark.slow
def test_quick_selfcheck_on_cpu(tmp_path: Path) -> None:
    # A real run. Whether it passes depends on how loaded the machine is, so only the structure is asserted; one
    # round (--quick's default of three, and the rounds added to reach a verdict, are the budget tests': 10-20 s here).
    out = tmp_path / "selfcheck.md"
    args = ["selfcheck", "--device", "cpu", "--quick", "--rounds", "1", "--max-rounds", "1", "-o", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code in (0, 1, EXIT_INCONCLUSIVE), result.output
    for text in ("attnbench", TIMER, "verdict", "matmul", "sdpa-flash", "vanilla", "lstm", "1 paired round;"):
        assert text in result.output
    assert result.output.count("2 min") >= 2 and "--budget-s" in result.output  # said before, and how much was used
    # Invoked inside this test session, the budget starts at the call, not at the session's start.
    took = re.search(r"took (.+?) of its 2 min", result.output)
    assert took is not None and "min" not in took[1], took[0]
    assert ("selfcheck passed" in result.output) == (result.exit_code == 0)
    text = out.read_text()
    assert text.startswith("# ") and "cpu" in text.splitlines()[0]
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(table) == 2 + len(ops_for("cpu", quick=True))  # header, rule, one row per op
    assert DO_BENCH not in text  # no GPU here


def timings(ours: tuple[float, ...], timer: tuple[float, ...]) -> SelfcheckTimings:
    return SelfcheckTimings("cpu", "Test CPU", "2.13.0", 2, 3, (TIMER,), (OpTimings(MATMUL, ours, ((TIMER, timer),)),))


def test_judge_keeps_every_round() -> None:
    judged = judge(timings((1.0e-3, 1.1e-3, 0.9e-3), (1e-3,) * 3))
    assert judged.checks == (check((1.0e-3, 1.1e-3, 0.9e-3), (1e-3,) * 3),)
    assert judged.timings.device == "cpu" and judged.timings.rounds == 3


def test_a_disagreement_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    failing = timings((1.2e-3,) * 3, (1e-3,) * 3)
    monkeypatch.setattr(measure_selfcheck, "run_selfcheck", lambda *args, **kwargs: failing)
    result = runner.invoke(app, ["selfcheck", "--device", "cpu"])
    assert result.exit_code == 1
    assert summary_line(judge(failing)) in " ".join(result.output.split())
    passing = timings((1e-3,) * 3, (1e-3,) * 3)
    monkeypatch.setattr(measure_selfcheck, "run_selfcheck", lambda *args, **kwargs: passing)
    assert runner.invoke(app, ["selfcheck", "--device", "cpu"]).exit_code == 0
    undecided = timings((0.9e-3, 1.1e-3, 1.05e-3), (1e-3,) * 3)
    monkeypatch.setattr(measure_selfcheck, "run_selfcheck", lambda *args, **kwargs: undecided)
    result = runner.invoke(app, ["selfcheck", "--device", "cpu"])
    assert result.exit_code == EXIT_INCONCLUSIVE == 5
    assert summary_line(judge(undecided)) in " ".join(result.output.split())


def test_a_block_holds_several_calls_of_a_long_op() -> None:
    from attnbench.instrument.agreement import CALLS_PER_BLOCK, block_s_for

    assert block_s_for(1e-5, 0.05) == 0.05  # a short op: the block's length as before
    assert block_s_for(0.02, 0.05) == pytest.approx(CALLS_PER_BLOCK * 0.02)  # a 20 ms op: CALLS_PER_BLOCK calls


@pytest.mark.slow
def test_every_timer_times_the_same_prepared_closure_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through ``_check_op``: one closure, built once, is what attnbench and torch.utils.benchmark both time; each
    block has the same length (CALLS_PER_BLOCK calls of the op, from the warm-up measurement) and starts after the
    same PRIME_CALLS untimed calls, and the order alternates between rounds."""
    import contextlib
    import time

    import torch
    from torch.utils.benchmark import Timer

    from attnbench.instrument.agreement import CALLS_PER_BLOCK, PRIME_CALLS
    from attnbench.timing import adaptive

    call_s = 2e-3
    events: list[tuple[str, object]] = []

    def fn() -> None:
        events.append(("call", None))
        end = time.perf_counter() + call_s
        while time.perf_counter() < end:
            pass

    @contextlib.contextmanager
    def built(op: SelfcheckOp, dev: torch.device) -> object:
        yield fn

    real_measure, real_autorange = adaptive.measure, Timer.blocked_autorange

    def measure(f: object, clock: object, policy: TimingPolicy) -> object:
        events.append(("attnbench", (f is fn, policy.min_time_s)))
        return real_measure(f, clock, policy)  # type: ignore[arg-type]

    def blocked_autorange(self: Timer, callback: object = None, min_run_time: float = 0.2) -> object:
        events.append((TIMER, (self._globals["fn"] is fn, min_run_time)))
        return real_autorange(self, min_run_time=min_run_time)

    monkeypatch.setattr(measure_selfcheck, "_built", built)
    monkeypatch.setattr(adaptive, "measure", measure)
    monkeypatch.setattr(Timer, "blocked_autorange", blocked_autorange)
    op = SelfcheckOp("matmul", "float32", size=8)
    timed = measure_selfcheck._check_op(OpTimings(op), torch.device("cpu"), loose_policy(), (4, 4), 1e-3, [TIMER], None)
    assert len(timed.ours_s) == len(dict(timed.references)[TIMER]) == 4
    blocks = [(i, who, what) for i, (who, what) in enumerate(events) if who != "call"]
    warm_up, rounds = blocks[0], blocks[1:]
    assert warm_up[1] == "attnbench"  # the warm-up measurement, before any round
    assert [who for _, who, _ in rounds] == ["attnbench", TIMER, TIMER, "attnbench"] * 2  # the order alternates
    assert {what for _, _, what in rounds} == {(True, rounds[0][2][1])}  # the same closure, the same block length
    assert rounds[0][2][1] >= CALLS_PER_BLOCK * call_s  # long enough for CALLS_PER_BLOCK calls
    for (i, _, _), (before, _, _) in zip(rounds, [warm_up, *rounds[:-1]], strict=True):
        # Each block starts after PRIME_CALLS calls that belong to no timer (the previous block ended before them).
        assert events[i - PRIME_CALLS : i] == [("call", None)] * PRIME_CALLS and i - before > PRIME_CALLS
    calls = [
        sum(1 for who, _ in events[i + 1 : j] if who == "call")
        for (i, _, _), (j, _, _) in zip(rounds, [*rounds[1:], (len(events) + PRIME_CALLS, "", None)], strict=True)
    ]
    # Each block made about its CALLS_PER_BLOCK calls (fewer when the machine stalled a call: blocks are timed),
    # never the one or two a block of the old fixed length held for an op this long.
    timed_calls = [n - PRIME_CALLS for n in calls[:-1]]
    assert min(timed_calls) >= 3 and statistics.median(timed_calls) >= CALLS_PER_BLOCK - 1, timed_calls


@pytest.mark.slow
@pytest.mark.serial  # page faults count the machine's memory pressure too: run alone, after the parallel pass
@pytest.mark.xfail(
    strict=False,
    reason="on this VM a warm call inside steady_heap still faulted 256-4096 pages in some runs (powers of two: "
    "transparent huge pages?); results/selfcheck-vanilla-spread-cpu.md has the measured counts; to be pinned down",
)
def test_the_written_out_attention_faults_no_pages_in_inside_steady_heap() -> None:
    """Why vanilla's rounds spread (issue 50 §4): by default its n×n buffers went back to the kernel after a call and
    were faulted in anew by the next; inside ``steady_heap`` a warm call faults in none. Counted in a fresh process:
    a test worker's other threads (a finished test's sampler, torch's pool) fault pages of their own."""
    import subprocess
    import sys

    if not sys.platform.startswith("linux"):
        pytest.skip("glibc's malloc")
    script = """
import resource, torch
from attnbench.host.memory import steady_heap
from attnbench.instrument.agreement import _built, ops_for
op = next(op for op in ops_for("cpu") if op.name == "vanilla" and op.case is not None and op.case.seq_len == 512)
with steady_heap() as steady, _built(op, torch.device("cpu")) as fn, torch.inference_mode():
    assert steady
    for _ in range(3):
        fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        fn()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    faults = int(done.stdout.split()[-1])
    assert faults < 5 * 10, faults  # a page or two of bookkeeping at most, against hundreds a call by default


def _cases_made_by_hand(source: str) -> list[int]:
    """Lines of ``source`` that call ``Case(…)`` themselves (deciding heads and causality outside the families)."""
    import ast

    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Case"
    ]


def test_the_instrument_makes_its_cases_through_the_families_hook() -> None:
    """Issue 47: the selfcheck's and calibrate's reference ops are made by ``families.references.reference_case``,
    so no module of the instrument knows that an LSTM has no heads and is causal."""
    from attnbench.families.references import STEPWISE_RECURRENCE, reference_case
    from tests.support import ROOT

    planted = 'Case("lstm", "forward", "float32", "cpu", 4, 64, 256, None, 1, True)\n'
    assert _cases_made_by_hand("x = 1\n" + planted) == [2]  # the rule catches what it is for
    for path in sorted((ROOT / "attnbench" / "instrument").glob("*.py")):
        assert _cases_made_by_hand(path.read_text(encoding="utf-8")) == [], path.name
    recurrent = [op.case for op in ops_for("cpu") if op.name == STEPWISE_RECURRENCE]
    assert recurrent and all(c is not None and c.heads is None and c.causal for c in recurrent)
    assert recurrent[0] == reference_case(STEPWISE_RECURRENCE, "forward", "float32", "cpu", 4, 64, 256, 4)
