"""Rounds over cases (``timing.rounds``, issue 51 item 2): every case visited R times in round order, a round's
share of the budget a visit, the blocks merged into one row, a failed block settling its case, and an interrupted
rounds run resumed from the blocks it kept. The executors are the fake (``tests.fakes``) or a spy of made-up rows:
the order and the merge are the point, not torch."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.config.experiment import load_experiment
from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.errors import AttnbenchError
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result
from attnbench.results.store import ROUNDS_FILE, load_blocks, load_run
from attnbench.sweeps.estimate import case_guess_s, estimate_sweep
from attnbench.sweeps.events import QuietListener
from attnbench.sweeps.rounds import MIN_BLOCK_SAMPLES, block_policy, run_rounds
from attnbench.sweeps.runner import SweepRequest, open_sweep, plan_sweep
from attnbench.timing.executor import Executor, ExecutorSettings
from attnbench.timing.profiling import trace_name
from tests.fakes import FakeExecutors
from tests.support import numbers, tiny_config

runner = CliRunner()
TIMING = {"min_samples": 9, "max_samples": 300, "min_time_s": 0.03, "max_case_s": 0.6, "warmup_max_s": 0.5}
CASES = [Case(m, "forward", "float32", "cpu", 1, 8, 16, None, 1, True) for m in ("lstm", "gru", "mingru")]


def _config(tmp_path: Path, **timing: object) -> Path:
    path = tmp_path / "rounds.yaml"
    path.write_text(tiny_config(name="rounds", timing={**TIMING, **timing}))
    return path


class Spy:
    """An executor of made-up ok rows whose median moves with every visit (the rounds of a busy machine); a case
    named in ``fail`` fails at that visit."""

    def __init__(self, fail: dict[str, tuple[int, str]] | None = None) -> None:
        self.ran: list[str] = []
        self.fail = fail or {}

    def run(self, case: Case) -> Result:
        self.ran.append(case.model)
        visit = self.ran.count(case.model)
        failing = self.fail.get(case.model)
        if failing is not None and failing[0] == visit:
            return Result(case, "oom", "out of memory")  # type: ignore[arg-type]
        median = 1e-3 * (1 + 0.1 * len(self.ran))
        samples = (median * 0.99, median, median * 1.01, median)
        m = Measurement(samples, 1, 3, 0.01, True, "converged", 0.01)
        return Result(case, "ok", measurement=m, duration_s=0.5, extra={"flops": 1})

    def close(self, *, now: bool = False) -> None:
        pass


def test_the_block_policy_is_a_rounds_share_of_the_budget() -> None:
    policy = TimingPolicy(min_samples=10, max_samples=1000, min_time_s=0.3, max_case_s=9.0, warmup_max_s=2.0)
    assert block_policy(policy) is policy  # rounds 1: today's policy, untouched
    block = block_policy(TimingPolicy(**{**policy.to_dict(), "rounds": 3}))
    assert (block.max_case_s, block.min_time_s) == pytest.approx((3.0, 0.1))
    assert (block.min_samples, block.max_samples, block.rounds) == (4, 334, 1)  # ceil(10 / 3), ceil(1000 / 3)
    assert block.warmup_max_s == 2.0  # every round builds the case again: a whole warm-up, within the share
    tight = block_policy(TimingPolicy(min_samples=3, max_case_s=1.0, warmup_max_s=2.0, rounds=4))
    assert tight.min_samples == MIN_BLOCK_SAMPLES and tight.warmup_max_s == pytest.approx(0.25)


def test_rounds_visit_the_cases_in_round_order_and_merge_each_cases_blocks() -> None:
    spy, rows, rounds_seen, blocks = Spy(), [], [], []
    run_rounds(
        CASES,
        3,
        spy.run,
        lambda i, r: rows.append(r),
        on_round=lambda n, of: rounds_seen.append((n, of)),
        on_block=lambda i, b: blocks.append(b.case.model),
    )
    assert spy.ran == ["lstm", "gru", "mingru"] * 3
    assert rounds_seen == [(1, 3), (2, 3), (3, 3)]
    assert blocks == ["lstm", "gru", "mingru"] * 2  # every block but a case's last is handed on to be kept
    assert [r.case.model for r in rows] == ["lstm", "gru", "mingru"]  # each row as its last round ends
    for offset, row in enumerate(rows):
        m = row.measurement
        assert row.ok and m is not None and row.extra["rounds"] == 3
        assert len(m.samples_s) == 12  # the three blocks' samples pooled
        # One median a round: visits 1+offset, 4+offset, 7+offset of the spy's rising medians.
        assert m.replicate_medians_s == pytest.approx([1e-3 * (1 + 0.1 * (v + offset)) for v in (1, 4, 7)])
        assert m.summary.ci_halfwidth_rel > m.within.ci_halfwidth_rel  # the rounds' spread widens the CI
        assert row.duration_s == pytest.approx(1.5)


def test_a_failed_block_settles_its_case_and_the_others_go_on() -> None:
    spy, rows = Spy({"gru": (2, "oom")}), []
    run_rounds(CASES, 3, spy.run, lambda i, r: rows.append(r))
    assert spy.ran == ["lstm", "gru", "mingru", "lstm", "gru", "mingru", "lstm", "mingru"]  # no round 3 for gru
    by_model = {r.case.model: r for r in rows}
    assert [r.case.model for r in rows] == ["gru", "lstm", "mingru"]  # gru's row the moment it failed
    gru = by_model["gru"]
    assert gru.status == "oom" and gru.measurement is None and numbers(gru.reason)[:2] == [2, 3]  # round 2 of 3
    assert by_model["lstm"].extra["rounds"] == 3 and by_model["mingru"].ok


def test_kept_blocks_are_merged_and_only_the_missing_rounds_run() -> None:
    earlier = Spy()
    kept = {CASES[0].key: [earlier.run(CASES[0]), earlier.run(CASES[0])], CASES[1].key: [earlier.run(CASES[1])]}
    spy, rows = Spy(), []
    run_rounds(CASES, 3, spy.run, lambda i, r: rows.append(r), done=kept)
    assert spy.ran == ["mingru", "gru", "mingru", "lstm", "gru", "mingru"]  # each case only the rounds it lacks
    m = rows[0].measurement
    assert rows[0].case.model == "lstm" and m is not None and len(m.replicate_medians_s) == 3


def _sweep(config: Path, out: Path, fake: Executor | FakeExecutors, **request: object) -> Path:
    with open_sweep(SweepRequest(config, "cpu", out, isolate=False, **request), executor=fake) as sweep:  # type: ignore[arg-type]
        sweep.run(QuietListener())
        return sweep.folder


def test_a_sweep_with_rounds_3_shares_each_budget_and_stores_three_medians_a_row(tmp_path: Path) -> None:
    fake = FakeExecutors()
    folder = _sweep(_config(tmp_path, rounds=3), tmp_path / "out", fake)
    keys = [c.key for c in fake.built[0].ran]
    assert len(keys) == 12 and keys[:4] == keys[4:8] == keys[8:]  # A B C D, A B C D, A B C D
    timing = fake.built[0].settings.timing
    assert timing.max_case_s == pytest.approx(0.2) and timing.min_samples == 3  # a round's share of 0.6 s and 9
    stored = load_run(folder)
    assert stored.run.state == "complete" and stored.run.timing.rounds == 3
    for row in stored.results:
        assert row.extra["rounds"] == 3 and row.measurement is not None
        assert len(row.measurement.replicate_medians_s) == 3
    assert len(load_blocks(folder)[0]) == 4  # rounds 1 and 2 of each case were kept beside the rows


def test_rounds_1_is_todays_sweep_and_todays_config(tmp_path: Path) -> None:
    plain, once = _config(tmp_path), tmp_path / "once.yaml"
    once.write_text(tiny_config(name="rounds", timing={**TIMING, "rounds": 1}))
    a, b = load_experiment(plain), load_experiment(once)
    assert a.sha256 == b.sha256 and "rounds" not in a.resolved["timing"] and "rounds" not in a.timing.to_dict()
    three = tmp_path / "three.yaml"
    three.write_text(tiny_config(name="rounds", timing={**TIMING, "rounds": 3}))
    assert load_experiment(three).sha256 != a.sha256 and load_experiment(three).resolved["timing"]["rounds"] == 3
    fake = FakeExecutors()
    folder = _sweep(once, tmp_path / "out", fake)
    assert fake.built[0].settings.timing == a.timing  # the executor gets the config's budget whole
    assert len(fake.built[0].ran) == 4 and not (folder / ROUNDS_FILE).exists()
    assert "rounds" not in json.loads((folder / "run.json").read_text())["timing"]
    assert all("rounds" not in r.extra for r in load_run(folder).results)


class _StopAt:
    """The fake executors, but the ``at``-th case run anywhere raises the CLI's KeyboardInterrupt, or (``status``)
    comes back as that failure."""

    def __init__(self, at: int, status: str = "") -> None:
        self.fake, self.at, self.status, self.count = FakeExecutors(), at, status, 0

    def __call__(self, settings: ExecutorSettings, *, isolate: bool) -> Executor:
        inner = self.fake(settings, isolate=isolate)
        outer = self

        class Counting:
            def run(self, case: Case) -> Result:
                outer.count += 1
                if outer.count == outer.at and not outer.status:
                    raise KeyboardInterrupt
                result = inner.run(case)
                if outer.count == outer.at:
                    return Result(case, outer.status, "the worker was killed")  # type: ignore[arg-type]
                return result

            def close(self, *, now: bool = False) -> None:
                inner.close(now=now)

        return Counting()


def test_an_interrupted_rounds_run_resumes_from_the_blocks_it_kept(tmp_path: Path) -> None:
    config, out = _config(tmp_path, rounds=3), tmp_path / "out"
    stopping = _StopAt(7)  # round 2's third case: rounds 1 and 2 of two cases are done, none is a row yet
    with pytest.raises(KeyboardInterrupt):
        _sweep(config, out, stopping)
    (folder,) = out.iterdir()
    stored = load_run(folder)
    assert stored.run.state == "interrupted" and stored.results == ()
    assert sorted(len(b) for b in load_blocks(folder)[0].values()) == [1, 1, 2, 2]
    fake = FakeExecutors()
    with open_sweep(SweepRequest(None, None, out, resume=folder, isolate=False), executor=fake) as sweep:
        sweep.run(QuietListener())
    ran = [c.key for c in fake.ran]
    first = [c.key for c in stopping.fake.ran]
    assert ran == first[2:4] + first[:4]  # round 2 of the two left, then round 3 of all four
    stored = load_run(folder)
    assert stored.run.state == "complete" and len(stored.results) == 4
    assert all(r.extra["rounds"] == 3 and len(r.measurement.replicate_medians_s) == 3 for r in stored.results)  # type: ignore[union-attr]


def test_a_retried_case_starts_its_rounds_afresh(tmp_path: Path) -> None:
    config, out = _config(tmp_path, rounds=2), tmp_path / "out"
    failing = _StopAt(6, "crashed")  # round 2's second case crashes; its round 1 block is in rounds.jsonl
    folder = _sweep(config, out, failing)
    crashed = failing.fake.ran[5].key
    assert {r.case.key: r.status for r in load_run(folder).results}[crashed] == "crashed"
    assert crashed in load_blocks(folder)[0]
    fake = FakeExecutors()
    with open_sweep(SweepRequest(None, None, out, resume=folder, retry_failed=True), executor=fake) as sweep:
        sweep.run(QuietListener())
    assert [c.key for c in fake.ran] == [crashed, crashed]  # both rounds again: the old block is not its evidence
    row = next(r for r in load_run(folder).results if r.case.key == crashed)
    assert row.ok and row.extra["rounds"] == 2


def test_a_retried_case_interrupted_again_takes_only_its_fresh_rounds(tmp_path: Path) -> None:
    # The reviewer's case: the crashed case's pre-retry round-1 block must not stand in for a fresh round.
    config, out = _config(tmp_path, rounds=3), tmp_path / "out"
    failing = _StopAt(6, "crashed")  # round 2's second case crashes; its round-1 block is in rounds.jsonl
    folder = _sweep(config, out, failing)
    crashed = failing.fake.ran[5].key
    with pytest.raises(KeyboardInterrupt):  # --retry-failed, interrupted after the case's fresh round 1
        _resume(folder, out, _StopAt(2), retry_failed=True)
    assert len(load_blocks(folder)[0][crashed]) == 1  # the fresh block alone: the old one went at the resume
    fake = FakeExecutors()
    _resume(folder, out, fake)
    assert [c.key for c in fake.ran].count(crashed) == 2  # rounds 2 and 3 of its fresh start
    row = next(r for r in load_run(folder).results if r.case.key == crashed)
    assert row.ok and row.extra["rounds"] == 3


def _resume(folder: Path, out: Path, fake: Executor | FakeExecutors | _StopAt, **request: object) -> None:
    with open_sweep(SweepRequest(None, None, out, resume=folder, isolate=False, **request), executor=fake) as sweep:  # type: ignore[arg-type]
        sweep.run(QuietListener())


def _interrupted(tmp_path: Path) -> tuple[Path, Path, list[Case]]:
    """A rounds-3 run of four cases stopped in round 2's third case: rounds 1 and 2 of two cases kept, round 1 of
    two; the folder, --out and the cases in the order they ran."""
    config, out = _config(tmp_path, rounds=3), tmp_path / "out"
    stopping = _StopAt(7)
    with pytest.raises(KeyboardInterrupt):
        _sweep(config, out, stopping)
    (folder,) = out.iterdir()
    return folder, out, stopping.fake.ran


def test_a_block_after_a_torn_last_line_starts_a_line_of_its_own(tmp_path: Path) -> None:
    folder, out, first = _interrupted(tmp_path)
    with (folder / ROUNDS_FILE).open("a", encoding="utf-8") as torn:  # kill -9 in the middle of a block
        torn.write('{"case": {"model": "ls')
    with pytest.raises(KeyboardInterrupt):  # the resume keeps round 2 of the third case, then is stopped
        _resume(folder, out, _StopAt(2))
    blocks, warnings = load_blocks(folder)
    assert warnings == [] and len(blocks[first[2].key]) == 2  # the block read back, not glued onto the torn line
    assert sorted(len(b) for b in blocks.values()) == [1, 2, 2, 2]


def test_a_resumed_rows_telemetry_comes_with_its_kept_first_round(tmp_path: Path) -> None:
    folder, out, _ = _interrupted(tmp_path)
    _resume(folder, out, FakeExecutors())
    rows = load_run(folder).results
    entries = [json.loads(line) for line in (folder / "telemetry.jsonl").read_text().splitlines()]
    blocks = load_blocks(folder)[0]
    assert len(rows) == 4 and len(entries) == 4  # every row's samples, those of a round measured before the resume too
    for row in rows:
        (entry,) = [e for e in entries if (e["key"], e["started_utc"]) == (row.case.key, row.started_utc)]
        first = blocks[row.case.key][0]  # round 1, kept in rounds.jsonl by the interrupted run
        assert row.extra["telemetry_from"] == "round 1" and first.telemetry is not None
        assert entry["samples"] == [dict(s) for s in first.telemetry.raw] and entry["samples"]


class _Tracing:
    """The fake executors, writing a trace as --profile does where the settings name a trace folder: each write
    counted by file, the row naming its file."""

    def __init__(self) -> None:
        self.fake, self.writes = FakeExecutors(), Counter[str]()

    def __call__(self, settings: ExecutorSettings, *, isolate: bool) -> Executor:
        inner, outer = self.fake(settings, isolate=isolate), self

        class Traced:
            def run(self, case: Case) -> Result:
                result = inner.run(case)
                if settings.trace_dir is None or not result.ok:
                    return result
                name = trace_name(case)
                (Path(settings.trace_dir) / name).write_text(f"visit {outer.fake.ran.count(case)}")
                outer.writes[name] += 1
                return replace(result, extra={**result.extra, "trace": f"traces/{name}"})

            def close(self, *, now: bool = False) -> None:
                inner.close(now=now)

        return Traced()


def test_a_profiled_sweep_in_rounds_traces_round_1_alone_and_its_row_names_that_trace(tmp_path: Path) -> None:
    tracing = _Tracing()
    folder = _sweep(_config(tmp_path, rounds=3), tmp_path / "out", tracing, profile=True)
    assert [e.settings.trace_dir is not None for e in tracing.fake.built] == [True, False]  # round 1, rounds 2-3
    assert [len(e.ran) for e in tracing.fake.built] == [4, 8]
    rows = load_run(folder).results
    assert len(rows) == 4 and set(tracing.writes.values()) == {1}  # one trace a case, never overwritten
    for row in rows:
        trace = folder / str(row.extra["trace"])
        assert trace.read_text() == "visit 1"  # the file the row names is its round 1's, as are its extras


def test_rounds_with_processes_is_one_error_line_at_validate(tmp_path: Path) -> None:
    config = _config(tmp_path, rounds=2, processes=2)
    result = runner.invoke(app, ["validate", str(config)])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "timing.rounds" in errors[0] and "hint:" in result.output
    too_many = _config(tmp_path, rounds=51)
    assert runner.invoke(app, ["validate", str(too_many)]).exit_code == 2


def test_rounds_with_devices_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    request = SweepRequest(_config(tmp_path, rounds=2), None, tmp_path / "out", devices="cpu,cpu", dry_run=True)
    with pytest.raises(AttnbenchError) as caught:
        plan_sweep(request)
    assert "timing.rounds" in caught.value.message and not (tmp_path / "out").exists()


def test_the_dry_run_estimate_counts_a_warm_up_a_round(tmp_path: Path) -> None:
    once = plan_sweep(SweepRequest(_config(tmp_path, max_case_s=9), "cpu", tmp_path / "out", dry_run=True))
    thrice = plan_sweep(SweepRequest(_config(tmp_path, max_case_s=9, rounds=3), "cpu", tmp_path / "out", dry_run=True))
    block = block_policy(thrice.experiment.timing)
    assert thrice.estimate.likely_s == pytest.approx(sum(3 * case_guess_s(c, block) for c in thrice.todo))
    assert thrice.estimate.likely_s > once.estimate.likely_s  # the warm-ups repeat
    assert thrice.estimate.most_s == pytest.approx(once.estimate.most_s)  # R shares of max_case_s: the same bound
    same = estimate_sweep(thrice.todo, TimingPolicy(rounds=1), out=tmp_path, name="x", device="cpu")
    assert same.likely_s == pytest.approx(sum(case_guess_s(c, TimingPolicy()) for c in thrice.todo))
    result = runner.invoke(app, ["sweep", str(_config(tmp_path, rounds=3)), "--dry-run", "--out", str(tmp_path)])
    assert result.exit_code == 0 and "3 rounds" in result.output


@pytest.fixture
def slow_config(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "e2e.yaml"
    data = yaml.safe_load(tiny_config(name="e2e", timing={**TIMING, "rounds": 2}))
    data["models"], data["grid"], data["telemetry"] = ["lstm", "mingru"], {"batch": [1], "seq_len": [8]}, "off"
    path.write_text(yaml.safe_dump(data))
    yield path


@pytest.mark.slow
def test_attnbench_sweep_with_rounds_2_writes_merged_rows(slow_config: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "attnbench", "sweep", str(slow_config), "--no-isolate", "--out", str(out), "--no-plots"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "round 2 of 2" in done.stdout
    (folder,) = out.iterdir()
    rows = load_run(folder).results
    assert len(rows) == 2 and all(r.ok and r.extra["rounds"] == 2 for r in rows)
    assert all(len(r.measurement.replicate_medians_s) == 2 for r in rows)  # type: ignore[union-attr]


def test_a_block_line_that_does_not_read_is_dropped_with_a_warning_and_the_others_kept(tmp_path: Path) -> None:
    spy = Spy()
    good = [json.dumps(spy.run(case).to_dict()) for case in CASES[:2]]
    (tmp_path / ROUNDS_FILE).write_text(f"{good[0]}\n{{not json\n{good[1]}\n{good[1][:40]}", encoding="utf-8")
    blocks, warnings = load_blocks(tmp_path)
    assert sorted(blocks) == sorted(c.key for c in CASES[:2]) and len(warnings) == 2  # line 2, and the torn line 4
    assert f"{ROUNDS_FILE}:2:" in warnings[0] and f"{ROUNDS_FILE}:4:" in warnings[1]  # each names its line
    assert load_blocks(tmp_path / "nothing-here") == ({}, [])


@pytest.mark.parametrize("target", ["/dev/zero", "results.jsonl", "no-such-file"])
def test_a_rounds_file_that_is_a_link_is_refused_before_anything_is_written(tmp_path: Path, target: str) -> None:
    """A hostile run folder: rounds.jsonl a link (to a device, to another log, dangling) is refused as every file a
    sweep writes is, so a resume can neither read a device nor append through the link."""
    from attnbench.core.errors import ResultsError
    from attnbench.results.store import refuse_special_files

    (tmp_path / ROUNDS_FILE).symlink_to(target)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(ResultsError):
        refuse_special_files(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
