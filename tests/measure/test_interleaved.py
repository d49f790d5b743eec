"""``sweeps.interleaved`` (``attnbench ab``'s session) with fake sides: the order of the blocks, the warm-up round,
a case that fails on one side, and the two run folders it writes. The real workers are ``tests/e2e/test_ab.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from attnbench.analysis.thresholds import Thresholds
from attnbench.cli.ab import judge
from attnbench.core.cases import Case, TimingPolicy
from attnbench.host.inventory import collect_environment
from attnbench.results.records import Result
from attnbench.results.store import load_run
from attnbench.sweeps.interleaved import (
    ROLES,
    AbRequest,
    SideExecutor,
    block_policy,
    plan_ab,
    run_session,
    write_runs,
)
from tests.fakes import FakeExecutor
from tests.support import tiny_config


class Side(FakeExecutor):
    """A fake side that also logs, in one list shared by both sides, which side ran which case when."""

    def __init__(self, role: str, log: list[tuple[str, str]], **options: Any) -> None:
        super().__init__(**options)
        self.role = role
        self.log = log
        self.environment = collect_environment("cpu").to_dict()
        self.code = None

    def run(self, case: Case) -> Result:
        self.log.append((self.role, case.key))
        return super().run(case)


def _plan(tmp: Path, rounds: int = 6) -> Any:
    config = tmp / "tiny.yaml"
    config.write_text(tiny_config("ab-fake", models=["lstm", "sdpa-flash"], grid={"batch": [1], "seq_len": [8]}))
    return plan_ab(AbRequest(config, tmp / "ab", Path("/bin/sh"), Path("/bin/sh"), rounds=rounds))


def _sides(log: list[tuple[str, str]], **head: Any) -> dict[Any, SideExecutor]:
    return cast("dict[Any, SideExecutor]", {"base": Side("base", log), "head": Side("head", log, **head)})


def test_blocks_are_adjacent_and_the_side_that_goes_first_alternates(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    log: list[tuple[str, str]] = []
    session = run_session(plan, _sides(log))
    keys = [case.key for case in plan.cases]
    assert len(log) == 2 * len(keys) * (plan.request.rounds + 1)  # the warm-up round, then the judged ones
    pairs = [log[i : i + 2] for i in range(0, len(log), 2)]
    for n, ((first, key_a), (second, key_b)) in enumerate(pairs):
        round_, index = divmod(n, len(keys))
        assert key_a == key_b == keys[index]  # one case's two blocks are neighbours
        assert (first, second) == (ROLES if (round_ + index) % 2 == 0 else ROLES[::-1])
    for role in ROLES:
        assert all(len(session.blocks[role][key].rows) == plan.request.rounds for key in keys)


def test_a_slower_head_is_slower_and_both_runs_are_written(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    session = run_session(plan, _sides([], slowdown=1.3))
    judged = judge(session, Thresholds())
    assert [c.answer for c in judged.cases] == ["slower", "slower"] and judged.exit_code == 1
    assert all(c.ratio == pytest.approx(1.3) and len(c.ratios) == 6 for c in judged.cases)
    folders = write_runs(session)
    assert folders["base"].parent == tmp_path / "ab" / "base" and folders["base"].name.endswith("-base")
    assert folders["head"].name.endswith("-head") and folders["base"].name != folders["head"].name
    for role in ROLES:
        stored = load_run(folders[role])
        assert stored.run.label == role and stored.run.state == "complete"
        assert stored.run.timing == plan.settings.timing
        assert [r.case.key for r in stored.results] == [c.key for c in plan.cases]
        for row in stored.results:
            assert row.extra["ab_blocks"] == 6 and row.extra["ab_side"] == role and "replicates" not in row.extra
            # One process timed every block: no between-process medians for compare to take as processes.
            assert row.measurement is not None and row.measurement.replicate_medians_s == ()


def test_a_case_that_fails_on_one_side_is_not_run_again_and_judged_by_status(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    log: list[tuple[str, str]] = []
    session = run_session(plan, _sides(log, outcomes={"model=lstm": "error"}))
    lstm = next(c.key for c in plan.cases if c.model == "lstm")
    assert sum(key == lstm for _, key in log) == 2  # the warm-up round's two blocks (base first), then no more
    judged = {c.key: c for c in judge(session, Thresholds()).cases}
    assert judged[lstm].answer == "slower" and judged[lstm].head_status == "error"
    folders = write_runs(session)
    rows = {role: {r.case.key: r for r in load_run(folders[role]).results} for role in ROLES}
    assert rows["head"][lstm].status == "error"
    assert rows["base"][lstm].ok and rows["base"][lstm].extra["ab_blocks"] == 1  # its warm-up block: all it had


def test_the_block_policy_samples_briefly_without_a_ci_target() -> None:
    config = TimingPolicy(processes=3)
    policy = block_policy(config, 0.1)
    assert policy.min_time_s == 0.1 and policy.target_ci == 1.0 and policy.warmup_audit == 0
    assert policy.processes == 1 and policy.max_case_s == config.max_case_s
