"""The sha256 a config resolves to is its identity: stored runs are matched, merged and compared by it. Every
committed config and every committed run's stored config must resolve to the sha256 they always had, however the
resolved config is derived (issue 47, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnbench.config.experiment import load_experiment, stored_experiment
from tests.support import ROOT

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
RUNS = sorted(p for p in (ROOT / "results").rglob("run.json"))
# configs/*.yaml → the sha256 each resolved to when this test was written.
PINNED = json.loads((Path(__file__).with_name("committed_sha256.json")).read_text(encoding="utf-8"))


def test_every_config_is_pinned() -> None:
    assert sorted(PINNED) == [p.name for p in CONFIGS]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_committed_config_resolves_to_its_pinned_sha256(path: Path) -> None:
    experiment = load_experiment(path, force=True)
    assert experiment.sha256 == PINNED[path.name]
    # Its resolved config reads back to itself, so a run swept from it resolves the same.
    assert stored_experiment(experiment.resolved, "again").sha256 == experiment.sha256


@pytest.mark.parametrize("path", RUNS, ids=lambda p: p.parent.relative_to(ROOT).as_posix())
def test_a_committed_runs_stored_config_resolves_to_its_stored_sha256(path: Path) -> None:
    run = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(run.get("config"), dict) or "config_sha256" not in run:
        pytest.skip("a hand-made run.json without a stored config")
    again = stored_experiment(run["config"], str(path))
    assert again.sha256 == run["config_sha256"]
    stored = {k: v for k, v in run["config"].items() if k != "users"}
    assert {k: v for k, v in again.resolved.items() if k != "users"} == stored
