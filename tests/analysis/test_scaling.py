"""Scaling laws, crossovers and the train / (forward + backward) check: the numbers, then how reports print them."""

from __future__ import annotations

import math
import random

import pytest
from rich.console import Console

from attnbench.analysis.consistency import TRAIN_BAND, train_check_summary, train_checks
from attnbench.analysis.pivot import pivot_tables
from attnbench.analysis.reading import Reading
from attnbench.analysis.scaling import (
    FASTER,
    INDICATIVE,
    LEFT_OUT,
    SLOWER,
    Crossover,
    crossover_lines,
    crossovers,
    fit_power_law,
    scaling_laws,
)
from attnbench.core.cases import Case, TimingPolicy
from attnbench.report.markdown import render_markdown
from attnbench.report.terminal import comparison_tables
from attnbench.results.measurement import Measurement
from attnbench.results.records import Memory, Result, Run
from tests.support import numbers

# --- fit_power_law ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b"), [(3e-6, 2.0), (0.5, 1.0), (7.0, -0.5), (1e-3, 0.0), (2.0, 1.37)])
def test_exact_power_law_is_recovered_exactly(a: float, b: float) -> None:
    xs = [64, 128, 256, 512, 1024, 2048]
    fit = fit_power_law(xs, [a * x**b for x in xs])
    assert fit is not None
    assert fit.exponent == pytest.approx(b, abs=1e-9)
    assert fit.exponent_low == pytest.approx(b, abs=1e-9) and fit.exponent_high == pytest.approx(b, abs=1e-9)
    assert fit.prefactor == pytest.approx(a, rel=1e-9)
    assert (fit.x_min, fit.x_max, fit.points) == (64, 2048, 6)
    assert fit.r2 == pytest.approx(1.0, abs=1e-12)


def test_confidence_interval_covers_the_true_exponent() -> None:
    rng = random.Random(20261202)
    xs = [64, 128, 256, 512, 1024]
    true_b, trials, hits, widths = 1.7, 200, 0, []
    for _ in range(trials):
        # Multiplicative noise, as timings have: Gaussian in log space, the model the t-interval assumes.
        ys = [2e-6 * x**true_b * math.exp(rng.gauss(0.0, 0.1)) for x in xs]
        fit = fit_power_law(xs, ys)
        assert fit is not None and fit.exponent_low < fit.exponent < fit.exponent_high
        hits += fit.exponent_low <= true_b <= fit.exponent_high
        widths.append(fit.exponent_high - fit.exponent_low)
    assert hits / trials >= 0.90
    # ... and not by being uselessly wide: with σ = 0.1 over 4 octaves the 95 % half-width is about 0.1.
    assert sorted(widths)[trials // 2] < 0.35


def test_two_points_fit_exactly_with_no_interval() -> None:
    fit = fit_power_law([100, 400], [1.0, 4.0])
    assert fit is not None and fit.points == 2
    assert fit.exponent == pytest.approx(1.0)
    assert fit.exponent_low == fit.exponent == fit.exponent_high


@pytest.mark.parametrize(
    ("xs", "ys"),
    [
        ([], []),
        ([64], [1.0]),  # one point
        ([64, 256], [1.0, 0.0]),  # a zero leaves one usable point
        ([64, 256], [1.0, math.nan]),
        ([64, 256], [1.0, math.inf]),
        ([0, 256], [1.0, 2.0]),
        ([-64, 256], [1.0, 2.0]),
        ([256, 256, 256], [1.0, 2.0, 3.0]),  # one x only: no slope
    ],
)
def test_too_few_usable_points_give_no_fit(xs: list[float], ys: list[float]) -> None:
    assert fit_power_law(xs, ys) is None


def test_unusable_points_are_dropped_not_fitted() -> None:
    fit = fit_power_law([64, 128, 256, 512], [64.0**2, math.nan, 0.0, 512.0**2])
    assert fit is not None and fit.points == 2 and fit.exponent == pytest.approx(2.0)


def test_order_does_not_matter_and_duplicates_count_as_points() -> None:
    xs, ys = [64, 256, 1024, 128], [1.0, 4.1, 15.0, 2.2]
    ordered = fit_power_law(sorted(xs), [y for _, y in sorted(zip(xs, ys, strict=True))])
    assert fit_power_law(xs, ys) == ordered
    repeated = fit_power_law([64, 64, 256, 256], [1.0, 1.2, 4.0, 4.8])
    assert repeated is not None and repeated.points == 4
    # Both pairs differ by the same factor, so the slope is exactly log(4)/log(4) and the residuals are the spread.
    assert repeated.exponent == pytest.approx(1.0)
    assert repeated.exponent_low < 1.0 < repeated.exponent_high


def test_mismatched_lengths_are_a_bug() -> None:
    with pytest.raises(ValueError):
        fit_power_law([1, 2], [1.0])


# --- crossovers ----------------------------------------------------------------------------------------------------

XS = [64, 256, 1024]


def test_no_crossover() -> None:
    assert crossovers(XS, [1.0, 2.0, 3.0], [2.0, 4.0, 9.0]) == []


def test_one_crossover_is_interpolated_on_log_log() -> None:
    # a = n²/100, b = n: a/b = n/100 is a straight line in log-log, so the crossing is exactly n = 100.
    (c,) = crossovers(XS, [x * x / 100 for x in XS], [float(x) for x in XS])
    assert c.x == pytest.approx(100.0)
    assert (c.low_x, c.high_x, c.direction) == (64, 256, SLOWER)


def test_two_crossovers_in_both_directions() -> None:
    ys_b = [1.0, 1.0, 1.0, 1.0]
    found = crossovers([16, 64, 256, 1024], [0.5, 2.0, 2.0, 0.25], ys_b)
    assert [(c.low_x, c.high_x, c.direction) for c in found] == [(16, 64, SLOWER), (256, 1024, FASTER)]
    assert found[0].x == pytest.approx(32.0)  # log2 ratio -1 → +1 over 16 → 64: halfway in log n
    assert found[1].x == pytest.approx(256 * 4 ** (1 / 3))  # +1 → -2 over 256 → 1024: a third of the way


def test_exact_touch_at_a_measured_point() -> None:
    # Equal at n=256 and crossing there: the crossover is the measured point itself.
    assert crossovers(XS, [0.5, 1.0, 2.0], [1.0, 1.0, 1.0]) == [Crossover(256, 256, 256, SLOWER)]
    # Equal at n=256 but turning back: a touch, not a crossing.
    assert crossovers(XS, [0.5, 1.0, 0.5], [1.0, 1.0, 1.0]) == []
    # Starting or ending at exactly equal is no sign change either.
    assert crossovers(XS, [1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == []
    assert crossovers(XS, [0.5, 0.7, 1.0], [1.0, 1.0, 1.0]) == []
    # Equal over a run of measured points: bracketed by that run.
    (c,) = crossovers([16, 64, 256, 1024], [2.0, 1.0, 1.0, 0.5], [1.0] * 4)
    assert (c.low_x, c.high_x, c.direction) == (64, 256, FASTER) and c.x == pytest.approx(128.0)


def test_crossovers_skip_unusable_points_and_sort() -> None:
    found = crossovers([1024, 64, 256], [4.0, 0.5, math.nan], [1.0, 1.0, 1.0])
    assert [(c.low_x, c.high_x) for c in found] == [(64, 1024)]
    with pytest.raises(ValueError, match="twice"):
        crossovers([64, 64], [1.0, 2.0], [1.0, 1.0])
    with pytest.raises(ValueError):
        crossovers([64, 128], [1.0], [1.0, 2.0])


# --- a run: synthetic results with known laws -------------------------------------------------------------------


def result(
    model: str,
    n: int,
    median_s: float,
    *,
    mode: str = "forward",
    batch: int = 4,
    peak: int | None = None,
    status: str = "ok",
    spread: float = 0.0,
    converged: bool = True,
    extra: dict[str, str | int | float | bool | None] | None = None,
) -> Result:
    recurrent = model in ("lstm", "gru")
    causal = recurrent or mode == "decode"
    case = Case(model, mode, "float32", "cpu", batch, n, 64, None if recurrent else 4, 1, causal)  # type: ignore[arg-type]
    if status != "ok":
        return Result(case, status, reason="why")  # type: ignore[arg-type]
    samples = tuple(median_s * (1 + spread * (i - 5) / 5) for i in range(11))
    stop = "converged" if converged else "budget"
    m = Measurement(samples, 1, 3, 0.0, converged, stop, 0.01)  # type: ignore[arg-type]
    memory = Memory(peak, "cuda-allocator") if peak is not None else None
    return Result(case, "ok", measurement=m, memory=memory, extra=dict(extra or {}))


NS = (64, 256, 1024)


def laws_run() -> list[Result]:
    """lstm: time ∝ n, memory ∝ n; vanilla: time ∝ n², memory ∝ n², and OOM at 4096; sdpa-flash: time ∝ n^1.5."""
    out = [result("lstm", n, 1e-3 * n / 64, peak=1000 * n) for n in NS]
    out += [result("vanilla", n, 1e-4 * (n / 64) ** 2, peak=10 * n * n) for n in NS]
    out.append(result("vanilla", 4096, 0, status="oom"))
    out += [result("sdpa-flash", n, 2e-4 * (n / 64) ** 1.5, peak=500 * n) for n in NS]
    return out


def test_scaling_laws_recover_the_exponents() -> None:
    lines = {line.label: line for line in scaling_laws(laws_run())}
    assert set(lines) == {"lstm", "vanilla", "sdpa-flash"}
    for label, (time_b, memory_b) in {"lstm": (1, 1), "vanilla": (2, 2), "sdpa-flash": (1.5, 1)}.items():
        line = lines[label]
        assert line.time is not None and line.memory is not None
        assert line.time.exponent == pytest.approx(time_b, abs=1e-9)
        assert line.memory.exponent == pytest.approx(memory_b, abs=1e-9)
        assert (line.time.x_min, line.time.x_max, line.time.points) == (64, 1024, 3)  # the OOM row is left out
        assert (line.mode, line.batch, line.per_token) == ("forward", 4, False)
    # The line gives each exponent with its interval, the lengths fitted and how many points.
    text = lines["vanilla"].text
    assert text.startswith("vanilla") and {2.0, 95, 64, 1024, 3} <= set(numbers(text)) and 4096 not in numbers(text)


def test_a_bending_curve_says_where_it_steepens() -> None:
    # A fixed per-call cost hides the n² term at short lengths: the whole-range slope undersells it.
    results = [result("vanilla", n, 1e-3 + 1e-8 * n * n) for n in (64, 256, 1024, 4096)]
    (line,) = scaling_laws(results)
    assert line.time is not None and line.time_top is not None
    assert line.time.exponent < 1.5 and line.time_top.exponent > 1.8
    assert "steepening to n^1.9" in line.text and "at n=1024–4096" in line.text


def test_two_point_fits_are_marked_and_missing_fits_say_why() -> None:
    results = [result("lstm", 64, 1e-3, peak=0), result("lstm", 256, 4e-3, peak=4096)]
    results += [result("gru", 64, 1e-3), result("gru", 256, 0, status="oom")]
    lines = {line.label: line for line in scaling_laws(results)}
    assert lines["lstm"].time is not None and lines["lstm"].time.points == 2
    # Two points give a slope but no interval; a fit that is missing says why.
    assert {1.0, 64, 256, 2} <= set(numbers(lines["lstm"].text)) and 95 not in numbers(lines["lstm"].text)
    assert lines["lstm"].memory is None and lines["lstm"].notes
    assert lines["gru"].time is None and lines["gru"].memory is None and lines["gru"].notes
    assert numbers(lines["gru"].text) == [1]  # the one length that ran


def test_constant_token_grids_are_fitted_per_token() -> None:
    # 16384 tokens per call: a call's time mixes batch and length, so the fit is per token.
    results = [result("lstm", n, 1e-3, batch=16384 // n, peak=8 * 16384) for n in (256, 1024, 4096)]
    results += [result("vanilla", n, 1e-4 * n / 256, batch=16384 // n) for n in (256, 1024, 4096)]
    lines = {line.label: line for line in scaling_laws(results)}
    assert lines["lstm"].per_token and lines["lstm"].batch is None
    assert lines["lstm"].time is not None and lines["lstm"].time.exponent == pytest.approx(0.0, abs=1e-9)
    assert lines["vanilla"].time is not None and lines["vanilla"].time.exponent == pytest.approx(1.0)
    assert lines["lstm"].memory is not None and lines["lstm"].memory.exponent == pytest.approx(0.0, abs=1e-9)
    assert "per token" in lines["lstm"].text and numbers(lines["lstm"].text)[:2] == [0.0, 95]


def test_crossover_lines_pair_attention_with_recurrent_models() -> None:
    lines = crossover_lines(laws_run())
    assert [(line.a, line.b) for line in lines] == [("vanilla", "lstm"), ("sdpa-flash", "lstm")]
    vanilla, flash = lines
    # vanilla/lstm = n/640: crosses at exactly n = 640, between the measured 256 and 1024.
    (c,) = vanilla.crossings
    assert c.x == pytest.approx(640.0) and (c.low_x, c.high_x) == (256, 1024)
    assert (c.direction, numbers(vanilla.text)) == (SLOWER, [640, 256, 1024])
    assert vanilla.seq_lens == NS  # the OOM length is not one both ran
    # sdpa-flash/lstm = 0.2·√(n/64): crosses at n = 1600, past the last length.
    assert flash.crossings == ()
    assert all(ratio < 1 for ratio in flash.ratios) and numbers(flash.text) == [64, 1024]


def test_crossovers_compare_the_same_batch_only() -> None:
    results = [result(model, n, 1e-3 * n / 64, batch=b) for model in ("lstm", "vanilla") for b in (4, 8) for n in NS]
    lines = crossover_lines(results)
    assert sorted((line.a, line.b) for line in lines) == [("vanilla b=4", "lstm b=4"), ("vanilla b=8", "lstm b=8")]


def test_a_baseline_adds_its_own_pairs_without_repeating_any() -> None:
    results = laws_run() + [result("gru", n, 2e-3 * n / 64) for n in NS]
    pairs = [(line.a, line.b) for line in crossover_lines(results, baseline_model="vanilla")]
    # attention × recurrent, then the rest against vanilla: lstm/gru vs vanilla are already there the other way.
    assert pairs == [
        ("vanilla", "lstm"),
        ("vanilla", "gru"),
        ("sdpa-flash", "lstm"),
        ("sdpa-flash", "vanilla"),
        ("sdpa-flash", "gru"),
    ]
    pairs = [(line.a, line.b) for line in crossover_lines(results, baseline_model="lstm")]
    assert ("gru", "lstm") in pairs and ("lstm", "gru") not in pairs


def test_crossover_text_for_touches_and_noise() -> None:
    touch = [result("lstm", n, 1e-3) for n in NS]
    touch += [result("vanilla", n, t) for n, t in zip(NS, (5e-4, 1e-3, 2e-3), strict=True)]
    (line,) = crossover_lines(touch)
    (c,) = line.crossings
    assert (c.low_x, c.high_x, c.direction) == (256, 256, SLOWER) and numbers(line.text) == [256]
    # ±20 % sample spread at n=1024, 5 % apart: the two medians' CIs overlap, so the crossing there is unclear.
    noisy = [result("lstm", n, 1e-3, spread=0.2) for n in NS]
    noisy += [result("vanilla", n, t, spread=0.2) for n, t in zip(NS, (1e-4, 5e-4, 0.95e-3), strict=True)]
    (line,) = crossover_lines(noisy)
    assert line.crossings == () and line.unclear == (1024,) and numbers(line.text) == [64, 1024, 1024]
    one = [result("lstm", 64, 1e-3), result("vanilla", 64, 2e-3), result("vanilla", 256, 8e-3)]
    (line,) = crossover_lines(one)
    assert line.seq_lens == (64,) and line.ratios[0] > 1 and numbers(line.text) == [64]


# --- train / (forward + backward) --------------------------------------------------------------------------------


def three_modes(train_s: float, forward_s: float = 1e-3, backward_s: float = 2e-3, **kw: object) -> list[Result]:
    return [
        result("lstm", 64, forward_s, mode="forward"),
        result("lstm", 64, backward_s, mode="backward"),
        result("lstm", 64, train_s, mode="train", **kw),  # type: ignore[arg-type]
    ]


def test_train_matching_its_parts_is_not_flagged() -> None:
    (check,) = train_checks(three_modes(3.1e-3))
    assert check.ratio == pytest.approx(3.1 / 3)
    assert not check.flagged and check.reason == ""


def test_train_far_from_its_parts_is_flagged_with_a_reason() -> None:
    (above,) = train_checks(three_modes(4.5e-3))
    assert above.flagged and above.ratio == pytest.approx(1.5)
    assert numbers(above.reason)[0] == 1.1  # the bound it crossed, then why
    # The case, the ratio and the three times it is made of.
    assert above.text.startswith("lstm train float32") and numbers(above.text)[-4:] == [1.50, 4.5, 1, 2]
    (below,) = train_checks(three_modes(2.4e-3))
    assert below.flagged and numbers(below.reason)[0] == 0.9


def test_a_flag_the_noise_could_explain_says_so() -> None:
    (check,) = train_checks(three_modes(3.4e-3, spread=0.3, converged=False))
    assert check.flagged  # 1.13 by the medians...
    # ... but not beyond their CIs: the reason gives the range they allow, and names the mode that did not converge.
    assert check.ratio_range is not None
    low, high = check.ratio_range
    assert low <= TRAIN_BAND[1] and {round(low, 2), round(high, 2)} <= set(numbers(check.reason))
    assert "train" in check.reason.split(";")[-1]


def test_cases_missing_a_mode_or_a_timing_are_not_checked() -> None:
    assert train_checks(three_modes(3e-3)[1:]) == []
    failed = three_modes(3e-3)
    failed[0] = result("lstm", 64, 0, mode="forward", status="oom")
    assert train_checks(failed) == []
    other_batch = [*three_modes(3e-3)[:2], result("lstm", 64, 3e-3, mode="train", batch=8)]
    assert train_checks(other_batch) == []


# --- rendering ------------------------------------------------------------------------------------------------------

RUN = Run(
    run_id="synthetic",
    created_utc="2026-12-02T00:00:00Z",
    config_source="test",
    config={},
    config_sha256="0" * 64,
    timing=TimingPolicy(),
    environment={"device": "cpu", "device_type": "cpu", "cpu_model": "test", "torch": "2.x", "python": "3.11"},
    state="complete",
)


def report_run() -> list[Result]:
    """forward, backward and train for lstm and vanilla at three lengths; vanilla's train at n=1024 is off."""
    out = []
    for mode, factor in (("forward", 1.0), ("backward", 2.0), ("train", 3.0)):
        for n in NS:
            out.append(result("lstm", n, factor * 1e-3 * n / 64, mode=mode, peak=1000 * n))
            extra = 1.3 if (mode, n) == ("train", 1024) else 1.0
            out.append(result("vanilla", n, extra * factor * 1e-4 * (n / 64) ** 2, mode=mode, peak=10 * n * n))
    return out


def bullets(text: str) -> list[str]:
    return [line.removeprefix("- ") for line in text.splitlines() if line.startswith("- ")]


def table_rows(text: str) -> dict[str, list[str]]:
    """The body rows of a text's markdown tables, by their first cell (a later table's row replaces an earlier's)."""
    rows = [[cell.strip() for cell in line.split("|")[1:-1]] for line in text.splitlines() if line.startswith("| ")]
    return {cells[0]: cells[1:] for cells in rows}


def test_markdown_lists_each_tables_crossovers_and_laws_and_the_flagged_train_check() -> None:
    results = report_run()
    text = render_markdown(Reading(RUN, results))
    tables = pivot_tables(results)
    assert len(tables) == 3
    for table in tables:
        for said in [line.text for line in table.crossings] + [line.text for line in table.scaling]:
            assert said in bullets(text), said
    checks = train_checks(results)
    (flagged,) = [check for check in checks if check.flagged]
    assert flagged.train.case.seq_len == 1024 and flagged.ratio == pytest.approx(1.3, abs=5e-3)
    said = text.split("## Checks", 1)[1]
    # The summary over every check (5 of 6 inside the band), then the flagged case with its ratio, parts and reason.
    assert train_check_summary(checks) in said and {5, 6} <= set(numbers(train_check_summary(checks)))
    (line,) = bullets(said)
    assert flagged.train.case.label in line and flagged.text.split(": ", 1)[1] in line and flagged.reason in line


def test_train_lines_differ_per_mode_and_pivot_carries_them() -> None:
    tables = pivot_tables(report_run())
    assert [t.title.split(" · ")[0] for t in tables] == ["forward", "backward", "train"]
    train = tables[2]
    assert train.crossovers == tuple(line.text for line in train.crossings)
    assert [line.label for line in train.scaling] == ["lstm", "vanilla"]
    vanilla = train.scaling[1]
    assert vanilla.time is not None and vanilla.time.exponent > 2.0  # the slow n=1024 train row bends it up


def test_terminal_shows_the_same_lines() -> None:
    console = Console(width=200, record=True, color_system=None)
    console.print(comparison_tables(Reading(RUN, report_run())))
    text = console.export_text()
    markdown = render_markdown(Reading(RUN, report_run()))
    (forward, *_) = pivot_tables(report_run())
    for said in [line.text for line in forward.crossings] + [line.text for line in forward.scaling]:
        assert said in text and said in markdown

    checks = train_checks(report_run())
    assert train_check_summary(checks) in text
    assert all(check.text in text for check in checks if check.flagged)


# --- decode ------------------------------------------------------------------------------------------------------
DECODE_NS = (1024, 4096, 16384, 65536)


def decode_run() -> list[Result]:
    """lstm: 100 µs per token at any n, a 512 B state that reads 0 B measured; sdpa: 50 µs + 10 ns × n, a KV cache
    of 2·(n + 1)·64·4 bytes measured a page above that; the two cross at n = 5000 in time."""
    out = []
    for n in DECODE_NS:
        lstm = {"state_bytes": 512, "state_mem_bytes": 0, "state_mem_method": "resident-pages"}
        out.append(result("lstm", n, 1e-4, mode="decode", batch=1, spread=0.02, extra=lstm))
    for n in DECODE_NS:
        cache = 2 * (n + 1) * 64 * 4
        sdpa = {"state_bytes": cache, "state_mem_bytes": cache + 4096, "state_mem_method": "resident-pages"}
        out.append(result("sdpa", n, 5e-5 + 1e-8 * n, mode="decode", batch=1, spread=0.02, extra=sdpa))
    return out


def test_decode_rows_are_a_table_of_their_own_with_the_state_as_memory() -> None:
    tables = pivot_tables(report_run()[:6] + decode_run())
    assert [t.title.split(" · ")[0] for t in tables] == ["forward", "decode"]
    decode = tables[1]
    assert decode.decode and not tables[0].decode and decode.baseline == "lstm"
    lstm, sdpa = decode.scaling
    assert lstm.time is not None and lstm.time.exponent == pytest.approx(0.0, abs=1e-9)
    assert lstm.state is not None and lstm.state.exponent == 0 and lstm.memory is None
    assert sdpa.state is not None and sdpa.state.exponent == pytest.approx(1.0, abs=1e-3)
    assert sdpa.memory is not None and sdpa.memory.exponent == pytest.approx(1.0, abs=1e-2)  # measured
    # Each line names what the family calls its state, the computed bytes, and what the measurement resolved.
    assert lstm.state_noun in lstm.text and {0.0, 1024, 65536, 4, 512} <= set(numbers(lstm.text))
    assert sdpa.state_noun in sdpa.text and sdpa.state_noun != lstm.state_noun
    assert sdpa.time_top is not None and sdpa.time_top.exponent == pytest.approx(0.86, abs=5e-3)  # it steepens
    assert {0.86, 16384, 65536, 1.0, 0.99} <= set(numbers(sdpa.text))


def test_decode_crossovers_read_as_who_decodes_faster_from_where() -> None:
    (line,) = crossover_lines(decode_run())
    assert (line.a, line.b, line.mode) == ("sdpa", "lstm", "decode")
    # The faster model is named first: from n ≈ 4800 on, lstm.
    assert line.text.index("lstm") < line.text.index("sdpa") and numbers(line.text) == [4800, 4096, 16384]
    flipped = [result("lstm", n, 1e-4, mode="decode") for n in DECODE_NS]
    flipped += [result("sdpa", n, 2e-4 * (1024 / n), mode="decode") for n in DECODE_NS]  # sdpa gets faster
    (line,) = crossover_lines(flipped)
    assert line.text.index("sdpa") < line.text.index("lstm") and numbers(line.text)[0] == 2000


def test_markdown_and_terminal_show_decode_tables_with_the_state() -> None:
    text = render_markdown(Reading(RUN, decode_run()))
    assert [line for line in text.splitlines() if line.startswith("## ")] == [
        "## decode · float32 · cpu · d_model 64, batch 1 · layers 1"
    ]
    (line,) = crossover_lines(decode_run())
    assert line.text in bullets(text) and "`lstm`" in text  # the baseline of the speed-ups is named
    # Two tables: the per-token time with speed-ups against lstm, then the state, computed / measured, with the
    # method that measured it; a step's own peak is in the CSV, not a table here (the state is the story).
    assert "resident-pages" in text
    rows = table_rows(text)

    assert rows["lstm"] == ["512 B / 0 B"] * 4
    assert rows["sdpa"] == ["512 KiB / 516 KiB", "2 MiB / 2 MiB", "8 MiB / 8 MiB", "32 MiB / 32 MiB"]
    assert len([line for line in text.splitlines() if line.startswith("| model ")]) == 2
    console = Console(width=200, record=True, color_system=None)
    console.print(comparison_tables(Reading(RUN, decode_run()), memory=True))
    shown = console.export_text()
    assert "512 KiB / 516 KiB" in shown and "(0.14×)" in shown  # the state table, and the speed-ups vs lstm


# --- only good evidence enters fits, crossovers and speed-ups (issue 17, item 5) ---------------------------------


def _contended(r: Result) -> Result:
    from dataclasses import replace

    from attnbench.results.contention import Contention

    return replace(r, contention=Contention(True, ("other processes kept 1.0 of 2 cores busy",), 1.0))


def test_fits_leave_out_noisy_and_contended_lengths_and_say_so() -> None:
    ns = (64, 256, 1024, 4096)
    rows = [result("lstm", n, 1e-3 * n / 64) for n in ns]
    rows[1] = result("lstm", 256, 9e-3, spread=0.5, converged=False)  # far off the line, and its CI is ±25 %
    rows[3] = _contended(result("lstm", 4096, 1.0))  # far off too, but timed on a busy machine
    (line,) = scaling_laws(rows)
    assert line.time is not None and line.time.points == 2 and line.time.exponent == pytest.approx(1.0)
    note = line.notes[0]  # the lengths left out, and why
    assert note in line.text and LEFT_OUT in note and numbers(note) == [256, 4096]
    assert line.memory is None  # no peaks here; memory would use every length that ran
    # A length that missed the ±1 % target but whose CI is within ±5 % is still evidence.
    near = [result("lstm", n, 1e-3 * n / 64, spread=0.02, converged=False) for n in ns]
    (line,) = scaling_laws(near)
    assert line.time is not None and line.time.points == 4 and not any(LEFT_OUT in note for note in line.notes)


def test_memory_fits_use_every_length_that_ran_whatever_its_timing() -> None:
    rows = [_contended(result("vanilla", n, 1e-3, peak=10 * n * n)) for n in NS]
    (line,) = scaling_laws(rows)
    assert line.memory is not None and line.memory.exponent == pytest.approx(2.0)
    assert line.time is None
    (note,) = line.notes  # 3 of 3 lengths left out, and which
    assert note in line.text and LEFT_OUT in note and numbers(note) == [3, 3, *NS]


def test_crossovers_leave_out_lengths_and_say_when_none_is_left() -> None:
    lstm = [result("lstm", n, 1e-3) for n in NS]
    vanilla = [result("vanilla", n, t) for n, t in zip(NS, (5e-4, 1e-3, 2e-3), strict=True)]
    vanilla[0] = _contended(vanilla[0])
    (line,) = crossover_lines(lstm + vanilla)
    assert line.seq_lens == (256, 1024) and line.left_out == (64,)
    assert LEFT_OUT in line.text and numbers(line.text)[-3:] == [1, 3, 64]  # 1 of 3 left out: n=64
    gone = [_contended(r) for r in lstm] + vanilla
    (line,) = crossover_lines(gone)
    assert line.seq_lens == () and not line.crossings  # no evidence: claims and fits take nothing from it
    # ...but the text gives the best estimate over every length, marked, instead of "not determined" (issue 51).
    assert line.indicative is not None and line.indicative.seq_lens == NS and line.indicative.crossings
    assert line.text.startswith(line.indicative.text) and INDICATIVE in line.text and LEFT_OUT in line.text
    assert numbers(line.text)[-2:] == [3, 3]


def test_a_crossover_that_flips_within_noise_is_no_stable_crossover() -> None:
    ns = (64, 256, 1024, 4096)
    lstm = [result("lstm", n, 1e-3, spread=0.2) for n in ns]  # converged, CI about ±10 %: good, but wide
    vanilla = [
        result("vanilla", n, t, spread=0.2) for n, t in zip(ns, (0.97e-3, 1.03e-3, 0.97e-3, 1.03e-3), strict=True)
    ]
    (line,) = crossover_lines(lstm + vanilla)
    assert len(line.crossings) == 3 and not line.stable
    assert numbers(line.text)[:3] == [64, 4096, 3]  # over n=64–4096 the order flips 3 times
    # The same flips with tight medians are real crossings, and said as such.
    tight = [result("lstm", n, 1e-3) for n in ns]
    tight += [result("vanilla", n, t) for n, t in zip(ns, (0.8e-3, 1.2e-3, 0.8e-3, 1.2e-3), strict=True)]
    (line,) = crossover_lines(tight)
    assert line.stable and len(line.crossings) == 3 and line.crossings[0].direction == SLOWER
    assert numbers(line.text)[0] == pytest.approx(line.crossings[0].x, rel=0.05)


def test_a_speedup_from_a_contended_cell_is_a_marked_estimate() -> None:
    """Withheld, a busy machine's table answered almost nothing (issue 51): it is given, and marked."""
    from attnbench.report.cells import ESTIMATE_MARK, speedup_text, time_text

    rows = [result("lstm", 64, 1e-3), result("vanilla", 64, 5e-4), result("lstm", 256, 4e-3)]
    rows.append(_contended(result("vanilla", 256, 1e-3)))
    (table,) = pivot_tables(rows)
    cells = dict(table.rows)["vanilla"]
    assert cells[64].speedup == pytest.approx(2.0) and not cells[64].estimate
    assert cells[256].speedup == pytest.approx(4.0) and cells[256].estimate
    assert ESTIMATE_MARK in speedup_text(cells[256]) and ESTIMATE_MARK in time_text(cells[256])
    assert ESTIMATE_MARK not in speedup_text(cells[64]) + time_text(cells[64])
