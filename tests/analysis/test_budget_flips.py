"""A case at the edge of its time budget must not flip a gate (issue 51 §1): ``ok`` ↔ ``too_slow_for_budget`` is a
timing, never a status regression (nor an improvement); and a case timed on a busy machine on either side gets no
verdict, however far its numbers moved. Status changes that are real (ok → oom, ok → crashed) still regress."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analysis.compare import Policy, compare_case, compare_paths
from attnbench.cli import app
from attnbench.core.errors import EXIT_CASE_FAILED, EXIT_OK
from attnbench.results.contention import Contention
from attnbench.results.records import Result
from tests.analysis.test_compare import row
from tests.support import synthetic_runs

runner = CliRunner()
LSTM = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"
BUSY = {"contended": True, "reasons": ["other processes kept 1.0 of 2 cores busy"], "window_s": 1.0}


def too_slow(median: float = 1e-3) -> Result:
    timed = row(median=median, n=4)
    return Result(timed.case, "too_slow_for_budget", reason="too slow for the budget", measurement=timed.measurement)


@pytest.mark.parametrize("flip", ["ok → too slow", "too slow → ok"])
def test_a_budget_flip_is_no_status_verdict(flip: str) -> None:
    sides = ([row()], [too_slow(1.3e-3)]) if flip == "ok → too slow" else ([too_slow(1.3e-3)], [row()])
    got = compare_case("k", *sides, Policy(noise_floor=0.0))
    assert got.verdict == "noisy" and got.evidence == "status"
    # A real status change is judged as before.
    assert compare_case("k", [row()], [row("oom")], Policy()).verdict == "regressed"
    assert compare_case("k", [too_slow()], [row("crashed")], Policy()).verdict == "regressed"


def _edit(folder: Path, change: dict[str, object], *, samples: float = 1.0) -> None:
    for run in folder.iterdir():
        lines = []
        for line in (run / "results.jsonl").read_text().splitlines():
            data = json.loads(line)
            if data["key"].startswith(LSTM):
                data.update(change)
                data["measurement"]["samples_s"] = [s * samples for s in data["measurement"]["samples_s"]]
            lines.append(json.dumps(data))
        (run / "results.jsonl").write_text("\n".join(lines) + "\n")
        meta = json.loads((run / "run.json").read_text())
        (run / "run.json").write_text(json.dumps({**meta, "run_id": f"{folder.name}-{run.name}"}))


def _sides(tmp_path: Path) -> tuple[Path, Path]:
    base, current = tmp_path / "base", tmp_path / "current"
    synthetic_runs(base, [1.0], seed=1, sigma=0.0, case_sigma=0.0)
    synthetic_runs(current, [1.0], seed=1, sigma=0.0, case_sigma=0.0)
    return base, current


def test_readmes_ci_recipe_passes_when_unchanged_code_lands_at_the_budgets_edge(tmp_path: Path) -> None:
    base, current = _sides(tmp_path)
    _edit(current, {"status": "too_slow_for_budget", "reason": "too slow for the budget: 420 ms a sample"})
    comparison = compare_paths(base, current, Policy(noise_floor=0.0))
    (case,) = [c for c in comparison.cases if c.key.startswith(LSTM)]
    assert case.verdict == "noisy" and not comparison.regressed and comparison.exit_code == EXIT_OK
    out = runner.invoke(app, ["compare", str(base), str(current), "--noise-floor", "0"])
    assert out.exit_code == EXIT_OK, out.output
    out = runner.invoke(app, ["compare", str(current), str(base), "--noise-floor", "0"])  # and back: no improvement
    assert out.exit_code == EXIT_OK, out.output
    back = compare_paths(current, base, Policy(noise_floor=0.0))
    assert [c.verdict for c in back.cases if c.key.startswith(LSTM)] == ["noisy"]


@pytest.mark.parametrize("busy_side", ["base", "current"])
def test_a_case_timed_on_a_busy_machine_on_either_side_is_no_regression(tmp_path: Path, busy_side: str) -> None:
    base, current = _sides(tmp_path)
    _edit(current, {}, samples=1.85)  # +85 %: far beyond any floor
    _edit(base if busy_side == "base" else current, {"contention": BUSY})
    limits = ["--noise-floor", "0", "--fail-on", "tokens_per_s:5%"]
    comparison = compare_paths(base, current, Policy(noise_floor=0.0))
    (case,) = [c for c in comparison.cases if c.key.startswith(LSTM)]
    assert case.verdict == "noisy" and case.contended == (busy_side,)
    out = runner.invoke(app, ["compare", str(base), str(current), *limits])
    assert out.exit_code == EXIT_OK, out.output
    # The same change timed on a quiet machine fails the build: the contention alone withheld the verdict.
    _edit(base if busy_side == "base" else current, {"contention": {**BUSY, "contended": False, "reasons": []}})
    assert runner.invoke(app, ["compare", str(base), str(current), *limits]).exit_code == EXIT_CASE_FAILED
    assert Contention.from_dict(BUSY).contended
