"""A site's digests read as the run folders do: the same points and the same steps for every metric, a digest that
round-trips through JSON, and a refusal naming the file and key for one that does not."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnbench.analysis.history import METRICS, build_history
from attnbench.analysis.site import RunDigest, build_site, digest_reader, slug
from attnbench.api import load_runs
from attnbench.core.errors import ResultsError
from tests.support import FIXTURE, ROOT, numbers, tiny_case

EXAMPLE_RUNS = ROOT / "results" / "history-example-cpu" / "runs"


@pytest.mark.parametrize("metric", METRICS)
def test_a_history_of_digests_is_the_history_of_the_runs(metric: str) -> None:
    runs = load_runs([EXAMPLE_RUNS, FIXTURE])
    digests = [RunDigest.from_dict(json.loads(json.dumps(RunDigest.of(s).to_dict())), "x") for s in runs]
    assert all(d.run == s.run for d, s in zip(digests, runs, strict=True))
    direct = build_history(runs, metric=metric)  # type: ignore[arg-type]
    read = build_history([d.as_stored() for d in digests], metric=metric, read=digest_reader(digests))  # type: ignore[arg-type]
    assert [(c.key, c.segment) for c in read.cases] == [(c.key, c.segment) for c in direct.cases]
    for a, b in zip(direct.cases, read.cases, strict=True):
        assert [p.value for p in a.points] == [p.value for p in b.points]
        assert a.fit.steps == b.fit.steps
    assert [s.shift for s in direct.segments] == [s.shift for s in read.segments]


def test_a_board_per_config_with_the_planted_step() -> None:
    runs = load_runs([EXAMPLE_RUNS])
    site = build_site([RunDigest.of(s) for s in runs])
    (board,) = site.boards
    assert (
        board.config == "aa-cpu"
        and len(board.cases) == 8
        and list(board.histories) == ["median", "tokens_per_s", "peak_mem"]
    )
    (event,) = board.events
    assert event.case is None and event.position == 9 and event.worse
    assert 0.2 < event.step.change < 0.26
    (latest,) = {v.latest.text for v in board.cases}  # one event for every case: its change and the run it began
    assert numbers(latest) == [23.0, event.position]

    assert slug("aa-cpu", tiny_case("lstm")).startswith("aa-cpu-lstm-forward-float32-b-2-n-16-d-16-")


@pytest.mark.parametrize("peak", [0, 2**62])
def test_a_digest_reads_back_every_peak_a_row_may_hold(peak: int) -> None:
    """A tiny case may measure a peak of 0 bytes (below what the method resolves): the digest writes it, so its
    reader must take it, or every later publish of the site fails (issue 38)."""
    stored = load_runs([FIXTURE])[0]
    data = RunDigest.of(stored).to_dict()
    row = next(r for r in data["rows"] if "peak_bytes" in r)
    row["peak_bytes"] = peak
    again = RunDigest.from_dict(json.loads(json.dumps(data)), "x")
    assert peak in {r.peak_bytes for r in again.rows}


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda d: d.update(schema="x"), "schema: expected 'attnbench.site-run/1'"),
        (lambda d: d["rows"][0].update(median_s=-1), "median_s: expected a positive number"),
        (lambda d: d["rows"][0].update(peak_bytes=-1), "peak_bytes"),
        (lambda d: d["rows"][0].update(bytes_moved=0), "bytes_moved"),
        (lambda d: d["rows"][0]["case"].update(model="nope"), "model"),
        (lambda d: d["run"].pop("run_id"), "run_id"),
    ],
)
def test_a_bad_digest_is_refused_naming_the_file(change: object, says: str, tmp_path: Path) -> None:
    data = RunDigest.of(load_runs([FIXTURE])[0]).to_dict()
    change(data)  # type: ignore[operator]
    with pytest.raises(ResultsError) as info:
        RunDigest.from_dict(data, "site/data/runs/x.json")
    assert info.value.message.startswith("site/data/runs/x.json: ") and says in info.value.message


SERVING_RUN = ROOT / "tests" / "data" / "runs" / "tiny-serving-cpu"


def test_a_digest_keeps_the_runs_capacity_tables() -> None:
    """What a capacity page shows, read back from the digest as the run's reading has it."""
    from attnbench.analysis.reading import Reading

    (stored,) = load_runs([SERVING_RUN])
    digest = RunDigest.from_dict(json.loads(json.dumps(RunDigest.of(stored).to_dict())), "x")
    (kept,) = digest.capacity
    (table,) = Reading.of(stored).capacity
    assert (kept.title, kept.budget_bytes, kept.seq_lens, kept.curves) == (
        table.title,
        table.budget_bytes,
        table.seq_lens,
        table.curves,
    )
    assert kept.crossovers == table.crossovers and list(kept.crossings) == table.crossing_points()
    assert RunDigest.of(load_runs([FIXTURE])[0]).capacity == ()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda t: t["curves"][0]["points"][0].update(batch=0), "capacity[0].curves[0].points[0].batch"),
        (lambda t: t["curves"][0]["points"][0].update(tokens_per_s=-1.0), "tokens_per_s"),
        (lambda t: t["curves"][0]["points"][0].update(status="no way"), "status"),
        (lambda t: t.update(crossings=[[26.0, "yes", "lstm"]]), "capacity[0].crossings[0][1]"),
        (lambda t: t.update(extra=1), "unknown key 'extra'"),
    ],
)
def test_a_bad_capacity_digest_is_refused_naming_the_key(change: object, says: str) -> None:
    data = RunDigest.of(load_runs([SERVING_RUN])[0]).to_dict()
    change(data["capacity"][0])  # type: ignore[operator]
    with pytest.raises(ResultsError) as info:
        RunDigest.from_dict(data, "site/data/runs/x.json")
    assert info.value.message.startswith("site/data/runs/x.json: ") and says in info.value.message
