"""A sweep at bad moments and on hostile folders: signals while it starts, renders or closes; a full disk; links and
odd files planted in a run folder; a damaged run.json on resume; debris from a kill -9. Each ends in one error line
(or the signal's exit code and the resume line), never a traceback, a write through a link, or a lost row."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from attnbench.cli import app
from attnbench.core.errors import EXIT_BAD_INPUT, EXIT_WRITE_FAILED
from attnbench.results.store import load_run
from tests.support import ROOT, fill_disk, mentions, small_disk, tiny_config

runner = CliRunner()
CONFIG = tiny_config(
    "moments",
    models=["lstm", "gru"],
    grid={"batch": [1], "seq_len": [8, 16]},
    # The default process warm-up: the real Ctrl-C tests signal 1 and 2 s into a sweep, and a shorter start-up would
    # have it finished by then more often (the test then skips).
    timing={"min_samples": 3, "min_time_s": 0.01, "max_case_s": 0.1, "warmup_max_s": 0.02, "process_warmup_s": 0.5},
)
VICTIM_TEXT = "precious\n"


def sweep(*args: str) -> Result:
    return runner.invoke(app, ["sweep", *args])


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real finished sweep of four cases, with its telemetry; tests work on copies of it."""
    tmp = tmp_path_factory.mktemp("finished")
    (tmp / "c.yaml").write_text(CONFIG)
    done = sweep(str(tmp / "c.yaml"), "--out", str(tmp / "out"), "--no-isolate", "-q", "--plots")
    assert done.exit_code == 0, done.output
    (folder,) = (tmp / "out").iterdir()
    assert (folder / "telemetry.jsonl").exists()
    return folder


@pytest.fixture
def run(finished: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / finished.name))


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text(VICTIM_TEXT)
    return path


def fail_one_row(folder: Path) -> str:
    """Mark the second row failed (as a retried case would be), keeping its start time; returns its key."""
    path = folder / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    row = json.loads(lines[1])
    row.update(status="error", reason="ValueError: injected", measurement=None)
    lines[1] = json.dumps(row) + "\n"
    path.write_text("".join(lines))
    return str(row["key"])


def one_error(out: Result, code: int = EXIT_BAD_INPUT) -> str:
    lines = out.stderr.splitlines()
    assert out.exit_code == code, out.output
    assert lines[0].startswith("error: ") and len(lines) == 2 and lines[1].startswith("hint: "), out.stderr
    assert out.exception is None or isinstance(out.exception, SystemExit), out.exception
    return lines[0]


# ------------------------------------------------------------------------------------- links and odd files
@pytest.mark.slow
def test_resume_never_truncates_the_target_of_a_lock_link(run: Path, victim: Path) -> None:
    (run / ".lock").unlink()
    (run / ".lock").symlink_to(victim)
    line = one_error(sweep("--resume", str(run)))
    assert mentions(line, f"{run}/.lock", "link")  # the planted link, refused
    assert victim.read_text() == VICTIM_TEXT


def test_retry_failed_never_appends_to_the_target_of_a_telemetry_link(run: Path, victim: Path) -> None:
    fail_one_row(run)
    before = (run / "results.jsonl").read_bytes()
    (run / "telemetry.jsonl").unlink()
    (run / "telemetry.jsonl").symlink_to(victim)
    line = one_error(sweep("--resume", str(run), "--retry-failed"))
    assert mentions(line, f"{run}/telemetry.jsonl", "link")
    assert victim.read_text() == VICTIM_TEXT
    assert (run / "results.jsonl").read_bytes() == before  # refused before anything was written


@pytest.mark.parametrize("name", ["run.json", "results.jsonl", "summary.md"])
@pytest.mark.slow
def test_resume_refuses_any_planted_link_before_writing(run: Path, victim: Path, name: str) -> None:
    shutil.copyfile(run / name, victim)
    (run / name).unlink()
    (run / name).symlink_to(victim)
    copy = victim.read_bytes()
    line = one_error(sweep("--resume", str(run)))
    assert mentions(line, f"{run}/{name}", "link")
    assert victim.read_bytes() == copy


@pytest.mark.slow
def test_report_plots_are_never_drawn_through_a_plots_link(run: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.rmtree(run / "plots")
    (run / "plots").symlink_to(elsewhere)
    line = one_error(runner.invoke(app, ["report", str(run), "--plots"]))
    assert mentions(line, f"{run}/plots", "link")
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("make", ["folder", "fifo"])
def test_a_lock_that_is_not_a_file_is_a_located_error(run: Path, make: str) -> None:
    (run / ".lock").unlink()
    if make == "folder":
        (run / ".lock").mkdir()
    else:
        os.mkfifo(run / ".lock")
    line = one_error(sweep("--resume", str(run)))
    kind = "a folder" if make == "folder" else "a named pipe"
    assert line == f"error: {run}/.lock: {kind}, not a regular file"


def as_an_ordinary_user() -> list[str]:
    """The prefix that runs a command without root's right to read any folder: nothing for an ordinary user; for
    root, setpriv dropping CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH (root's own python lives where nobody else may
    look, so switching to another user is not an option)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: cannot give up the right to read any folder")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--"]


@pytest.mark.parametrize("command", ["report", "resume"])
@pytest.mark.slow
def test_a_parent_that_cannot_be_entered_is_a_located_error(run: Path, tmp_path: Path, command: str) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    target = Path(shutil.move(str(run), locked / run.name))
    args = ["report", str(target)] if command == "report" else ["sweep", "--resume", str(target)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    prefix = as_an_ordinary_user()
    locked.chmod(0o000)
    try:
        done = subprocess.run(
            [*prefix, sys.executable, "-m", "attnbench", *args],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        locked.chmod(0o700)
    lines = done.stderr.splitlines()
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert "Traceback" not in done.stderr and len(lines) == 2, done.stderr
    assert lines[0].startswith("error: ") and mentions(lines[0], str(target), "Permission denied")


# -------------------------------------------------------------------------------------------- resume debris
@pytest.mark.slow
def test_resume_removes_what_a_killed_write_left_behind(run: Path) -> None:
    debris = [run / ".summary.csv.k1ll3d.tmp", run / "plots" / ".latency-x.png.k1ll3d.tmp", run / ".run.json.x.tmp"]
    for path in debris:
        path.write_text("half a file")
    done = sweep("--resume", str(run))
    assert done.exit_code == 0, done.output
    assert not any(p.exists() for p in debris)
    assert not [p.name for p in run.rglob("*.tmp")]


@pytest.mark.slow
def test_resume_drops_the_telemetry_of_a_row_it_drops(run: Path) -> None:
    retried = fail_one_row(run)
    done = sweep("--resume", str(run), "--retry-failed", "--no-isolate")
    assert done.exit_code == 0, done.output
    rows = {(r.case.key, r.started_utc) for r in load_run(run).results}
    entries = [json.loads(line) for line in (run / "telemetry.jsonl").read_text().splitlines()]
    owners = [(e["key"], e["started_utc"]) for e in entries]
    assert len(owners) == len(set(owners)) == len(rows) == 4  # one entry per row, none for the dropped row
    assert set(owners) == rows and sum(key == retried for key, _ in owners) == 1


@pytest.mark.slow
def test_resume_drops_the_telemetry_of_a_torn_last_row(run: Path) -> None:
    path = run / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:100])  # the last row torn: its telemetry had landed first
    done = sweep("--resume", str(run), "--no-isolate")
    assert done.exit_code == 0, done.output
    owners = [json.loads(line)["key"] for line in (run / "telemetry.jsonl").read_text().splitlines()]
    assert sorted(owners) == sorted(r.case.key for r in load_run(run).results)


# ------------------------------------------------------------------------------------ a damaged run.json
@pytest.mark.parametrize(
    ("edit", "says"),
    [
        (("config", "name", "BAD NAME!"), "run.json, key 'config.name': name 'BAD NAME!' is not allowed"),
        (("config", "d_model", "wide"), "run.json, key 'config.d_model': must be an integer"),
        (("environment", "device", "gpu7"), "run.json, key 'environment.device': 'gpu7' is not a device"),
        (("environment", "device", ["cpu"]), "run.json, key 'environment.device': \"['cpu']\" is not a device"),
    ],
)
def test_a_bad_run_json_on_resume_names_run_json_and_the_field(
    run: Path, edit: tuple[str, str, Any], says: str
) -> None:
    section, key, value = edit
    data = json.loads((run / "run.json").read_text())
    data[section][key] = value
    (run / "run.json").write_text(json.dumps(data))
    line = one_error(sweep("--resume", str(run)))
    assert line.startswith(f"error: {run}/{says}"), line
    assert "--device" not in line and data["config_source"] not in line


# ------------------------------------------------------------------------------------------------ signals
def sigterm_self() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_a_signal_while_the_summaries_are_written_exits_with_its_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import attnbench.report.run_files as run_files

    real = run_files.render_csv

    def render_then_signal(*args: Any, **kwargs: Any) -> str:
        sigterm_self()  # arrives while the summary is being rendered
        return real(*args, **kwargs)

    monkeypatch.setattr(run_files, "render_csv", render_then_signal)
    (tmp_path / "c.yaml").write_text(CONFIG)
    done = sweep(str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"), "--no-isolate")
    (folder,) = (tmp_path / "out").iterdir()
    assert done.exit_code == 128 + signal.SIGTERM, done.output
    assert f"attnbench sweep --resume {folder}" in done.stderr  # the command that goes on
    assert mentions(done.stderr.splitlines(), "SIGTERM", values=(4, 4))  # 4 of 4 cases finished
    assert len((folder / "summary.csv").read_text().splitlines()) == 5  # written whole: a header and four rows
    assert (folder / "summary.md").exists() and load_run(folder).run.state == "complete"


@pytest.mark.slow
def test_a_signal_while_the_folder_is_closed_lets_it_close(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.timing.torch_executor import TorchExecutor

    real = TorchExecutor.close

    def close_then_signal(self: TorchExecutor, *, now: bool = False) -> None:
        sigterm_self()  # the loop is over; run.json is about to say so
        real(self, now=now)

    monkeypatch.setattr(TorchExecutor, "close", close_then_signal)
    (tmp_path / "c.yaml").write_text(CONFIG)
    done = sweep(str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"), "--no-isolate")
    (folder,) = (tmp_path / "out").iterdir()
    assert done.exit_code == 128 + signal.SIGTERM, done.output
    stored = load_run(folder)
    assert stored.run.state == "complete" and len(stored.results) == 4  # never left "running"


@pytest.mark.slow
def test_the_count_of_finished_cases_is_what_is_on_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.cli.progress import SweepDisplay

    real = SweepDisplay.finished

    def interrupted_before_the_last_is_shown(self: SweepDisplay, index: int, result: Any) -> None:
        if index == self.total - 1:
            raise KeyboardInterrupt  # the row is stored; the display never hears of it
        real(self, index, result)

    monkeypatch.setattr(SweepDisplay, "finished", interrupted_before_the_last_is_shown)
    (tmp_path / "c.yaml").write_text(CONFIG)
    done = sweep(str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"), "--no-isolate")
    (folder,) = (tmp_path / "out").iterdir()
    assert done.exit_code == 130
    assert len(load_run(folder).results) == 4
    assert mentions(done.stderr.splitlines(), "SIGINT", str(folder), values=(4,))  # 4 of 4 finished, saved there


@pytest.mark.parametrize("where", ["_environment", "_cached_calibration"])
def test_ctrl_c_while_starting_is_one_line_and_leaves_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    """While the environment is collected (torch imported), or just after the run folder is made."""
    import attnbench.sweeps.runner as library

    def interrupt(*args: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(library, where, interrupt)
    (tmp_path / "c.yaml").write_text(CONFIG)
    done = sweep(str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"))
    assert done.exit_code == 130, done.output
    assert done.stderr.count("\n") == 1 and "SIGINT" in done.stderr  # one line: nothing was started
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").iterdir()) == []


def test_a_ctrl_c_an_import_swallowed_while_starting_stops_before_any_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch imports numpy inside a try: a Ctrl-C then can vanish into a half-imported numpy, the start-up goes on,
    and rendering the summaries with that numpy crashed with a traceback. The signal is seen after start-up:
    nothing is measured or rendered, the run is closed as interrupted and says how to resume."""
    import attnbench.sweeps.runner as library

    real = library._environment

    def swallowing(*args: Any) -> Any:
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        except KeyboardInterrupt:
            pass  # what the import's own except clause did
        return real(*args)

    monkeypatch.setattr(library, "_environment", swallowing)
    (tmp_path / "c.yaml").write_text(CONFIG)
    done = sweep(str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"))
    assert done.exit_code == 130, done.output
    (folder,) = (tmp_path / "out").iterdir()
    assert done.stderr.count("\n") == 1 and mentions(done.stderr, "SIGINT", f"attnbench sweep --resume {folder}")
    stored = load_run(folder)
    assert stored.run.state == "interrupted" and stored.results == ()
    assert not (folder / "summary.csv").exists()


def import_interrupted(*args: Any) -> None:
    """What an extension does that catches the KeyboardInterrupt of a Ctrl-C during its import: raise its own."""
    try:
        raise KeyboardInterrupt
    except KeyboardInterrupt as exc:
        raise ImportError("initialisation was interrupted") from exc


@pytest.mark.parametrize("command", ["sweep", "report"])
def test_a_ctrl_c_an_extension_turned_into_its_own_error_is_still_an_interrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    import attnbench.results.store as store
    import attnbench.sweeps.runner as library

    (tmp_path / "c.yaml").write_text(CONFIG)
    if command == "sweep":
        monkeypatch.setattr(library, "_environment", import_interrupted)
        done = sweep(str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"))
        said = "stopped before the first case"
    else:
        monkeypatch.setattr(store, "load_run", import_interrupted)
        done = runner.invoke(app, ["report", str(tmp_path)])
        said = "stopped before it finished"
    assert done.exit_code == 130, done.output
    assert done.stderr == f"interrupted by SIGINT: {said}\n"


def test_ctrl_c_while_the_command_line_loads_is_one_line() -> None:
    """A KeyboardInterrupt raised by the import of the CLI itself, as a Ctrl-C in its first 0.2 s raises one."""
    code = (
        "import sys\n"
        "class Interrupt:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'attnbench.cli.sweep':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Interrupt())\n"
        "sys.argv = ['attnbench', 'report', '.']\n"
        "from attnbench.__main__ import main\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 130
    assert done.stderr.count("\n") == 1 and "SIGINT" in done.stderr


def test_a_ctrl_c_during_torchs_import_waits_for_it_then_stops_before_the_first_case(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch's C++ module initialisers cannot carry a Python exception through (a KeyboardInterrupt raised inside
    one ended a CI run's sweep in std::terminate): the import runs disarmed, and the signal is acted on after it."""
    import importlib

    import attnbench.cli.sweep as sweep_cli

    real = importlib.import_module
    finished: list[str] = []

    def import_with_a_ctrl_c(name: str, package: str | None = None) -> object:
        module = real(name, package)
        if name == "torch":
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside the "import"
            finished.append(name)  # reached only if the handler did not raise
        return module

    monkeypatch.setattr(sweep_cli.importlib, "import_module", import_with_a_ctrl_c)
    (tmp_path / "c.yaml").write_text(CONFIG)
    done = sweep(str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out"))
    assert finished == ["torch"]
    assert done.exit_code == 130 and done.stderr.count("\n") == 1 and "SIGINT" in done.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize("after_s", [0.3, 1.0, 2.0])
@pytest.mark.slow
def test_a_real_ctrl_c_at_start_up_never_prints_a_traceback(tmp_path: Path, after_s: float) -> None:
    (tmp_path / "c.yaml").write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "attnbench", "sweep", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "out")]
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(after_s)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.skip("the sweep had finished before the signal")
    # A shell sees 130 either way. When the Ctrl-C passed through code an extension ran with PyRun_String (torch's and
    # pydantic-core's imports do), CPython remembers it and ends the process by SIGINT itself after our exit(130)
    # (bpo-1054041: so that a calling shell script stops too); Popen reports that as -2.
    assert process.returncode in (130, -signal.SIGINT), err
    # Start-up may have warned first (the machine is busy, issue 17; no calibration of this CPU, once start-up is
    # past by the time the signal comes): one line each, then the interrupt.
    said = "".join(line for line in err.splitlines(keepends=True) if not line.startswith("warning: "))
    assert "Traceback" not in err and said.startswith("interrupted by SIGINT"), err
    for folder in (tmp_path / "out").glob("*"):
        assert (folder / "run.json").exists(), f"{folder} holds only {os.listdir(folder)}"


# ------------------------------------------------------------------------------------------------ a full disk
@pytest.fixture
def disk(tmp_path: Path) -> Iterator[Path]:
    with small_disk(tmp_path / "disk", "16m") as mounted:
        yield mounted


def fill_after_first_row(out: Path) -> threading.Thread:
    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for rows in out.glob("*/results.jsonl"):
                if rows.stat().st_size > 0:
                    fill_disk(out.parent)
                    return
            time.sleep(0.002)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_a_disk_that_fills_mid_sweep_is_an_error_with_the_resume_line(disk: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        CONFIG.replace("min_time_s: 0.01", "min_time_s: 0.2").replace("max_case_s: 0.1", "max_case_s: 0.3")
    )
    out = disk / "out"
    watcher = fill_after_first_row(out)
    done = sweep(str(config), "--out", str(out), "--no-isolate")
    watcher.join()
    (folder,) = out.iterdir()
    assert done.exit_code == EXIT_WRITE_FAILED, done.output
    errors = [line for line in done.stderr.splitlines() if line.startswith(("error:", "hint:"))]
    assert len(errors) == 2 and "Traceback" not in done.output
    # The file that could not be written and why, where the finished cases are, and the command that goes on.
    assert mentions(errors[0], "jsonl", "No space left on device", str(folder))
    assert errors[1].startswith("hint:") and errors[1].endswith(f"attnbench sweep --resume {folder}")
    stored = load_run(folder)  # whole lines only, and run.json says how it ended
    assert stored.warnings == () and 1 <= len(stored.results) < 4
    assert stored.run.state == "interrupted"

    (disk / "filler").unlink()
    resumed = sweep("--resume", str(folder), "--no-isolate")
    assert resumed.exit_code == 0, resumed.output
    keys = [r.case.key for r in load_run(folder).results]
    assert len(keys) == len(set(keys)) == 4


def test_a_full_disk_at_start_is_one_error_and_leaves_no_folder(disk: Path, tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(CONFIG)
    (disk / "out").mkdir()
    fill_disk(disk)
    line = one_error(sweep(str(config), "--out", str(disk / "out"), "--no-isolate"), EXIT_WRITE_FAILED)
    assert "No space left on device" in line

    assert list((disk / "out").iterdir()) == []
