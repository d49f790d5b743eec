"""history: runs in order, cut where the environment changes, each case's series and its step changes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from attnbench.analysis.history import build_history, commit_order, order_runs, segments_of
from attnbench.core.errors import AttnbenchError
from attnbench.results.store import load_runs
from tests.support import mentions, synthetic_runs

STEPPED = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"


def steps_by_case(paths: list[Path], **kw: object) -> dict[str, list[int]]:
    runs, _ = load_runs(paths)
    history = build_history(runs, **kw)  # type: ignore[arg-type]
    return {c.key: [s.index for s in c.fit.steps] for c in history.cases if c.fit.steps}


PLANTED = [1.0] * 7 + [1.1] * 5  # 10 % slower from run 7 (0-based) of 12


def only_the_planted_step(found: dict[str, list[int]]) -> bool:
    return len(found) == 1 and next(iter(found)).startswith(STEPPED) and list(found.values()) == [[7]]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.slow
def test_a_planted_ten_percent_step_at_run_7_is_found_and_nothing_else(tmp_path: Path, seed: int) -> None:
    # 12 runs of the fixture with realistic noise (3 % between runs, shared by every case, 1 % per case); one
    # case is 10 % slower from run 7 on. Every other case is flat: any step found there would be a false one.
    assert only_the_planted_step(steps_by_case(synthetic_runs(tmp_path, PLANTED, seed=seed, only=STEPPED)))


@pytest.mark.slow
def test_the_planted_step_alone_is_found_in_most_histories(tmp_path: Path) -> None:
    # The rate behind the single-seed tests (deterministic seeds); results/history-detection-rates.md has it over
    # 100 histories (scripts/history_rates.py).
    hits = sum(
        only_the_planted_step(steps_by_case(synthetic_runs(tmp_path / str(seed), PLANTED, seed=seed, only=STEPPED)))
        for seed in range(20)
    )
    assert hits >= 14


@pytest.mark.slow
def test_the_step_is_measured_with_an_interval(tmp_path: Path) -> None:
    runs, _ = load_runs(synthetic_runs(tmp_path, [1.0] * 7 + [1.1] * 5, only=STEPPED))
    history = build_history(runs)
    (case,) = [c for c in history.cases if c.fit.steps]
    (step,) = case.fit.steps
    assert step.low < 0.10 < step.high and 0.05 < step.change < 0.15
    assert history.steps == 1 and history.order == "time"


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.slow
def test_a_flat_noisy_series_of_12_runs_has_no_step(tmp_path: Path, seed: int) -> None:
    runs, _ = load_runs(synthetic_runs(tmp_path, [1.0] * 12, seed=seed))
    assert build_history(runs).steps == 0


def test_a_step_in_every_case_is_one_run_level_step(tmp_path: Path) -> None:
    # What an injected slowdown, a busier host or a change to code every case runs looks like.
    runs, _ = load_runs(synthetic_runs(tmp_path, PLANTED, seed=0))
    history = build_history(runs)
    (segment,) = history.segments
    assert segment.shift is not None and segment.shift.cases >= 5
    (step,) = segment.shift.fit.steps
    assert step.index == 7 and step.low < 0.10 < step.high
    assert all(c.adjusted and not c.fit.steps for c in history.cases)  # no case moved beyond the whole run


def test_a_new_environment_starts_a_new_segment_and_is_never_mixed(tmp_path: Path) -> None:
    # Runs 6.. on another torch are 20 % slower: across the cut that is not a regression of the code, and within
    # each segment the level is flat, so no step is reported at all.
    levels = [1.0] * 6 + [1.2] * 6
    changed = {i: {"torch": "2.14.1"} for i in range(6, 12)}
    runs, _ = load_runs(synthetic_runs(tmp_path, levels, environment=changed))
    history = build_history(runs)
    assert [len(s.runs) for s in history.segments] == [6, 6]
    (changed,) = history.segments[1].changed  # the key that changed, from and to
    assert mentions(changed, "torch", "'2.13.0+cpu'", "'2.14.1'") and changed.index("2.13") < changed.index("2.14")
    assert history.steps == 0
    assert {c.segment for c in history.cases} == {0, 1}


def test_fewer_than_four_runs_cannot_detect_and_the_history_says_so(tmp_path: Path) -> None:
    runs, _ = load_runs(synthetic_runs(tmp_path, [1.0, 1.0, 2.0]))
    history = build_history(runs)
    assert history.steps == 0 and all(c.fit.too_short for c in history.cases)


def test_the_same_run_twice_is_read_once(tmp_path: Path) -> None:
    (path,) = synthetic_runs(tmp_path, [1.0])
    runs, _ = load_runs([path, path])
    history = build_history(runs)
    assert len(history.runs) == 1 and "read once" in history.warnings[0]


def test_two_runs_of_one_second_in_two_folders_are_two_runs(tmp_path: Path) -> None:
    """Sweeps started in the same second into two --out folders get the same folder name (the run's id): both are
    read, since each was created at its own moment; only a copy (the same id and moment) is read once."""
    first, second = synthetic_runs(tmp_path / "a", [1.0]) + synthetic_runs(tmp_path / "b", [2.0])
    run = json.loads((second / "run.json").read_text(encoding="utf-8"))
    run["created_utc"] = run["created_utc"].replace("00.000000Z", "00.417000Z")  # the same second, a later moment
    (second / "run.json").write_text(json.dumps(run), encoding="utf-8")
    runs, _ = load_runs([first, second])
    assert runs[0].run.run_id == runs[1].run.run_id and runs[0].run.created_utc != runs[1].run.created_utc
    history = build_history(runs)
    assert len(history.runs) == 2 and not any("read once" in w for w in history.warnings)


def test_cases_missing_from_some_runs_are_listed_and_matched_by_key(tmp_path: Path) -> None:
    paths = synthetic_runs(tmp_path, [1.0] * 5)
    results = paths[2] / "results.jsonl"
    results.write_text("".join(line + "\n" for line in results.read_text().splitlines() if STEPPED not in line))
    runs, _ = load_runs(paths)
    history = build_history(runs)
    (partial,) = history.partial
    assert partial.startswith(STEPPED)
    (case,) = [c for c in history.cases if c.key == partial]
    assert [p.status for p in case.points] == ["ok", "ok", "missing", "ok", "ok"]


def test_case_patterns_and_metrics(tmp_path: Path) -> None:
    runs, _ = load_runs(synthetic_runs(tmp_path, [1.0] * 4))
    history = build_history(runs, patterns=["*lstm*"], metric="tokens_per_s")
    assert {c.case.model for c in history.cases} == {"lstm"}
    first = history.cases[0].points[0]
    assert first.low is not None and first.high is not None and first.value is not None
    assert first.low < first.value < first.high
    with pytest.raises(AttnbenchError) as nothing:
        build_history(runs, patterns=["nothing-like-this"])
    assert "nothing-like-this" in nothing.value.message  # the pattern that matched no case

    memory = build_history(runs, metric="peak_mem")
    assert any(p.value is not None for c in memory.cases for p in c.points)


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_runs_are_ordered_by_commit_when_git_can_order_them(tmp_path: Path) -> None:
    import json

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    commits = []
    for i in range(4):
        (repo / "f").write_text(str(i))
        git(repo, "add", "f")
        git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", str(i))
        commits.append(git(repo, "rev-parse", "HEAD"))
    assert commit_order(list(reversed(commits)), repo) == commits
    # Runs started in the opposite order of their commits (a re-run of an old commit last): commit order wins.
    paths = synthetic_runs(tmp_path / "runs", [1.0] * 4)
    for path, commit in zip(paths, reversed(commits), strict=True):
        run = json.loads((path / "run.json").read_text())
        run["code"] = {"commit": commit, "dirty": False, "branch": "main"}
        (path / "run.json").write_text(json.dumps(run))
    runs, _ = load_runs(paths)
    ordered, order, note = order_runs(runs, repo)
    assert order == "commit" and [r.run.commit for r in ordered] == commits
    assert "ordered by commit" in note
    ordered, order, note = order_runs(runs, tmp_path)  # not a checkout: start time, and why
    assert order == "time" and "git cannot order" in note


def test_segments_of_nothing_changed(tmp_path: Path) -> None:
    runs, _ = load_runs(synthetic_runs(tmp_path, [1.0] * 3))
    (segment,) = segments_of(runs)
    assert segment.changed == () and len(segment.runs) == 3
