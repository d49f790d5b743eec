"""What ``compare`` is fed: the same evidence twice (a row pasted twice, a run folder copied twice) counts once,
contradictory rows are refused, a folder of runs says what it skipped, a thresholds file may not repeat a key."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnbench.analysis.compare import Policy, compare_paths, load_side
from attnbench.cli import app
from attnbench.core.errors import EXIT_BAD_INPUT, ResultsError
from tests.analysis.test_compare import BASE, derive
from tests.support import BAD_RUNS, mentions

runner = CliRunner()
SLOWER = 1.07  # beyond the 5 % threshold, but not beyond it and the 4 % floor for one process a side
CASE = ("lstm", "forward", 64)


def slower_current(folder: Path, factor: float = SLOWER) -> Path:
    run, rows = derive.read_run(BASE)
    current = derive.with_run(run, "20261203-000000-current", derive.CURRENT_COMMIT)
    return derive.write_run(folder, current, [derive.scaled(r, factor) for r in rows])


def verdict_of(base: Path, current: Path) -> Any:
    comparison = compare_paths(base, current, Policy())
    (case,) = [c for c in comparison.cases if (c.case.model, c.case.mode, c.case.seq_len) == CASE]
    return case, comparison


def test_a_run_copied_twice_into_a_folder_of_runs_counts_once(tmp_path: Path) -> None:
    for name in ("copy-a", "copy-b"):
        shutil.copytree(BASE, tmp_path / "base" / name)
    case, comparison = verdict_of(tmp_path / "base", slower_current(tmp_path / "current"))
    # Two copies are one process: no between-process spread of zero, no interval collapsed to a point.
    assert (case.verdict, case.evidence) == ("noisy", "samples")
    assert comparison.base.run_ids == (json.loads((BASE / "run.json").read_text())["run_id"],)
    assert mentions(comparison.warnings, f"{tmp_path}/base/copy-b", f"{tmp_path}/base/copy-a")  # which, and of what


def test_a_row_pasted_twice_counts_once(tmp_path: Path) -> None:
    base = Path(shutil.copytree(BASE, tmp_path / "base"))
    rows = (base / "results.jsonl").read_text().splitlines(keepends=True)
    (base / "results.jsonl").write_text("".join(rows + rows))
    case, comparison = verdict_of(base, slower_current(tmp_path / "current"))
    assert (case.verdict, case.evidence, case.base_n) != ("regressed", "processes", 2)
    assert case.evidence == "samples"
    assert mentions(comparison.warnings, f"{base}/results.jsonl:{len(rows) + 1}", values=(1,))  # a copy of line 1


def test_the_same_measurement_under_two_run_ids_counts_once(tmp_path: Path) -> None:
    run, rows = derive.read_run(BASE)
    for i in range(2):
        derive.write_run(tmp_path / "base" / f"r{i}", derive.with_run(run, f"renamed-{i}", derive.BASE_COMMIT), rows)
    case, comparison = verdict_of(tmp_path / "base", slower_current(tmp_path / "current"))
    assert case.evidence == "samples"
    # The run whose rows repeat another's, and how many of them: they count once.
    timed = sum(1 for r in rows if r["status"] == "ok" and r.get("measurement"))
    assert mentions(comparison.warnings, f"{tmp_path}/base/r1", values=(timed,))


def test_copies_of_one_run_that_disagree_are_refused(tmp_path: Path) -> None:
    run, rows = derive.read_run(BASE)
    derive.write_run(tmp_path / "base" / "a", run, rows)
    derive.write_run(tmp_path / "base" / "b", run, [derive.scaled(r, 1.5) for r in rows])
    with pytest.raises(ResultsError) as caught:
        load_side(tmp_path / "base", "base")
    # Both copies, the run they hold, and a case whose rows differ.
    assert mentions(caught.value.message, str(tmp_path / "base" / "a"), str(tmp_path / "base" / "b"), run["run_id"])
    assert "model=" in caught.value.message
    assert caught.value.exit_code == EXIT_BAD_INPUT and "remove the copy" in caught.value.hint


def test_independent_runs_stay_independent_processes(tmp_path: Path) -> None:
    run, rows = derive.read_run(BASE)
    for i, factor in enumerate((0.99, 1.01)):
        member = derive.with_run(run, f"run-{i}", derive.BASE_COMMIT)
        derive.write_run(tmp_path / "base" / f"r{i}", member, [derive.scaled(r, factor) for r in rows])
    case, comparison = verdict_of(tmp_path / "base", slower_current(tmp_path / "current"))
    assert case.evidence == "processes" and case.base_n == 2
    assert not [w for w in comparison.warnings if "counted once" in w]


def test_a_folder_of_runs_says_what_it_skipped(tmp_path: Path) -> None:
    shutil.copytree(BASE, tmp_path / "base" / "run-1")
    (tmp_path / "base" / "notes").mkdir()
    (tmp_path / "base" / "README.md").write_text("runs of the base commit\n")
    side = load_side(tmp_path / "base", "base")
    (warning,) = side.warnings  # the folder without a run.json, not the file beside the runs
    assert mentions(warning, f"{tmp_path}/base", "notes/", "run.json") and "README.md" not in warning
    out = runner.invoke(app, ["compare", str(tmp_path / "base"), str(BASE)])
    assert out.exit_code == 0 and "skipped notes/" in out.stderr


def test_a_contradictory_row_is_refused_not_called_regressed() -> None:
    out = runner.invoke(app, ["compare", str(BASE), str(BAD_RUNS / "rows-ok-without-measurement")])
    assert out.exit_code == EXIT_BAD_INPUT, out.output
    (error,) = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert mentions(error, "results.jsonl:2", "'measurement'")  # the line and the key
    assert "regressed" not in out.stdout


def test_a_lone_surrogate_compares_without_an_encoding_error() -> None:
    folder = BAD_RUNS / "rows-lone-surrogate"
    for fmt in ("table", "md", "json"):
        out = runner.invoke(app, ["compare", str(folder), str(folder), "-f", fmt])
        assert out.exit_code == 0 and out.exception is None, (fmt, out.output)


def test_a_key_given_twice_in_a_thresholds_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text("default: 5%\nlstm: 8%\nlstm: 50%\n")
    out = runner.invoke(app, ["compare", str(BASE), str(BASE), "--thresholds", str(path)])
    lines = out.stderr.splitlines()
    assert out.exit_code == EXIT_BAD_INPUT, out.output
    assert lines[0].startswith("error:") and mentions(lines[0], "--thresholds", f"{path}:3", "'lstm'", values=(2, 3))
    assert lines[1].startswith("hint:")
