"""attnbench submit: the debug executor end to end, the local one through re-attach, the Slurm job array as sbatch
receives it (a stand-in sbatch at the command seam: the real cluster run is scripts/slurm_check.sh), and every
fault a person can meet: a task that dies or times out, an sbatch that refuses, no submitit, bad options."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import attnbench.cluster.submission as submission_module
from attnbench.cli import app
from attnbench.cluster.submission import (
    SubmitRequest,
    load_submission,
    plan_submission,
    prepare_folder,
    run_shard,
    shard_command,
)
from attnbench.core.shards import Shard
from attnbench.results.store import load_run
from tests.support import ROOT, mentions, tiny_config

runner = CliRunner()
# A budget that three samples of a tiny case fit in beside another test worker (0.05 s did not, and the end-to-end
# test's "every row ok" failed under load); converged cases stop long before it.
QUICK = {"min_samples": 3, "min_time_s": 0.005, "max_case_s": 0.5, "warmup_max_s": 0.02}
CONFIG = tiny_config(
    "submit", models=["lstm", "gru", "sdpa-flash", "vanilla"], grid={"batch": [1], "seq_len": [8, 16, 32]}, timing=QUICK
)


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "submit.yaml"
    path.write_text(CONFIG)
    return path


def submit(*args: str | Path) -> Any:
    return runner.invoke(app, ["submit", *map(str, args)])


def config_keys(config: Path) -> list[str]:
    out = runner.invoke(app, ["sweep", str(config), "--dry-run", "--device", "cpu"])
    return [line for line in out.output.splitlines() if line.startswith("model=")]


def shard_sizes(config: Path, n: int) -> list[int]:
    plan = plan_submission(SubmitRequest(config, "debug", n))
    return [len(cases) for cases in plan.shards]


# ------------------------------------------------------------------------------------- the debug executor


@pytest.mark.slow  # real sweeps in subprocesses
def test_submit_through_the_debug_executor_end_to_end(config: Path, tmp_path: Path) -> None:
    folder = tmp_path / "sub"
    result = submit(config, "--executor", "debug", "--array", "3", "--folder", folder)
    assert result.exit_code == 0, result.output
    assert "3 shards" in result.output and "timing:" in result.output  # how long the submission took, said
    merged = load_run(folder / "merged")
    keys = [r.case.key for r in merged.results]
    assert keys == config_keys(config)  # every case exactly once, in the config's order
    assert merged.run.state == "complete" and all(r.ok for r in merged.results)
    record = load_submission(folder)
    assert record.executor == "debug" and record.shards == 3 and len(record.jobs) == 3
    assert sorted(s.shard for s in merged.run.merged_from) == [Shard(i, 3) for i in range(3)]
    status = submit("--status", folder)
    assert status.exit_code == 0 and "12 of 12" in status.output  # cases with a row


@pytest.mark.slow  # real sweeps in subprocesses
def test_a_task_that_dies_is_reported_and_resume_reruns_only_its_cases(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes = shard_sizes(config, 2)  # two shards: one dies, one runs (a sweep fewer than three)
    victim = max(range(2), key=lambda i: sizes[i])
    real = shard_command

    def dies(folder: Path, shard: Shard, device: str) -> list[str]:
        if shard.index == victim:  # the task's sweep is killed (an OOM killer, a node going down)
            return [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
        return real(folder, shard, device)

    monkeypatch.setattr(submission_module, "shard_command", dies)
    folder = tmp_path / "sub"
    failed = submit(config, "--executor", "debug", "--array", "2", "--folder", folder)
    assert failed.exit_code == 1, failed.output
    assert f"shard {victim}/2" in failed.output and "FAILED" in failed.output and "code -9" in failed.output
    assert mentions(failed.output.splitlines(), f"{victim}/2", values=(sizes[victim],))  # its cases, missing
    assert f"attnbench submit --resume {folder}" in failed.output
    partial = load_run(folder / "merged")
    assert partial.run.state == "interrupted" and len(partial.results) == 12 - sizes[victim]

    monkeypatch.setattr(submission_module, "shard_command", real)
    resumed = submit("--resume", folder)
    assert resumed.exit_code == 0, resumed.output
    assert f"resubmitted shard(s) {victim}/2 (missing cases)" in resumed.output
    merged = load_run(folder / "merged")
    assert merged.run.state == "complete" and [r.case.key for r in merged.results] == config_keys(config)
    attempts = {(j.shard, j.attempt) for j in load_submission(folder).jobs}
    assert (victim, 2) in attempts and len(attempts) == 3  # only the dead shard ran again


@pytest.mark.slow  # real sweeps in subprocesses
def test_a_task_told_to_stop_saves_its_rows_and_the_next_attempt_finishes_them(tmp_path: Path) -> None:
    """What a Slurm time limit does: submitit raises in the task (SIGUSR2), the task stops its sweep with
    SIGTERM, the rows finished so far stay, and the next attempt resumes the same folder."""
    config = tmp_path / "slow.yaml"
    slow = {"min_samples": 5, "min_time_s": 0.3, "max_case_s": 0.4, "warmup_max_s": 0.05}
    config.write_text(
        tiny_config("slow", models=["lstm", "gru"], grid={"batch": [1], "seq_len": [8, 16, 32, 64]}, timing=slow)
    )
    plan = plan_submission(SubmitRequest(config, "debug", 1, folder=tmp_path / "sub"))
    record = prepare_folder(plan, None)
    task = (
        "import signal, sys\n"
        "from attnbench.cluster.submission import run_shard\n"
        "def timed_out(*_):\n"
        "    raise RuntimeError('Job not requeued because: timed-out and not checkpointable.')\n"
        "signal.signal(signal.SIGUSR2, timed_out)\n"
        "run_shard(sys.argv[1], '0/1', 'cpu')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, "-c", task, str(record.folder)], stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 120
    rows: list[Path] = []
    while time.monotonic() < deadline and not any(p.stat().st_size for p in rows):
        rows = list((record.folder / "shards").glob("*/results.jsonl"))
        time.sleep(0.1)
    process.send_signal(signal.SIGUSR2)
    _, errors = process.communicate(timeout=120)
    assert process.returncode != 0 and "timed-out and not checkpointable" in errors
    (shard,) = (record.folder / "shards").iterdir()
    stopped = load_run(shard)
    assert stopped.run.state == "interrupted" and 1 <= len(stopped.results) < 8

    run_shard(str(record.folder), "0/1", "cpu")  # the next attempt
    finished = load_run(shard)
    keys = [r.case.key for r in finished.results]
    assert finished.run.state == "complete" and len(keys) == len(set(keys)) == 8
    assert [p.name for p in (record.folder / "shards").iterdir()] == [shard.name]  # the same folder, resumed


# ----------------------------------------------------------------------------------- the local executor


@pytest.mark.slow
def test_the_local_executor_without_waiting_then_resume_waits_and_merges(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import functools

    import attnbench.cluster.jobarray as jobarray

    # Polls every 0.2 s, not 2 s: the shards end within seconds here, and the test should not sleep past them.
    monkeypatch.setattr(jobarray, "wait", functools.partial(jobarray.wait, poll_s=0.2))
    folder = tmp_path / "sub"
    started = submit(config, "--executor", "local", "--array", "2", "--folder", folder, "--no-wait")
    assert started.exit_code == 0, started.output
    assert f"attnbench submit --resume {folder}" in started.output
    status = submit("--status", folder)
    assert status.exit_code == 0 and "local · 2 shards" in status.output
    finished = submit("--resume", folder)  # nothing is missing once they end: it waits for them and merges
    assert finished.exit_code == 0, finished.output
    assert [r.case.key for r in load_run(folder / "merged").results] == config_keys(config)


# ------------------------------------------------------------------------------- the Slurm job array


@pytest.fixture
def fake_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """srun (what submitit looks for) and an sbatch that keeps the script it is given and answers as Slurm does."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "srun": "#!/bin/sh\nexit 0\n",
        "sbatch": '#!/bin/sh\ncp "$1" "$ATTNBENCH_TEST_CAPTURE"\necho "Submitted batch job 4242"\n',
    }
    for name, text in scripts.items():
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("ATTNBENCH_TEST_CAPTURE", str(tmp_path / "captured.sh"))
    return tmp_path / "captured.sh"


def test_the_slurm_path_builds_one_array_of_one_shard_per_task(config: Path, tmp_path: Path, fake_slurm: Path) -> None:
    import submitit

    folder = tmp_path / "sub"
    result = submit(
        config, "--executor", "slurm", "--array", "3", "--device", "cuda", "--partition", "gpu",
        "--time", "1:30:00", "--exclusive", "--slurm-arg", "account=proj", "--cpus-per-task", "4",
        "--folder", folder, "--no-wait",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert all(job in result.output for job in ("4242_0", "4242_1", "4242_2"))  # the array's tasks, by id
    script = fake_slurm.read_text()
    for line in (
        "#SBATCH --array=0-2%3",  # one sbatch for all three shards, all at once
        "#SBATCH --gpus-per-node=1",  # each task on its own GPU
        "#SBATCH --partition=gpu",
        "#SBATCH --time=90",
        "#SBATCH --exclusive",
        "#SBATCH --account=proj",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH --job-name=attnbench-submit",
    ):
        assert line in script, line
    # The task runs the submitter's interpreter, with the submitter's environment (sbatch's default --export=ALL).
    assert f"{sys.executable} -u -m submitit.core._submit" in script and "--export" not in script
    record = load_submission(folder)
    assert [j.job_id for j in record.jobs] == ["4242_0", "4242_1", "4242_2"] and record.device == "cuda"
    for job in record.jobs:
        pickled = folder / "jobs" / job.job_id / f"{job.job_id}_submitted.pkl"
        assert b"attnbench.cluster.submission" in pickled.read_bytes()  # by reference: importable in the task
        delayed = submitit.core.utils.DelayedSubmission.load(pickled)
        assert delayed.function is run_shard
        assert delayed.args == (str(folder.resolve()), f"{job.shard}/3", "cuda")
        assert shard_command(folder.resolve(), Shard(job.shard, 3), "cuda")[3:] == [
            "sweep", "--no-plots", str(folder.resolve() / "config.yaml"), "--shard", f"{job.shard}/3",
            "--device", "cuda", "--out", str(folder.resolve() / "shards"),
        ]  # fmt: skip


@pytest.mark.slow  # real sweeps in subprocesses
def test_a_pickled_task_runs_its_shard(config: Path, tmp_path: Path, fake_slurm: Path) -> None:
    """What srun runs on a node: the pickled task, loaded by reference, sweeping its shard into the folder."""
    import submitit

    folder = tmp_path / "sub"
    assert submit(config, "--executor", "slurm", "--array", "2", "--folder", folder, "--no-wait").exit_code == 0
    job = load_submission(folder).jobs[0]
    delayed = submitit.core.utils.DelayedSubmission.load(folder / "jobs" / job.job_id / f"{job.job_id}_submitted.pkl")
    outcome = delayed.result()
    assert outcome["exit_code"] == 0
    (shard,) = (folder / "shards").iterdir()
    stored = load_run(shard)
    assert stored.run.shard == Shard(job.shard, 2) and len(stored.results) == shard_sizes(config, 2)[job.shard]


def test_an_sbatch_that_refuses_is_a_clean_error_and_leaves_no_folder(
    config: Path, tmp_path: Path, fake_slurm: Path
) -> None:
    sbatch = fake_slurm.parent / "bin" / "sbatch"
    sbatch.write_text(
        "#!/bin/sh\necho 'sbatch: error: invalid partition specified: nope' >&2\n"
        "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\nexit 1\n"
    )
    folder = tmp_path / "sub"
    result = submit(config, "--executor", "slurm", "--array", "2", "--partition", "nope", "--folder", folder)
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len([line for line in lines if line.startswith("error:")]) == 1
    assert "invalid partition specified: nope" in result.output  # sbatch's own reason, passed on
    assert mentions([line for line in lines if line.startswith("hint:")], "--partition")  # the flag to check

    assert "Traceback" not in result.output and not folder.exists()


def test_without_srun_the_slurm_executor_says_where_to_run(
    config: Path, tmp_path: Path, fake_slurm: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (fake_slurm.parent / "bin" / "srun").unlink()
    monkeypatch.setenv("PATH", str(fake_slurm.parent / "bin"))  # no srun anywhere on it
    result = submit(config, "--executor", "slurm", "--folder", tmp_path / "sub")
    assert result.exit_code == 2 and "srun" in result.output and "--executor local" in result.output


def test_without_submitit_submit_says_how_to_install_it(
    config: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "submitit", None)  # import submitit → ImportError
    result = submit(config, "--executor", "debug", "--folder", tmp_path / "sub")
    assert result.exit_code == 2
    assert "submitit" in result.output and 'pip install "attnbench[slurm]"' in result.output  # how to install it

    assert not (tmp_path / "sub").exists()


@pytest.mark.parametrize(
    ("args", "problem"),
    [
        (["--array", "13"], "the config has only 12 cases"),
        (["--array", "0"], "--array"),
        (["--time", "soon"], "not a Slurm time limit"),
        (["--time", "1"], "before it could start"),
        (["--slurm-arg", "account"], "expected KEY=VALUE"),
        (["--slurm-arg", "account=proj\n#SBATCH --wrap=evil"], "a control character"),  # issue 38: its own line
        (["--partition", "gpu\n#SBATCH --wrap=evil"], "a control character"),
        (["--no-wait"], "--no-wait with --executor debug"),
        (["--device", "cuda", "--gpus-per-task", "0"], "the tasks would see no GPU"),
        (["--device", "tpu"], "not a device"),
    ],
)
def test_bad_submit_options_are_refused_before_anything_is_written(
    config: Path, tmp_path: Path, args: list[str], problem: str
) -> None:
    result = submit(config, "--executor", "debug", "--folder", tmp_path / "sub", *args)
    assert result.exit_code == 2 and problem in result.output, result.output
    assert not (tmp_path / "sub").exists()


def test_status_and_resume_need_a_submission_folder(tmp_path: Path) -> None:
    for flag in ("--status", "--resume"):
        result = submit(flag, tmp_path)
        assert result.exit_code == 2 and "no submission.json here" in result.output


@pytest.mark.slow
def test_a_huge_submission_json_is_one_error_line(tmp_path: Path) -> None:
    """A 3 GB submission.json (sparse: nothing on disk) was read whole into a MemoryError traceback (issue 38); in a
    child held to 2 GiB, as a reader of a hostile file must be."""
    import resource

    with (tmp_path / "submission.json").open("wb") as handle:
        handle.truncate(3 << 30)

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    done = subprocess.run(
        [sys.executable, "-m", "attnbench", "submit", "--status", str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=cap,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("error:") == 1 and "Traceback" not in done.stderr and "larger than" in done.stderr


def test_a_used_folder_is_refused(config: Path, tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "something").write_text("x")
    result = submit(config, "--executor", "debug", "--folder", tmp_path / "sub")
    assert result.exit_code == 2 and "exists and is not empty" in result.output


SLURM_CHECK = Path(__file__).resolve().parents[2] / "scripts" / "slurm_check.sh"


def _which_python(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """scripts/slurm_check.sh's choice of Python, from a fresh environment (no cluster is started)."""
    base = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "ATTNBENCH_VENV": str(tmp_path / "no-venv")}
    return subprocess.run(
        ["bash", str(SLURM_CHECK), "python"], env={**base, **env}, capture_output=True, text=True, cwd=tmp_path
    )


def test_slurm_check_takes_its_python_from_the_environment_path_or_venv(tmp_path: Path) -> None:
    here = Path(sys.executable)
    given = _which_python(tmp_path, ATTNBENCH_PYTHON=str(here))
    assert given.returncode == 0 and given.stdout.strip() == str(here), given.stderr
    # The attnbench on PATH: its script's interpreter.
    on_path = _which_python(tmp_path, PATH=f"{here.parent}:/usr/bin:/bin")
    assert on_path.returncode == 0 and Path(on_path.stdout.strip()).name.startswith("python"), on_path.stderr
    venv = _which_python(tmp_path, ATTNBENCH_VENV=str(here.parent.parent))
    assert venv.returncode == 0 and venv.stdout.strip() == str(here.parent / "python"), venv.stderr
    # None of them: one error that says which it looked for.
    missing = _which_python(tmp_path, ATTNBENCH_PYTHON="/usr/bin/false")
    assert missing.returncode == 1
    for looked in ("ATTNBENCH_PYTHON=/usr/bin/false (does not import attnbench)", "no-venv (absent)", "PATH (none)"):
        assert looked in missing.stderr
