"""``attnbench ab``: the same cases timed alternately in two Python environments, in one session.

Two runs taken minutes apart on a shared 2-core runner cannot tell a 25 % slowdown from the machine: the machine
reads a case 0.93× or 1.25× its median for seconds at a time (issue 50). Here both sides share those seconds. Each
side is one long-lived isolated worker (``isolated_executor``'s, started by that environment's interpreter through
``side_worker``); the session runs ``rounds`` rounds, and in each round every case gets one short block on each
side, back to back, the side that goes first alternating (by round and by case).

Every ``pair_rounds`` rounds both workers are replaced by fresh processes (started one after the other, the side
that starts first alternating by pair), so that a lasting difference between two processes (memory layout, thread
placement) is drawn anew for each pair rather than kept by one side the whole session. Each worker pair begins with
a warm-up round that is not judged. ``analysis.paired`` judges each case on its per-round ratios head / base,
grouped by worker pair.

Both sides' rows are then written as ordinary run folders, ``OUT/base/<run>`` and ``OUT/head/<run>`` (one row per
case: the side's blocks pooled, ``extra.ab_blocks`` of them; a case that failed on a side keeps that side's failed
row), each with the environment its own worker collected, so ``compare``, ``history`` and ``publish`` read them.
The folders are made only once every round is done: an interrupted session leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import IO, Any, Literal

from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.errors import AttnbenchError
from attnbench.results.environment import CodeIdentity, Environment
from attnbench.results.files import utc_now
from attnbench.results.lock import RunLock
from attnbench.results.records import Result, Run
from attnbench.results.store import RunWriter
from attnbench.sweeps.isolated_executor import _START_TIMEOUT_S, IsolatedExecutor, WorkerStartError
from attnbench.sweeps.replicated_executor import merge_replicates
from attnbench.sweeps.runner import SweepPlan, SweepRequest, _cached_calibration, _new_run_folder, plan_sweep
from attnbench.sweeps.side_worker import settings_to_dict
from attnbench.timing.executor import ExecutorSettings

Role = Literal["base", "head"]
ROLES: tuple[Role, ...] = ("base", "head")

DEFAULT_ROUNDS = 12  # judged rounds: a 95 % sign-test interval of the median then spans ranks 3-10 of 12
MIN_ROUNDS, MAX_ROUNDS = 6, 1000  # below 6 no 95 % interval of a median exists
MIN_PAIRS = 3  # ``analysis.paired``'s (sweeps do not import analysis): below it, no usable interval over pairs
# Each side's block in a round: short, so the two blocks of a round are neighbours in time; long against a call.
DEFAULT_BLOCK_S = 0.1
MIN_BLOCK_S, MAX_BLOCK_S = 0.01, 60.0
# Judged rounds per worker pair (then both workers are replaced): the interval rests on the pairs, so more pairs of
# fewer rounds narrow it most (Student's t at 5 degrees of freedom is 2.57, at 3 it is 3.18). Simulated at the
# 2-core VM's spread (rounds ±8-15 %, workers' offsets 3-5 %), 12 rounds in 6 pairs caught a 25 % slowdown in 78-100 %
# of sessions where 4 pairs of 3 caught 40-92 %, and called no more A/A sessions slower; each pair costs two
# interpreter starts and a warm-up round.
DEFAULT_PAIR_ROUNDS = 2
_STDERR_TAIL = 400  # characters of a side's stderr quoted when its worker cannot start


@dataclass(frozen=True)
class AbRequest:
    """What ``attnbench ab`` was asked: the config, the two interpreters, the rounds and where the runs go."""

    config: Path | None
    out: Path
    base_python: Path
    head_python: Path
    overrides: tuple[str, ...] = ()
    rounds: int = DEFAULT_ROUNDS
    block_s: float = DEFAULT_BLOCK_S
    pair_rounds: int | None = None  # None: DEFAULT_PAIR_ROUNDS (any MIN_ROUNDS rounds or more make 3 pairs)


def block_policy(timing: TimingPolicy, block_s: float) -> TimingPolicy:
    """One block: about ``block_s`` of samples (at least five), no CI target to chase (the rounds' spread is the
    interval), one warm-up call after the model is built (the process is warm), no audit, one process and one
    round (ab's own rounds are the interleaving); the config's budget per case, cache state and process warm-up
    stand."""
    return replace(
        timing,
        target_ci=1.0,
        min_samples=5,
        min_time_s=block_s,
        warmup_min_calls=1,
        warmup_max_s=block_s,
        warmup_audit=0,
        processes=1,
        rounds=1,  # ab interleaves in rounds of its own (--rounds); the config's timing.rounds is a sweep's
    )


def check_python(path: Path, flag: str) -> Path:
    """``path`` as an interpreter to run: an executable regular file (a link to one is fine, as a venv's is)."""
    if not path.is_file():
        what = "does not exist" if not path.exists() else "is not a file"
        raise AttnbenchError(f"{flag} {path}: {what}", hint="give a Python interpreter, e.g. .venv-base/bin/python")
    if not os.access(path, os.X_OK):
        raise AttnbenchError(f"{flag} {path}: not executable", hint="chmod +x it, or give the interpreter itself")
    return path


@dataclass(frozen=True)
class AbPlan:
    """Everything checked, nothing started: the sweep plan of the config, the block policy and the interpreters."""

    request: AbRequest
    sweep: SweepPlan
    settings: ExecutorSettings  # the blocks' settings, both sides
    pythons: tuple[Path, Path]  # base, head
    pair_rounds: int  # judged rounds per worker pair; equal to the rounds for one pair the whole session

    @property
    def cases(self) -> tuple[Case, ...]:
        return self.sweep.cases

    @property
    def worker_pairs(self) -> int:
        return -(-self.request.rounds // self.pair_rounds)


def resolve_pair_rounds(rounds: int, pair_rounds: int | None) -> int:
    """Judged rounds per worker pair: ``pair_rounds`` (0: one pair for the whole session), by default
    ``DEFAULT_PAIR_ROUNDS`` or fewer, so that the rounds make at least ``MIN_PAIRS`` pairs. Raises
    ``AttnbenchError`` for a count that would leave 2 pairs (no usable interval) or is out of range."""
    if pair_rounds is None:
        return min(DEFAULT_PAIR_ROUNDS, rounds // MIN_PAIRS)
    if pair_rounds == 0:
        return rounds
    pairs = -(-rounds // pair_rounds) if pair_rounds > 0 else 0
    if pair_rounds < 0 or 1 < pairs < MIN_PAIRS:
        raise AttnbenchError(
            f"--pair-rounds {pair_rounds}: {rounds} rounds would make {pairs} worker pairs",
            hint=f"0 (one pair for the whole session), or at most {rounds // MIN_PAIRS} so that the {rounds} rounds "
            f"make at least {MIN_PAIRS} pairs, the fewest an interval over pairs needs",
        )
    return min(pair_rounds, rounds)


def plan_ab(request: AbRequest) -> AbPlan:
    """Read and check the config, the flags and both interpreters; raises ``AttnbenchError``; writes nothing."""
    if not MIN_ROUNDS <= request.rounds <= MAX_ROUNDS:
        raise AttnbenchError(
            f"--rounds {request.rounds}: out of range",
            hint=f"{MIN_ROUNDS} to {MAX_ROUNDS}: below {MIN_ROUNDS} rounds no 95 % interval of a median exists",
        )
    if not MIN_BLOCK_S <= request.block_s <= MAX_BLOCK_S:
        raise AttnbenchError(
            f"--block {request.block_s:g}: out of range", hint=f"{MIN_BLOCK_S:g} to {MAX_BLOCK_S:g} seconds"
        )
    pythons = (
        check_python(request.base_python, "--base-python"),
        check_python(request.head_python, "--head-python"),
    )
    pair_rounds = resolve_pair_rounds(request.rounds, request.pair_rounds)
    sweep = plan_sweep(SweepRequest(config=request.config, device=None, out=request.out, overrides=request.overrides))
    if not sweep.cases:
        raise AttnbenchError("the config has no cases to time", hint="check its models, modes and grid")
    settings = sweep.settings
    settings = replace(settings, timing=block_policy(settings.timing, request.block_s))
    return AbPlan(request, sweep, settings, pythons, pair_rounds)


class _Subprocess:
    """A ``subprocess.Popen`` as ``IsolatedExecutor`` sees a worker process (``isolated_executor.WorkerProcess``)."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen

    @property
    def pid(self) -> int | None:
        return self.popen.pid

    @property
    def exitcode(self) -> int | None:
        return self.popen.poll()

    def is_alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.popen.kill()

    def join(self, timeout: float | None = None) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout)


class SideExecutor(IsolatedExecutor):
    """An ``IsolatedExecutor`` whose worker is started by another interpreter (``side_worker``); the rest —
    timeouts, a worker that dies, rows read back — is the isolated executor's own. ``environment`` and ``code``
    are what the latest worker collected in its environment."""

    def __init__(self, settings: ExecutorSettings, python: Path, role: Role) -> None:
        super().__init__(settings)
        self.python = python
        self.role = role
        self.environment: dict[str, Any] = {}
        self.code: CodeIdentity | None = None
        self._stderr: IO[bytes] | None = None

    def _failed(self, popen: subprocess.Popen[bytes], why: str) -> WorkerStartError:
        with contextlib.suppress(ProcessLookupError):
            popen.kill()
        popen.wait(5)
        told = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            lines = self._stderr.read().decode("utf-8", "replace").strip().splitlines()
            told = f" (its last words: {lines[-1][-_STDERR_TAIL:]})" if lines else ""
        return WorkerStartError(f"the {self.role} side's worker ({self.python}) {why}{told}", device=True)

    def _spawn(self) -> tuple[_Subprocess, Connection]:
        ours, theirs = socket.socketpair()
        conn = Connection(ours.detach())
        if self._stderr is not None:
            self._stderr.close()
        # Its warnings would garble our output; kept to quote when it cannot start.
        self._stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed with the executor)
        with theirs:
            fd = theirs.fileno()
            popen = subprocess.Popen(
                [str(self.python), "-m", "attnbench.cli.side_worker", str(fd)],
                pass_fds=(fd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=self._stderr,
            )
        try:
            conn.send(settings_to_dict(self.settings))
            if not conn.poll(_START_TIMEOUT_S):
                raise self._failed(popen, f"did not answer within {_START_TIMEOUT_S:.0f} s")
            message = conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            popen.wait(5)
            raise self._failed(popen, f"exited while starting (exit code {popen.returncode})") from None
        if message[0] == "failed":
            raise self._failed(popen, f"could not start: {message[1]}")
        _, environment, code = message
        self.environment = dict(environment)
        self.code = None if code is None else CodeIdentity.from_dict(code)
        return _Subprocess(popen), conn

    def close(self, *, now: bool = False) -> None:
        super().close(now=now)
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


@dataclass
class CaseBlocks:
    """One case's blocks on one side: each judged round's row (None where the case was no longer run)."""

    rows: list[Result] = field(default_factory=list)
    pairs: list[int] = field(default_factory=list)  # the worker pair (0, 1, …) that timed each of ``rows``
    failed: Result | None = None
    warmup: Result | None = None  # the warm-up round's block: the row of a side whose case then failed on the other


@dataclass(frozen=True)
class Session:
    """What a session measured: per side, per case key, its blocks in round order (the warm-up round left out)."""

    plan: AbPlan
    blocks: dict[Role, dict[str, CaseBlocks]]
    environments: dict[Role, dict[str, Any]]
    codes: dict[Role, CodeIdentity | None]

    def paired(self, key: str) -> tuple[list[float], list[float], list[int]]:
        """The rounds in which both sides timed the case: their block medians, base and head, and the worker pair
        that timed them, in round order."""
        base, head = self.blocks["base"][key], self.blocks["head"][key]
        rounds = zip(base.rows, head.rows, base.pairs, strict=False)
        kept = [(b.measurement, h.measurement, p) for b, h, p in rounds]
        both = [(b.median_s, h.median_s, p) for b, h, p in kept if b is not None and h is not None]
        return [b for b, _, _ in both], [h for _, h, _ in both], [p for _, _, p in both]


# (round, rounds, pair): a round begins (round 0: the warm-up round of worker pair ``pair``, counted from 0).
Listener = Callable[[int, int, int], None]


def start_sides(plan: AbPlan, pair: int = 0) -> dict[Role, SideExecutor]:
    """Both workers started, one after the other (base first for even ``pair``, head first for odd: neither side
    always gets the freshly freed memory), each having told its environment. Raises ``AttnbenchError`` (exit 2)
    when a side cannot start: the interpreter lacks attnbench, or its environment refuses (a bad
    ``ATTNBENCH_INJECT_SLOWDOWN``)."""
    sides: dict[Role, SideExecutor] = {}
    order = list(zip(ROLES, plan.pythons, strict=True))
    try:
        for role, python in order if pair % 2 == 0 else order[::-1]:
            side = sides[role] = SideExecutor(plan.settings, python, role)
            side.start()
    except WorkerStartError as exc:
        for side in sides.values():
            side.close(now=True)
        flag = f"--{role}-python"
        raise AttnbenchError(
            f"{flag}: {exc}",
            hint=f"{flag} must be a Python with this attnbench (or a later one) installed: "
            f"{python} -m pip install attnbench (or -e your checkout)",
        ) from None
    return sides


Starter = Callable[[AbPlan, int], dict[Role, SideExecutor]]  # (plan, pair): a fresh pair of workers, started


def run_session(
    plan: AbPlan, sides: dict[Role, SideExecutor], on_round: Listener | None = None, start: Starter = start_sides
) -> Session:
    """``rounds`` judged rounds, ``pair_rounds`` per worker pair, each pair's preceded by a warm-up round that is
    not judged; in each round every case still running gets one block on each side, adjacent, the first side
    alternating (by round, warm-ups counted, and by case). ``sides`` is the first pair, started; before each later
    pair the current workers are closed (so they do not share the CPUs with the new ones) and ``start`` makes the
    next, which ``sides`` then holds. A case that fails on either side is not run again: the failed row stands for
    that side. The caller closes ``sides`` (also on Ctrl-C)."""
    rounds = plan.request.rounds
    blocks: dict[Role, dict[str, CaseBlocks]] = {role: {c.key: CaseBlocks() for c in plan.cases} for role in ROLES}
    judged = step = 0
    for pair in range(plan.worker_pairs):
        if pair > 0:
            close_sides(sides, now=False)
            sides.clear()
            sides.update(start(plan, pair))
        count = min(plan.pair_rounds, rounds - judged)
        for round_ in [0, *range(judged + 1, judged + count + 1)]:
            if on_round is not None:
                on_round(round_, rounds, pair)
            _run_round(plan, sides, blocks, pair if round_ else None, step)
            step += 1
        judged += count
    environments = {role: sides[role].environment for role in ROLES}
    return Session(plan, blocks, environments, {role: sides[role].code for role in ROLES})


def _run_round(
    plan: AbPlan,
    sides: dict[Role, SideExecutor],
    blocks: dict[Role, dict[str, CaseBlocks]],
    pair: int | None,
    step: int,
) -> None:
    """One round: a block a side for every case still running; ``pair`` None for a warm-up round."""
    for index, case in enumerate(plan.cases):
        if any(blocks[role][case.key].failed is not None for role in ROLES):
            continue
        for role in ROLES if (step + index) % 2 == 0 else ROLES[::-1]:
            result = sides[role].run(case)
            held = blocks[role][case.key]
            if not result.ok or result.measurement is None:
                held.failed = result
                break
            if pair is None:
                held.warmup = held.warmup or result  # the first warm-up block: all a side keeps if the other fails
            else:
                held.rows.append(result)
                held.pairs.append(pair)


def side_row(role: Role, held: CaseBlocks) -> Result | None:
    """The row a side stores for a case: its failed block, else its judged blocks pooled (as replicates are
    pooled, but the block medians are not kept as between-process evidence: several blocks of one process each,
    which ``compare`` would read as one process a block), else (the other side failed in the first warm-up round)
    its warm-up block. ``extra.ab_workers``: how many worker processes timed the blocks."""
    if held.failed is not None:
        return held.failed
    blocks = held.rows or ([held.warmup] if held.warmup is not None else [])
    if not blocks:
        return None
    merged = merge_replicates(blocks)
    assert merged.measurement is not None
    extra = {k: v for k, v in merged.extra.items() if k not in ("replicates", "telemetry_from")}
    return replace(
        merged,
        measurement=replace(merged.measurement, replicate_medians_s=()),
        extra={**extra, "ab_blocks": len(blocks), "ab_side": role, "ab_workers": len(set(held.pairs)) or 1},
    )


def write_runs(session: Session) -> dict[Role, Path]:
    """Each side's run folder under ``OUT/<role>/``, complete, with its rows in the config's order."""
    plan = session.plan
    experiment = plan.sweep.experiment
    folders: dict[Role, Path] = {}
    for role in ROLES:
        environment = session.environments[role]
        calibration, _ = _cached_calibration(Environment.from_dict(environment))
        folder = _new_run_folder(plan.request.out / role, experiment, plan.sweep.device, f"-{role}")
        lock = RunLock(folder).acquire()
        try:
            run = Run(
                run_id=folder.name,
                created_utc=utc_now(),
                config_source=experiment.source,
                config=experiment.resolved,
                config_sha256=experiment.sha256,
                timing=plan.settings.timing,
                environment=environment,
                command=tuple(sys.argv),
                calibration=calibration,
                code=session.codes[role],
                label=role,
                contended_cases=0,
            )
            writer = RunWriter(folder, run)
            for case in plan.cases:
                row = side_row(role, session.blocks[role][case.key])
                if row is not None:
                    writer.append(row)
            writer.close("complete", utc_now())
        finally:
            lock.release()
        folders[role] = folder
    return folders


def close_sides(sides: Sequence[SideExecutor] | dict[Role, SideExecutor], *, now: bool) -> None:
    for side in sides.values() if isinstance(sides, dict) else sides:
        side.close(now=now)
