"""Dashboard exports (github-action-benchmark, Bencher BMF) and the raw-sample export, on the stored fixture run.

The two dashboard formats are checked against their documented schemas, written down here as checkers:
- github-action-benchmark, README "Generic JSON format" (customBiggerIsBetter / customSmallerIsBetter): "Every
  entry in the JSON file you provide only needs to provide `name`, `unit`, and `value`. You can also provide
  optional `range` (results' variance) and `extra` ..."; the action's ``BenchmarkResult`` (src/extract.ts) types
  them ``name: string; value: number; range?: string; unit: string; extra?: string``, and its
  ``extractRangeInfo`` (src/extractRangeInfo.ts) reads a range only as ``/(\\+-|±)\\s*(\\d.+)/``.
- Bencher Metric Format, https://bencher.dev/docs/reference/bencher-metric-format: an object of benchmarks, each
  an object of measures, each ``{"value": number, "lower_value"?: number, "upper_value"?: number}`` with
  ``value`` required (its JSON schema, draft-07); benchmark names up to 1024 characters, measure slugs up to 64.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.report.exports import (
    BMF_LATENCY,
    BMF_MEMORY,
    BMF_THROUGHPUT,
    bmf_document,
    gab_entries,
    render_bmf,
    render_gab,
)
from attnbench.report.samples import COLUMNS, render_samples_csv, render_samples_jsonl, sample_rows
from attnbench.results.store import StoredRun, load_run
from tests.support import FIXTURE, check_golden, mentions

runner = CliRunner()
GAB_RANGE = re.compile(r"(?P<prefix>(\+-|±)\s*)(?P<value>\d.+)")  # the action's own pattern
SLUG = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


def is_number(x: object) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def gab_problems(doc: object) -> list[str]:
    """Everything that makes ``doc`` not a customSmallerIsBetter file; empty when it is one."""
    if not isinstance(doc, list):
        return ["not a JSON array"]
    problems = []
    names = [e.get("name") for e in doc if isinstance(e, dict)]
    if len(set(names)) != len(names):
        problems.append("duplicate names (the action keys a chart by name)")
    for i, entry in enumerate(doc):
        if not isinstance(entry, dict):
            problems.append(f"[{i}] not an object")
            continue
        for key in ("name", "unit", "value"):
            if key not in entry:
                problems.append(f"[{i}] no {key!r}")
        if set(entry) - {"name", "unit", "value", "range", "extra"}:
            problems.append(f"[{i}] unknown keys {sorted(set(entry) - {'name', 'unit', 'value', 'range', 'extra'})}")
        if not (isinstance(entry.get("name"), str) and entry["name"]):
            problems.append(f"[{i}] name is not a non-empty string")
        if not isinstance(entry.get("unit"), str):
            problems.append(f"[{i}] unit is not a string")
        if not is_number(entry.get("value")):
            problems.append(f"[{i}] value is not a finite number")
        if "range" in entry:
            match = GAB_RANGE.search(entry["range"]) if isinstance(entry["range"], str) else None
            if match is None or not is_number(float(match["value"])):
                problems.append(f"[{i}] range {entry['range']!r} is not '± <number>'")
        if "extra" in entry and not isinstance(entry["extra"], str):
            problems.append(f"[{i}] extra is not a string")
    return problems


def bmf_problems(doc: object) -> list[str]:
    """Everything that makes ``doc`` not BMF JSON; empty when it is."""
    if not isinstance(doc, dict):
        return ["not a JSON object"]
    problems = []
    for name, measures in doc.items():
        if not (isinstance(name, str) and 0 < len(name) <= 1024):
            problems.append(f"benchmark name {name!r} is not 1-1024 characters")
        if not isinstance(measures, dict) or not measures:
            problems.append(f"{name}: not a non-empty object of measures")
            continue
        for slug, metric in measures.items():
            if not (len(slug) <= 64 and SLUG.fullmatch(slug)):
                problems.append(f"{name}: measure {slug!r} is not a slug of at most 64 characters")
            if not isinstance(metric, dict) or "value" not in metric:
                problems.append(f"{name}/{slug}: no 'value'")
                continue
            if set(metric) - {"value", "lower_value", "upper_value"}:
                problems.append(f"{name}/{slug}: unknown keys")
            if not all(is_number(v) for v in metric.values()):
                problems.append(f"{name}/{slug}: a value is not a finite number")
            elif not metric.get("lower_value", -math.inf) <= metric["value"] <= metric.get("upper_value", math.inf):
                problems.append(f"{name}/{slug}: value outside [lower_value, upper_value]")
    return problems


@pytest.fixture(scope="module")
def stored() -> StoredRun:
    return load_run(FIXTURE)


def test_golden_gab(stored: StoredRun) -> None:
    check_golden("tiny-cpu.gab.json", render_gab(stored.results))


def test_gab_says_a_single_sample_has_no_spread(stored: StoredRun) -> None:
    """One sample has no IQR: "IQR 0.0 % (noisy)" would read as a measured, perfectly steady case."""
    latency = [e["extra"] for e in gab_entries(stored.results) if e["name"].endswith("|metric=latency")]
    by_samples = {extra.split("samples: ")[1].split(" ")[0]: extra for extra in latency}
    assert "IQR: 1 sample, no spread" in by_samples["1"]
    assert all("no spread" not in extra for n, extra in by_samples.items() if n != "1")


def test_golden_bmf(stored: StoredRun) -> None:
    check_golden("tiny-cpu.bmf.json", render_bmf(stored.results))


def test_checkers_reject_what_the_formats_do_not_allow() -> None:
    # A checker that accepts everything proves nothing: each of these breaks one documented rule.
    assert gab_problems({"name": "a"}) == ["not a JSON array"]
    (problem,) = gab_problems([{"name": "a", "unit": "ms", "value": "1"}])
    assert mentions(problem, "[0]", "value")  # which entry, and which key
    assert gab_problems([{"name": "a", "unit": "ms", "value": 1, "range": "3%"}])
    assert gab_problems([{"name": "a", "unit": "ms", "value": 1}] * 2)
    assert gab_problems([{"name": "a", "value": 1}])
    assert bmf_problems({"b": {"latency": {"lower_value": 1.0}}})
    assert bmf_problems({"b": {"Latency ms": {"value": 1.0}}})
    assert bmf_problems({"b": {"latency": {"value": 2.0, "lower_value": 3.0, "upper_value": 4.0}}})
    assert not gab_problems([{"name": "a", "unit": "ms", "value": 1.5, "range": "± 0.25", "extra": "x"}])
    assert not bmf_problems({"b": {"latency": {"value": 88.0, "lower_value": 87.42, "upper_value": 88.88}}})


def test_gab_is_valid_custom_smaller_is_better(stored: StoredRun) -> None:
    doc = json.loads(render_gab(stored.results))
    assert gab_problems(doc) == []


def test_gab_values_are_the_medians_in_ms_and_memory_in_mib(stored: StoredRun) -> None:
    entries = {e["name"]: e for e in gab_entries(stored.results)}
    timed = [r for r in stored.results if r.ok]
    assert len(entries) == 2 * len(timed)  # every timed case has a latency and (on this run) a memory entry
    for r in timed:
        assert r.measurement is not None and r.memory is not None and r.memory.peak_bytes is not None
        s = r.measurement.summary
        latency = entries[f"{r.case.key}|metric=latency"]
        assert latency["unit"] == "ms"
        assert latency["value"] == pytest.approx(s.median * 1e3, rel=1e-5)
        if math.isfinite(s.ci_halfwidth_rel):
            half = float(GAB_RANGE.search(latency["range"])["value"])  # type: ignore[index]
            assert half == pytest.approx(s.ci_halfwidth_rel * s.median * 1e3, rel=1e-5)
        else:
            assert "range" not in latency and "too few samples" in latency["extra"]
        assert "tokens/s" in latency["extra"]  # bigger-is-better rides along in extra, never as an entry
        memory = entries[f"{r.case.key}|metric=peak_memory"]
        assert memory["unit"] == "MiB" and memory["value"] == pytest.approx(r.memory.peak_bytes / 2**20, rel=1e-5)
    assert not any("sdpa-efficient" in name for name in entries)  # unsupported cases have nothing to chart


def test_bmf_is_valid_and_uses_the_builtin_measures_units(stored: StoredRun) -> None:
    doc = json.loads(render_bmf(stored.results))
    assert bmf_problems(doc) == []
    timed = [r for r in stored.results if r.ok]
    assert list(doc) == [r.case.key for r in timed]
    for r in timed:
        assert r.measurement is not None and r.memory is not None
        s = r.measurement.summary
        measures = doc[r.case.key]
        latency = measures[BMF_LATENCY]
        assert latency["value"] == pytest.approx(s.median * 1e9, rel=1e-5)  # Bencher's latency is in ns
        throughput = measures[BMF_THROUGHPUT]
        assert throughput["value"] == pytest.approx(r.case.tokens / s.median, rel=1e-5)
        if math.isfinite(s.ci_low) and math.isfinite(s.ci_high):
            assert latency["lower_value"] == pytest.approx(s.ci_low * 1e9, rel=1e-5)
            assert latency["upper_value"] == pytest.approx(s.ci_high * 1e9, rel=1e-5)
            assert throughput["lower_value"] == pytest.approx(r.case.tokens / s.ci_high, rel=1e-5)
        else:  # one sample: no interval, so no bounds rather than infinities
            assert set(latency) == {"value"} and set(throughput) == {"value"}
        assert measures[BMF_MEMORY] == {"value": r.memory.peak_bytes}


def test_exports_name_benchmarks_by_case_key_so_runs_line_up(stored: StoredRun) -> None:
    # The same case in another run has the same key, so a dashboard's history follows it.
    keys = {r.case.key for r in stored.results if r.ok}
    assert set(bmf_document(stored.results)) == keys
    assert {e["name"].rsplit("|metric=", 1)[0] for e in gab_entries(stored.results)} == keys


@pytest.mark.parametrize(("fmt", "problems"), [("gab", gab_problems), ("bmf", bmf_problems)])
def test_cli_writes_the_export_and_says_what_is_left_out(fmt: str, problems: Any, tmp_path: Path) -> None:
    out = tmp_path / f"x.{fmt}.json"
    result = runner.invoke(app, ["report", str(FIXTURE), "--format", fmt, "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert problems(json.loads(out.read_text())) == []
    assert mentions(result.stderr.splitlines(), fmt, values=(5,))  # 5 cases left out of it, said
    to_stdout = runner.invoke(app, ["report", str(FIXTURE), "--format", fmt, "-o", "-"])
    assert to_stdout.stdout == out.read_text()


# ------------------------------------------------------------------------------------------------- raw samples


def first_rows_per_case(rows: list[dict[str, Any]], k: int = 3) -> list[dict[str, Any]]:
    """The golden keeps the first ``k`` samples of each case: the whole export is megabytes of numbers."""
    return [row for row in rows if row["sample"] < k]


def test_golden_samples_jsonl(stored: StoredRun) -> None:
    rows = [json.loads(line) for line in render_samples_jsonl(stored.run, stored.results).splitlines()]
    head = "".join(json.dumps(row) + "\n" for row in first_rows_per_case(rows))
    check_golden("tiny-cpu.samples.jsonl", head)


def test_golden_samples_csv(stored: StoredRun) -> None:
    text = render_samples_csv(stored.run, stored.results)
    lines = text.splitlines(keepends=True)
    rows = list(csv.DictReader(io.StringIO(text)))
    head = [lines[0]] + [line for line, row in zip(lines[1:], rows, strict=True) if int(row["sample"]) < 3]
    check_golden("tiny-cpu.samples.csv", "".join(head))


def test_samples_are_every_stored_sample_exactly(stored: StoredRun) -> None:
    rows = [json.loads(line) for line in render_samples_jsonl(stored.run, stored.results).splitlines()]
    assert all(list(row) == list(COLUMNS) for row in rows)
    timed = [r for r in stored.results if r.measurement is not None]
    assert len(rows) == sum(len(r.measurement.samples_s) for r in timed if r.measurement)
    for r in timed:
        assert r.measurement is not None
        mine = [row for row in rows if row["key"] == r.case.key]
        assert [row["sample"] for row in mine] == list(range(len(r.measurement.samples_s)))
        assert tuple(row["seconds"] for row in mine) == r.measurement.samples_s  # bit for bit
        assert {row["calls_per_sample"] for row in mine} == {r.measurement.calls_per_sample}
    csv_rows = list(csv.DictReader(io.StringIO(render_samples_csv(stored.run, stored.results))))
    assert [float(row["seconds"]) for row in csv_rows] == [row["seconds"] for row in rows]  # repr round-trips


@pytest.mark.slow
def test_samples_cli_picks_the_container_from_the_file_name(tmp_path: Path) -> None:
    jsonl, as_csv = tmp_path / "s.jsonl", tmp_path / "s.csv"
    assert runner.invoke(app, ["report", str(FIXTURE), "-f", "samples", "-o", str(jsonl)]).exit_code == 0
    assert runner.invoke(app, ["report", str(FIXTURE), "-f", "samples", "-o", str(as_csv)]).exit_code == 0
    assert json.loads(jsonl.read_text().splitlines()[0])["sample"] == 0
    assert as_csv.read_text().splitlines()[0] == ",".join(COLUMNS)
    stdout = runner.invoke(app, ["report", str(FIXTURE), "-f", "samples"])
    assert stdout.exit_code == 0 and stdout.stdout == jsonl.read_text()


def test_parquet_without_pyarrow_is_an_error_with_a_hint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    result = runner.invoke(app, ["report", str(FIXTURE), "-f", "samples", "-o", str(tmp_path / "s.parquet")])
    assert result.exit_code == 2
    assert mentions([line for line in result.stderr.splitlines() if line.startswith("hint:")], "pip install pyarrow")

    assert not (tmp_path / "s.parquet").exists()  # never a JSON file under a .parquet name


def test_parquet_round_trips_where_pyarrow_is_installed(stored: StoredRun, tmp_path: Path) -> None:
    pytest.importorskip("pyarrow")
    import pandas as pd

    path = tmp_path / "s.parquet"
    assert runner.invoke(app, ["report", str(FIXTURE), "-f", "samples", "-o", str(path)]).exit_code == 0
    frame = pd.read_parquet(path)
    assert list(frame.columns) == list(COLUMNS)
    assert list(frame["seconds"]) == [row["seconds"] for row in sample_rows(stored.run, stored.results)]
