"""No result lost, nothing run twice: worker crashes, timeouts, interrupts, resume, locks, OOM skipping."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.cases import Case
from attnbench.core.errors import ResultsError
from attnbench.results.lock import RunLock
from attnbench.results.records import Result
from attnbench.sweeps.isolated_executor import IsolatedExecutor
from attnbench.sweeps.loop import OomSkipper, run_cases
from attnbench.timing.executor import ExecutorSettings
from tests.fakes import FakeExecutors
from tests.support import ROOT, numbers, quick_policy, tiny_case, tiny_config

runner = CliRunner()
QUICK = quick_policy(min_samples=3, min_time_s=0.01, max_case_s=0.2, warmup_max_s=0.05)
# A case that cannot end early: an unreachable CI target and a sample cap far above what 4 s holds (a tiny LSTM
# fills the default 10 000 samples of 100 µs in about a second on a quiet machine, which beat the 1 s timeout).
SLOW = quick_policy(min_samples=3, min_time_s=3.0, max_case_s=4.0, warmup_max_s=0.05, target_ci=1e-6, max_samples=10**7)


def case(seq_len: int = 16, model: str = "lstm") -> Case:
    return tiny_case(model, batch=1, seq_len=seq_len)


@pytest.fixture(scope="module")
def worker() -> IsolatedExecutor:
    executor = IsolatedExecutor(ExecutorSettings("cpu", QUICK, seed=0, threads=1, timeout_s=30))
    yield executor
    executor.close()


def kill_soon(executor: IsolatedExecutor, sig: int, after_s: float) -> threading.Thread:
    pid = executor.worker_pid
    assert pid is not None
    thread = threading.Thread(target=lambda: (time.sleep(after_s), os.kill(pid, sig)))
    thread.start()
    return thread


@pytest.mark.slow  # two worker processes
def test_a_worker_killed_mid_case_is_a_crashed_row_and_the_next_case_runs() -> None:
    # SIGSEGV (a crash in a kernel); SIGKILL, the OOM killer's signal, is test_pool's killed worker.
    executor = IsolatedExecutor(ExecutorSettings("cpu", SLOW, seed=0, threads=1, timeout_s=30))
    try:
        executor.start()
        thread = kill_soon(executor, signal.SIGSEGV, 0.5)
        result = executor.run(case())
        thread.join()
        assert result.status == "crashed"
        assert "SIGSEGV" in result.reason and "OOM" not in result.reason  # no OOM-killer hint: that is SIGKILL's

        executor.policy = QUICK  # the next worker takes the policy it is started with
        assert executor.run(case(32)).status == "ok"
        assert executor.workers_started == 2
    finally:
        executor.close()


@pytest.mark.slow  # a worker process per test
def test_a_case_past_its_timeout_is_killed_and_recorded() -> None:
    executor = IsolatedExecutor(ExecutorSettings("cpu", SLOW, seed=0, threads=1, timeout_s=1.0))
    try:
        executor.start()  # the worker's start-up is not part of a case's time
        result = executor.run(case())
        assert result.status == "timeout" and "1 s" in result.reason
        executor.policy = QUICK
        executor.timeout_s = 30
        assert executor.run(case()).ok
    finally:
        executor.close()


@pytest.mark.slow  # a worker process per test
def test_worker_results_equal_in_process_contract(worker: IsolatedExecutor) -> None:
    result = worker.run(case(model="sdpa-efficient"))
    assert result.status == "unsupported" and "CUDA" in result.reason
    ok = worker.run(case(model="sdpa-flash"))
    assert ok.ok and ok.measurement is not None and ok.memory is not None


def test_oom_skipper_skips_longer_lengths_of_the_same_family() -> None:
    def execute(c: Case) -> Result:
        return Result(c, "oom", "out of memory") if c.seq_len >= 64 else Result(c, "ok")

    cases = [case(n) for n in (16, 64, 256, 1024)] + [case(1024, "gru")]
    seen: list[Result] = []
    run_cases(cases, execute, lambda i, r: seen.append(r), skipper=OomSkipper())
    assert [r.status for r in seen] == ["ok", "oom", "oom", "oom", "oom"]
    assert seen[2].reason == seen[3].reason != seen[1].reason and numbers(seen[2].reason) == [64]  # the oom at 64
    assert "skipped" not in seen[4].reason  # another model is its own family


def test_a_second_writer_is_refused_naming_the_first(tmp_path: Path) -> None:
    first = RunLock(tmp_path).acquire()
    try:
        with pytest.raises(ResultsError, match=f"pid {os.getpid()}"):
            RunLock(tmp_path).acquire()
    finally:
        first.release()
    RunLock(tmp_path).acquire().release()  # free again once released


CONFIG = tiny_config(
    "resilience",
    models=["lstm", "gru", "sdpa-flash", "vanilla"],
    grid={"batch": [1], "seq_len": [16, 32]},
    # Slow enough (≥ 0.3 s a case) that a signal sent mid-sweep lands inside a case.
    timing={"min_samples": 5, "min_time_s": 0.3, "max_case_s": 0.4, "warmup_max_s": 0.05},
)


def start_sweep(tmp_path: Path, *extra: str) -> subprocess.Popen[str]:
    config = tmp_path / "r.yaml"
    config.write_text(CONFIG)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "attnbench", "sweep", str(config), "--out", str(tmp_path / "out"), *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for_rows(folder_parent: Path, rows: int, timeout_s: float = 120) -> Path:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in folder_parent.glob("*/results.jsonl"):
            if len(path.read_text().splitlines()) >= rows:
                return path.parent
        time.sleep(0.05)
    raise AssertionError("the sweep never wrote enough rows")


@pytest.mark.slow
@pytest.mark.parametrize(("sig", "isolate"), [(signal.SIGINT, "--no-isolate"), (signal.SIGTERM, "--isolate")])
def test_interrupt_then_resume_keeps_every_row_once(
    tmp_path: Path, sig: int, isolate: str, fake_executors: FakeExecutors
) -> None:
    """The interrupted sweep is real, in its own process; the resumes in this one measure on the fake executor: what
    is checked of them is which rows they add and keep, not how they time."""
    process = start_sweep(tmp_path, isolate)
    folder = wait_for_rows(tmp_path / "out", 3)
    process.send_signal(sig)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 128 + sig, err
    assert f"attnbench sweep --resume {folder}" in err
    assert json.loads((folder / "run.json").read_text())["state"] == "interrupted"
    before = (folder / "results.jsonl").read_text()
    assert 3 <= len(before.splitlines()) < 8
    assert (folder / "summary.md").exists()  # the partial summary was rendered

    resumed = runner.invoke(app, ["sweep", "--resume", str(folder), "--no-isolate", "--no-plots"])
    assert resumed.exit_code == 0, resumed.output
    after = (folder / "results.jsonl").read_text()
    assert after.startswith(before)  # the rows from before the interrupt, byte for byte
    keys = [json.loads(line)["key"] for line in after.splitlines()]
    assert len(keys) == 8 and len(set(keys)) == 8
    assert json.loads((folder / "run.json").read_text())["state"] == "complete"
    again = runner.invoke(app, ["sweep", "--resume", str(folder), "--no-plots"])
    assert again.exit_code == 0 and "0 of 8 cases left" in again.output
    assert (folder / "results.jsonl").read_text() == after


@pytest.fixture
def finished_run(tmp_path: Path, fake_executors: FakeExecutors) -> Path:
    """A finished run of four cases, swept (and later resumed) by the CLI on the fake executor: these tests are
    about which rows a resume keeps, reruns and refuses, not about timing them."""
    config = tmp_path / "r.yaml"
    config.write_text(CONFIG.replace("min_time_s: 0.3, max_case_s: 0.4", "min_time_s: 0.01, max_case_s: 0.1"))
    out = runner.invoke(
        app, ["sweep", str(config), "--out", str(tmp_path / "out"), "--set", "grid.seq_len=[8]", "--no-plots"]
    )
    assert out.exit_code == 0, out.output
    (folder,) = (tmp_path / "out").iterdir()
    return folder


@pytest.mark.slow
def test_resume_refuses_another_config(finished_run: Path, tmp_path: Path) -> None:
    out = runner.invoke(app, ["sweep", str(tmp_path / "r.yaml"), "--resume", str(finished_run)])
    assert out.exit_code == 2
    assert "the config differs" in out.output and "grid.seq_len: [8] then" in out.output and "hint:" in out.output


@pytest.mark.slow
def test_resume_refuses_another_environment(finished_run: Path) -> None:
    run = json.loads((finished_run / "run.json").read_text())
    run["environment"]["torch"] = "1.0.0"
    (finished_run / "run.json").write_text(json.dumps(run))
    out = runner.invoke(app, ["sweep", "--resume", str(finished_run)])
    assert out.exit_code == 2 and "torch: '1.0.0' then" in out.output


@pytest.mark.parametrize("threads", [10**12, 0, "2", True])
def test_resume_refuses_a_stored_thread_count_no_config_allows(
    tmp_path: Path, fake_executors: FakeExecutors, threads: object
) -> None:
    """A run started with the default count resumes at the count it recorded; one edited past what a config may
    ask is an error line (exit 2), not torch's overflow."""
    config = tmp_path / "r.yaml"
    config.write_text(CONFIG.replace("threads: 1\n", "threads: null\n"))
    out = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / "out"), "--no-plots"])
    assert out.exit_code == 0, out.output
    (folder,) = (tmp_path / "out").iterdir()
    run = json.loads((folder / "run.json").read_text())
    run["environment"]["torch_threads"] = threads
    (folder / "run.json").write_text(json.dumps(run))
    out = runner.invoke(app, ["sweep", "--resume", str(folder)])
    assert out.exit_code == ResultsError.exit_code, out.output
    assert "environment.torch_threads" in out.output  # the key, and no traceback
    assert out.exception is None or isinstance(out.exception, SystemExit)


def test_retry_failed_reruns_only_failed_rows_once(finished_run: Path, fake_executors: FakeExecutors) -> None:
    path = finished_run / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    broken = json.loads(lines[1])
    broken.update(status="error", reason="ValueError: injected", measurement=None)
    torn = lines[3][: len(lines[3]) // 2]  # and a kill -9 in the middle of the last line
    path.write_text(lines[0] + json.dumps(broken) + "\n" + lines[2] + torn)
    plain = runner.invoke(app, ["sweep", "--resume", str(finished_run), "--no-plots"])
    assert plain.exit_code == 1, plain.output  # the error row is kept, so the run still failed
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 4 and [r["status"] for r in rows].count("error") == 1
    retried = runner.invoke(app, ["sweep", "--resume", str(finished_run), "--retry-failed", "--no-plots"])
    assert retried.exit_code == 0, retried.output
    assert [c.key for c in fake_executors.ran[-1:]] == [broken["key"]]  # the failed case ran again, alone
    text = path.read_text()
    rows = [json.loads(line) for line in text.splitlines()]
    assert sorted(r["key"] for r in rows) == sorted({r["key"] for r in rows})
    assert len(rows) == 4 and all(r["status"] == "ok" for r in rows)
    assert text.startswith(lines[0] + lines[2])


@pytest.mark.slow
def test_cpu_oom_is_a_row_and_the_next_case_is_unaffected() -> None:
    from attnbench.timing.torch_executor import TorchExecutor

    executor = TorchExecutor(ExecutorSettings("cpu", QUICK, threads=1))
    # 8 TiB of scores; its inputs and projections are 64 MiB each (at 2**22, a gigabyte to fill before the refusal)
    huge = Case("vanilla", "forward", "float32", "cpu", 1, 2**20, 16, 2, 1, False)
    result = executor.run(huge)
    assert result.status == "oom" and "allocate" in result.reason
    assert executor.run(case()).ok


@pytest.mark.gpu
@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a CUDA device")
def test_cuda_oom_leaves_the_allocator_clean_for_the_next_case() -> None:
    import torch

    from attnbench.timing.torch_executor import TorchExecutor

    executor = TorchExecutor(ExecutorSettings("cuda:0", QUICK))
    baseline = torch.cuda.memory_allocated()
    huge = Case("vanilla", "forward", "bfloat16", "cuda:0", 64, 2**17, 1024, 16, 1, False)  # petabytes of scores
    assert executor.run(huge).status == "oom"
    assert torch.cuda.memory_allocated() == baseline
    small = Case("vanilla", "forward", "bfloat16", "cuda:0", 1, 256, 64, 4, 1, False)
    assert executor.run(small).ok


@pytest.mark.slow
def test_resume_keeps_a_whole_last_row_that_lost_its_newline(finished_run: Path) -> None:
    path = finished_run / "results.jsonl"
    text = path.read_text()
    path.write_text(text.rstrip("\n"))  # e.g. an editor that strips the final newline
    out = runner.invoke(app, ["sweep", "--resume", str(finished_run), "--no-plots"])
    assert out.exit_code == 0, out.output
    assert path.read_text() == text  # nothing lost, nothing rerun, the newline restored
    assert "0 of 4 cases left" in out.output


@pytest.mark.slow
def test_resume_reports_a_dropped_torn_line(finished_run: Path) -> None:
    path = finished_run / "results.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:3]) + lines[3][:20])
    out = runner.invoke(app, ["sweep", "--resume", str(finished_run), "--dry-run"])
    assert out.exit_code == 0
    assert "dropped a torn last line" in out.stderr
    (planned,) = [line for line in out.stdout.splitlines() if "(dry run" in line]
    assert numbers(planned)[0] == 1  # only the case whose row was torn is left


def test_error_text_with_brackets_is_not_read_as_markup(tmp_path: Path) -> None:
    out = runner.invoke(app, ["report", str(tmp_path / "[red]run[/x]")])
    assert out.exit_code == 2
    assert "[red]run[/x]" in out.stderr and "Traceback" not in out.output


def test_a_telemetry_failure_costs_the_row_its_telemetry_not_its_measurement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import attnbench.timing.torch_executor as executor_module
    from attnbench.timing.torch_executor import TorchExecutor

    class Broken:
        def __enter__(self) -> Broken:
            return self

        def __exit__(self, *exc: object) -> None:
            raise ValueError("a bug in a telemetry reading")

        def mark_sampling(self) -> None:
            return None

    monkeypatch.setattr(executor_module, "open_telemetry", lambda *args, **kwargs: Broken())
    result = TorchExecutor(ExecutorSettings("cpu", QUICK, threads=1)).run(case())
    assert result.ok and result.measurement is not None
    assert result.telemetry is None
    assert result.extra["telemetry_error"] == "ValueError: a bug in a telemetry reading"
