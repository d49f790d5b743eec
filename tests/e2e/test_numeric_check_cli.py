"""The numerical check through the CLI (issue 50, item 1): a model whose fast form is off its reference is an
``incorrect`` row that fails the sweep (exit 1) and reads as a regression in ``compare``; ``--no-check`` and the
config's ``check: off`` time it without the check; a bad ``check`` value is bad input (exit 2)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.errors import EXIT_BAD_INPUT, EXIT_CASE_FAILED
from attnbench.results.store import load_run
from tests.support import QUICK_TIMING

runner = CliRunner()
WRONG = "tests.measure.test_reference_check:off_by_1e_2"


def config(tmp_path: Path, **changes: object) -> Path:
    data: dict[str, object] = {
        "name": "checked",
        "device": "cpu",
        "threads": 1,
        "models": ["mingru", {"name": "my-wrong", "factory": WRONG, "kind": "recurrent"}],
        "modes": ["forward"],
        "causal": True,
        "grid": {"batch": [2], "seq_len": [16, 48]},
        "d_model": 16,
        "heads": 2,
        "timing": dict(QUICK_TIMING),
        **changes,
    }
    path = tmp_path / "checked.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sweep(path: Path, out: Path, *extra: str) -> tuple[int, Path, str]:
    result = runner.invoke(app, ["sweep", str(path), "--out", str(out), "--no-plots", *extra])
    folders = sorted(out.iterdir()) if out.exists() else []
    return result.exit_code, folders[-1] if folders else out, result.output


@pytest.mark.slow
def test_a_wrong_model_is_incorrect_fails_the_sweep_and_regresses_in_compare(tmp_path: Path) -> None:
    code, checked, output = sweep(config(tmp_path), tmp_path / "on")
    assert code == EXIT_CASE_FAILED, output
    stored = load_run(checked)
    status = {(r.case.model, r.case.seq_len): r.status for r in stored.results}
    assert status == {
        ("mingru", 16): "ok",
        ("mingru", 48): "ok",
        ("my-wrong", 16): "incorrect",
        ("my-wrong", 48): "incorrect",
    }
    table = list(csv.DictReader((checked / "summary.csv").open()))
    wrong = [row for row in table if row["model"] == "my-wrong"]
    assert {row["status"] for row in wrong} == {"incorrect"} and {row["check_status"] for row in wrong} == {"failed"}
    assert all(float(row["check_rel_err"]) > float(row["check_tol"]) == 5e-3 for row in wrong)
    assert {row["check_status"] for row in table if row["model"] == "mingru"} == {"passed"}
    assert all(row["median_ms"] == "" for row in wrong)  # never timed

    code, unchecked, output = sweep(config(tmp_path), tmp_path / "off", "--no-check")
    assert code == 0, output
    rows = load_run(unchecked).results
    assert all(r.ok and r.check is not None and r.check.status == "skipped" for r in rows)

    # The same cases, timed ok without the check and incorrect with it: a regression, exit 1.
    compared = runner.invoke(app, ["compare", str(unchecked), str(checked), "--format", "json"])
    assert compared.exit_code == EXIT_CASE_FAILED, compared.output
    verdicts = {c["case"]["model"]: c["verdict"] for c in json.loads(compared.stdout)["cases"]}
    assert verdicts == {"mingru": verdicts["mingru"], "my-wrong": "regressed"}
    # history reads the status as a status of its own, in both runs' order
    history = runner.invoke(app, ["history", str(unchecked), str(checked), "--format", "json"])
    assert history.exit_code == 0, history.output
    statuses = {p["status"] for c in json.loads(history.stdout)["cases"] for p in c["points"]}
    assert {"ok", "incorrect"} <= statuses
    assert "incorrect" in (checked / "summary.md").read_text()


@pytest.mark.slow
def test_check_off_in_the_config_times_without_the_check(tmp_path: Path) -> None:
    code, folder, output = sweep(config(tmp_path, check="off", grid={"batch": [2], "seq_len": [16]}), tmp_path / "o")
    assert code == 0, output
    rows = load_run(folder).results
    assert {r.status for r in rows} == {"ok"} and all(r.check and r.check.status == "skipped" for r in rows)


@pytest.mark.parametrize("value", ["maybe", 1])
def test_a_check_value_other_than_on_or_off_is_bad_input(tmp_path: Path, value: object) -> None:
    result = runner.invoke(app, ["validate", str(config(tmp_path, check=value))])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "check" in result.output


def test_check_off_written_bare_in_yaml_validates(tmp_path: Path) -> None:
    path = config(tmp_path)
    path.write_text(path.read_text() + "check: off\n")
    assert runner.invoke(app, ["validate", str(path)]).exit_code == 0
