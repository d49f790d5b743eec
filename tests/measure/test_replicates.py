"""Between-process replicates: the merge rule on made-up rows, and a real sweep in fresh worker processes."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.cases import Case
from attnbench.results.measurement import Measurement
from attnbench.results.records import Memory, Result
from attnbench.results.store import load_run
from attnbench.sweeps.replicated_executor import ReplicatedExecutor, merge_replicates
from tests.support import numbers

CASE = Case("lstm", "forward", "float32", "cpu", 2, 16, 32, None, 1, True)


def _row(median: float, peak: int, *, warnings: tuple[str, ...] = ()) -> Result:
    m = Measurement(
        samples_s=(median * 0.99, median, median * 1.01),
        calls_per_sample=4,
        warmup_calls=5,
        warmup_s=0.01,
        converged=True,
        stop_reason="converged",
        target_ci=0.01,
        warnings=warnings,
    )
    return Result(CASE, "ok", measurement=m, memory=Memory(peak, "rss-hwm"), duration_s=1.0, extra={"a": 1})


def test_merge_pools_samples_keeps_each_median_and_the_largest_peak() -> None:
    merged = merge_replicates([_row(1e-3, 10), _row(1.2e-3, 30, warnings=("noisy",)), _row(1.1e-3, 20)])
    m = merged.measurement
    assert m is not None and merged.memory is not None
    assert len(m.samples_s) == 9
    assert m.replicate_medians_s == pytest.approx((1e-3, 1.2e-3, 1.1e-3))
    assert m.warmup_calls == 15
    assert m.warnings == ("replicate 2: noisy",)
    assert merged.memory.peak_bytes == 30
    assert merged.duration_s == pytest.approx(3.0)
    assert merged.extra["replicates"] == 3 and merged.extra["a"] == 1
    # The between-process spread (≈ 9 %) dominates the CI, not the 1 % within each replicate.
    assert m.summary.ci_halfwidth_rel > 0.2 > m.within.ci_halfwidth_rel


class _Scripted:
    def __init__(self, results: list[Result]) -> None:
        self.results, self.closed = list(results), 0

    def run(self, case: Case) -> Result:
        return self.results.pop(0)

    def close(self, *, now: bool = False) -> None:
        self.closed += 1


def test_every_replicate_gets_a_fresh_worker_and_a_failure_fails_the_case() -> None:
    crashed = Result(CASE, "crashed", "the worker was killed by SIGSEGV")
    inner = _Scripted([_row(1e-3, 1), crashed])
    result = ReplicatedExecutor(inner, 3).run(CASE)
    assert result.status == "crashed"
    assert result.reason.endswith(crashed.reason) and numbers(result.reason)[:2] == [2, 3]  # replicate 2 of 3

    assert inner.closed == 2  # closed before each run: the next one starts a new process


@pytest.mark.slow
def test_a_sweep_with_processes_2_runs_fresh_workers_and_stores_both_medians(tmp_path: Path) -> None:
    config = tmp_path / "rep.yaml"
    config.write_text(
        "name: rep\ndevice: cpu\nmodels: [lstm]\nmodes: [forward]\ngrid: {batch: [2], seq_len: [16]}\n"
        "d_model: 32\ntelemetry: off\n"
        "timing: {processes: 2, target_ci: 0.05, min_samples: 5, min_time_s: 0.01, max_case_s: 2.0,\n"
        "  process_warmup_s: 0.05}\n"
    )
    result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "out").iterdir()
    (row,) = load_run(folder).results
    assert row.ok and row.measurement is not None
    assert len(row.measurement.replicate_medians_s) == 2
    assert row.extra["replicates"] == 2


def test_processes_with_no_isolate_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "rep.yaml"
    config.write_text("name: rep\nmodels: [lstm]\ngrid: {batch: [2], seq_len: [16]}\ntiming: {processes: 2}\n")
    result = CliRunner().invoke(app, ["sweep", str(config), "--no-isolate", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert "forbids" in result.output and "hint:" in result.output
