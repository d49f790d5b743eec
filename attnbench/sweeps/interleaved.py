"""``attnbench ab``: the same cases timed alternately in two Python environments, in one session.

Two runs taken minutes apart on a shared 2-core runner cannot tell a 25 % slowdown from the machine: the machine
reads a case 0.93× or 1.25× its median for seconds at a time (issue 50). Here both sides share those seconds. Each
side is one long-lived isolated worker (``isolated_executor``'s, started by that environment's interpreter through
``side_worker``); the session runs ``rounds`` rounds, and in each round every case gets one short block on each
side, back to back, the side that goes first alternating (by round and by case). Round 0 warms both sides up and is
not judged. ``analysis.paired`` judges each case on its per-round ratios head / base.

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
# Each side's block in a round: short, so the two blocks of a round are neighbours in time; long against a call.
DEFAULT_BLOCK_S = 0.1
MIN_BLOCK_S, MAX_BLOCK_S = 0.01, 60.0
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


def block_policy(timing: TimingPolicy, block_s: float) -> TimingPolicy:
    """One block: about ``block_s`` of samples (at least five), no CI target to chase (the rounds' spread is the
    interval), one warm-up call after the model is built (the process is warm), no audit; the config's budget per
    case, cache state and process warm-up stand."""
    return replace(
        timing,
        target_ci=1.0,
        min_samples=5,
        min_time_s=block_s,
        warmup_min_calls=1,
        warmup_max_s=block_s,
        warmup_audit=0,
        processes=1,
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

    @property
    def cases(self) -> tuple[Case, ...]:
        return self.sweep.cases


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
    sweep = plan_sweep(SweepRequest(config=request.config, device=None, out=request.out, overrides=request.overrides))
    if not sweep.cases:
        raise AttnbenchError("the config has no cases to time", hint="check its models, modes and grid")
    settings = sweep.settings
    settings = replace(settings, timing=block_policy(settings.timing, request.block_s))
    return AbPlan(request, sweep, settings, pythons)


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
    failed: Result | None = None
    warmup: Result | None = None  # the warm-up round's block: the row of a side whose case then failed on the other


@dataclass(frozen=True)
class Session:
    """What a session measured: per side, per case key, its blocks in round order (the warm-up round left out)."""

    plan: AbPlan
    blocks: dict[Role, dict[str, CaseBlocks]]
    environments: dict[Role, dict[str, Any]]
    codes: dict[Role, CodeIdentity | None]

    def paired(self, key: str) -> tuple[list[float], list[float]]:
        """The rounds in which both sides timed the case: their block medians, base and head, in round order."""
        base, head = self.blocks["base"][key].rows, self.blocks["head"][key].rows
        pairs = [(b.measurement, h.measurement) for b, h in zip(base, head, strict=False)]
        kept = [(b.median_s, h.median_s) for b, h in pairs if b is not None and h is not None]
        return [b for b, _ in kept], [h for _, h in kept]


Listener = Callable[[int, int], None]  # (round, rounds): a round begins (0: the warm-up round)


def start_sides(plan: AbPlan) -> dict[Role, SideExecutor]:
    """Both workers started (base first), each having told its environment. Raises ``AttnbenchError`` (exit 2)
    when a side cannot start: the interpreter lacks attnbench, or its environment refuses (a bad
    ``ATTNBENCH_INJECT_SLOWDOWN``)."""
    sides: dict[Role, SideExecutor] = {}
    try:
        for role, python in zip(ROLES, plan.pythons, strict=True):
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


def run_session(plan: AbPlan, sides: dict[Role, SideExecutor], on_round: Listener | None = None) -> Session:
    """Round 0 (warm-up, not judged) then ``rounds`` rounds; in each, every case still running gets one block on
    each side, adjacent, the first side alternating. A case that fails on either side is not run again: the
    failed row stands for that side. The caller closes the sides (also on Ctrl-C)."""
    rounds = plan.request.rounds
    blocks: dict[Role, dict[str, CaseBlocks]] = {role: {c.key: CaseBlocks() for c in plan.cases} for role in ROLES}
    for round_ in range(rounds + 1):
        if on_round is not None:
            on_round(round_, rounds)
        for index, case in enumerate(plan.cases):
            if any(blocks[role][case.key].failed is not None for role in ROLES):
                continue
            order = ROLES if (round_ + index) % 2 == 0 else ROLES[::-1]
            for role in order:
                result = sides[role].run(case)
                held = blocks[role][case.key]
                if not result.ok or result.measurement is None:
                    held.failed = result
                    break
                if round_ > 0:
                    held.rows.append(result)
                else:
                    held.warmup = result
    environments = {role: sides[role].environment for role in ROLES}
    return Session(plan, blocks, environments, {role: sides[role].code for role in ROLES})


def side_row(role: Role, held: CaseBlocks) -> Result | None:
    """The row a side stores for a case: its failed block, else its judged blocks pooled (as replicates are
    pooled, but the block medians are not kept as between-process evidence: one process timed them all), else (the
    other side failed in the warm-up round) its warm-up block."""
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
        extra={**extra, "ab_blocks": len(blocks), "ab_side": role},
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
