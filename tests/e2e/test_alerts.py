"""history --fail-on-step (the alert on a step the newest run confirmed) and --bisect (the commits between the last
good and the first bad run, and a git bisect command that finds the commit, run here on a small git repository)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analysis.alerts import new_steps, step_events
from attnbench.analysis.bisect import bisect_hint, bisectable, noise_floor_for, one_case_sets
from attnbench.api import history, load_runs
from attnbench.cli import app
from attnbench.config.experiment import load_experiment
from attnbench.core.errors import AttnbenchError
from attnbench.report.alerts_md import ALERT_MARKER
from attnbench.workflows.history import HistoryRequest, trace
from tests.support import ROOT, mentions, synthetic_runs, tiny_config

runner = CliRunner()
STEPPED = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"


def test_an_alert_only_when_the_newest_run_confirms_a_worse_step(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    synthetic_runs(folder, [1.0] * 6 + [1.3] * 2, only=STEPPED, sigma=0.01, case_sigma=0.005)
    alert = tmp_path / "alert.md"
    result = runner.invoke(app, ["history", str(folder), "-f", "md", "--fail-on-step", "--alert", str(alert)])
    assert result.exit_code == 1, result.output
    text = alert.read_text()
    heading = next(line for line in text.splitlines() if line.startswith("## "))
    assert mentions(heading, "median", values=(1,)) and "**synthetic-007**" in text  # 1 case; the newest run
    (row,) = [line for line in text.splitlines() if line.startswith("| lstm forward float32 b=2 n=64")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1].endswith("slower") and 25 < float(cells[1].split()[0].lstrip("+")) < 35
    assert "…" in cells[2]  # the step's 95 % interval
    assert cells[3].startswith("7. synthetic-006") and cells[4].startswith("6. synthetic-005")
    assert not re.search(r"`[0-9a-f]{12}", text)  # the runs record no commit: no range to name
    # One run later the step is old news: no alert, and the stale file is removed.
    synthetic_runs(tmp_path / "more", [1.3], only=STEPPED, seed=5)
    later = tmp_path / "more" / "run-000"
    run = json.loads((later / "run.json").read_text())
    (later / "run.json").write_text(
        json.dumps({**run, "run_id": "synthetic-008", "created_utc": "2026-12-01T09:00:00Z"})
    )
    again = runner.invoke(app, ["history", str(folder), str(later), "--fail-on-step", "--alert", str(alert)])
    assert again.exit_code == 0, again.output
    assert not alert.exists()


@pytest.mark.parametrize("target", ["notes", "rows", "folder", "link"])
def test_an_alert_path_that_is_not_an_alert_is_refused_and_kept(tmp_path: Path, target: str) -> None:
    """Without a new step the alert file is removed: before issue 38 whatever --alert named went, a run's
    results.jsonl or someone's notes included, and a folder was a traceback."""
    folder = tmp_path / "runs"
    synthetic_runs(folder, [1.0] * 4, only=STEPPED)  # no step: the path given is what gets removed
    notes = tmp_path / "notes.md"
    notes.write_text("my notes\n")
    alert = {
        "notes": notes,
        "rows": sorted(folder.iterdir())[0] / "results.jsonl",
        "folder": tmp_path,
        "link": tmp_path / "alert.md",
    }[target]
    if target == "link":
        alert.symlink_to(notes)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    result = runner.invoke(app, ["history", str(folder), "--fail-on-step", "--alert", str(alert)])
    assert result.exit_code == 2, result.output
    assert result.output.count("error:") == 1 and "Traceback" not in result.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()} == before


def test_an_alert_it_wrote_and_an_empty_file_are_replaced_or_removed(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    synthetic_runs(folder, [1.0] * 4, only=STEPPED)
    for content in ("<!-- attnbench-history-alert -->\n## an old alert\n", ""):
        alert = tmp_path / "alert.md"
        alert.write_text(content)
        result = runner.invoke(app, ["history", str(folder), "--fail-on-step", "--alert", str(alert)])
        assert result.exit_code == 0, result.output
        assert not alert.exists()


def test_a_faster_step_does_not_fail(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    synthetic_runs(folder, [1.0] * 6 + [0.7] * 2, only=STEPPED, sigma=0.01, case_sigma=0.005)
    result = runner.invoke(app, ["history", str(folder), "--fail-on-step"])
    assert result.exit_code == 0, result.output
    (event,) = new_steps(history(folder), history(sorted(folder.iterdir())[:-1]))
    assert not event.worse and event.position == 7


def test_the_example_history_alerts_once_its_step_is_confirmed(tmp_path: Path) -> None:
    """The committed example (a 25 % slowdown planted from run 9): with runs 1–11 the eleventh confirms it."""
    runs = sorted((ROOT / "results" / "history-example-cpu" / "runs").iterdir())
    first_eleven = load_runs(runs[:11])
    events = new_steps(history(first_eleven), history(first_eleven[:-1]))
    (event,) = events
    assert event.case is None and event.cases == 8 and event.worse
    assert (event.position, event.good_position) == (9, 8)
    assert event.first_bad.run.label == "run-09-slow25" and event.last_good.run.label == "run-08"
    assert not new_steps(history(load_runs(runs)), history(load_runs(runs[:11])))  # run 12 adds nothing new


def test_the_history_workflow_hands_the_command_one_frozen_value_and_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``workflows.history.trace`` does the command's work: the alert and the bisect hints come back rendered, the
    alert file is the command's to write, and nothing is printed on the way (only ``cli`` prints)."""
    folder = tmp_path / "runs"
    synthetic_runs(folder, [1.0] * 6 + [1.3] * 2, only=STEPPED, sigma=0.01, case_sigma=0.005)
    runs = tuple(sorted(folder.iterdir()))
    alert = tmp_path / "alert.md"
    traced = trace(HistoryRequest(runs=runs, bisect=True, alerts=True, alert=alert))
    assert traced.confirmed == 1 and traced.alert is not None and traced.alert.startswith(ALERT_MARKER)
    assert traced.bisect is not None and len(traced.reads) == 8 and len(traced.view.history.runs) == 8
    assert traced.notice is None and traced.wrote == () and traced.view.pictures == []  # no panels asked for
    assert not alert.exists() and capsys.readouterr() == ("", "")
    with pytest.raises(dataclasses.FrozenInstanceError):
        traced.alert = None  # type: ignore[misc]
    # Without a new step an earlier alert is removed, and one that is not an alert is refused before anything.
    alert.write_text(f"{ALERT_MARKER}\nold\n")
    assert trace(HistoryRequest(runs=runs[:4], alerts=True, alert=alert)).alert is None
    assert not alert.exists()
    alert.write_text("notes\n")
    with pytest.raises(AttnbenchError):
        trace(HistoryRequest(runs=runs[:4], alerts=True, alert=alert))
    assert alert.read_text() == "notes\n"


# ------------------------------------------------------------------------------------------------------ bisection


def test_one_case_overrides_pin_every_case_of_a_config() -> None:
    for name in ("aa-cpu.yaml", "variants-cpu.yaml", "serving-cpu.yaml", "serving-prefix-cpu.yaml"):
        path = ROOT / "configs" / name
        cases = load_experiment(path).cases("cpu")
        if name == "serving-cpu.yaml":  # every serving question once, of one model: each asks them all alike
            cases = [case for case in cases if case.model == cases[0].model]
        for case in cases:
            if dict(case.options).get("window", 0) >= case.seq_len:
                continue  # a window as long as the sequence is allowed only beside longer lengths
            pinned = load_experiment(path, one_case_sets(case)).cases("cpu")
            assert [c.key for c in pinned] == [case.key]


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


FAKE_SWEEP = """
import json, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.support import synthetic_runs
out = Path(sys.argv[sys.argv.index("--out") + 1])
assert sys.argv[sys.argv.index("--set") + 1] == "models=[lstm]", sys.argv
level = float(Path("speed.txt").read_text())  # the checkout's own speed: what the commit under test changed
(run,) = synthetic_runs(out, [level], only={stepped!r}, sigma=0.0, case_sigma=0.0)
rows = (run / "results.jsonl").read_text().splitlines()  # one case, as the sweep narrowed by --set writes
(run / "results.jsonl").write_text("".join(r + "\\n" for r in rows if {stepped!r} in json.loads(r)["key"]))
data = json.loads((run / "run.json").read_text())
(run / "run.json").write_text(json.dumps({{**data, "run_id": "bisect-" + str(level)}}))
"""


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, list[str], Path]:
    """A git repository of twelve commits whose code got 30 % slower at the seventh, and runs of commits 1–4 and
    9–12 (the runner was away for 5–8): the step lies somewhere in 5..9."""
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commits = []
    for i in range(1, 13):
        (repo / "speed.txt").write_text("1.3" if i >= 7 else "1.0")
        (repo / "notes.txt").write_text(f"commit {i}\n")
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", f"commit {i}")
        commits.append(git(repo, "rev-parse", "HEAD"))
    runs = tmp_path / "runs"
    measured = [1, 2, 3, 4, 9, 10, 11, 12]
    folders = synthetic_runs(runs, [1.3 if i >= 7 else 1.0 for i in measured], only=STEPPED, sigma=0.01, seed=3)
    for folder, i in zip(folders, measured, strict=True):
        run = json.loads((folder / "run.json").read_text())
        code = {"commit": commits[i - 1], "dirty": False, "branch": "main"}
        (folder / "run.json").write_text(json.dumps({**run, "code": code, "label": f"c{i}"}))
    return repo, commits, runs


@pytest.mark.slow
def test_bisect_names_the_range_and_a_command_that_finds_the_commit(
    project: tuple[Path, list[str], Path], tmp_path: Path
) -> None:
    repo, commits, runs = project
    result = runner.invoke(app, ["history", str(runs), "--repo", str(repo), "--bisect", "-f", "md", "-o", "-"])
    assert result.exit_code == 0, result.output
    out = result.stdout.split("## Where to look", 1)[1]
    assert f"commits `{commits[3][:12]}..{commits[8][:12]}` (5 commits)" in out
    assert "`lstm forward float32 b=2 n=64 d=32`" in out  # the case to bisect on
    start = next(line.strip() for line in out.splitlines() if "git bisect start" in line)
    assert start == f"git bisect start {commits[8]} {commits[3]}"
    run_line = next(line.strip() for line in out.splitlines() if "git bisect run" in line)
    assert '--set "models=[lstm]"' in run_line and "--allow-mismatch config_sha256" in run_line

    # Run it: a stand-in Python whose sweep reads the checkout's speed, and the real compare.
    fake = tmp_path / "fake_sweep.py"
    fake.write_text(FAKE_SWEEP.format(root=str(ROOT), stepped=STEPPED))
    python = tmp_path / "python"
    python.write_text(
        f'#!/usr/bin/env bash\nif [ "$1" = -P ]; then exec {sys.executable} "$@"; fi\n'
        f'shift 2; exec {sys.executable} {fake} "$@"\n'
    )
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    good = next(s for s in load_runs([runs]) if s.run.label == "c4")
    found = history(runs, repo=repo)
    (event,) = [e for e in step_events(found) if e.worse]
    assert event.case is not None
    floor = noise_floor_for(found, event.segment, event.case, event.step)
    assert floor is not None and bisectable(event.step.change, floor)
    hint = bisect_hint(
        event.case,
        commits[3],
        commits[8],
        config="tiny.yaml",
        baseline=good.folder,
        gates=["median:15%"],
        noise_floor=floor,
        python=str(python),
        repo=repo,
    )
    # One process a side at each commit: judged against the spread the history measured between its runs (σ 1 %),
    # not compare's default for runs that record no floor, which would call only a change beyond ×2.
    assert f"--noise-floor {floor * 100:.3g}%" in hint.run
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(shlex.split(hint.start), cwd=repo, check=True, capture_output=True)
    bisected = subprocess.run(shlex.split(hint.run), cwd=repo, capture_output=True, text=True, env=env)
    subprocess.run(["git", "bisect", "reset"], cwd=repo, check=True, capture_output=True)
    assert f"{commits[6]} is the first bad commit" in bisected.stdout, bisected.stdout + bisected.stderr


@pytest.mark.slow
def test_bisect_gives_commands_for_a_step_of_a_users_model(tmp_path: Path) -> None:
    """A stored run's config names the models the user brought under ``users``; --bisect read it as a config one
    writes, which has no such key, so a user model's step never got its commands (issue 38)."""
    entry = {"name": "my-fine", "factory": "tests.measure.hostile_models:fine", "kind": "attention"}
    config = tmp_path / "byo.yaml"
    config.write_text(tiny_config("byo", models=[entry], grid={"batch": [1], "seq_len": [8]}))
    swept = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / "one")])
    assert swept.exit_code == 0, swept.output
    (template,) = (tmp_path / "one").iterdir()
    repo = tmp_path / "project"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    runs = tmp_path / "runs"
    for i, level in enumerate([1.0] * 4 + [1.3] * 4):
        (repo / "notes.txt").write_text(f"commit {i}\n")
        git(repo, "add", ".")
        git(repo, "commit", "-q", "-m", f"commit {i}")
        run = json.loads((template / "run.json").read_text())
        code = {"commit": git(repo, "rev-parse", "HEAD"), "dirty": False, "branch": "main"}
        run.update(run_id=f"byo-{i}", created_utc=f"2026-12-01T{i:02d}:00:00.000000Z", code=code)
        rows = [json.loads(line) for line in (template / "results.jsonl").read_text().splitlines()]
        for row in rows:
            factor = level * (1 + 0.002 * ((i * 7) % 5))  # a little spread between runs, none within one
            row["measurement"]["samples_s"] = [s * factor for s in row["measurement"]["samples_s"]]
        (runs / f"run-{i}").mkdir(parents=True)
        (runs / f"run-{i}" / "run.json").write_text(json.dumps(run))
        (runs / f"run-{i}" / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = runner.invoke(app, ["history", str(runs), "--repo", str(repo), "--bisect", "-f", "md", "-o", "-"])
    assert result.exit_code == 0, result.output
    out = result.stdout.split("## Where to look", 1)[1]
    assert "`my-fine forward float32" in out and "git bisect run" in out, out


def test_the_bisect_floor_is_the_spread_of_two_single_runs_the_history_measured(tmp_path: Path) -> None:
    # 8 runs a side of a +30 % step, the whole run moving σ 3 % and the case 1 % more (log): two single runs of the
    # case differ within about ±t·√2·√(0.03² + 0.01²) ≈ ±10 %, drift included; one estimate, so within a factor.
    runs = tmp_path / "runs"
    synthetic_runs(runs, [1.0] * 8 + [1.3] * 8, only=STEPPED, sigma=0.03, case_sigma=0.01, seed=2)
    found = history(runs)
    event = next(e for e in step_events(found) if e.worse and e.case is not None and STEPPED in e.case.key)
    assert event.case is not None
    floor = noise_floor_for(found, event.segment, event.case, event.step)
    expected = math.expm1(2.145 * math.sqrt(2) * math.hypot(0.03, 0.01))  # t at 14 degrees of freedom
    assert floor is not None and expected / 1.6 < floor < expected * 1.6
    # A +30 % step leaves room for that floor at a gate of half of it; +10 % does not (one run a commit cannot
    # tell its halves apart, and the hint says so instead of a bisection that would blame the wrong commit).
    assert bisectable(0.3, floor) and not bisectable(0.1, floor)


def test_compare_can_exit_with_a_code_of_its_own_when_a_case_is_noisy(tmp_path: Path) -> None:
    # What a bisect step relies on: noisy is a skip (125), never "good"; a regression still exits 1.
    base, current = ROOT / "tests" / "data" / "compare" / "base", ROOT / "tests" / "data" / "compare" / "current"
    same = runner.invoke(app, ["compare", str(base), str(base), "--exit-noisy", "125"])
    assert same.exit_code == 125, same.output  # one process a side, no measured floor: every timed case noisy
    assert runner.invoke(app, ["compare", str(base), str(base)]).exit_code == 0  # without it, noisy passes
    assert runner.invoke(app, ["compare", str(base), str(current), "--exit-noisy", "125"]).exit_code == 1
    bad = runner.invoke(app, ["compare", str(base), str(base), "--exit-noisy", "0"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
    lines = bad.output.splitlines()
    assert mentions([line for line in lines if line.startswith("error:")], "--exit-noisy", values=(0,))
    assert mentions([line for line in lines if line.startswith("hint:")], values=(1, 255))  # the codes allowed


def test_bisect_says_when_there_is_nothing_to_bisect() -> None:
    result = runner.invoke(app, ["history", str(ROOT / "results" / "history-example-cpu" / "runs"), "--bisect"])
    assert result.exit_code == 0, result.output
    assert "`c696c51ed8fd`" in result.stdout and "git bisect" not in result.stdout  # one commit: nothing to bisect


def test_one_case_overrides_pin_a_factory_model_with_its_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "examples" / "plugin" / "src"))
    entry = {
        "name": "my-alibi",
        "factory": "attnbench_example.layers:alibi_attention",
        "kind": "attention",
        "options": {"slope_base": [2.0, 8.0]},
    }
    path = tmp_path / "byo.yaml"
    path.write_text(tiny_config(models=["lstm", entry], grid={"batch": [1], "seq_len": [8, 16]}))
    cases = [c for c in load_experiment(path).cases("cpu") if c.model == "my-alibi"]
    assert len(cases) == 4
    for case in cases:
        pinned = load_experiment(path, one_case_sets(case)).cases("cpu")
        assert [c.key for c in pinned] == [case.key] and pinned[0].definition == case.definition
