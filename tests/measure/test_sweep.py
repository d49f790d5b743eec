"""The library's sweep: plan, open, run, all without a console. Only the CLI prints.

One real sweep of tiny models; the rest run on the fake executor (``tests.fakes``), through the same seam.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnbench.core.cases import Case
from attnbench.core.errors import AttnbenchError
from attnbench.results.records import Result
from attnbench.results.store import load_run
from attnbench.sweeps.runner import SweepRequest, open_sweep, plan_sweep
from tests.fakes import FakeExecutors
from tests.support import ROOT, numbers, tiny_config


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []

    def started(self, index: int, case: Case) -> None:
        self.events.append(("started", case.key))

    def measured(self, index: int, result: Result) -> None:
        self.events.append(("measured", result.case.key))

    def finished(self, index: int, result: Result) -> None:
        self.events.append(("finished", result.case.key))

    def warning(self, text: str) -> None:
        self.events.append(("warning", text))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(tiny_config(timing={"min_samples": 3, "min_time_s": 0.005, "max_case_s": 0.1}))
    return path


@pytest.mark.slow
def test_the_library_sweep_writes_every_row_and_prints_nothing(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    recorder = Recorder()
    request = SweepRequest(config, "cpu", tmp_path / "out", isolate=False)
    with open_sweep(request) as sweep:
        rows = sweep.run(recorder)
        folder = sweep.folder
    assert capsys.readouterr() == ("", "")  # nothing on stdout or stderr: progress went to the listener
    stored = load_run(folder)
    assert stored.run.state == "complete"
    assert [r.case.key for r in stored.results] == [r.case.key for r in rows] and len(rows) == 4
    assert [kind for kind, _ in recorder.events] == ["started", "measured", "finished"] * 4
    assert [key for kind, key in recorder.events if kind == "finished"] == [r.case.key for r in rows]


@pytest.mark.slow
def test_an_interrupt_closes_the_folder_as_interrupted_and_keeps_the_rows(config: Path, tmp_path: Path) -> None:
    class StopAfterTwo(Recorder):
        def finished(self, index: int, result: Result) -> None:
            super().finished(index, result)
            if index == 1:
                raise KeyboardInterrupt  # what the CLI's signal handler raises

    fake = FakeExecutors()
    with open_sweep(SweepRequest(config, "cpu", tmp_path / "out", isolate=False), executor=fake) as sweep:
        with pytest.raises(KeyboardInterrupt):
            sweep.run(StopAfterTwo())
        folder = sweep.folder
    stored = load_run(folder)
    assert stored.run.state == "interrupted" and len(stored.results) == 2
    assert len(fake.ran) == 2 and fake.built[0].closed == [True]  # stopped at once: a case may have been running


def test_ctrl_c_inside_a_case_keeps_the_rows_before_it_and_never_stores_the_case(config: Path, tmp_path: Path) -> None:
    fake = FakeExecutors({"model=sdpa-flash|seq_len=8": "interrupt"})  # the third case of four
    recorder = Recorder()
    with open_sweep(SweepRequest(config, "cpu", tmp_path / "out", isolate=False), executor=fake) as sweep:
        with pytest.raises(KeyboardInterrupt):
            sweep.run(recorder)
        folder = sweep.folder
    stored = load_run(folder)
    assert stored.run.state == "interrupted"
    assert [r.case.key for r in stored.results] == [c.key for c in fake.ran[:2]]
    assert [kind for kind, _ in recorder.events] == ["started", "measured", "finished"] * 2 + ["started"]


def test_every_failure_is_a_row_and_the_run_still_completes(config: Path, tmp_path: Path) -> None:
    path = tmp_path / "more.yaml"
    models = ["lstm", "gru", "vanilla", "sdpa-flash", "sdpa-math", "mingru", "sdpa"]
    path.write_text(tiny_config(models=models, grid={"batch": [1], "seq_len": [8]}))
    failures = ["oom", "unsupported", "error", "timeout", "crashed", "too_slow_for_budget"]
    fake = FakeExecutors(dict(zip([f"model={m}" for m in models[1:]], failures, strict=True)))  # type: ignore[arg-type]
    with open_sweep(SweepRequest(path, "cpu", tmp_path / "out", isolate=False), executor=fake) as sweep:
        rows = sweep.run(Recorder())
        folder = sweep.folder
    stored = load_run(folder)
    assert stored.run.state == "complete" and [r.case.key for r in stored.results] == [r.case.key for r in rows]
    assert [r.status for r in stored.results] == ["ok", *failures]
    assert all(r.reason for r in stored.results[1:]) and stored.results[0].reason == ""
    slow = stored.results[-1]
    assert slow.measurement is not None and slow.measurement.stop_reason == "too_slow_for_budget"
    assert fake.built[0].closed == [False]  # every case ended: closed politely


def test_after_an_oom_the_longer_lengths_are_rows_without_running(tmp_path: Path) -> None:
    path = tmp_path / "oom.yaml"
    path.write_text(tiny_config(models=["vanilla", "lstm"], grid={"batch": [1], "seq_len": [8, 16, 32, 64]}))
    fake = FakeExecutors({"model=vanilla|seq_len=16": "oom"})
    with open_sweep(SweepRequest(path, "cpu", tmp_path / "out", isolate=False), executor=fake) as sweep:
        rows = sweep.run(Recorder())
    by_key = {(r.case.model, r.case.seq_len): r for r in rows}
    assert [by_key["vanilla", n].status for n in (8, 16, 32, 64)] == ["ok", "oom", "oom", "oom"]
    assert by_key["vanilla", 32].status == "oom" and numbers(by_key["vanilla", 32].reason) == [16]  # after n=16
    assert {(c.model, c.seq_len) for c in fake.ran} == {("vanilla", 8), ("vanilla", 16)} | {
        ("lstm", n) for n in (8, 16, 32, 64)
    }


def test_a_refusal_is_raised_before_any_folder_exists(config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    request = SweepRequest(config, "cpu", out, overrides=("timing.processes=2",), isolate=False)
    with pytest.raises(AttnbenchError, match="--no-isolate"):
        plan_sweep(request)
    with pytest.raises(AttnbenchError), open_sweep(request):
        pass
    assert not out.exists()


def test_the_plan_lists_what_a_dry_run_shows(config: Path, tmp_path: Path) -> None:
    plan = plan_sweep(SweepRequest(config, "cpu", tmp_path / "out"))
    assert len(plan.cases) == len(plan.todo) == 4 and plan.stored is None
    assert plan.settings.device == "cpu" and plan.settings.timing.max_case_s == 0.1


def test_a_dry_run_plan_tells_the_device_without_torch_and_budgets_the_time(config: Path, tmp_path: Path) -> None:
    plan = plan_sweep(SweepRequest(None, None, tmp_path / "out", dry_run=True))
    assert plan.device in ("cpu", "cuda:0") and plan.device_basis  # how "auto" was told, said
    timing = plan.experiment.timing
    assert plan.estimate.most_s == pytest.approx(len(plan.todo) * timing.max_case_s)
    replicated = plan_sweep(SweepRequest(config, None, tmp_path / "out", ("timing.processes=3",), dry_run=True))
    assert replicated.device == "cpu" and replicated.device_basis == ""  # the config says cpu: nothing to tell
    assert replicated.estimate.most_s == pytest.approx(4 * 3 * 0.1)
    # A GPU config planned where CUDA does not look available: the cases are listed, with a warning.
    gpu = plan_sweep(SweepRequest(config, "cuda", tmp_path / "out", dry_run=True))
    assert gpu.device == "cuda:0" and all(case.device == "cuda:0" for case in gpu.todo)
    if not gpu.warnings:
        pytest.skip("CUDA looks available here")
    assert "'cuda'" in gpu.warnings[0]


SERVING_RUN = ROOT / "results" / "20261204-235950-serving-cpu-cpu"  # the lab's serving-cpu sweep: 540 s of cases


def test_a_dry_run_estimates_the_likely_time_not_every_case_at_its_budget(tmp_path: Path) -> None:
    """serving-cpu's 20 s budget is for its capacity steps: its dry run said 58 min for a sweep of 9 (issue 51)."""
    config = ROOT / "configs" / "serving-cpu.yaml"
    measured = sum(r.duration_s or 0.0 for r in load_run(SERVING_RUN).results)
    fresh = plan_sweep(SweepRequest(config, None, tmp_path / "fresh", dry_run=True)).estimate
    assert fresh.most_s == pytest.approx(175 * 20.0) and fresh.earlier_run is None
    assert measured / 2 < fresh.likely_s < 2 * measured < fresh.most_s / 2
    # With an earlier run of the same config in --out, each case is counted as long as it took there.
    out = tmp_path / "runs"
    shutil.copytree(SERVING_RUN, out / SERVING_RUN.name)
    known = plan_sweep(SweepRequest(config, None, out, dry_run=True)).estimate
    assert known.earlier_run == SERVING_RUN.name and known.known == 175
    assert known.likely_s == pytest.approx(measured)
