"""analysis.alerts.alert_steps: what history --fail-on-step and --alert raise, decided in analysis rather than in
the command: the worse steps the history less its newest run did not report."""

from __future__ import annotations

from pathlib import Path

from attnbench.analysis.alerts import alert_steps
from attnbench.api import history, load_runs
from tests.support import synthetic_runs


def test_alert_steps_are_the_worse_steps_the_history_less_its_newest_run_did_not_report(tmp_path: Path) -> None:
    stepped = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"
    folder = tmp_path / "runs"
    synthetic_runs(folder, [1.0] * 6 + [1.3] * 2, only=stepped, sigma=0.01, case_sigma=0.005)
    runs = load_runs(sorted(folder.iterdir()))
    (event,) = alert_steps(runs, history(runs))
    assert event.worse and event.key.startswith(stepped + "|") and event.position == 7
    # The run before confirmed nothing yet; a faster step raises nothing.
    assert alert_steps(runs[:-1], history(runs[:-1])) == []
    faster = tmp_path / "faster"
    synthetic_runs(faster, [1.0] * 6 + [0.7] * 2, only=stepped, sigma=0.01, case_sigma=0.005)
    quicker = load_runs(sorted(faster.iterdir()))
    assert alert_steps(quicker, history(quicker)) == []
