"""``sweeps.interleaved`` (``attnbench ab``'s session) with fake sides: the order of the blocks, the warm-up round,
a case that fails on one side, and the two run folders it writes. The real workers are ``tests/e2e/test_ab.py``'s."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from attnbench.analysis import paired
from attnbench.analysis.thresholds import Thresholds
from attnbench.cli.ab import judge
from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.errors import AttnbenchError
from attnbench.host.inventory import collect_environment
from attnbench.results.records import Result
from attnbench.results.store import load_run
from attnbench.sweeps import interleaved
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


class Starter:
    """Makes each worker pair after the first as ``start_sides`` does, with fake sides; logs the start order."""

    def __init__(self, log: list[tuple[str, str]], **head: Any) -> None:
        self.log, self.head = log, head
        self.made: list[dict[Any, SideExecutor]] = []

    def __call__(self, plan: Any, pair: int) -> dict[Any, SideExecutor]:
        order = ROLES if pair % 2 == 0 else ROLES[::-1]
        self.log += [(role, "start") for role in order]
        self.made.append(_sides(self.log, **self.head))
        return self.made[-1]


def _sides(log: list[tuple[str, str]], **head: Any) -> dict[Any, SideExecutor]:
    return cast("dict[Any, SideExecutor]", {"base": Side("base", log), "head": Side("head", log, **head)})


def _session(plan: Any, log: list[tuple[str, str]], **head: Any) -> Any:
    return run_session(plan, _sides(log, **head), start=Starter(log, **head))


def test_blocks_are_adjacent_and_the_side_that_goes_first_alternates(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    log: list[tuple[str, str]] = []
    session = _session(plan, log)
    keys = [case.key for case in plan.cases]
    blocks = [entry for entry in log if entry[1] != "start"]
    # 6 rounds, 2 per worker pair: 3 pairs, each a warm-up round, then its judged ones.
    assert plan.pair_rounds == 2 and plan.worker_pairs == 3
    assert len(blocks) == 2 * len(keys) * (plan.request.rounds + 3)
    pairs = [blocks[i : i + 2] for i in range(0, len(blocks), 2)]
    for n, ((first, key_a), (second, key_b)) in enumerate(pairs):
        round_, index = divmod(n, len(keys))
        assert key_a == key_b == keys[index]  # one case's two blocks are neighbours
        assert (first, second) == (ROLES if (round_ + index) % 2 == 0 else ROLES[::-1])
    for role in ROLES:
        assert all(len(session.blocks[role][key].rows) == plan.request.rounds for key in keys)
        assert all(session.blocks[role][key].pairs == [0, 0, 1, 1, 2, 2] for key in keys)


def test_every_few_rounds_both_workers_are_replaced_started_in_alternating_order(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config("ab-fake", models=["lstm"], grid={"batch": [1], "seq_len": [8]}))
    plan = plan_ab(AbRequest(config, tmp_path / "ab", Path("/bin/sh"), Path("/bin/sh"), rounds=10, pair_rounds=3))
    assert plan.worker_pairs == 4  # 3 + 3 + 3 + 1
    log: list[tuple[str, str]] = []
    first = _sides(log)
    starter = Starter(log)
    session = run_session(plan, dict(first), start=starter)
    assert [role for role, what in log if what == "start"] == ["head", "base", "base", "head", "head", "base"]
    # Each pair's workers timed a warm-up block and its judged blocks, then were closed politely before the next.
    pairs = [first, *starter.made]
    assert [len(cast("Side", p["base"]).ran) for p in pairs] == [4, 4, 4, 2]
    assert all(cast("Side", p[role]).closed == [False] for p in pairs[:-1] for role in ROLES)
    assert session.paired(plan.cases[0].key)[2] == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3]
    judged = judge(session, Thresholds())
    assert [len(c.pair_ratios) for c in judged.cases] == [4]
    folders = write_runs(session)
    assert load_run(folders["head"]).results[0].extra["ab_workers"] == 4


def test_pair_rounds_that_leave_too_few_worker_pairs_are_refused(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config("ab-fake", models=["lstm"], grid={"batch": [1], "seq_len": [8]}))

    def plan(rounds: int, pair_rounds: int | None) -> Any:
        return plan_ab(
            AbRequest(config, tmp_path, Path("/bin/sh"), Path("/bin/sh"), rounds=rounds, pair_rounds=pair_rounds)
        )

    assert interleaved.MIN_PAIRS == paired.MIN_PAIRS and interleaved.MIN_ROUNDS == paired.MIN_ROUNDS
    assert plan(12, None).pair_rounds == 2 and plan(6, None).worker_pairs == 3  # at least 3 pairs by default
    assert plan(12, 0).worker_pairs == 1 and plan(12, 12).worker_pairs == 1  # one pair for the whole session
    for bad in (6, 7, -1):  # 2 pairs of 12 rounds: no usable interval
        with pytest.raises(AttnbenchError):
            plan(12, bad)


def test_a_slower_head_is_slower_and_both_runs_are_written(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    session = _session(plan, [], slowdown=1.3)
    judged = judge(session, Thresholds())
    assert [c.answer for c in judged.cases] == ["slower", "slower"] and judged.exit_code == 1
    assert all(c.ratio == pytest.approx(1.3) and len(c.ratios) == 6 and len(c.pair_ratios) == 3 for c in judged.cases)
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
    session = _session(plan, log, outcomes={"model=lstm": "error"})
    lstm = next(c.key for c in plan.cases if c.model == "lstm")
    assert sum(key == lstm for _, key in log) == 2  # the first warm-up round's two blocks (base first), no more
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
    # A config's sweep rounds are not ab's: ab interleaves its blocks in --rounds of its own.
    assert block_policy(TimingPolicy(rounds=3), 0.1).rounds == 1
