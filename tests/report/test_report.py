"""Golden-text tests for every export format, and the pivot logic behind the tables."""

from __future__ import annotations

import pytest

from attnbench.analysis.pivot import pivot_tables
from attnbench.analysis.reading import Reading
from attnbench.core.cases import Case
from attnbench.report.cells import status_text
from attnbench.report.jsonfmt import render_json
from attnbench.report.markdown import render_markdown
from attnbench.report.rows import render_csv
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result
from attnbench.results.store import load_run
from tests.support import FIXTURE, check_golden, numbers


@pytest.mark.parametrize(
    ("name", "render"),
    [
        ("tiny-cpu.md", lambda s: render_markdown(Reading(s.run, s.results))),
        ("tiny-cpu-vs-vanilla.md", lambda s: render_markdown(Reading(s.run, s.results, "vanilla"))),
        ("tiny-cpu.csv", lambda s: render_csv(Reading(s.run, s.results))),
        ("tiny-cpu.json", lambda s: render_json(Reading(s.run, s.results))),
    ],
)
def test_golden(name: str, render) -> None:  # type: ignore[no-untyped-def]
    check_golden(name, render(load_run(FIXTURE)))


def fake(model: str, seq_len: int, median_s: float, batch: int = 4, status: str = "ok", heads: int = 4) -> Result:
    recurrent = model in ("lstm", "gru")
    case = Case(model, "forward", "float32", "cpu", batch, seq_len, 64, None if recurrent else heads, 1, recurrent)
    if status != "ok":
        return Result(case, status, reason="why")  # type: ignore[arg-type]
    m = Measurement((median_s,) * 10, 1, 3, 0.0, True, "converged", 0.01)
    return Result(case, "ok", measurement=m)


def test_pivot_speedups_and_crossover() -> None:
    results = [fake("lstm", n, 1.0 * n / 64) for n in (64, 256, 1024)]
    results += [fake("vanilla", n, (n / 256) ** 2) for n in (64, 256, 1024)]
    (table,) = pivot_tables(results)
    assert table.baseline == "lstm"
    rows = dict(table.rows)
    assert rows["lstm"][64].speedup is None  # the baseline row shows no ratio against itself
    assert rows["vanilla"][64].speedup == pytest.approx(1.0 / (1 / 16))
    assert rows["vanilla"][1024].speedup == pytest.approx(16 / 16)
    # vanilla/lstm = n/1024: below 1 up to the last length and exactly 1 there, so no crossing inside the range.
    (line,) = table.crossings
    assert table.crossovers == (line.text,) and numbers(line.text) == [64, 1024, 1024]  # equal at n=1024
    assert (line.a, line.b, line.crossings) == ("vanilla", "lstm", ())
    assert [s.label for s in table.scaling] == ["lstm", "vanilla"]


def test_pivot_crossover_is_interpolated_between_the_lengths_around_it() -> None:
    results = [fake("lstm", n, 1e-3 * n / 64) for n in (64, 256, 1024)]
    results += [fake("sdpa-flash", n, 1e-4 * (n / 64) ** 2) for n in (64, 256, 1024)]
    (table,) = pivot_tables(results)
    # sdpa-flash/lstm = n/640 on these lengths: it crosses 1 at n = 640, between the measured 256 and 1024.
    assert table.crossovers == (table.crossings[0].text,) and numbers(table.crossovers[0]) == [640, 256, 1024]
    assert table.crossings[0].crossings[0].x == pytest.approx(640.0)


def test_pivot_marks_failures_and_splits_varying_heads() -> None:
    results = [
        fake("lstm", 64, 1e-3),
        fake("vanilla", 64, 1e-3, heads=4),
        fake("vanilla", 64, 1e-3, heads=8),
        fake("vanilla", 128, 0, status="oom", heads=8),
    ]
    (table,) = pivot_tables(results)
    labels = [label for label, _ in table.rows]
    assert labels == ["lstm", "vanilla h=4", "vanilla h=8"]
    assert status_text(dict(table.rows)["vanilla h=8"][128]) == "OOM"


def test_pivot_ties_batch_to_seq_len_for_constant_token_grids() -> None:
    results = [fake(model, n, 1e-3, batch=16384 // n) for model in ("lstm", "sdpa-flash") for n in (512, 1024)]
    (table,) = pivot_tables(results)
    assert table.batch_for_seq == {512: 32, 1024: 16}
    assert [label for label, _ in table.rows] == ["lstm", "sdpa-flash"]


def test_pivot_groups_by_mode_and_dtype() -> None:
    a = fake("lstm", 64, 1e-3)
    b = Result(Case("lstm", "train", "float32", "cpu", 4, 64, 64, None, 1, True), "ok", measurement=a.measurement)
    assert [t.title.split(" · ")[0] for t in pivot_tables([a, b])] == ["forward", "train"]


def test_speedups_compare_rows_of_the_same_batch() -> None:
    results = [fake(model, 64, 1e-3 * b, batch=b) for model in ("lstm", "vanilla") for b in (4, 8)]
    (table,) = pivot_tables(results)
    rows = dict(table.rows)
    assert set(rows) == {"lstm b=4", "lstm b=8", "vanilla b=4", "vanilla b=8"}
    assert rows["vanilla b=8"][64].speedup == pytest.approx(1.0)  # against lstm b=8, not lstm b=4
    assert rows["lstm b=8"][64].speedup is None  # a baseline row is not compared with itself or its twin


def test_one_case_on_one_thread_is_counted_in_the_singular() -> None:
    """ "1 cases", "1 threads" (issue 51): every count of one reads as one."""
    import re
    from dataclasses import replace

    from attnbench.report.html import render_html
    from attnbench.results.contention import Contention

    stored = load_run(FIXTURE)
    run = replace(stored.run, environment={**stored.run.environment, "torch_threads": 1, "device_type": "cpu"})
    busy = Contention(True, ("load",), 1.0, threads=1, cpu_share=0.5)
    row = replace(next(r for r in stored.results if r.is_timed), contention=busy)
    texts = [render_markdown(Reading(run, [row])), render_html(Reading(run, [row])), busy.evidence]
    for text in texts:
        assert not re.search(r"(?<!of )\b1 (cases|threads|runs)\b", text), text  # "1 of 1 cases" reads right
    assert re.search(r"\b1 case\b", texts[0]) and re.search(r"\b1 thread\b", texts[0] + busy.evidence)
