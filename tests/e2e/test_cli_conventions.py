"""What users of hyperfine, nvbench and pytest expect of a CLI: --version, shell completion, --format json on every
command that prints data, ``latest`` for the newest run, and one name per concept (old names kept as aliases)."""

from __future__ import annotations

import json
import shutil
from importlib.metadata import version
from pathlib import Path
from typing import Any, get_args

import pytest
import typer
from typer.testing import CliRunner

import attnbench
from attnbench.cli import app
from attnbench.families.catalogue import MODELS
from attnbench.results.store import RUN_FILE, latest_run, resolve_run
from tests.support import BAD_CONFIGS, FIXTURE, ROOT, mentions

runner = CliRunner()
HISTORY_RUNS = ROOT / "results" / "history-example-cpu" / "runs"


def _json(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ------------------------------------------------------------------------------------------------------ --version
def test_version_prints_the_installed_version_that_run_json_records() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout == f"attnbench {version('attnbench')}\n"
    # The package's own figure and the installed metadata's (pyproject) are one number.
    assert attnbench.__version__ == version("attnbench")


def test_version_is_eager_and_needs_no_command() -> None:
    """--version answers before any command is parsed, so a broken command line after it does not matter."""
    result = runner.invoke(app, ["--version", "no-such-command"])
    assert result.exit_code == 0 and result.stdout.startswith("attnbench ")


# ------------------------------------------------------------------------------------------------- completion
def test_shell_completion_is_offered() -> None:
    help_text = runner.invoke(app, ["--help"]).output
    assert "--install-completion" in help_text and "--show-completion" in help_text


def test_completion_completes_commands_and_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the installed bash script asks the program: the words that complete the one under the cursor."""
    for words, cword, expected in (
        ("attnbench rep", "1", "report"),
        ("attnbench history --plots-d", "2", "--plots-dir"),
    ):
        monkeypatch.setenv("_ATTNBENCH_COMPLETE", "complete_bash")
        monkeypatch.setenv("COMP_WORDS", words)
        monkeypatch.setenv("COMP_CWORD", cword)
        result = runner.invoke(app, [], prog_name="attnbench")
        assert expected in result.output.split(), result.output


# ------------------------------------------------------------------------------------------------ --format json
def test_models_format_json_lists_every_model_with_its_options() -> None:
    data = _json("models", "--device", "cpu", "--format", "json")
    assert data["device"] == "cpu" and data["dtype"] == "float32"
    by_name = {m["name"]: m for m in data["models"]}
    assert set(MODELS) <= set(by_name)
    assert by_name["lstm"]["available"] is True and by_name["lstm"]["reason"] is None
    assert by_name["flash-attn"]["available"] is False and by_name["flash-attn"]["reason"]
    for name, spec in MODELS.items():
        assert set(by_name[name]["options"]) == {o.name for o in spec.options if o.name != "preset"}


def test_env_format_json_holds_what_run_json_records() -> None:
    data = _json("env", "--device", "cpu", "-f", "json")
    assert data["environment"]["attnbench"] == version("attnbench")
    assert data["environment"]["device"] == "cpu"
    assert isinstance(data["load"]["busy"], bool) and "psutil" in data["telemetry"]


def test_validate_format_json_one_object_per_config_and_exit_2_on_a_bad_one() -> None:
    bad = sorted(BAD_CONFIGS.glob("*.yaml"))[0]
    result = runner.invoke(app, ["validate", str(ROOT / "configs" / "cpu-quick.yaml"), str(bad), "-f", "json"])
    assert result.exit_code == 2
    good, failed = json.loads(result.stdout)
    assert good["ok"] is True and good["cases"] > 0 and len(good["sha256"]) == 64
    assert failed["ok"] is False and failed["error"] and failed["config"] == str(bad)


def test_history_format_json_is_the_history() -> None:
    data = _json("history", str(HISTORY_RUNS), "--format", "json")
    assert data["schema"] == "attnbench.history/1" and data["metric"] == "median" and data["unit"] == "s"
    assert len(data["runs"]) == len(list(HISTORY_RUNS.iterdir()))
    assert len(data["cases"]) == 8 and all(len(c["points"]) == len(data["runs"]) for c in data["cases"])
    # The committed history's one step: every case together, from run 9 (results/README.md, issue 19).
    (shift_step,) = data["segments"][0]["shift"]["steps"]
    named = {r["run_id"]: r["name"] for r in data["runs"]}
    assert named[shift_step["run_id"]] == "run-09-slow25"
    assert shift_step["ci95_low"] < shift_step["change"] < shift_step["ci95_high"]
    # --bisect's hint goes to stderr then, so stdout stays one JSON document.
    assert _json("history", str(HISTORY_RUNS), "--format", "json", "--bisect") == data


def test_calibrate_format_json_is_the_cached_calibration(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.results.calibration import CACHE_ENV, save
    from tests.measure.test_calibration import own_calibration

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    cached = own_calibration(skipped={"float16": "skipped in this test"})
    save(cached)
    data = _json("calibrate", "--device", "cpu", "--noise-processes", "0", "-f", "json")
    assert data["schema"] == "attnbench.calibrate/1" and data["calibration"] == cached.to_dict()
    assert data["vendor"] is None and "none for CPUs" in data["vendor_note"] and "cached" in data["origin"]


def test_selfcheck_format_json_keeps_the_verdict_and_the_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.instrument import agreement as measure_selfcheck
    from attnbench.results.selfcheck import TIMER, OpTimings, SelfcheckOp, SelfcheckTimings

    op = OpTimings(SelfcheckOp("matmul", "float32", size=512), (1.2e-3,) * 3, ((TIMER, (1e-3,) * 3),))
    failing = SelfcheckTimings("cpu", "Test CPU", "2.13.0", 2, 3, (TIMER,), (op,))
    monkeypatch.setattr(measure_selfcheck, "run_selfcheck", lambda *args, **kwargs: failing)
    result = runner.invoke(app, ["selfcheck", "--device", "cpu", "--format", "json"])
    assert result.exit_code == 1  # the verdict's exit code, whatever the format
    data = json.loads(result.stdout)
    assert data["schema"] == "attnbench.selfcheck/1" and data["exit_code"] == 1
    (matmul,) = data["ops"]
    assert matmul["outcome"] == "fail" and matmul["references"][0]["ratio"] == pytest.approx(1.2)


@pytest.mark.parametrize(
    "name", ["report", "claims", "compare", "ab", "history", "models", "env", "validate", "calibrate", "selfcheck"]
)
def test_every_command_that_prints_data_has_format_json(name: str) -> None:
    command = typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
    (option,) = (p for p in command.params if "--format" in p.opts)
    assert "-f" in option.opts and "json" in get_args(option.type_descriptor.annotation)


# ------------------------------------------------------------------------------------------------------ latest
def _runs_dir(tmp: Path, *names: str) -> Path:
    runs = tmp / "results" / "runs"
    for name in names:
        shutil.copytree(FIXTURE, runs / name)
    return runs


def test_latest_is_the_greatest_run_id(tmp_path: Path) -> None:
    runs = _runs_dir(tmp_path, "20261203-090000-b-cpu", "20261203-100000-a-cpu", "20261202-235959-z-cpu")
    (runs / "my-merged-run").mkdir()  # named by hand: no time in the name, never "latest"
    (runs / "my-merged-run" / RUN_FILE).write_text("{}")
    (runs / "20261209-000000-empty").mkdir()  # not a run folder
    assert latest_run(runs) == runs / "20261203-100000-a-cpu"
    assert resolve_run(Path("somewhere"), runs) == Path("somewhere")


def test_report_compare_and_history_take_latest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _runs_dir(tmp_path, "20261203-090000-tiny-cpu", "20261203-100000-tiny-cpu")
    monkeypatch.chdir(tmp_path)
    by_alias = runner.invoke(app, ["report", "latest", "-f", "json"])
    by_path = runner.invoke(app, ["report", "results/runs/20261203-100000-tiny-cpu", "-f", "json"])
    assert by_alias.exit_code == 0 and by_alias.stdout == by_path.stdout
    compared = runner.invoke(app, ["compare", "results/runs/20261203-090000-tiny-cpu", "latest", "-f", "json"])
    assert compared.exit_code == 0, compared.output
    assert json.loads(compared.stdout)["current"]["path"] == "results/runs/20261203-100000-tiny-cpu"
    assert runner.invoke(app, ["history", "latest", "-f", "json"]).exit_code == 0


def test_folder_slash_latest_is_the_newest_run_a_sweep_wrote_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """README's CI recipe sweeps with --out runs/head: `report latest` read results/runs, an older run (issue 51)."""
    _runs_dir(tmp_path, "20261203-120000-tiny-cpu")  # newer, but in results/runs
    for name in ("20261203-090000-tiny-cpu", "20261203-100000-tiny-cpu"):
        shutil.copytree(FIXTURE, tmp_path / "runs" / "head" / name)
    monkeypatch.chdir(tmp_path)
    assert resolve_run(Path("runs/head/latest")) == Path("runs/head/20261203-100000-tiny-cpu")
    by_alias = runner.invoke(app, ["report", "runs/head/latest", "-f", "json"])
    by_path = runner.invoke(app, ["report", "runs/head/20261203-100000-tiny-cpu", "-f", "json"])
    assert by_alias.exit_code == 0 and by_alias.stdout == by_path.stdout
    assert runner.invoke(app, ["report", "runs/none/latest"]).exit_code == 2


def test_a_folder_named_latest_wins_over_the_alias(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _runs_dir(tmp_path, "20261203-100000-tiny-cpu")
    shutil.copytree(FIXTURE, tmp_path / "latest")
    monkeypatch.chdir(tmp_path)
    assert resolve_run(Path("latest")) == Path("latest")


def test_latest_without_runs_is_one_error_line_and_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for args in (["report", "latest"], ["sweep", "--resume", "latest"], ["history", "latest"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 2, result.output
        (error,) = [line for line in result.output.splitlines() if line.startswith("error:")]
        assert mentions(error, "latest", "results/runs")  # what was asked, and where it looked

        assert "Traceback" not in result.output


# --------------------------------------------------------------------------------------------- one name, old kept
def test_history_plots_dir_is_the_name_and_plots_the_old_alias() -> None:
    command = typer.main.get_command(app).commands["history"]  # type: ignore[attr-defined]
    (option,) = (p for p in command.params if p.name == "plots")
    assert option.opts[:2] == ["--plots-dir", "--plots"]
    report = typer.main.get_command(app).commands["report"]  # type: ignore[attr-defined]
    assert any("--plots-dir" in p.opts for p in report.params)


@pytest.mark.parametrize("command", ["calibrate", "selfcheck"])
@pytest.mark.parametrize("threads", ["99999999999", "5000"])
def test_threads_beyond_the_configs_cap_are_refused_before_anything_runs(command: str, threads: str) -> None:
    """Issue 50 §3.5: ``--threads 99999999999`` was a ValueError from torch, and ``--threads 5000`` ran 5000 threads
    where a config's ``threads`` stops at 4096 (``core.cases.MAX_THREADS``)."""
    out = runner.invoke(app, [command, "--device", "cpu", "--threads", threads])
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit)
    assert "--threads" in out.output
