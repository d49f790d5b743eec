"""sweep --shard and --devices through the command line: the slices a person lists and runs, the refusals, and
Ctrl-C/SIGTERM with several workers (the first keeps what finished, the second leaves at once; no worker outlives
the sweep)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.results.store import load_run
from tests.fakes import FakeExecutors
from tests.support import ROOT, mentions, tiny_config

runner = CliRunner()
QUICK = {"min_samples": 3, "min_time_s": 0.005, "max_case_s": 0.05, "warmup_max_s": 0.02}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    grid = {"batch": [1], "seq_len": [8, 16, 32]}
    path.write_text(tiny_config("dist", models=["lstm", "gru", "sdpa-flash", "vanilla"], grid=grid, timing=QUICK))
    return path


def sweep(*args: str | Path) -> object:
    return runner.invoke(app, ["sweep", *map(str, args)])


def listed(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("model=")]


def test_dry_run_lists_each_slice_and_the_slices_make_the_whole(config: Path) -> None:
    whole = runner.invoke(app, ["sweep", str(config), "--dry-run"])
    slices = [runner.invoke(app, ["sweep", str(config), "--dry-run", "--shard", f"{i}/3"]) for i in range(3)]
    assert all(s.exit_code == 0 for s in slices)
    parts = [listed(s.output) for s in slices]
    assert sorted(k for part in parts for k in part) == sorted(listed(whole.output))
    assert mentions(slices[0].output.splitlines(), "0/3", values=(len(parts[0]), 12))  # of the config's 12


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--shard", "3/3"], "0 ≤ i < 3"),
        (["--shard", "0/0"], "N must be at least 1"),
        (["--shard", "half"], "expected i/N"),
        (["--devices", "cpu,cpu", "--device", "cpu"], "--device and --devices both given"),
        (["--devices", "cpu,cpu", "--no-isolate"], "which --no-isolate forbids"),
        (["--allow-mixed-devices"], "--allow-mixed-devices applies to --devices"),
        (["--devices", "tpu:0"], "'tpu:0' is not a device"),
        (["--devices", "cpu,cuda:0"], "cuda"),
    ],
)
def test_bad_shard_and_device_options_are_one_error_and_a_hint(
    config: Path, tmp_path: Path, args: list[str], problem: str
) -> None:
    out = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / "out"), *args])
    assert out.exit_code == 2, out.output
    assert "error:" in out.output and "hint:" in out.output and problem in out.output
    assert "Traceback" not in out.output and not (tmp_path / "out").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_devices_on_a_machine_without_them_is_refused(config: Path) -> None:
    for devices in ("all", "cuda:0,cuda:1"):
        out = runner.invoke(app, ["sweep", str(config), "--devices", devices, "--dry-run"])
        assert out.exit_code == 2 and ("no CUDA device here" in out.output or "CUDA is not available" in out.output)


@pytest.mark.slow
def test_a_shard_run_records_its_slice_and_the_full_config_and_resume_keeps_it(
    config: Path, tmp_path: Path, fake_executors: FakeExecutors
) -> None:
    out = sweep(config, "--shard", "1/3", "--out", tmp_path / "out", "--no-isolate", "-q", "--no-plots")
    assert out.exit_code == 0, out.output
    (folder,) = (tmp_path / "out").iterdir()
    run = json.loads((folder / "run.json").read_text())
    assert run["shard"] == {"index": 1, "count": 3}
    assert [c.key for c in fake_executors.ran] == [r.case.key for r in load_run(folder).results]  # its slice only
    whole = sweep(config, "--out", tmp_path / "whole", "--no-isolate", "-q", "--no-plots")
    assert whole.exit_code == 0
    (whole_folder,) = (tmp_path / "whole").iterdir()
    assert run["config_sha256"] == json.loads((whole_folder / "run.json").read_text())["config_sha256"]
    other = sweep("--resume", folder, "--shard", "0/3")
    assert other.exit_code == 2 and mentions(other.output, "1/3", "0/3")  # the run's shard, and the one asked for
    again = sweep("--resume", folder, "--no-isolate", "--no-plots")
    assert again.exit_code == 0 and f"0 of {len(load_run(folder).results)} cases left, shard 1/3" in again.output


def children(pid: int) -> set[int]:
    """Every process the sweep started (its worker processes), from /proc."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found |= {int(c) for c in text}
    return found


def alive(pid: int) -> bool:
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0]
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.parametrize("signals", [1, 2])
def test_sigterm_with_two_workers_keeps_the_finished_rows_and_leaves_no_worker(
    config: Path, tmp_path: Path, signals: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Slow enough (≥ 0.3 s a case) that the signals land inside cases.
    slow = {"min_samples": 5, "min_time_s": 0.3, "max_case_s": 0.4, "warmup_max_s": 0.05}
    grid = {"batch": [1], "seq_len": [8, 16]}
    config.write_text(tiny_config("dist", models=["lstm", "gru", "sdpa-flash", "vanilla"], grid=grid, timing=slow))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnbench", "sweep", str(config), "--devices", "cpu,cpu", "--out", str(out)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = list(out.glob("*/results.jsonl"))
        if rows and len(rows[0].read_text().splitlines()) >= 2:
            break
        time.sleep(0.05)
    workers = children(process.pid)
    assert len(workers) >= 2  # one per device (and multiprocessing's resource tracker, perhaps)
    for _ in range(signals):
        process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + signal.SIGTERM, err
    time.sleep(0.5)
    assert not [pid for pid in workers if alive(pid)]
    (folder,) = out.iterdir()
    kept = (folder / "results.jsonl").read_text()
    assert len(kept.splitlines()) >= 2
    if signals == 1:
        assert f"attnbench sweep --resume {folder}" in err

        assert json.loads((folder / "run.json").read_text())["state"] == "interrupted"
    if signals == 1:
        resumed = sweep("--resume", folder, "--devices", "cpu,cpu", "--no-plots")  # the pool resumes too
    else:
        # What a resume keeps is the same in-process: the cases left run on the fake executor.
        import attnbench.sweeps.runner as library

        monkeypatch.setattr(library, "make_executor", FakeExecutors())
        resumed = sweep("--resume", folder, "--no-isolate", "--no-plots")
    assert resumed.exit_code == 0, resumed.output
    after = (folder / "results.jsonl").read_text()
    keys = [json.loads(line)["key"] for line in after.splitlines()]
    assert after.startswith(kept) and len(keys) == len(set(keys)) == 8
