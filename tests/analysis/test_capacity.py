"""Capacity under a memory budget read from rows (issue 41): the batch each model found and the tokens/s it decodes,
where a recurrence starts serving more than attention, and the serving questions' curves kept apart."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attnbench.analysis.capacity import capacity_tables
from attnbench.analysis.scaling import crossover_lines, group_curves
from attnbench.core.cases import Case
from attnbench.results.contention import Contention
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result

BUDGET = 2**30
NS = (16, 64, 1024, 16384)


def row(model: str, n: int, step_s: float, batch: int, *, contended: bool = False, mode: str = "capacity") -> Result:
    heads = None if model == "lstm" else 4
    case = Case(model, mode, "float32", "cpu", 1, n, 64, heads, 1, True, serving=(("memory_budget", BUDGET),))  # type: ignore[arg-type]
    m = Measurement(tuple([step_s] * 11), 1, 3, 0.0, True, "converged", 0.01)
    extra = {"capacity_batch": batch, "bytes_per_sequence": BUDGET // batch, "memory_budget_bytes": BUDGET}
    busy = Contention(True, ("busy",), 1.0) if contended else None
    return Result(case, "ok", measurement=m, extra=extra, contention=busy)


def run(*, contended: bool = False) -> list[Result]:
    """lstm: 400 000 sequences at every n, 2 s a step (200k tok/s); sdpa-flash: a batch ∝ 1/n, a step of 50 ms
    (1.6M tok/s at n = 16, 100k at 1024): attention serves more at short contexts, the LSTM from between 64 and 1024."""
    rows = [row("lstm", n, 2.0, 400_000, contended=contended) for n in NS]
    rows += [row("sdpa-flash", n, 0.05, 5_000_000 // n, contended=contended) for n in NS]
    return rows


def test_a_capacity_table_holds_each_models_batch_and_tokens_per_second() -> None:
    (table,) = capacity_tables(run())
    assert table.budget_bytes == BUDGET and table.seq_lens == NS and "budget 1 GiB" in table.title
    lstm, sdpa = table.curves
    assert [p.batch for p in lstm.points] == [400_000] * 4
    assert [p.batch for p in sdpa.points] == [312_500, 78_125, 4_882, 305]
    assert sdpa.points[0].tokens_per_s == pytest.approx(312_500 / 0.05)


def test_the_crossover_says_from_which_n_the_recurrence_serves_more_tokens_per_second() -> None:
    (table,) = capacity_tables(run())
    (line,) = table.crossovers
    assert line.startswith("lstm serves more tokens/s under the memory budget than sdpa-flash from n ≈")
    assert "(between 64 and 1024)" in line
    (crossing,) = table.crossing_points()
    assert 64 < crossing[0] < 1024 and crossing[1:] == (False, "lstm")


def test_contended_timings_still_name_the_crossover_as_indicative() -> None:
    (table,) = capacity_tables(run(contended=True))
    (line,) = table.crossovers
    assert "from n ≈" in line and line.endswith("(indicative: every length's timing is noisy or contended)")
    assert table.crossing_points()[0][1] is True


def test_a_capacity_row_counts_its_tokens_at_the_batch_it_found_in_every_crossover() -> None:
    """The generic crossover lines compare time per token: a capacity row's step over its batch."""
    (line,) = crossover_lines(run())
    assert line.mode == "capacity" and line.ratios[0] == pytest.approx((0.05 / 312_500) / (2.0 / 400_000))


def test_curves_of_different_serving_questions_stay_apart_and_are_not_paired() -> None:
    def prefill(model: str, n: int, chunk: int, t: float) -> Result:
        case = replace(row(model, n, t, 1).case, mode="prefill", serving=(("prefill_chunk", chunk),))
        return replace(row(model, n, t, 1, mode="prefill"), case=case, extra={})

    rows = [
        prefill(m, n, chunk, 0.001 * n * (2 if m == "lstm" else 1))
        for m in ("lstm", "sdpa-flash")
        for chunk in (0, 64)
        for n in (64, 256)
    ]
    (group,) = group_curves(rows)
    assert [c.label for c in group.curves] == [
        "lstm prefill_chunk=0", "lstm prefill_chunk=64", "sdpa-flash prefill_chunk=0", "sdpa-flash prefill_chunk=64"
    ]  # fmt: skip
    assert {(line.a, line.b) for line in crossover_lines(rows)} == {
        ("sdpa-flash prefill_chunk=0", "lstm prefill_chunk=0"),
        ("sdpa-flash prefill_chunk=64", "lstm prefill_chunk=64"),
    }


def too_slow(result: Result) -> Result:
    """The row a decode step that ran out of timing budget leaves: the search's batch kept, the status not ok."""
    return replace(result, status="too_slow_for_budget", reason="too slow for the time budget")


def test_a_capacity_whose_timing_ran_out_still_shows_the_batch_it_measured() -> None:
    rows = [too_slow(r) if r.case.model == "lstm" else r for r in run()]
    (table,) = capacity_tables(rows)
    lstm, sdpa = table.curves
    assert [p.batch for p in lstm.points] == [400_000] * 4
    assert all(p.untimed and p.tokens_per_s is None and not p.good for p in lstm.points)
    assert not any(p.untimed for p in sdpa.points)
    from attnbench.report.capacity_md import point_text

    cell = point_text(lstm.points[0])
    assert "400000" in cell and "tok/s" not in cell  # the batch, and no rate it did not measure


def test_the_capacity_plot_draws_every_batch_found_and_marks_the_untimed_ones() -> None:
    pytest.importorskip("matplotlib")
    from attnbench.report.capacity_plots import capacity_figure
    from attnbench.results.store import load_run
    from tests.support import FIXTURE

    rows = [too_slow(r) if r.case.model == "lstm" else r for r in run()]
    (table,) = capacity_tables(rows)
    fig = capacity_figure(load_run(FIXTURE).run, table, {})
    batch_ax, rate_ax = fig.axes[:2]
    drawn = {line.get_label().split()[0]: list(line.get_ydata()) for line in batch_ax.get_lines()}
    assert drawn["lstm"] == [400_000] * 4  # the memory measurement, whatever the timing did
    assert len(rate_ax.get_lines()) - len([x for x in table.crossing_points()]) == 1  # only sdpa-flash has a rate
    crosses = [c for c in batch_ax.collections if list(c.get_offsets()[:, 0]) == list(NS)]
    assert crosses, "the untimed batches carry their own marker"


def test_a_search_that_did_not_settle_is_a_lower_bound_in_the_table() -> None:
    """Issue 50 §3.7: the row keeps the largest batch a try held; the table marks it ≥, as a capped search's."""
    from dataclasses import replace

    from attnbench.report.capacity_md import point_text

    rows = run()
    rows[0] = replace(rows[0], extra={**rows[0].extra, "capacity_unsettled": "did not settle after 4 tries"})
    (table,) = capacity_tables(rows)
    first, second = table.curves[0].points[:2]
    assert first.capped and not second.capped
    assert point_text(first).startswith("≥400000") and not point_text(second).startswith("≥")
