"""A submission folder: a sweep split into shards, each run as one task of a job array (``attnbench submit``).

```
<folder>/
  submission.json  what was submitted: executor, parameters, shard count, and a job per shard per attempt
  config.yaml      the resolved config, frozen at submission: every task sweeps exactly this (sha256 included)
  shards/          the shards' run folders (sweep --shard i/N --out <folder>/shards)
  jobs/<job id>/   submitit's pickles and each task's log
  merged/          the merged run (attnbench merge <folder>/shards -o <folder>/merged), unless -o says elsewhere
```

This module holds what needs no scheduler: planning a submission, its record on disk, the state of each shard
read from its run folder, and ``run_shard`` — the function every task runs. submitit pickles a task's function
by reference, so it lives here, importable by the task's interpreter, and it only starts
``python -m attnbench sweep`` (or ``--resume`` of the shard's folder, so a task that runs again continues where
the last attempt stopped). The scheduler side (submitit) is ``measure.jobarray``.

Schema history of submission.json (``SUBMISSION_VERSION``): 1 — first version.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from attnbench.config.experiment import Experiment, load_experiment, resolved_text
from attnbench.core.cases import Case
from attnbench.core.errors import AttnbenchError, ResultsError
from attnbench.core.shards import Shard, parse_shard, split
from attnbench.results import fields
from attnbench.results.files import read_bounded, utc_now, write_atomic
from attnbench.results.records import FAILED, Run
from attnbench.results.store import RUN_FILE, load_run

ExecutorKind = Literal["slurm", "local", "debug"]
EXECUTORS: tuple[ExecutorKind, ...] = ("slurm", "local", "debug")

SUBMISSION_FILE = "submission.json"
CONFIG_FILE = "config.yaml"
SHARDS = "shards"
JOBS = "jobs"
MERGED = "merged"
SUBMISSION_VERSION = 1

# submitit asks Slurm for SIGUSR2 this long before the time limit and then ends a task that cannot checkpoint: the
# sweep under it gets SIGTERM and saves what it finished. The limit must leave room for it.
SIGNAL_DELAY_S = 90
_SLURM_TIME = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")


# ------------------------------------------------------------------------------------------------- the request


@dataclass(frozen=True)
class SubmitRequest:
    """What ``attnbench submit CONFIG`` was asked for, before anything is read."""

    config: Path | None
    executor: ExecutorKind
    array: int = 1
    overrides: tuple[str, ...] = ()
    device: str | None = None
    partition: str | None = None
    gpus_per_task: int | None = None  # None: 1 on a CUDA device, 0 on the CPU
    time: str | None = None  # Slurm's forms: minutes, H:MM:SS, D-HH[:MM[:SS]]; None: estimated
    exclusive: bool = False
    cpus_per_task: int | None = None  # None: the config's threads, when it sets them
    mem_gb: float | None = None
    parallel: int | None = None  # at most this many tasks at once (sbatch --array=…%P)
    slurm_args: tuple[str, ...] = ()  # KEY=VALUE, passed to sbatch as --KEY=VALUE
    folder: Path | None = None
    force: bool = False


@dataclass(frozen=True)
class SubmitPlan:
    """A checked request: the frozen config, its shards, and the parameters the scheduler gets."""

    request: SubmitRequest
    experiment: Experiment
    device: str  # what each task sweeps on: "cpu" or "cuda" (its own GPU is its cuda:0)
    shards: tuple[tuple[Case, ...], ...]  # every shard's cases (some may be empty)
    parameters: Mapping[str, Any]  # submitit's update_parameters
    time_estimated: bool
    folder: Path
    warnings: tuple[str, ...] = ()

    @property
    def submitted(self) -> tuple[int, ...]:
        """The shards that hold cases: an empty one gets no task."""
        return tuple(i for i, cases in enumerate(self.shards) if cases)


def parse_time(text: str) -> int:
    """A Slurm time limit (``90``, ``1:30:00``, ``2-00``, ``2-12:00``) → whole minutes, at least one."""
    match = _SLURM_TIME.fullmatch(text.strip())
    if match is None:
        raise AttnbenchError(
            f"--time {text!r}: not a Slurm time limit", hint="minutes (90), H:MM:SS (1:30:00) or D-HH (2-00)"
        )
    days, first, second, third = (int(g) if g is not None else None for g in match.groups())
    assert first is not None
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        seconds = days * 86400 + first * 3600 + (second or 0) * 60 + (third or 0)
    elif third is not None:  # H:MM:SS
        seconds = first * 3600 + (second or 0) * 60 + third
    elif second is not None:  # MM:SS
        seconds = first * 60 + second
    else:
        seconds = first * 60
    if seconds <= SIGNAL_DELAY_S:
        raise AttnbenchError(
            f"--time {text}: the task would be stopped {SIGNAL_DELAY_S} s before its limit, before it could start",
            hint="give each task several minutes at least",
        )
    return math.ceil(seconds / 60)


def estimate_minutes(experiment: Experiment, cases: int) -> int:
    """A time limit for a shard of ``cases`` cases: each case's budget (warm-up and timing, per replicate) plus
    building, memory and telemetry passes, the worker's start, and submitit's margin; doubled for the unknown."""
    t = experiment.timing
    per_case = t.processes * (t.max_case_s + t.warmup_max_s + 10.0)
    seconds = 2 * (120 + cases * per_case) + SIGNAL_DELAY_S
    return max(10, math.ceil(seconds / 60))


def _task_device(request: SubmitRequest, experiment: Experiment) -> str:
    """A task's device: its own GPU is its cuda:0 (Slurm hides the others), so only the kind matters."""
    wanted = request.device or experiment.device
    if wanted == "auto":
        return "cuda" if (request.gpus_per_task or 0) > 0 else "cpu"
    return wanted.split(":")[0]


def _slurm_args(items: Sequence[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().lstrip("-")
        if not sep or not re.fullmatch(r"[a-z][a-z0-9-]*", key):
            raise AttnbenchError(
                f"--slurm-arg {item!r}: expected KEY=VALUE, an sbatch option without its dashes",
                hint="e.g. --slurm-arg account=myproj --slurm-arg qos=high --slurm-arg constraint=h100",
            )
        if _CONTROL.search(value):
            raise AttnbenchError(
                f"--slurm-arg {item!r}: a control character (a newline, say) in the value",
                hint="each value becomes one #SBATCH line of the job script: give one line of text",
            )
        found[key] = value
    return found


# sbatch reads its options from lines of the job script: a newline in a value would be a line of its own.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def default_folder(experiment: Experiment) -> Path:
    return Path("results") / "submit" / f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{experiment.name}"


def plan_submission(request: SubmitRequest) -> SubmitPlan:
    """Read and check the config and every option; nothing is written and nothing is submitted."""
    if request.executor not in EXECUTORS:
        raise AttnbenchError(f"--executor {request.executor!r}", hint=f"one of: {', '.join(EXECUTORS)}")
    if request.array < 1:
        raise AttnbenchError(f"--array {request.array}: at least one task", hint="--array 1 submits the whole sweep")
    if request.partition is not None and _CONTROL.search(request.partition):
        raise AttnbenchError(f"--partition {request.partition!r}: a control character", hint="give a partition name")
    experiment = load_experiment(request.config, request.overrides, force=request.force)
    device = _task_device(request, experiment)
    if device not in ("cpu", "cuda"):
        raise AttnbenchError(f"--device {request.device}: not a device", hint="cpu or cuda (each task's own GPU)")
    cases = experiment.cases(device)
    if request.array > len(cases):
        raise AttnbenchError(
            f"--array {request.array}: the config has only {len(cases)} cases",
            hint=f"at most --array {len(cases)} (a task per case)",
        )
    shards = tuple(tuple(s) for s in split(cases, request.array))
    gpus = request.gpus_per_task if request.gpus_per_task is not None else (1 if device == "cuda" else 0)
    if gpus < 0:
        raise AttnbenchError(f"--gpus-per-task {gpus}: not a count", hint="0 on CPU nodes, 1 for one GPU per shard")
    warnings: list[str] = []
    if device == "cuda" and gpus == 0:
        raise AttnbenchError(
            "--gpus-per-task 0 with a CUDA sweep: the tasks would see no GPU", hint="--gpus-per-task 1 (the default)"
        )
    if gpus > 1:
        warnings.append(f"--gpus-per-task {gpus}: a shard measures on one GPU; the others stay idle but reserved")
    minutes = parse_time(request.time) if request.time else estimate_minutes(experiment, max(map(len, shards)))
    cpus = request.cpus_per_task if request.cpus_per_task is not None else experiment.threads
    n = len([s for s in shards if s])
    parameters: dict[str, Any] = {
        "name": f"attnbench-{experiment.name}",
        "timeout_min": minutes,
        "slurm_array_parallelism": min(request.parallel or n, n),
        **({"gpus_per_node": gpus} if gpus else {}),
        **({"cpus_per_task": cpus} if cpus else {}),
        **({"mem_gb": request.mem_gb} if request.mem_gb else {}),
        **({"slurm_partition": request.partition} if request.partition else {}),
        # Only ever True: submitit writes slurm_exclusive=False as --exclusive=False, which sbatch refuses.
        **({"slurm_exclusive": True} if request.exclusive else {}),
        **({"slurm_additional_parameters": _slurm_args(request.slurm_args)} if request.slurm_args else {}),
    }
    if request.executor != "slurm":
        ignored = [o for o, on in (("--partition", request.partition), ("--exclusive", request.exclusive)) if on]
        ignored += ["--slurm-arg"] if request.slurm_args else []
        if ignored:
            warnings.append(f"{', '.join(ignored)}: Slurm options, ignored by the {request.executor} executor")
        if request.executor == "local" and gpus:
            warnings.append(
                "the local executor shows every task the same GPUs (0…n-1) and starts all of them at once: on one "
                "machine with several GPUs, attnbench sweep --devices all runs one worker per GPU instead"
            )
    empty = len(shards) - n
    if empty:
        warnings.append(f"{empty} of {len(shards)} shards hold no case (the split hashes case keys); no task for them")
    folder = request.folder or default_folder(experiment)
    return SubmitPlan(request, experiment, device, shards, parameters, request.time is None, folder, tuple(warnings))


# ---------------------------------------------------------------------------------------------- the record


@dataclass(frozen=True)
class Job:
    """One task of an array: the shard it runs and its scheduler id (``<array>_<index>`` on Slurm)."""

    shard: int
    job_id: str
    attempt: int
    submitted_utc: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "shard": self.shard,
            "job_id": self.job_id,
            "attempt": self.attempt,
            "submitted_utc": self.submitted_utc,
        }

    @classmethod
    def from_dict(cls, data: object) -> Job:
        d = fields.record(data, "", ("shard", "job_id", "attempt", "submitted_utc"))
        return cls(
            shard=fields.integer(d["shard"], "shard", minimum=0),
            job_id=fields.text(d["job_id"], "job_id"),
            attempt=fields.integer(d["attempt"], "attempt"),
            submitted_utc=fields.text(d["submitted_utc"], "submitted_utc"),
        )


def _job(value: object, key: str) -> Job:
    return fields.nested(key, Job.from_dict, value)


@dataclass(frozen=True)
class Submission:
    """submission.json: enough to re-attach to the jobs, resubmit a shard and merge, from any later process."""

    folder: Path
    executor: ExecutorKind
    shards: int  # N of the i/N split
    device: str  # what each task sweeps on
    config_sha256: str
    parameters: Mapping[str, Any]
    output: str  # the merged run folder
    created_utc: str
    jobs: tuple[Job, ...] = ()
    schema_version: int = SUBMISSION_VERSION

    @property
    def config(self) -> Path:
        return self.folder / CONFIG_FILE

    @property
    def shard_folder(self) -> Path:
        return self.folder / SHARDS

    @property
    def jobs_folder(self) -> Path:
        return self.folder / JOBS

    def latest(self) -> dict[int, Job]:
        """Each shard's most recent job."""
        latest: dict[int, Job] = {}
        for job in self.jobs:
            if job.shard not in latest or job.attempt >= latest[job.shard].attempt:
                latest[job.shard] = job
        return latest

    def with_jobs(self, jobs: Sequence[Job]) -> Submission:
        return replace(self, jobs=(*self.jobs, *jobs))

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "executor": self.executor,
            "shards": self.shards,
            "device": self.device,
            "config_sha256": self.config_sha256,
            "parameters": dict(self.parameters),
            "output": self.output,
            "created_utc": self.created_utc,
            "jobs": [job.to_dict() for job in self.jobs],
        }

    @classmethod
    def from_dict(cls, folder: Path, data: object) -> Submission:
        d = fields.record(
            data,
            "",
            ("schema_version", "executor", "shards", "device", "config_sha256", "parameters", "output", "jobs"),
            ("created_utc",),
        )
        version = fields.integer(d["schema_version"], "schema_version")
        if version > SUBMISSION_VERSION:
            raise fields.FieldError("schema_version", f"{version} is newer than this attnbench reads")
        parameters = d["parameters"]
        if not isinstance(parameters, dict):
            raise fields.expected("parameters", "an object", parameters)
        return cls(
            folder=folder,
            executor=fields.choice(d["executor"], "executor", EXECUTORS, "executor"),  # type: ignore[arg-type]
            shards=fields.integer(d["shards"], "shards"),
            device=fields.choice(d["device"], "device", ("cpu", "cuda"), "device"),
            config_sha256=fields.text(d["config_sha256"], "config_sha256"),
            parameters=parameters,
            output=fields.text(d["output"], "output"),
            created_utc=fields.text(d.get("created_utc", ""), "created_utc"),
            jobs=tuple(fields.items(d["jobs"], "jobs", _job)),
            schema_version=version,
        )


def write_submission(submission: Submission) -> None:
    write_atomic(submission.folder / SUBMISSION_FILE, json.dumps(submission.to_dict(), indent=2) + "\n")


def load_submission(folder: Path) -> Submission:
    """Read ``folder``/submission.json; a ``ResultsError`` naming file and key when it is not one."""
    path = Path(folder) / SUBMISSION_FILE
    if not path.is_file():
        raise ResultsError(
            f"{folder}: no {SUBMISSION_FILE} here", hint="pass the --folder an 'attnbench submit' wrote (it prints it)"
        )
    hint = f"{SUBMISSION_FILE} is written by 'attnbench submit'; was it edited?"
    try:  # bounded, a regular file only: a huge or special file is one error line, not a MemoryError or a hang
        return Submission.from_dict(Path(folder), json.loads(read_bounded(path, hint)))
    except (OSError, ValueError) as exc:
        key = f", key '{exc.key}'" if isinstance(exc, fields.FieldError) and exc.key else ""
        problem = exc.problem if isinstance(exc, fields.FieldError) else str(exc)
        raise ResultsError(f"{path}{key}: {problem}", hint=hint) from None


def prepare_folder(plan: SubmitPlan, output: Path | None) -> Submission:
    """Create the submission folder with its frozen config (no jobs yet). Refuses a folder already in use."""
    folder = plan.folder
    if folder.exists() and any(folder.iterdir()):
        raise AttnbenchError(
            f"--folder {folder}: exists and is not empty",
            hint=f"choose a new folder, or continue that submission with: attnbench submit --resume {folder}",
        )
    try:
        (folder / SHARDS).mkdir(parents=True, exist_ok=True)
        (folder / JOBS).mkdir(exist_ok=True)
    except OSError as exc:
        raise AttnbenchError(
            f"--folder {folder}: cannot create it ({exc.strerror})", hint="choose a writable folder"
        ) from None
    write_atomic(folder / CONFIG_FILE, resolved_text(plan.experiment.resolved))
    return Submission(
        folder=folder.resolve(),
        executor=plan.request.executor,
        shards=len(plan.shards),
        device=plan.device,
        config_sha256=plan.experiment.sha256,
        parameters=plan.parameters,
        output=str((output or folder / MERGED).resolve()),
        created_utc=utc_now(),
    )


def discard_folder(submission: Submission) -> None:
    """Remove a submission folder whose array was never submitted (it holds only the frozen config)."""
    shutil.rmtree(submission.folder, ignore_errors=True)


# -------------------------------------------------------------------------------------------- shard states


def _read_run(folder: Path) -> Run | None:
    try:
        return Run.from_dict(json.loads(read_bounded(folder / RUN_FILE, "")))
    except (ResultsError, OSError, ValueError, KeyError, TypeError):
        return None


def shard_run(shards: Path, shard: Shard) -> Path | None:
    """The run folder of ``shard`` under ``shards`` (the first one, in name order), or None."""
    if not shards.is_dir():
        return None
    for folder in sorted(p for p in shards.iterdir() if p.is_dir()):
        run = _read_run(folder)
        if run is not None and run.shard == shard:
            return folder
    return None


@dataclass(frozen=True)
class ShardState:
    """One shard of a submission as its run folder shows it, and its latest job."""

    shard: Shard
    cases: int  # in the shard
    rows: int = 0  # of those, with a row
    failed: int = 0  # rows that ended error, timeout, crashed or incorrect
    folder: Path | None = None
    run_state: str = ""  # running, complete, interrupted; "" before the task made its folder
    problem: str = ""  # the folder does not read: where and why
    job: Job | None = None
    scheduler: str = ""  # the scheduler's word for the job (PENDING, RUNNING, COMPLETED, …)

    @property
    def missing(self) -> int:
        return self.cases - self.rows


def shard_states(submission: Submission) -> list[ShardState]:
    """Every shard that holds cases, read from its run folder (the scheduler's state is filled in elsewhere)."""
    experiment = load_experiment(submission.config, force=True)
    latest = submission.latest()
    states = []
    for index, cases in enumerate(split(experiment.cases(submission.device), submission.shards)):
        if not cases:
            continue
        shard = Shard(index, submission.shards)
        state = ShardState(shard, len(cases), job=latest.get(index))
        folder = shard_run(submission.shard_folder, shard)
        if folder is not None:
            try:
                stored = load_run(folder)
            except ResultsError as exc:
                states.append(replace(state, folder=folder, problem=exc.message))
                continue
            keys = {c.key for c in cases}
            rows = [r for r in stored.results if r.case.key in keys]
            state = replace(
                state,
                rows=len({r.case.key for r in rows}),
                failed=sum(1 for r in rows if r.status in FAILED),
                folder=folder,
                run_state=stored.run.state,
            )
        states.append(state)
    return states


# ------------------------------------------------------------------------------------------------ the task


class ShardFailed(RuntimeError):
    """A task's sweep ended without finishing its shard (bad input, a signal): the client sees it as the job's
    error, with the sweep's last words."""


def shard_command(folder: Path, shard: Shard, device: str) -> list[str]:
    """The sweep a task runs: a resume of the shard's folder when an earlier attempt left one, else a new sweep
    of the frozen config's slice."""
    existing = shard_run(folder / SHARDS, shard)
    # No plots per shard: the merge draws them once, for the whole run (a shard's would be a slice of each curve).
    sweep = [sys.executable, "-m", "attnbench", "sweep", "--no-plots"]
    if existing is not None:
        return [*sweep, "--resume", str(existing)]
    return [*sweep, str(folder / CONFIG_FILE), "--shard", str(shard), "--device", device, "--out", str(folder / SHARDS)]


def run_shard(folder: str, shard: str, device: str) -> dict[str, Any]:
    """What each task of the array runs (submitit pickles it by reference): sweep the shard, or resume it.

    Returns the shard's outcome; raises ``ShardFailed`` when the sweep did not get through its cases (its
    rows are on disk whatever happened). A signal that ends the task (submitit's timeout warning, a cancel)
    reaches the sweep as SIGTERM, so it saves what it finished before the task goes."""
    command = shard_command(Path(folder), parse_shard(shard), device)
    # A Slurm or local task's stdout is its log: the sweep's progress lines go there. A debug task runs inside
    # `attnbench submit`, whose own lines say how it goes.
    logged = "SUBMITIT_EXECUTOR" in os.environ
    child = subprocess.Popen(command, stdout=None if logged else subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, errors = child.communicate()
    except BaseException:
        child.send_signal(signal.SIGTERM)
        try:
            child.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise
    sys.stderr.write(errors)
    # 0: every case ran; 1: every case has a row, some of them failed (a row says why). Anything else: not done.
    if child.returncode not in (0, 1):
        last = "\n".join(errors.strip().splitlines()[-5:])
        raise ShardFailed(f"shard {shard}: attnbench sweep exited with code {child.returncode}:\n{last}")
    return {"shard": shard, "exit_code": child.returncode, "command": command}
