"""``sweep --budget-from RUN`` (issue 51 §1): a case at the edge of its time budget is decided once. The cases the
base run timed ok take ``timing.min_samples`` in the head run even past ``timing.max_case_s``, so unchanged code is
not ok on one side and too slow on the other, and a slowdown is judged by its time."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.results.store import load_run
from tests.support import QUICK_TIMING, tiny_config

runner = CliRunner()


def _sweep(config: Path, out: Path, *args: str) -> list:  # type: ignore[type-arg]
    result = runner.invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots", "-q", *args])
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    return list(load_run(folder).results)


@pytest.mark.slow
def test_a_head_run_keeps_the_base_runs_budget_decisions(tmp_path: Path) -> None:
    config = tmp_path / "edge.yaml"
    config.write_text(tiny_config("edge", models=["lstm"], grid={"batch": [1], "seq_len": [8, 16]}))
    base = _sweep(config, tmp_path / "base")
    assert {r.status for r in base} == {"ok"}
    (base_folder,) = (tmp_path / "base").iterdir()
    # A budget no case fits (far below min_samples samples of any call): every case is too slow on its own...
    tight = ["--set", "timing.max_case_s=0.001", "--set", "timing.min_time_s=0.0005"]
    alone = _sweep(config, tmp_path / "alone", *tight)
    assert {r.status for r in alone} == {"too_slow_for_budget"}
    assert not any(r.extra.get("budget_decided") for r in alone)
    # ... and ok where the base run decided its budget: min_samples taken past it, the row says why.
    decided = _sweep(config, tmp_path / "head", *tight, "--budget-from", str(base_folder))
    assert {r.status for r in decided} == {"ok"}
    assert all(r.extra.get("budget_decided") is True for r in decided)
    assert all(len(r.timing.samples_s) >= int(QUICK_TIMING["min_samples"]) for r in decided)


def test_a_budget_from_a_missing_run_is_one_error_line(tmp_path: Path) -> None:
    config = tmp_path / "edge.yaml"
    config.write_text(tiny_config("edge", models=["lstm"]))
    result = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / "o"), "--budget-from", "nowhere"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert not (tmp_path / "o").exists()
