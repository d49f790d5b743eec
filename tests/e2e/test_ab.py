"""``attnbench ab`` end to end: two real worker processes (this interpreter, or a wrapper script that injects a
slowdown into its side), tiny torch models, the exit codes, and run folders that ``compare`` reads.

The thresholds are wide where a test needs a verdict that no machine load can move (an A/A session at ±50 %, a
head four times as slow at ±5 %): these tests hold the command's behaviour; its power at 25 % is
``scripts/ab_power.py``'s."""

from __future__ import annotations

import json
import stat
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.errors import EXIT_BAD_INPUT, EXIT_CASE_FAILED
from attnbench.results.store import load_run
from tests.support import tiny_config

runner = CliRunner()
FAST = ["--rounds", "6", "--block", "0.02", "-q", "--no-plots"]


def _config(tmp: Path) -> Path:
    path = tmp / "tiny.yaml"
    path.write_text(tiny_config("ab-tiny", models=["lstm"], grid={"batch": [1], "seq_len": [16]}))
    return path


def _wrapper(tmp: Path, environment: str, name: str = "python-slow") -> Path:
    """A --head-python that runs this interpreter with ``environment`` (``NAME=value``) set: how a user makes a
    known regression."""
    path = tmp / name
    path.write_text(f'#!/bin/sh\n{environment} exec "{sys.executable}" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _error_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_aa_is_same_exit_0_and_compare_reads_both_runs(tmp_path: Path) -> None:
    out = tmp_path / "ab"
    # 8 rounds, 2 a worker pair: four pairs, the fewest whose t interval (3 degrees of freedom) a loaded machine's
    # spread keeps inside ±50 %; each pair costs two interpreter starts.
    aa = [*FAST, "--rounds", "8", "--fail-on", "median:50%"]
    result = runner.invoke(app, ["ab", str(_config(tmp_path)), "--out", str(out), *aa])
    assert result.exit_code == 0, result.output
    (base,) = (out / "base").iterdir()
    (head,) = (out / "head").iterdir()
    for folder, role in ((base, "base"), (head, "head")):
        stored = load_run(folder)
        assert stored.run.label == role and stored.run.state == "complete"
        (row,) = stored.results
        assert row.ok and row.extra["ab_blocks"] == 8 and row.extra["ab_side"] == role
        assert row.extra["ab_workers"] == 4  # 2 rounds a worker pair, then fresh workers
        assert row.measurement is not None and row.measurement.injected_delay_s == 0
        assert (folder / "summary.csv").is_file()
    compared = runner.invoke(app, ["compare", str(base), str(head), "--format", "json"])
    assert compared.exit_code == 0, compared.output
    assert len(json.loads(compared.stdout)["cases"]) == 1
    history = runner.invoke(app, ["history", str(base), str(head), "--format", "json"])
    assert history.exit_code == 0, history.output
    site = tmp_path / "site"
    published = runner.invoke(app, ["publish", str(out / "base"), str(out / "head"), "-o", str(site)])
    assert published.exit_code == 0, published.output
    assert (site / "index.html").is_file()


def test_an_injected_slowdown_on_the_head_exits_1(tmp_path: Path) -> None:
    out = tmp_path / "ab"
    head = _wrapper(tmp_path, "ATTNBENCH_INJECT_SLOWDOWN=3")  # ×4: the least of 6 rounds' ratios stays above 1.05
    # One worker pair (--pair-rounds 0): each fresh pair costs two interpreter starts; the slow A/A test has four.
    args = ["ab", str(_config(tmp_path)), "--out", str(out), "--head-python", str(head), "-f", "json", *FAST]
    args += ["--pair-rounds", "0"]
    result = runner.invoke(app, args)
    assert result.exit_code == EXIT_CASE_FAILED, result.output
    data = json.loads(result.stdout)
    assert data["answer"] == "slower" and data["exit_code"] == 1 and data["counts"]["slower"] == 1
    (case,) = data["cases"]
    assert case["rounds"] == 6 and case["ratio"] > 2 and case["ci_low"] > 1.05
    assert case["worker_pairs"] == 1 and case["pair_ratios"] == []
    head_row = load_run(Path(data["runs"]["head"])).results[0]
    base_row = load_run(Path(data["runs"]["base"])).results[0]
    assert head_row.measurement is not None and head_row.measurement.injected_delay_s > 0
    assert base_row.measurement is not None and base_row.measurement.injected_delay_s == 0


@pytest.mark.parametrize(
    ("extra", "flag"),
    [
        (["--base-python", "/no/such/python"], "--base-python"),
        (["--head-python", "."], "--head-python"),
        (["--rounds", "3"], "--rounds"),
        (["--block", "0"], "--block"),
        (["--pair-rounds", "4"], "--pair-rounds"),  # 6 rounds: 2 worker pairs, too few for an interval
        (["--fail-on", "peak_mem:5%"], "--fail-on"),
        (["--fail-on", "fast"], "--fail-on"),
    ],
)
def test_bad_flags_and_paths_are_one_error_line_and_exit_2(tmp_path: Path, extra: list[str], flag: str) -> None:
    out = tmp_path / "ab"
    result = runner.invoke(app, ["ab", str(_config(tmp_path)), "--out", str(out), *FAST, *extra])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "Traceback" not in result.output
    (line,) = _error_lines(result.output)
    assert flag in line
    assert not out.exists()


def test_a_file_that_is_not_executable_is_refused(tmp_path: Path) -> None:
    python = tmp_path / "python"
    python.write_text("#!/bin/sh\n")
    result = runner.invoke(app, ["ab", str(_config(tmp_path)), "--base-python", str(python), *FAST])
    assert result.exit_code == EXIT_BAD_INPUT and len(_error_lines(result.output)) == 1


@pytest.mark.parametrize(
    "environment",
    [
        "ATTNBENCH_INJECT_SLOWDOWN=-0.5",  # out of range: the side's worker refuses to start
        pytest.param("ATTNBENCH_INJECT_SLOWDOWN=lots", marks=pytest.mark.slow),  # not a number
        # No standard library at all: the interpreter dies before it can say anything over the socket.
        pytest.param("PYTHONHOME=/nowhere", marks=pytest.mark.slow),
    ],
)
def test_a_side_that_cannot_start_is_one_error_line_and_exit_2(tmp_path: Path, environment: str) -> None:
    out = tmp_path / "ab"
    head = _wrapper(tmp_path, environment)
    result = runner.invoke(app, ["ab", str(_config(tmp_path)), "--out", str(out), "--head-python", str(head), *FAST])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "Traceback" not in result.output
    (line,) = _error_lines(result.output)
    assert "--head-python" in line
    assert not out.exists()


def test_a_bad_config_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmodels: [lsmt]\n")
    result = runner.invoke(app, ["ab", str(bad), "--out", str(tmp_path / "ab"), *FAST])
    assert result.exit_code == EXIT_BAD_INPUT and len(_error_lines(result.output)) == 1
