"""The scheduler side of ``attnbench submit``: a submission's shards as one job array through submitit, re-attached
from submission.json by any later process, and waited for in a loop of our own.

Why submitit and Slurm, not a scheduler of our own (ARCHITECTURE.md, "Beyond one machine"): benchmark work wants
exclusive devices, not tight packing; a Slurm job array is what research clusters already run, with queues, limits
and accounting; and long-lived workers (Ray, Dask) would undo the fresh-process replicates the timing relies on.

``executor``: ``slurm`` (``AutoExecutor(cluster="slurm")``: one ``sbatch --array``, a task per shard, each on its
own GPU through ``--gpus-per-node``), ``local`` (each task a process on this machine, all at once) or ``debug``
(each task in this process, one after another: what the tests drive end to end).

Waiting does not trust ``job.result()`` alone (/work/scratch/slurm/NOTES.md §5): a task that died leaves no result
file, and an array element cancelled while pending vanishes from both ``sacct`` and ``squeue``, so ``result()``
would wait forever. The loop here checks for the result file every few seconds, asks ``sacct`` now and then, and
calls a task that no result file, no ``sacct`` state and no ``squeue`` line account for ``lost``.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from attnbench.cluster.submission import Job, Submission, run_shard, write_submission
from attnbench.core.errors import AttnbenchError
from attnbench.core.shards import Shard
from attnbench.results.files import utc_now
from attnbench.sweeps.events import Progress

# Slurm states of a job that may still produce a result.
ACTIVE = frozenset(
    {"PENDING", "RUNNING", "REQUEUED", "CONFIGURING", "COMPLETING", "SUSPENDED", "RESIZING", "READY", "PREEMPTED"}
)
INSTALL_HINT = 'pip install "attnbench[slurm]" (or pip install submitit)'


def import_submitit() -> ModuleType:
    """submitit, an optional extra; its absence is an ``AttnbenchError`` saying how to install it."""
    try:
        import submitit
    except ImportError:
        raise AttnbenchError(
            "attnbench submit needs submitit, an optional extra that is not installed", hint=INSTALL_HINT
        ) from None
    return submitit


@dataclass
class Task:
    """One shard's job: its record and submitit's handle (None for a debug job seen from a later process)."""

    job: Job
    handle: Any
    started: float  # time.monotonic() when we began watching it

    @property
    def shard(self) -> int:
        return self.job.shard


@dataclass(frozen=True)
class TaskOutcome:
    """How a task ended: ``done`` (its sweep went through its cases), ``failed`` (the task raised, timed out or
    was killed) or ``lost`` (the scheduler forgot it)."""

    shard: int
    job_id: str
    status: str
    detail: str
    seconds: float


def _executor(submitit: ModuleType, submission: Submission) -> Any:
    folder = submission.jobs_folder / "%j"
    try:
        executor = submitit.AutoExecutor(folder=folder, cluster=submission.executor)
    except RuntimeError as exc:  # 'Could not detect "srun", are you indeed on a slurm cluster?'
        raise AttnbenchError(
            f"--executor {submission.executor}: {exc}",
            hint="run submit where Slurm's commands work (a login node), or --executor local on this machine",
        ) from None
    try:
        executor.update_parameters(**submission.parameters)
    except (NameError, AssertionError, ValueError) as exc:
        raise AttnbenchError(
            f"the scheduler refused a parameter: {exc}", hint="check --time, --mem-gb and --slurm-arg"
        ) from None
    return executor


def _first_lines(text: str, limit: int = 3) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip() and not set(line.strip()) <= {"-"}]
    return " | ".join(lines[:limit])


def submit_shards(submission: Submission, shards: Sequence[int]) -> tuple[Submission, list[Task]]:
    """Submit ``shards`` as one job array and record the jobs in submission.json at once. An ``sbatch`` that
    refuses (a bad partition, more GPUs than a node has) is an ``AttnbenchError`` with sbatch's words."""
    submitit = import_submitit()
    executor = _executor(submitit, submission)
    folder, device = str(submission.folder), submission.device
    specs = [str(Shard(i, submission.shards)) for i in shards]
    errors = (submitit.core.utils.FailedJobError, submitit.core.utils.FailedSubmissionError, OSError)
    try:
        jobs = executor.map_array(run_shard, [folder] * len(specs), specs, [device] * len(specs))
    except errors as exc:
        raise AttnbenchError(
            f"the {submission.executor} executor refused the job array: {_first_lines(str(exc), 2)}",
            hint="check --partition, --gpus-per-task, --time, --mem-gb and --slurm-arg against what the cluster "
            "offers (sinfo)",
        ) from None
    attempts = {job.shard: job.attempt for job in submission.jobs}
    now, started = utc_now(), time.monotonic()
    records = [Job(i, job.job_id, attempts.get(i, 0) + 1, now) for i, job in zip(shards, jobs, strict=True)]
    submission = submission.with_jobs(records)
    write_submission(submission)
    return submission, [Task(record, job, started) for record, job in zip(records, jobs, strict=True)]


def attach(submission: Submission, shards: Sequence[int]) -> list[Task]:
    """The latest job of each of ``shards``, re-attached from its id (a later process than the one that
    submitted). Debug jobs ran inside their submitter and leave nothing to attach to."""
    latest = submission.latest()
    records = [latest[i] for i in shards if i in latest]
    if submission.executor == "debug" or not records:
        return [Task(record, None, time.monotonic()) for record in records]
    submitit = import_submitit()
    folder = submission.jobs_folder / "%j"
    make = submitit.SlurmJob if submission.executor == "slurm" else submitit.local.local.LocalJob
    return [Task(record, make(folder=folder, job_id=record.job_id), time.monotonic()) for record in records]


def _pid_alive(job_id: str) -> bool:
    try:
        os.kill(int(job_id), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _squeue(job_id: str) -> str:
    """squeue's state of one array element, or "" when squeue does not know it (or cannot be asked)."""
    try:
        out = subprocess.run(
            ["squeue", "-h", "-r", "-j", job_id, "-o", "%T"], capture_output=True, text=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else ""


def scheduler_state(submission: Submission, task: Task, *, refresh: bool = False, squeue: bool | None = None) -> str:
    """The scheduler's word for a task: Slurm's state (sacct, asked now with ``refresh``; else squeue, when
    ``squeue``, which defaults to ``refresh``), RUNNING/FINISHED/GONE for a local process, "" for a debug job."""
    handle = task.handle
    if handle is None:
        return ""
    if handle.paths.result_pickle.exists() and submission.executor == "local":
        return "FINISHED"
    if submission.executor == "local":
        process = getattr(handle, "_process", None)
        if process is not None:
            return "RUNNING" if process.poll() is None else "FINISHED"
        return "RUNNING" if _pid_alive(task.job.job_id) else "GONE"
    state = str(handle.get_info(mode="force" if refresh else "standard").get("State", "") or "")
    if state.upper() == "UNKNOWN":
        state = ""
    if not state and (refresh if squeue is None else squeue):  # sacct may lag a new job, or never know one
        state = _squeue(task.job.job_id)
    return state


def active(state: str) -> bool:
    return state.split(" ")[0].upper() in ACTIVE or state == "RUNNING"


def _outcome(task: Task, error: BaseException | None, value: object = None) -> TaskOutcome:
    seconds = time.monotonic() - task.started
    if error is None:
        code = value.get("exit_code") if isinstance(value, dict) else None
        detail = "some cases ended error, timeout, crashed or incorrect (their rows say why)" if code == 1 else ""
        return TaskOutcome(task.shard, task.job.job_id, "done", detail, seconds)
    text = str(error)
    marker = "ShardFailed: "
    if marker in text:  # the task's own words, out of submitit's traceback
        text = text[text.index(marker) + len(marker) :]
    return TaskOutcome(task.shard, task.job.job_id, "failed", _first_lines(text, 4), seconds)


def _finish(task: Task) -> TaskOutcome:
    """Collect a finished task: ``exception()`` once (it runs a debug job, and never opens pdb as result() does)."""
    error = task.handle.exception()
    if error is not None:
        return _outcome(task, error)
    return _outcome(task, None, task.handle.result())


def wait(
    submission: Submission,
    tasks: Sequence[Task],
    progress: Progress | None = None,
    *,
    poll_s: float = 2.0,
    check_s: float = 30.0,
    lost_s: float = 60.0,
    sleep: Callable[[float], None] = time.sleep,
) -> list[TaskOutcome]:
    """Wait until every task ended, telling ``progress`` as each does; a task nothing accounts for any more for
    ``lost_s`` is ``lost``. KeyboardInterrupt stops the waiting, not the jobs."""
    say = progress or (lambda text: None)
    total = submission.shards
    outcomes: dict[int, TaskOutcome] = {}

    def record(outcome: TaskOutcome) -> None:
        outcomes[outcome.shard] = outcome
        what = {"done": "finished", "failed": "FAILED", "lost": "LOST"}[outcome.status]
        detail = f": {outcome.detail}" if outcome.detail else ""
        say(f"shard {outcome.shard}/{total} (job {outcome.job_id}): {what} after {outcome.seconds:.0f} s{detail}")

    watched = [t for t in tasks if t.handle is not None]
    for task in tasks:
        if task.handle is None:  # a debug job of an earlier process: it ran (or not) back then
            record(TaskOutcome(task.shard, task.job.job_id, "lost", "a debug job runs inside its submitter", 0.0))
    if submission.executor == "debug":
        for task in watched:
            say(f"shard {task.shard}/{total}: running in this process (debug executor)")
            record(_finish(task))
        return [outcomes[t.shard] for t in tasks]

    vanished: dict[int, float] = {}
    last_check = time.monotonic()
    while len(outcomes) < len(tasks):
        refresh = time.monotonic() - last_check >= check_s
        if refresh:
            last_check = time.monotonic()
        for task in watched:
            if task.shard in outcomes:
                continue
            if task.handle.paths.result_pickle.exists():
                record(_finish(task))
                continue
            state = scheduler_state(submission, task, refresh=refresh)
            if submission.executor == "local" and state in ("FINISHED", "GONE"):
                record(_finish(task))  # no result file: exception() says how it ended
            elif submission.executor == "slurm" and state and not active(state):
                record(_finish(task))  # FAILED, CANCELLED, TIMEOUT, OUT_OF_MEMORY, NODE_FAIL, COMPLETED late
            elif submission.executor == "slurm" and not state and refresh:
                since = vanished.setdefault(task.shard, time.monotonic())
                if time.monotonic() - since >= lost_s:
                    detail = "neither sacct nor squeue knows it any more (cancelled while pending?)"
                    record(TaskOutcome(task.shard, task.job.job_id, "lost", detail, time.monotonic() - task.started))
            elif state:
                vanished.pop(task.shard, None)
        if len(outcomes) < len(tasks):
            sleep(poll_s)
    return [outcomes[t.shard] for t in tasks]
