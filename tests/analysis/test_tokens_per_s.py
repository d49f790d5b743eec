"""One definition of a row's tokens per second — ``Result.tokens_per_call`` ÷ the median — read alike by every reader
and gate: report's rows, history, the published site's digests and compare's ``tokens_per_s`` gate. A capacity row
counts the batch it found on its own side (issue 50 §3.1: compare once divided both sides by the base's batch, and
publish by the grid's batch of 1)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analysis.compare import Policy, compare_paths
from attnbench.analysis.history import point
from attnbench.analysis.site import RunDigest
from attnbench.analysis.thresholds import Thresholds, with_fail_on
from attnbench.api import load_run
from attnbench.cli import app
from attnbench.report.rows import summary_row
from tests.support import ROOT

SERVING = ROOT / "tests" / "data" / "runs" / "tiny-serving-cpu"
runner = CliRunner()
CAPACITY = "model=lstm|mode=capacity|dtype=float32|device=cpu|batch=1|seq_len=64|"


def _copy(tmp_path: Path, name: str, *, batch_factor: int = 1, time_factor: float = 1.0) -> Path:
    """The serving fixture, with one lstm capacity row's batch found and step time scaled."""
    out = tmp_path / name
    shutil.copytree(SERVING, out)
    run = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**run, "run_id": name}))
    lines = []
    for line in (out / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["key"].startswith(CAPACITY):
            row["extra"]["capacity_batch"] *= batch_factor
            m = row["measurement"]
            m["samples_s"] = [s * time_factor for s in m["samples_s"]]
        lines.append(json.dumps(row))
    (out / "results.jsonl").write_text("\n".join(lines) + "\n")
    return out


def test_a_capacity_that_doubled_at_a_slower_step_is_more_tokens_per_s_in_every_reader(tmp_path: Path) -> None:
    base = _copy(tmp_path, "base")
    current = _copy(tmp_path, "current", batch_factor=2, time_factor=1.6)  # 2 / 1.6 = 1.25 × the tokens/s
    limits = with_fail_on(Thresholds(10.0), ["tokens_per_s:5%"])  # the median gate alone passes whatever it reads
    comparison = compare_paths(base, current, Policy(limits, noise_floor=0.0))
    (gate,) = [g for g in comparison.gates if g.key.startswith(CAPACITY)]
    assert gate.ratio == pytest.approx(1.25, rel=1e-6)
    assert gate.verdict == "improved" and not comparison.regressed and comparison.exit_code == 0
    gates = ["--fail-on", "median:99%", "--fail-on", "tokens_per_s:5%"]
    cli = runner.invoke(app, ["compare", str(base), str(current), "--noise-floor", "0", *gates])
    assert cli.exit_code == 0, cli.output

    for folder in (base, current):
        stored = load_run(folder)
        (row,) = [r for r in stored.results if r.case.key.startswith(CAPACITY)]
        expected = row.extra["capacity_batch"] / row.timing.summary.median  # capacity_batch ÷ median
        assert row.tokens_per_s == pytest.approx(expected)
        assert summary_row(row)["tokens_per_s"] == pytest.approx(expected)  # report (summary.csv, tables)
        assert point(row, "tokens_per_s").value == pytest.approx(expected)  # history
        (digest,) = [d for d in RunDigest.of(stored).rows if d.case.key == row.case.key]
        assert digest.point("tokens_per_s").value == pytest.approx(expected)  # publish
        again = RunDigest.from_dict(json.loads(json.dumps(RunDigest.of(stored).to_dict())), "digest")
        (read,) = [d for d in again.rows if d.case.key == row.case.key]
        assert read.point("tokens_per_s").value == pytest.approx(expected)  # a published site read back
    assert gate.current is not None and gate.base is not None
