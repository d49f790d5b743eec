"""``attnbench submit CONFIG --executor slurm|local|debug --array N``: a sweep's shards as one job array, waited for
and merged into one run; ``--status FOLDER`` and ``--resume FOLDER`` for a submission already made.

Exit codes: 0 every shard finished and the merged run is complete; 1 a task failed or was lost, cases are
missing (``--resume`` reruns them) or a case ended error/crashed/timeout/incorrect; 2 bad input (including a missing
submitit, or an sbatch that refused the array); 3 the shards' environments are not comparable; 130 interrupted
while waiting (the jobs go on).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.markup import escape
from rich.table import Table

from attnbench.cli.common import (
    ConfigArg,
    PlotsOpt,
    SetOpt,
    handles_errors,
    plots_wanted,
    print_warnings,
    stderr,
    stdout,
)
from attnbench.core.errors import EXIT_CASE_FAILED, AttnbenchError, ResultsError
from attnbench.results.records import FAILED

if TYPE_CHECKING:
    from attnbench.cluster.jobarray import Task, TaskOutcome
    from attnbench.cluster.submission import ShardState, Submission, SubmitRequest


@handles_errors
def submit(
    config: ConfigArg = None,
    executor: Annotated[
        Literal["slurm", "local", "debug"],
        typer.Option("--executor", help="slurm: one sbatch job array; local: processes here; debug: in this process."),
    ] = "slurm",
    array: Annotated[int, typer.Option("--array", min=1, help="Tasks (shards) in the array.")] = 1,
    partition: Annotated[str | None, typer.Option("--partition", help="Slurm partition.", show_default=False)] = None,
    gpus_per_task: Annotated[
        int | None,
        typer.Option("--gpus-per-task", min=0, help="GPUs each task gets.", show_default="1 for CUDA, 0 for CPU"),
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option("--time", help="Each task's limit: minutes, H:MM:SS or D-HH.", show_default="estimated"),
    ] = None,
    exclusive: Annotated[bool, typer.Option("--exclusive", help="Each task gets a whole node.")] = False,
    folder: Annotated[
        Path | None,
        typer.Option("--folder", help="Submission folder.", show_default="results/submit/<time>-<name>"),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="The merged run folder.", show_default="FOLDER/merged")
    ] = None,
    device: Annotated[
        str | None, typer.Option("--device", help="cpu or cuda (each task's own GPU).", show_default="the config's")
    ] = None,
    overrides: SetOpt = None,
    cpus_per_task: Annotated[
        int | None,
        typer.Option("--cpus-per-task", min=1, help="CPUs per task.", show_default="the config's threads, when set"),
    ] = None,
    mem_gb: Annotated[
        float | None, typer.Option("--mem-gb", min=0.1, help="Memory per task.", show_default=False)
    ] = None,
    parallel: Annotated[
        int | None, typer.Option("--parallel", min=1, help="At most this many tasks at once.", show_default="all")
    ] = None,
    slurm_arg: Annotated[
        list[str] | None,
        typer.Option("--slurm-arg", help="Another sbatch option, KEY=VALUE (repeatable).", show_default=False),
    ] = None,
    no_wait: Annotated[bool, typer.Option("--no-wait", help="Submit, print the job ids and return.")] = False,
    status: Annotated[
        Path | None, typer.Option("--status", help="Show a submission's shards and jobs.", show_default=False)
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option("--resume", help="Rerun the shards with missing cases, wait, merge.", show_default=False),
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="Allow a grid above the 10000-case cap.")] = False,
    plots: PlotsOpt = None,
) -> None:
    """Sweep CONFIG as N shards of one job array (Slurm through submitit), wait, and merge them into one run.

    Needs the slurm extra: pip install "attnbench[slurm]". Plots are drawn once, for the merged run: a task's
    shard is a slice of the curves.
    """
    if status is not None:
        _show_status(status)
        return
    draw_plots = plots_wanted(plots)
    if resume is not None:
        code = _resume(resume, no_wait, plots=draw_plots)
    else:
        from attnbench.cluster.submission import SubmitRequest

        request = SubmitRequest(
            config=config,
            executor=executor,
            array=array,
            overrides=tuple(overrides or ()),
            device=device,
            partition=partition,
            gpus_per_task=gpus_per_task,
            time=time_limit,
            exclusive=exclusive,
            cpus_per_task=cpus_per_task,
            mem_gb=mem_gb,
            parallel=parallel,
            slurm_args=tuple(slurm_arg or ()),
            folder=folder,
            force=force,
        )
        code = _submit(request, output, no_wait, plots=draw_plots)
    if code:
        raise typer.Exit(code)


def _say(text: str) -> None:
    stdout.print(f"attnbench submit: {text}", markup=False, highlight=False)


def _submit(request: SubmitRequest, output: Path | None, no_wait: bool, *, plots: bool) -> int:
    from attnbench.cluster.jobarray import import_submitit, submit_shards
    from attnbench.cluster.submission import discard_folder, plan_submission, prepare_folder

    plan = plan_submission(request)
    import_submitit()  # before anything is written: without it, say how to install it
    if no_wait and request.executor == "debug":
        raise AttnbenchError("--no-wait with --executor debug: debug tasks run inside this process", hint="drop one")
    print_warnings(plan.warnings)
    submission = prepare_folder(plan, output)
    shards = plan.submitted
    limit = plan.parameters["timeout_min"]
    t0 = time.monotonic()
    try:
        submission, tasks = submit_shards(submission, shards)
    except BaseException:
        discard_folder(submission)  # nothing was submitted: the folder holds only the frozen config
        raise
    sizes = ", ".join(f"{i}/{len(plan.shards)}: {len(plan.shards[i])}" for i in shards)
    _say(
        f"{len(plan.experiment.cases(plan.device))} cases of {plan.experiment.source} in {len(shards)} shards "
        f"(cases per shard {sizes}), {request.executor} executor, {limit} min per task"
        + (" (estimated; --time to set)" if plan.time_estimated else "")
    )
    _say(f"submitted {_ids(tasks)}; folder {submission.folder}")
    if no_wait:
        _say(f"not waiting. State: attnbench submit --status {submission.folder}")
        _say(f"wait and merge (rerunning what is missing): attnbench submit --resume {submission.folder}")
        return 0
    return _wait_and_merge(submission, tasks, t0, plots=plots)


def _ids(tasks: list[Task]) -> str:
    ids = [t.job.job_id for t in tasks]
    # Slurm names array elements <array>_<index>; a one-task array is a plain job id.
    arrays = sorted({i.split("_")[0] for i in ids if "_" in i and not i.startswith("DEBUG_")})
    head = f"job array {', '.join(arrays)}: " if arrays else "jobs: "
    return head + ", ".join(ids)


def _wait_and_merge(submission: Submission, tasks: list[Task], t0: float, *, plots: bool) -> int:
    from attnbench.cli.merge import merge_summary
    from attnbench.cluster.jobarray import wait
    from attnbench.workflows import merge as merging

    try:
        outcomes = wait(submission, tasks, _say) if tasks else []
    except KeyboardInterrupt:
        stderr.print(
            f"stopped waiting; the jobs go on. State: attnbench submit --status {submission.folder}; wait and "
            f"merge later: attnbench submit --resume {submission.folder}",
            markup=False,
        )
        return 130
    waited = time.monotonic() - t0
    output = Path(submission.output)
    try:
        plan = merging.plan([submission.shard_folder], output, partial=True, command=tuple(sys.argv))
    except ResultsError as exc:
        if "holds no run" not in exc.message:
            raise
        stderr.print(f"nothing to merge: no shard wrote a run folder ({exc.message})", markup=False)
        return _verdict(outcomes, None, submission)
    print_warnings(plan.warnings)
    written = merging.write(plan, output, plots=plots)
    merged = time.monotonic() - t0
    stdout.print(merge_summary(plan, output), markup=False, highlight=False)
    if written.problem is not None:
        print_warnings([written.problem])
    for path in written.paths:
        stdout.print(f"wrote {path}", markup=False, highlight=False)
    _say(f"timing: submit → all tasks ended {waited:.1f} s, submit → merged {merged:.1f} s")
    return _verdict(outcomes, plan.complete and not any(r.status in FAILED for r in plan.results), submission)


def _verdict(outcomes: list[TaskOutcome], merged_ok: bool | None, submission: Submission) -> int:
    bad = [o for o in outcomes if o.status != "done"]
    for outcome in bad:
        stderr.print(f"shard {outcome.shard}/{submission.shards}: {outcome.status}: {outcome.detail}", markup=False)
    if bad or not merged_ok:
        stderr.print(f"rerun the missing cases with: attnbench submit --resume {submission.folder}", markup=False)
        return EXIT_CASE_FAILED
    return 0


def _states(submission: Submission) -> tuple[list[ShardState], list[Task]]:
    """Every shard's state from its folder, with its latest job's state from the scheduler."""
    from dataclasses import replace

    from attnbench.cluster.jobarray import attach, scheduler_state
    from attnbench.cluster.submission import shard_states

    states = shard_states(submission)
    tasks = attach(submission, [s.shard.index for s in states])
    by_shard = {t.shard: t for t in tasks}
    out = []
    for i, state in enumerate(states):
        task = by_shard.get(state.shard.index)
        # sacct once for all (it answers for every registered job), squeue for any it does not know yet.
        word = scheduler_state(submission, task, refresh=i == 0, squeue=True) if task is not None else ""
        out.append(replace(state, scheduler=word))
    return out, tasks


def _show_status(folder: Path) -> None:
    from attnbench.cluster.submission import load_submission

    submission = load_submission(folder)
    states, _ = _states(submission)
    table = Table(
        title=f"{submission.folder} · {submission.executor} · {submission.shards} shards", title_justify="left"
    )
    for column in ("shard", "job", "scheduler", "run", "rows", "failed", "folder"):
        table.add_column(column, justify="right" if column in ("rows", "failed") else "left")
    for s in states:
        table.add_row(
            str(s.shard),
            s.job.job_id if s.job else "—",
            s.scheduler or "—",
            escape(s.problem) if s.problem else (s.run_state or "not started"),
            f"{s.rows}/{s.cases}",
            str(s.failed),
            escape(str(s.folder.name)) if s.folder else "—",
        )
    stdout.print(table)
    missing = sum(s.missing for s in states)
    total = sum(s.cases for s in states)
    stdout.print(
        f"{total - missing} of {total} cases have a row; merged run: {submission.output}"
        + ("" if Path(submission.output).exists() else " (not yet written)"),
        markup=False,
        highlight=False,
    )
    if missing:
        stdout.print(
            f"rerun what is missing, wait and merge: attnbench submit --resume {submission.folder}", markup=False
        )


def _resume(folder: Path, no_wait: bool, *, plots: bool) -> int:
    from attnbench.cluster.jobarray import active, submit_shards
    from attnbench.cluster.submission import load_submission

    submission = load_submission(folder)
    t0 = time.monotonic()
    states, tasks = _states(submission)
    running = {s.shard.index for s in states if s.scheduler and active(s.scheduler)}
    broken = [s for s in states if s.problem]
    for s in broken:
        stderr.print(f"shard {s.shard}: its run folder does not read: {s.problem}", markup=False)
    rerun = [s.shard.index for s in states if s.missing and not s.problem and s.shard.index not in running]
    waiting = [t for t in tasks if t.shard in running]
    if rerun:
        submission, new = submit_shards(submission, rerun)
        listed = ", ".join(f"{i}/{submission.shards}" for i in rerun)
        _say(f"resubmitted shard(s) {listed} (missing cases): {_ids(new)}")
        waiting += new
    if waiting and running:
        listed = ", ".join(f"{i}/{submission.shards}" for i in sorted(running))
        _say(f"waiting for shard(s) still queued or running: {listed}")
    if not rerun and not running and not broken:
        _say("every shard's cases have rows; merging")
    if no_wait:
        return 0
    return _wait_and_merge(submission, waiting, t0, plots=plots)
