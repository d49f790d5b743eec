"""attnbench merge: shards of one sweep become one run, exactly as if it had run in one place; everything that
would not make one run is refused with the reason (analysis.merge, results.merged, cli.merge)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.shards import Shard
from attnbench.results.store import load_run
from attnbench.sweeps.events import QuietListener
from attnbench.sweeps.runner import SweepRequest, open_sweep
from attnbench.workflows.merge import plan as plan_merge
from tests.support import mentions, tiny_config

runner = CliRunner()
CONFIG = tiny_config(
    "merge",
    models=["lstm", "gru", "sdpa-flash", "vanilla"],
    grid={"batch": [1], "seq_len": [8, 16, 32]},
    timing={"min_samples": 3, "min_time_s": 0.005, "max_case_s": 0.05, "warmup_max_s": 0.02},
)


def sweep(config: Path, out: Path, shard: Shard | None = None) -> Path:
    with open_sweep(SweepRequest(config, "cpu", out, isolate=False, shard=shard)) as run:
        run.run(QuietListener())
        return run.folder


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One unsharded run of the config, and its three shards, swept for real."""
    tmp = tmp_path_factory.mktemp("merge")
    config = tmp / "merge.yaml"
    config.write_text(CONFIG)
    whole = sweep(config, tmp / "whole")
    shards = [sweep(config, tmp / "shards", Shard(i, 3)) for i in range(3)]
    return {"config": config, "whole": whole, "shards": shards, "parent": tmp / "shards"}


def snapshot(folders: list[Path]) -> dict[str, tuple[bytes, int]]:
    files = [p for folder in folders for p in sorted(folder.rglob("*")) if p.is_file()]
    return {str(p): (p.read_bytes(), p.stat().st_mtime_ns) for p in files}


def copy_run(
    src: Path,
    dst: Path,
    run: Callable[[dict[str, Any]], None] | None = None,
    rows: Callable[[list[str]], list[str]] | None = None,
) -> Path:
    """A copy of a run folder with run.json and results.jsonl edited, to plant what a merge must refuse."""
    shutil.copytree(src, dst)
    if run is not None:
        data = json.loads((dst / "run.json").read_text())
        run(data)
        (dst / "run.json").write_text(json.dumps(data))
    if rows is not None:
        lines = (dst / "results.jsonl").read_text().splitlines()
        (dst / "results.jsonl").write_text("".join(line + "\n" for line in rows(lines)))
    return dst


def merge(*args: str | Path) -> Any:
    return runner.invoke(app, ["merge", *map(str, args)])


@pytest.mark.slow
def test_a_merge_of_every_shard_is_the_unsharded_run(runs: dict[str, Any], tmp_path: Path) -> None:
    plan = plan_merge(runs["shards"], tmp_path / "m")
    whole = load_run(runs["whole"])
    # The same cases, in the same (the config's) order as the run swept in one place.
    assert [r.case.key for r in plan.results] == [r.case.key for r in whole.results]
    # Every row exactly as its shard stored it.
    stored = {r.case.key: r.to_dict() for folder in runs["shards"] for r in load_run(folder).results}
    assert [r.to_dict() for r in plan.results] == [stored[r.case.key] for r in plan.results]
    assert plan.complete and plan.run.state == "complete" and plan.shards == 3 and plan.duplicates == 0
    assert plan.run.config_sha256 == whole.run.config_sha256  # a shard records the full config's sha256
    assert [s.shard for s in plan.run.merged_from] == [Shard(0, 3), Shard(1, 3), Shard(2, 3)]
    assert sum(s.rows for s in plan.run.merged_from) == len(whole.results)


@pytest.mark.slow
def test_the_merged_folder_keeps_the_run_contract_and_every_command_reads_it(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    out = tmp_path / "merged"
    before = snapshot(runs["shards"])
    result = merge(runs["parent"], "-o", out, "--plots")
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert all(f"{i}/3" in said for i in range(3)) and mentions(said, values=(3, 12))  # 3 shards, 12 of 12 cases
    assert {"run.json", "results.jsonl", "telemetry.jsonl", "summary.csv", "summary.md", "plots"} <= {
        p.name for p in out.iterdir()
    }
    assert any((out / "plots").glob("latency-*.png"))
    assert snapshot(runs["shards"]) == before  # the inputs are never written
    for command in (["report", str(out)], ["compare", str(runs["whole"]), str(out)], ["claims", str(out)]):
        read = runner.invoke(app, command)
        assert read.exit_code in (0, 1), (command, read.output)  # 1: compare may find a noisy regression
        assert "error:" not in read.output
    telemetry = [json.loads(line) for line in (out / "telemetry.jsonl").read_text().splitlines()]
    keys = {r.case.key for r in load_run(out).results}
    assert telemetry and {entry["key"] for entry in telemetry} <= keys


@pytest.mark.slow
def test_the_merge_renders_from_its_plan_what_the_folder_it_wrote_renders(
    runs: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge renders its summaries and plots from the rows it holds, never reading its folder back: byte for
    byte what a sweep's renderer (which reads the folder) writes of the merged folder."""
    from attnbench.report import run_files
    from attnbench.workflows import merge as merging

    out = tmp_path / "merged"
    rendered: list[run_files.RunFiles] = []
    render = run_files.render_run_files

    def spy(*args: Any, **kwargs: Any) -> run_files.RunFiles:
        rendered.append(render(*args, **kwargs))
        return rendered[-1]

    monkeypatch.setattr(merging, "render_run_files", spy)
    monkeypatch.setattr(run_files, "load_run", lambda folder: pytest.fail("the merge read its folder back"))
    merging.write(plan_merge(runs["shards"], out), out)
    assert len(rendered) == 1 and rendered[0].plots
    merged = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    monkeypatch.undo()
    again = tmp_path / "again"
    shutil.copytree(out, again)
    _, paths, problem = run_files.write_run_files(again)
    assert problem is None and {str(p.relative_to(again)) for p in paths} == {name for name, _ in rendered[0].files}
    assert {str(p.relative_to(again)): p.read_bytes() for p in paths} == {
        name: merged[name] for name, _ in rendered[0].files
    }


@pytest.mark.slow
def test_merging_again_gives_the_same_folder(runs: dict[str, Any], tmp_path: Path) -> None:
    out = tmp_path / "merged"
    files = ("run.json", "results.jsonl", "telemetry.jsonl", "summary.csv", "summary.md")
    assert merge(*runs["shards"], "-o", out).exit_code == 0
    first = {name: (out / name).read_bytes() for name in files}
    again = merge(*runs["shards"], "-o", out)
    assert again.exit_code == 0, again.output
    assert {name: (out / name).read_bytes() for name in files} == first
    # An earlier merge given beside its own shards adds nothing: identical rows are kept once.
    plan = plan_merge([out, *runs["shards"]], tmp_path / "other")
    assert plan.duplicates == 12 and len(plan.results) == 12 and len(plan.run.merged_from) == 3


@pytest.mark.slow
def test_a_missing_shard_is_named_and_partial_merges_the_rest(runs: dict[str, Any], tmp_path: Path) -> None:
    two = [runs["shards"][0], runs["shards"][2]]
    refused = merge(*two, "-o", tmp_path / "m")
    assert refused.exit_code == 2
    assert "shard 1/3: no run folder" in refused.output and "--partial" in refused.output
    assert not (tmp_path / "m").exists()
    partial = merge(*two, "-o", tmp_path / "m", "--partial")
    assert partial.exit_code == 0, partial.output
    assert "1/3" in partial.output  # the shard left out, named
    merged = load_run(tmp_path / "m")
    assert merged.run.state == "interrupted" and len(merged.results) < 12


def test_cases_missing_from_a_shard_are_named(runs: dict[str, Any], tmp_path: Path) -> None:
    cut = copy_run(runs["shards"][0], tmp_path / "cut", rows=lambda lines: lines[:-1])
    refused = merge(cut, runs["shards"][1], runs["shards"][2], "-o", tmp_path / "m")
    assert refused.exit_code == 2
    assert refused.output.count("error:") == 1
    assert mentions(" ".join(refused.output.split()), "0/3", str(cut), values=(1,))  # the shard, its folder, 1 case


def test_shards_of_different_configs_are_refused(runs: dict[str, Any], tmp_path: Path) -> None:
    def other_config(run: dict[str, Any]) -> None:
        run["config"]["seed"] = 7
        run["config_sha256"] = "f" * 64

    other = copy_run(runs["shards"][1], tmp_path / "other", run=other_config)
    refused = merge(runs["shards"][0], other, runs["shards"][2], "-o", tmp_path / "m")
    assert refused.exit_code == 2
    assert "seed" in refused.output  # the config key they differ in


def test_two_different_rows_for_one_case_are_refused(runs: dict[str, Any], tmp_path: Path) -> None:
    def crash_first(lines: list[str]) -> list[str]:
        row = json.loads(lines[0])
        row.update(status="crashed", reason="planted", measurement=None)
        return [json.dumps(row), *lines[1:]]

    again = copy_run(runs["shards"][0], tmp_path / "again", rows=crash_first)
    refused = merge(*runs["shards"], again, "-o", tmp_path / "m")
    assert refused.exit_code == 2
    assert "crashed" in refused.output and str(again) in " ".join(refused.output.split())  # which row, and where


@pytest.mark.slow
def test_environments_that_differ_are_refused_unless_allowed(runs: dict[str, Any], tmp_path: Path) -> None:
    def other_torch(run: dict[str, Any]) -> None:
        run["environment"]["torch"] = "9.9.9"

    odd = copy_run(runs["shards"][2], tmp_path / "odd", run=other_torch)
    args = [runs["shards"][0], runs["shards"][1], odd, "-o", tmp_path / "m"]
    refused = merge(*args)
    assert refused.exit_code == 3
    assert "torch:" in refused.output and "'9.9.9'" in refused.output and "--allow-mismatch torch" in refused.output
    allowed = merge(*args, "--allow-mismatch", "torch")
    assert allowed.exit_code == 0 and "allowed: torch:" in allowed.output
    unknown = merge(*args, "--allow-mismatch", "nope")
    assert unknown.exit_code == 2 and "unknown key 'nope'" in unknown.output


def test_shards_of_different_splits_are_refused(runs: dict[str, Any], tmp_path: Path) -> None:
    def four(run: dict[str, Any]) -> None:
        run["shard"] = {"index": 3, "count": 4}

    odd = copy_run(runs["shards"][2], tmp_path / "odd", run=four)
    refused = merge(runs["shards"][0], odd, "-o", tmp_path / "m")
    assert refused.exit_code == 2 and "different splits" in refused.output


@pytest.mark.slow
def test_a_corrupt_shard_is_located_and_the_others_merge_with_partial(runs: dict[str, Any], tmp_path: Path) -> None:
    broken = copy_run(runs["shards"][1], tmp_path / "broken", rows=lambda lines: ["{not json", *lines])
    args = [runs["shards"][0], broken, runs["shards"][2], "-o", tmp_path / "m"]
    refused = merge(*args)
    assert refused.exit_code == 2
    assert f"{broken / 'results.jsonl'}:1" in refused.output and "--partial" in refused.output
    partial = merge(*args, "--partial")
    assert partial.exit_code == 0, partial.output
    assert "1/3" in partial.output  # the shard left out, named


def test_the_output_is_never_an_input_nor_a_sweep_run(runs: dict[str, Any]) -> None:
    inside = merge(runs["parent"], "-o", runs["parent"] / "merged")
    assert inside.exit_code == 2 and "overlaps the input" in inside.output
    assert not (runs["parent"] / "merged").exists()
    onto = merge(runs["shards"][0], runs["shards"][1], runs["shards"][2], "-o", runs["whole"])
    assert onto.exit_code == 2 and str(runs["whole"]) in " ".join(onto.output.split())


def test_a_path_without_runs_is_a_clean_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = merge(tmp_path / "empty", "-o", tmp_path / "m")
    assert out.exit_code == 2 and "holds no run" in out.output
    missing = merge(tmp_path / "nope", "-o", tmp_path / "m")
    assert missing.exit_code == 2 and "no such run folder" in missing.output
