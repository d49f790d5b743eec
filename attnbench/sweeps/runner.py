"""A sweep, start to finish: config → cases → executor → rows in a run folder (ARCHITECTURE.md, "The flow").

``plan_sweep`` reads and checks everything a sweep needs (config, stored run, device, options) before anything
is written, so a refusal never leaves a folder behind. ``open_sweep`` then locks or creates the run folder and
writes run.json; ``Sweep.run`` measures the cases left, appending each row the moment it exists, and closes the
folder as ``complete`` or ``interrupted`` whatever ended the loop.

Nothing here prints, exits or installs a signal handler: progress and warnings go to a ``SweepListener``, and a
Ctrl-C arrives as the ``KeyboardInterrupt`` the CLI raises; ``Sweep.abort`` stops a worker at once for a second
signal. Rendering the summaries from the stored rows is the report layer's job.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from attnbench.config.experiment import Experiment, load_experiment, load_experiment_text, resolved_text
from attnbench.config.messages import OVERRIDE
from attnbench.core.cases import MAX_THREADS, Case
from attnbench.core.errors import AttnbenchError, ConfigError, DeviceError, ResultsError
from attnbench.core.shards import Shard
from attnbench.host.busy import logical_cores, wait_for_idle
from attnbench.host.devices import device_slug, guess_device, resolve_device, resolve_threads, threads_handed_back
from attnbench.host.inventory import code_identity, collect_environment
from attnbench.host.memory import check_budget, check_prefix_states
from attnbench.results import fields
from attnbench.results.calibration import Calibration, cache_path, foreign, load_cached
from attnbench.results.contention import Contention
from attnbench.results.environment import Environment
from attnbench.results.files import remove_leftovers, utc_now
from attnbench.results.lock import RunLock, remove_if_only_lock
from attnbench.results.records import Result, Run
from attnbench.results.store import (
    RUN_FILE,
    RunWriter,
    StoredRun,
    load_blocks,
    load_run,
    refuse_special_files,
    rewrite_blocks,
    rewrite_rows,
    traces_folder,
)
from attnbench.sweeps.estimate import SweepEstimate, estimate_sweep
from attnbench.sweeps.events import SweepListener
from attnbench.sweeps.isolated_executor import IsolatedExecutor
from attnbench.sweeps.loop import OomSkipper, run_cases
from attnbench.sweeps.pool import DeviceSet, DevicesFailedError, WorkerPool, resolve_devices
from attnbench.sweeps.replicated_executor import ReplicatedExecutor
from attnbench.sweeps.rounds import block_policy, run_rounds
from attnbench.timing.executor import Executor, ExecutorSettings


@dataclass(frozen=True)
class SweepRequest:
    """What the user asked for: the ``sweep`` command's options, before anything is read."""

    config: Path | None
    device: str | None
    out: Path
    overrides: tuple[str, ...] = ()
    isolate: bool | None = None
    resume: Path | None = None
    retry_failed: bool = False
    force: bool = False
    # Validation of `compare` only: busy-wait this fraction of each call's time inside every timed call.
    inject_slowdown: float = 0.0
    label: str = ""  # a free label for this run (history and compare name runs by it)
    # Plan only (--dry-run): tell the device without importing torch, which costs seconds (devices.guess_device).
    dry_run: bool = False
    shard: Shard | None = None  # measure only this slice of the config's cases (sweep --shard i/N)
    devices: str | None = None  # one isolated worker per device: "all", "cuda:0,cuda:1", "cpu,cpu" (--devices)
    allow_mixed_devices: bool = False  # --devices may name GPUs of different models
    # Before the first case: wait up to this long for a busy machine to go quiet (--wait-idle); 0 checks once.
    wait_idle_s: float = 0.0
    # For external profilers: a Chrome trace per ok case under traces/ (--profile), an NVTX range named by the case
    # key around each timed call (--nvtx, a GPU only), one timed call after the warm-up (--run-once).
    profile: bool = False
    nvtx: bool = False
    run_once: bool = False
    no_check: bool = False  # time without the numerical check (--no-check; the config's ``check: off``)
    # A run whose budget decisions this one takes (--budget-from): the cases it timed ok are timed here too.
    budget_from: Path | None = None


@dataclass(frozen=True)
class SweepPlan:
    """Everything checked and resolved, nothing written: what ``--dry-run`` lists and ``open_sweep`` runs."""

    request: SweepRequest
    experiment: Experiment
    device: str
    cases: tuple[Case, ...]  # every case of the config
    todo: tuple[Case, ...]  # the ones this sweep measures (a resume skips the rows it keeps)
    stored: StoredRun | None  # the run being resumed
    kept: tuple[Result, ...]  # the stored rows a resume keeps
    isolate: bool
    warnings: tuple[str, ...] = ()
    shard: Shard | None = None  # cases and todo are this slice's (a resumed shard keeps its own)
    devices: tuple[str, ...] = ()  # a worker per device (--devices); empty: one executor on ``device``
    device_basis: str = ""  # a dry run tells "auto" without torch: what its answer rests on
    threads: int | None = None  # the config's, else on a CPU attnbench's default (resolve_threads); dry run: config's
    decided_ok: frozenset[str] = frozenset()  # the keys --budget-from's run timed ok

    @property
    def estimate(self) -> SweepEstimate:
        """How long the cases left will likely take, and the most their warm-up and sampling may (each case stops
        at timing.max_case_s in each of timing.processes workers): ``sweeps.estimate``. An estimate, not a
        promise. With --devices the workers share the cases."""
        return estimate_sweep(
            self.todo,
            self.experiment.timing,
            out=self.request.out,
            name=self.experiment.name,
            device=self.device,
            workers=len(self.devices),
        )

    @property
    def settings(self) -> ExecutorSettings:
        e = self.experiment
        return ExecutorSettings(
            device=self.device,
            timing=e.timing,
            seed=e.seed,
            threads=self.threads,
            timeout_s=e.timeout_s,
            telemetry=e.telemetry,
            telemetry_interval_s=e.interval_for(self.device),
            inject_slowdown=self.request.inject_slowdown,
            nvtx=self.request.nvtx and self.device.startswith("cuda"),
            run_once=self.request.run_once,
            check=e.check and not self.request.no_check,
            decided_ok=self.decided_ok,
        )


def plan_sweep(request: SweepRequest) -> SweepPlan:
    """Read the config (or the stored run to resume) and check every option against it and the device.
    Raises ``AttnbenchError`` with a hint for anything a person must change; writes nothing."""
    stored: StoredRun | None = None
    warnings: list[str] = []
    basis: list[str] = []

    def resolve(wanted: str) -> str:
        if not request.dry_run:
            return resolve_device(wanted)
        guess = guess_device(wanted)
        basis.append(guess.basis)
        if guess.problem and guess.problem not in warnings:
            warnings.append(guess.problem)
        return guess.device

    pool = _pool_devices(request)
    requested = pool.devices[0] if pool is not None else request.device
    if request.resume is not None:
        stored = load_run(request.resume)
        warnings += stored.warnings
        experiment = _resume_experiment(request, stored)
        device = _resume_device(requested, stored, resolve)
    else:
        device_type = resolve(requested or "auto").split(":")[0] if request.config is None else "cpu"
        experiment = load_experiment(request.config, request.overrides, device_type=device_type, force=request.force)
        device = resolve(requested or experiment.device)
    isolate = _check_on_device(request, experiment, device, pool is not None, warnings)
    # The rows a resume keeps (and does not rerun): all of them, or with --retry-failed only the ok ones.
    kept = tuple(r for r in stored.results if r.ok or not request.retry_failed) if stored else ()
    done = {r.case.key for r in kept}
    shard = _shard(request, stored)
    cases = tuple(experiment.cases(device))
    check_prefix_states(cases, device, experiment.source)  # a prefix's states this machine cannot hold: refused
    if shard is not None:
        cases = tuple(shard.select(cases))
    todo = tuple(case for case in cases if case.key not in done)
    devices = pool.devices if pool is not None else ()
    warnings += pool.warnings if pool is not None else ()
    device_basis = basis[-1] if basis else ""  # the device's own, after the builtin config's choice
    # A dry run resolves no threads: the rule asks torch, which a dry run does not import. A resumed run keeps the
    # count it was started with (a run from before the rule, or from a machine whose CPUs changed, still resumes).
    threads = experiment.threads
    if stored is not None and threads is None:
        threads = _stored_threads(stored)
    elif not request.dry_run:
        threads = resolve_threads(threads, device)
    return SweepPlan(
        request,
        experiment,
        device,
        cases,
        todo,
        stored,
        kept,
        isolate,
        tuple(warnings),
        shard,
        devices,
        device_basis,
        threads,
        _decided_ok(request.budget_from, cases, warnings),
    )


def _check_on_device(
    request: SweepRequest, experiment: Experiment, device: str, pooled: bool, warnings: list[str]
) -> bool:
    """The options and settings that only some devices can honour, checked against ``device`` (an error, or a
    warning added to ``warnings``); whether the cases run isolated."""
    if request.inject_slowdown and not device.startswith("cpu"):
        raise AttnbenchError(
            f"--inject-slowdown busy-waits on the host, which does not slow work queued on {device}",
            hint="use it on --device cpu, where it exists to validate `attnbench compare`",
        )
    if request.nvtx and not device.startswith("cuda"):
        warnings.append(f"--nvtx does nothing on {device}: NVTX ranges mark CUDA work for nsys; timing goes on without")
    timing = experiment.timing
    if timing.cuda_graph and not device.startswith("cuda"):
        raise AttnbenchError(
            f"timing.cuda_graph applies to CUDA devices; this sweep runs on {device}",
            hint="set timing.cuda_graph: false for CPU runs",
        )
    if timing.processes > 1 and request.isolate is False:
        raise AttnbenchError(
            f"timing.processes = {timing.processes} runs each case in fresh worker processes, which --no-isolate "
            "forbids",
            hint="drop --no-isolate, or set timing.processes: 1",
        )
    if timing.rounds > 1 and pooled:
        raise AttnbenchError(
            f"timing.rounds = {timing.rounds} visits every case in rounds on one worker, which --devices does not do",
            hint="drop --devices, or set timing.rounds: 1",
        )
    isolate = request.isolate if request.isolate is not None else experiment.isolate_on(device) or pooled
    if not isolate and experiment.case_timeout_s is not None:
        warnings.append(
            "case_timeout_s applies only with isolation (--isolate); in-process cases are bounded by "
            "timing.max_case_s alone"
        )
    if (
        not device.startswith("cuda")
        and "capacity" in experiment.axes.modes
        and not experiment.resolved.get("memory_budget")
    ):
        raise AttnbenchError(
            f"mode capacity on {device} needs memory_budget: only a GPU has free memory to default to",
            hint="add memory_budget (e.g. 4GiB) to the config, or run it on a GPU",
        )
    if "capacity" in experiment.axes.modes:
        check_budget(experiment.resolved.get("memory_budget"), device, experiment.source)
    return isolate


def _decided_ok(budget_from: Path | None, cases: tuple[Case, ...], warnings: list[str]) -> frozenset[str]:
    """The keys of this sweep's cases that ``--budget-from``'s run timed ok: their budget is decided (issue 51, a
    case at the edge of its budget must not be ok in one run and too slow in the next)."""
    if budget_from is None:
        return frozenset()
    base = load_run(budget_from)
    wanted = {case.key for case in cases}
    decided = frozenset(r.case.key for r in base.results if r.ok and r.case.key in wanted)
    if not decided:
        warnings.append(
            f"--budget-from {budget_from}: it timed none of this sweep's cases ok, so every budget is decided here"
        )
    return decided


def _stored_threads(stored: StoredRun) -> int | None:
    """The thread count a resumed run was started with, checked as a config's ``threads`` is (a run.json edited to
    10**12 threads must be an error line, not torch's overflow)."""
    found = stored.run.environment.get("torch_threads")
    if found is None:
        return None
    try:
        return fields.integer(found, "environment.torch_threads", maximum=MAX_THREADS)
    except fields.FieldError as exc:
        raise ResultsError(
            f"{stored.folder}/run.json: {exc}", hint="this run cannot be resumed; start a new sweep"
        ) from None


def _pool_devices(request: SweepRequest) -> DeviceSet | None:
    """The devices of ``--devices``, checked against the options that cannot go with it."""
    if request.devices is None:
        if request.allow_mixed_devices:
            raise AttnbenchError("--allow-mixed-devices applies to --devices", hint="drop it, or add --devices …")
        return None
    if request.device is not None:
        raise AttnbenchError(
            "--device and --devices both given", hint="--devices names every device the sweep uses; drop --device"
        )
    if request.isolate is False:
        raise AttnbenchError(
            "--devices runs one isolated worker per device, which --no-isolate forbids", hint="drop --no-isolate"
        )
    return resolve_devices(request.devices, allow_mixed=request.allow_mixed_devices)


def _shard(request: SweepRequest, stored: StoredRun | None) -> Shard | None:
    """The slice to measure: the request's, or a resumed run's own (which a different --shard may not change)."""
    if stored is None:
        return request.shard
    if request.shard is not None and request.shard != stored.run.shard:
        had = f"shard {stored.run.shard}" if stored.run.shard else "every case (no shard)"
        raise AttnbenchError(
            f"--resume {stored.folder} --shard {request.shard}: the run measures {had}",
            hint="resume without --shard: a run keeps the slice it was started with",
        )
    return stored.run.shard


class ExecutorFactory(Protocol):
    """What builds a sweep's executor from its settings: ``make_executor``, or a test's fake (``open_sweep``)."""

    def __call__(self, settings: ExecutorSettings, *, isolate: bool) -> Executor: ...


def make_executor(settings: ExecutorSettings, *, isolate: bool) -> Executor:
    """The executor a sweep runs: in-process, or isolated (and replicated when ``timing.processes`` > 1)."""
    if isolate:
        isolated = IsolatedExecutor(settings)
        processes = settings.timing.processes
        return ReplicatedExecutor(isolated, processes) if processes > 1 else isolated
    if settings.timing.processes > 1:
        raise ValueError("timing.processes > 1 needs isolated workers")
    # Imported here: the in-process executor imports torch, which an isolated sweep leaves to its workers.
    from attnbench.timing.torch_executor import TorchExecutor

    return TorchExecutor(settings)


class Sweep:
    """A run folder open for writing, locked for as long as this sweep owns it."""

    def __init__(
        self,
        plan: SweepPlan,
        writer: RunWriter,
        environment: Environment,
        warnings: tuple[str, ...],
        executor: ExecutorFactory | None = None,
    ):
        self.plan = plan
        self.writer = writer
        self.environment = environment
        self.warnings = warnings  # the plan's, and what opening the folder found
        self._make_executor = executor  # None: make_executor, looked up when the sweep runs
        self._executor: Executor | WorkerPool | None = None

    @property
    def folder(self) -> Path:
        return self.writer.folder

    @property
    def settings(self) -> ExecutorSettings:
        """The plan's, with the folder that receives the traces (--profile), made here: never a link."""
        settings = self.plan.settings
        if not self.plan.request.profile:
            return settings
        return replace(settings, trace_dir=str(traces_folder(self.folder)))

    def run(self, listener: SweepListener) -> tuple[Result, ...]:
        """Measure every case left, appending each row before the next case starts (with ``timing.rounds``, as its
        case's last round ends, each earlier round kept in rounds.jsonl); returns the rows written.
        Whatever ends the loop (the last case, a KeyboardInterrupt, a full disk, a bug of ours), the folder is
        closed before it propagates: ``complete`` only when every case has its row."""
        plan = self.plan
        skipper = (
            # Only kept rows may skip longer cases: an OOM about to be retried must not veto its longer lengths.
            OomSkipper(tied_batch=plan.experiment.tokens is not None, seen=plan.kept)
            if plan.experiment.skip_larger_after_oom
            else None
        )
        finished: list[Result] = []

        def on_result(index: int, result: Result) -> None:
            listener.measured(index, result)  # the case's work is over; storing its row must not be abandoned
            self.writer.append(result)
            finished.append(result)
            listener.finished(index, result)

        complete = False
        settings = self.settings
        try:
            if plan.devices:
                pool = self._executor = WorkerPool(settings, plan.devices)
                try:
                    pool.run(plan.todo, on_result, listener.started, skipper, listener.warning)
                except DevicesFailedError as exc:
                    exc.hint = (
                        f"check the devices (nvidia-smi), then finish the run: attnbench sweep --resume {self.folder}"
                    )
                    raise
            elif settings.timing.rounds > 1:
                execute, on_round = self._round_executors(listener)
                run_rounds(
                    plan.todo,
                    settings.timing.rounds,
                    execute,
                    on_result,
                    on_start=listener.started,
                    on_round=on_round,
                    on_block=self._keep_block(listener),
                    skipper=skipper,
                    done=self._kept_blocks(listener),
                )
            else:
                make = self._make_executor or make_executor
                executor = self._executor = make(settings, isolate=plan.isolate)
                run_cases(plan.todo, executor.run, on_result, listener.started, skipper)
            complete = len(finished) == len(plan.todo)
        except BaseException:
            # Already failing (a signal, a full disk, a bug of ours): close as well as can be, and let the first
            # failure propagate; a second one while closing (the same full disk) would only hide it.
            self._close(complete=False, quietly=True)
            raise
        self._close(complete=complete)
        return tuple(finished)

    def _round_executors(self, listener: SweepListener) -> tuple[Callable[[Case], Result], Callable[[int, int], None]]:
        """What runs a block, and what starts a round, for a sweep in rounds: each block with a round's share of
        each budget. With --profile only round 1 is traced: a merged row's extras are its first round's, so its
        ``trace`` names round 1's file, which a later round would overwrite. Rounds 2 on get an executor without
        a trace folder, built when round 2 starts."""
        make = self._make_executor or make_executor
        traced = replace(self.settings, timing=block_policy(self.settings.timing))
        untraced = replace(traced, trace_dir=None)
        built: list[tuple[ExecutorSettings, Executor]] = []

        def execute(case: Case) -> Result:
            return built[-1][1].run(case)

        def on_round(number: int, rounds: int) -> None:
            listener.round_started(number, rounds)
            wanted = traced if number == 1 else untraced
            if built and built[-1][0] == wanted:
                return
            if built:
                built[-1][1].close()  # between rounds: no case is running
                self._executor = None  # closed: nothing for abort() or _close() to stop until the next is built
            executor = make(wanted, isolate=self.plan.isolate)
            built.append((wanted, executor))
            self._executor = executor

        return execute, on_round

    def _keep_block(self, listener: SweepListener) -> Callable[[int, Result], None]:
        """What an ok round that is not its case's last does: its work is over (the listener disarms Ctrl-C, as
        for a row), then it lands in rounds.jsonl before the next block starts."""

        def keep(index: int, block: Result) -> None:
            listener.measured(index, block)
            self.writer.append_block(block)

        return keep

    def _kept_blocks(self, listener: SweepListener) -> dict[str, list[Result]]:
        """A resumed run's finished rounds of the cases still without a row (timing.rounds): rounds.jsonl's blocks,
        which opening the folder rewrote to those alone (``rewrite_blocks``: a retried case starts its rounds
        afresh)."""
        if self.plan.stored is None:
            return {}
        blocks, warnings = load_blocks(self.folder)
        for text in warnings:
            listener.warning(text)
        return blocks

    def _close(self, *, complete: bool, quietly: bool = False) -> None:
        try:
            if self._executor is not None:  # None: building it failed, so there is nothing to stop
                self._executor.close(now=not complete)
        finally:
            try:
                self.writer.close("complete" if complete else "interrupted", utc_now())
            except (AttnbenchError, OSError):
                if not quietly:
                    raise

    def stop_before_start(self) -> None:
        """Close the run as interrupted without measuring anything: it holds its run.json and resumes as any
        other (the caller saw a signal during start-up that something in it swallowed)."""
        self._close(complete=False)

    def abort(self) -> None:
        """Stop a worker that may be running a case, now (a second Ctrl-C). Safe from a signal handler."""
        if isinstance(self._executor, WorkerPool):
            self._executor.abort()  # only signals: the pool's threads do the rest
        elif self._executor is not None:
            self._executor.close(now=True)


def busy_warning(busy: Contention, waited_s: float) -> str:
    """What the pre-sweep check says when the machine is busy, with the evidence and what to do about it."""
    waited = f" after waiting {waited_s:g} s" if waited_s else ""
    hint = "" if waited_s else "; --wait-idle SECONDS waits for quiet first"
    return (
        f"the machine is busy{waited} ({'; '.join(busy.reasons)}; {busy.evidence}): timings taken now are slower by "
        f"an unknown amount, and each case timed while it lasts will be marked contended{hint}"
    )


@contextmanager
def open_sweep(
    request: SweepRequest,
    *,
    on_busy: Callable[[Contention, float], None] | None = None,
    executor: ExecutorFactory | None = None,
) -> Iterator[Sweep]:
    """Plan the sweep, then lock (resume) or create (new) its run folder and write run.json; the lock is held
    until the block ends. A resume locks before it reads, so nobody appends between our reading and our rows,
    then clears what a killed write left behind. A new folder that stops before it holds run.json (a signal, a
    full disk) is removed again: a folder holding nothing but the lock is debris, not a run.

    ``executor`` builds the executor instead of ``make_executor`` (the seam tests put a fake executor in; a
    ``--devices`` sweep's pool builds its own isolated workers)."""
    lock: RunLock | None = None
    created: Path | None = None
    handed_back = ExitStack()
    try:
        if request.resume is not None and _holds_a_run(Path(request.resume)):
            lock = RunLock(Path(request.resume)).acquire()
        plan = plan_sweep(request)
        # Before the environment records the thread count; handed back when the sweep ends.
        handed_back.enter_context(threads_handed_back(plan.threads))
        environment = _environment(plan)
        warnings = list(plan.warnings)
        # Before anything is written: is the machine already busy? (≤ 1 s, or up to --wait-idle for quiet)
        threads = environment.torch_threads or logical_cores()
        busy = wait_for_idle(plan.device, threads, request.wait_idle_s, on_busy=on_busy)
        if busy.contended:
            warnings.append(busy_warning(busy, request.wait_idle_s))
        if plan.stored is not None:
            _check_same_environment(plan.stored, environment)
            folder = plan.stored.folder
            refuse_special_files(folder)  # before the first write: nothing is written through a planted link
            remove_leftovers(folder)
            # A resume keeps the run's code identity and label: the rows belong to the run as it was started.
            contended = sum(r.contended for r in plan.kept)
            run = replace(plan.stored.run, state="running", finished_utc="", contended_cases=contended)
            rewrite_rows(folder, lambda r: r.ok or not request.retry_failed)  # the same rule as plan.kept
            # The rounds of the cases still to do that never had a row; a retried case's old blocks go, so a later
            # resume cannot take them for its fresh rounds.
            had_row = {r.case.key for r in plan.stored.results}
            waiting = {c.key for c in plan.todo} - had_row
            warnings += rewrite_blocks(folder, waiting.__contains__)
        else:
            folder = created = _new_run_folder(request.out, plan.experiment, plan.device)
            lock = RunLock(folder).acquire()
            calibration, problem = _cached_calibration(environment)
            if problem:
                warnings.append(problem)
            elif calibration is None and plan.device == "cpu":
                # A CPU has no vendor figures: without a calibration its rows get rates but no % of a peak.
                warnings.append(
                    f"no calibration of this CPU at {environment.torch_threads} torch threads, so pct_of_peak and "
                    f"pct_of_peak_bw stay empty; 'attnbench calibrate --threads {environment.torch_threads}' measures "
                    "one once, for every later sweep"
                )
            run = Run(
                run_id=folder.name,
                created_utc=utc_now(),
                config_source=plan.experiment.source,
                config=plan.experiment.resolved,
                config_sha256=plan.experiment.sha256,
                timing=plan.experiment.timing,
                environment=environment.to_dict(),
                command=tuple(sys.argv),
                calibration=calibration,
                code=code_identity(),
                label=request.label,
                shard=plan.shard,
                contended_cases=0,
            )
        writer = RunWriter(folder, run)
        created = None  # it holds run.json: a run to resume from now on, never removed
        yield Sweep(plan, writer, environment, tuple(warnings), executor)
    finally:
        handed_back.close()
        if lock is not None:
            lock.release()
        if created is not None:
            remove_if_only_lock(created)


def _holds_a_run(folder: Path) -> bool:
    try:
        return (folder / RUN_FILE).is_file()
    except OSError as exc:  # a parent we may not enter
        raise ResultsError(
            f"--resume {folder}: cannot read it ({exc.strerror or exc})", hint="check the path and its permissions"
        ) from None


def _environment(plan: SweepPlan) -> Environment:
    """What the run was measured in (torch imported here, when nothing imported it yet)."""
    return collect_environment(plan.device)


def _cached_calibration(environment: Environment) -> tuple[Calibration | None, str]:
    """The machine's cached ceilings, if 'attnbench calibrate' ran here: never measured implicitly (that takes a
    minute); without them pct_of_peak falls back to vendor peaks. A damaged cache costs a warning."""
    try:
        cached = load_cached(environment.fingerprint())
    except ResultsError as exc:
        return None, f"{exc.message}; pct_of_peak uses vendor peaks ({exc.hint})"
    why = None if cached is None else foreign(cached, environment.to_dict())
    if why:  # filed under this machine's key, but measured elsewhere: never copied into a run (issue 50 §3.2)
        return None, (
            f"the cached calibration {cache_path(environment.fingerprint())} is not of this machine ({why}): it is "
            "ignored, so pct_of_peak uses vendor peaks and compare its default floor; 'attnbench calibrate "
            "--refresh' measures this one"
        )
    return cached, ""


def _new_run_folder(out: Path, experiment: Experiment, device: str, suffix: str = "") -> Path:
    """A fresh folder. The name comes from the config, which only admits a slug ([a-z0-9][a-z0-9._-]*), so it
    cannot climb out of --out; ``suffix`` (a slug of ours: ``ab``'s side) tells two runs of one moment apart."""
    stem = f"{datetime.now(UTC):%Y%m%d-%H%M%S}-{experiment.name}-{device_slug(device)}{suffix}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        for n in range(1, 1000):
            folder = out / (stem if n == 1 else f"{stem}-{n}")
            try:
                folder.mkdir()  # exclusive: two sweeps started in the same second get two folders
                return folder
            except FileExistsError:
                continue
    except OSError as exc:
        raise AttnbenchError(
            f"--out: cannot create a run folder in {out}: {exc.strerror}", hint="choose a writable folder with --out"
        ) from None
    raise AttnbenchError(f"--out: {out} already holds 999 runs named {stem}", hint="choose another --out")


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _only_added(then: Mapping[str, Any], now: Mapping[str, Any]) -> bool:
    """Whether ``now`` differs from ``then`` only by keys ``then`` does not have at all."""
    a, b = _flatten(then), _flatten(now)
    return set(a) <= set(b) and all(a[k] == b[k] for k in a)


def _differences(then: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """``key.path: <then> then, <now> now`` for every leaf that differs."""
    a, b = _flatten(then), _flatten(now)
    return [f"{k}: {a.get(k)!r} then, {b.get(k)!r} now" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def _resume_experiment(request: SweepRequest, stored: StoredRun) -> Experiment:
    """The stored run's own config, or the one given, which must resolve to the same thing."""
    if request.config is None:
        text = resolved_text(stored.run.config)
        try:
            experiment = load_experiment_text(
                text, stored.run.config_source, request.overrides, force=True, stored=True
            )
        except ConfigError as exc:
            if exc.where.startswith(OVERRIDE):
                raise  # about a --set the user gave: it names the flag
            raise _stored_problem(
                stored,
                f"config.{exc.key}" if exc.key else "config",
                exc.problem,
                hint="run.json holds the config the run was started with, so it was edited or damaged; "
                "restore it, or start a new sweep",
            ) from None
    else:
        experiment = load_experiment(request.config, request.overrides, force=request.force)
    # A setting this attnbench added since the run began (absent from the stored config, so its default now) is
    # no difference of the user's making: a run started before timing.process_warmup_s existed still resumes.
    if experiment.sha256 != stored.run.config_sha256 and not _only_added(stored.run.config, experiment.resolved):
        diff = _differences(stored.run.config, experiment.resolved)
        raise ResultsError(
            f"--resume {stored.folder}: the config differs from the one the run was started with "
            f"({'; '.join(diff) or 'sha256 differs'})",
            hint="resume with the run's own config (give no CONFIG and no --set), or start a new sweep",
        )
    return experiment


def _stored_problem(stored: StoredRun, key: str, problem: str, hint: str) -> ResultsError:
    """An error about a resumed run's own run.json: it names that file and the field, never a flag or a YAML file
    the user did not give."""
    return ResultsError(f"{stored.folder / RUN_FILE}, key '{key}': {problem}", hint=hint)


def _resume_device(requested: str | None, stored: StoredRun, resolve: Callable[[str], str]) -> str:
    """The device a resume runs on: the one asked for (--device, or --devices' first), else the run's own."""
    if requested is not None:
        return resolve(requested)
    device = stored.run.environment.get("device", "cpu")
    try:
        return resolve(device if isinstance(device, str) else repr(device))
    except DeviceError as exc:
        raise _stored_problem(
            stored,
            "environment.device",
            exc.message.removeprefix("--device: "),
            hint="resume on a machine that has the run's device; a run cannot move to another device",
        ) from None


def _check_same_environment(stored: StoredRun, environment: Environment) -> None:
    try:
        then = Environment.from_dict(stored.run.environment).resume_fields()
    except TypeError as exc:
        raise ResultsError(
            f"{stored.folder}/run.json: the environment is incomplete ({exc})",
            hint="this run cannot be resumed; start a new sweep",
        ) from None
    now = environment.resume_fields()
    if then != now:
        raise ResultsError(
            f"--resume {stored.folder}: this machine or code differs from the one the run was started with "
            f"({'; '.join(_differences(then, now))})",
            hint="timings from different environments cannot share a run; start a new sweep here",
        )
