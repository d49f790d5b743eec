"""sweep --profile, --nvtx and --run-once: traces for the profilers people already use, on real tiny sweeps."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.cases import TimingPolicy
from attnbench.results.store import load_run
from attnbench.timing import profiling
from attnbench.timing.adaptive import RUN_ONCE
from attnbench.timing.executor import ExecutorSettings
from attnbench.timing.profiling import trace_name
from tests.support import tiny_case, tiny_config

runner = CliRunner()

TINY = tiny_config(models=["lstm", "sdpa-flash", "sdpa-efficient"], modes=["forward", "train"], threads=1)


def sweep(tmp: Path, *flags: str) -> tuple[Path, str]:
    config = tmp / "tiny.yaml"
    config.write_text(TINY)
    result = runner.invoke(app, ["sweep", str(config), "--out", str(tmp / "out"), "--no-plots", *flags])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp / "out").iterdir()
    return folder, result.output


@pytest.fixture(scope="module")
def profiled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return sweep(tmp_path_factory.mktemp("profiled"), "--profile")


@pytest.mark.slow
def test_every_ok_case_leaves_a_chrome_trace_of_its_own_work(profiled: tuple[Path, str]) -> None:
    folder, output = profiled
    stored = load_run(folder)
    ok = [r for r in stored.results if r.ok]
    assert len(ok) == 8 and all(not r.ok for r in stored.results if r.case.model == "sdpa-efficient")
    traced = [r.extra["trace"] for r in ok]
    assert len(set(traced)) == len(ok)  # one file per case, none overwritten
    for result in ok:
        path = folder / str(result.extra["trace"])
        assert path.parent == folder / "traces"
        trace = json.loads(path.read_text())
        names = {e.get("name", "") for e in trace["traceEvents"]}
        # The profiler saw this case's model run, not an empty window: the LSTM's kernel or SDPA's flash op.
        expected = "aten::lstm" if result.case.model == "lstm" else "aten::_scaled_dot_product_flash_attention"
        assert any(n.startswith(expected) for n in names), sorted(n for n in names if n.startswith("aten::"))[:40]
        if result.case.mode == "train":
            assert any("Backward" in n or "backward" in n for n in names)
    # run.json lists exactly the rows' traces; failed rows have none.
    assert sorted(stored.run.traces) == sorted(str(t) for t in traced)
    assert all("trace" not in r.extra for r in stored.results if not r.ok)
    assert f"({len(ok)} Chrome traces" in output


def test_a_profiled_sweep_still_times_every_case_with_the_stopping_rule(profiled: tuple[Path, str]) -> None:
    folder, _ = profiled
    for result in load_run(folder).results:
        if result.ok:
            assert result.measurement is not None and result.measurement.stop_reason != "run_once"
            assert len(result.measurement.samples_s) >= 5


@pytest.mark.slow
def test_workers_in_their_own_processes_write_their_traces_into_the_run(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config(models=["sdpa-flash"], grid={"batch": [1], "seq_len": [16]}, threads=1))
    out = tmp_path / "out"
    result = runner.invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots", "--isolate", "--profile"])
    assert result.exit_code == 0, result.output
    (folder,) = out.iterdir()
    (row,) = load_run(folder).results
    assert row.ok and json.loads((folder / str(row.extra["trace"])).read_text())["traceEvents"]


@pytest.mark.slow
def test_run_once_times_a_single_call_after_the_warm_up(tmp_path: Path) -> None:
    folder, _ = sweep(tmp_path, "--run-once")
    ok = [r for r in load_run(folder).results if r.ok]
    assert len(ok) == 8
    for result in ok:
        m = result.measurement
        assert m is not None
        assert (len(m.samples_s), m.calls_per_sample, m.stop_reason, m.converged) == (1, 1, "run_once", False)
        assert m.warmup_calls >= 3 and RUN_ONCE in m.warnings


@pytest.mark.slow
def test_nvtx_on_a_cpu_is_a_one_line_note_and_changes_nothing(tmp_path: Path) -> None:
    folder, output = sweep(tmp_path, "--nvtx")
    notes = [line for line in output.splitlines() if "--nvtx" in line]
    assert len(notes) == 1 and "does nothing on cpu" in notes[0], output
    assert all("nvtx" not in r.extra and "nvtx_error" not in r.extra for r in load_run(folder).results)


def test_trace_names_are_safe_readable_and_distinct() -> None:
    plain = tiny_case("sdpa-flash", seq_len=32)
    windowed = tiny_case("sdpa-flash", seq_len=32, window=8)
    assert trace_name(plain) != trace_name(windowed)
    assert trace_name(plain).startswith("sdpa-flash-forward-float32-b2-n32-")
    assert trace_name(plain) == trace_name(tiny_case("sdpa-flash", seq_len=32))  # stable: a resume finds it
    assert set(trace_name(windowed)) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


@pytest.mark.slow
def test_a_linked_traces_folder_is_refused_before_anything_is_measured(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    out = tmp_path / "out"
    first = runner.invoke(app, ["sweep", str(config), "--out", str(out), "--no-plots", "--run-once"])
    assert first.exit_code == 0, first.output
    (folder,) = out.iterdir()
    (folder / "traces").symlink_to(elsewhere)
    again = runner.invoke(app, ["sweep", "--resume", str(folder), "--retry-failed", "--profile"])
    assert again.exit_code != 0 and "traces" in again.output and "symbolic link" in again.output, again.output
    assert not os.listdir(elsewhere)


@pytest.mark.slow
def test_a_failing_trace_costs_the_row_its_trace_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.timing import torch_executor
    from attnbench.timing.torch_executor import TorchExecutor

    def broken(*_: object) -> Path:
        raise RuntimeError("kineto is busy")

    monkeypatch.setattr(torch_executor, "write_trace", broken)
    # A budget a loaded machine's cold first call fits in: the row must end ok for its trace to be the question.
    policy = TimingPolicy(min_samples=3, min_time_s=0.0, max_case_s=5.0, warmup_max_s=0.05, process_warmup_s=0)
    executor = TorchExecutor(ExecutorSettings("cpu", policy, telemetry="off", trace_dir=str(tmp_path)))
    try:
        result = executor.run(tiny_case("lstm"))
    finally:
        executor.close()
    assert result.ok, (result.status, result.error)
    assert "kineto is busy" in str(result.extra["trace_error"]) and "trace" not in result.extra


def test_a_trace_is_bounded_by_the_kernels_a_call_launches_where_they_were_counted() -> None:
    from attnbench.timing.profiling import TRACE_MAX_KERNELS, trace_refusal

    assert trace_refusal(0.001, TRACE_MAX_KERNELS) is None
    assert trace_refusal(0.001, TRACE_MAX_KERNELS + 1) is not None  # a fast step loop launching 10⁵ kernels
    assert trace_refusal(4.0, 100, gpu=True) is None  # few kernels: a long call makes a small trace
    assert trace_refusal(6.0, 100, gpu=True) is not None  # but two calls of it are made
    assert trace_refusal(1.0, None, gpu=True) is not None  # a GPU call whose kernels went uncounted
    assert trace_refusal(1.0, None) is None and trace_refusal(6.0, None) is not None  # a CPU: time alone


def test_a_trace_records_the_call_after_a_warm_up_one(tmp_path: Path) -> None:
    """A fresh CUPTI's first call pays its set-up: the trace is of the second."""
    calls = iter(range(2))

    def step() -> None:
        with torch.profiler.record_function(f"attnbench-call-{next(calls)}"):
            torch.ones(4).sum()

    path = profiling.write_trace(step, torch.device("cpu"), tmp_path, "t.json")
    names = {e.get("name", "") for e in json.loads(path.read_text())["traceEvents"]}
    assert "attnbench-call-1" in names and "attnbench-call-0" not in names
    assert [p.name for p in tmp_path.iterdir()] == ["t.json"]  # no temporary left beside it


def test_nvtx_is_checked_once_per_process_not_per_case(monkeypatch: pytest.MonkeyPatch) -> None:
    pushed: list[str] = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", pushed.append)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: None)
    profiling.nvtx_problem.cache_clear()
    try:
        wraps = [profiling.nvtx_range(f"case-{i}") for i in range(3)]
        assert len(pushed) == 1  # the check, once
        wraps[2](lambda: None)()
        assert pushed[1:] == ["case-2"]
    finally:
        profiling.nvtx_problem.cache_clear()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nvtx_ranges_wrap_the_timed_calls_on_a_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.timing.torch_executor import TorchExecutor

    pushed: list[str] = []
    real_push: Callable[[str], object] = torch.cuda.nvtx.range_push

    def spy(name: str) -> object:
        pushed.append(name)
        return real_push(name)

    monkeypatch.setattr(torch.cuda.nvtx, "range_push", spy)
    policy = TimingPolicy(min_samples=5, min_time_s=0.05, max_case_s=1.0, warmup_max_s=0.1)
    settings = ExecutorSettings("cuda", policy, telemetry="off", nvtx=True, trace_dir=str(tmp_path))
    executor = TorchExecutor(settings)
    case = tiny_case("sdpa", device="cuda", dtype="float16", d_model=64)
    try:
        result = executor.run(case)
    finally:
        executor.close()
    assert result.ok and result.extra["nvtx"] is True, (result.reason, result.extra)
    m = result.measurement
    assert m is not None
    timed_calls = len(m.samples_s) * m.calls_per_sample
    # One range per timed call (the check is once per process, not by case); none for the warm-up's calls.
    assert pushed.count(case.key) == timed_calls
    trace = json.loads((tmp_path / trace_name(case)).read_text())
    assert any(e.get("cat") == "kernel" for e in trace["traceEvents"])  # CUDA activity in the trace too
    assert isinstance(result.extra["kernels_per_call"], int) and "trace_skipped" not in result.extra
    assert profiling.TRACES == "traces"
