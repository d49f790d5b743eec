"""A merge as a library call: the inputs read and checked (``analysis.merge``), the cases the stored config
expands to (``config``: the room that may read it, so analysis is handed the cases rather than a way to get them),
its summaries and plots rendered once from the plan (``report.run_files``), the folder built beside the output
with them (``results.merged``) and put in place whole. ``attnbench merge`` and ``attnbench submit`` both call it.
Torch-free."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnbench.analysis.merge import MergePlan, plan_merge, read_inputs
from attnbench.analysis.reading import Reading
from attnbench.config.experiment import stored_experiment
from attnbench.core.cases import Case
from attnbench.core.errors import ConfigError
from attnbench.report.run_files import render_run_files
from attnbench.results.files import write_files
from attnbench.results.merged import discard, publish, staging_folder, write_run_folder
from attnbench.results.records import Run
from attnbench.results.store import RESULTS_FILE, RUN_FILE, TELEMETRY_FILE


@dataclass(frozen=True)
class Merged:
    """What a merge wrote: the paths under the output, and the one line to show when plots could not be drawn."""

    paths: tuple[Path, ...]
    problem: str | None


def config_cases(run: Run) -> list[Case] | None:
    """Every case of a stored run's config (on its kind of device), or None when the config no longer reads."""
    try:
        experiment = stored_experiment(run.config, run.config_source)
    except ConfigError:
        return None
    return experiment.cases(str(run.environment.get("device") or "cpu"))


def plan(
    paths: Sequence[Path],
    output: Path,
    *,
    partial: bool = False,
    allow_mismatch: Sequence[str] = (),
    command: Sequence[str] = (),
) -> MergePlan:
    """Read the inputs (run folders, or folders of them), check that they make one run and decide the run written
    to ``output``; nothing is written. Raises what ``analysis.merge`` raises."""
    inputs = read_inputs(paths, output, partial=partial, allow_mismatch=allow_mismatch)
    return plan_merge(inputs, output, expected=config_cases(inputs.config), command=command)


def write(plan: MergePlan, output: Path, *, plots: bool = True) -> Merged:
    """Render the merged run's summaries (and plots) from the plan, build its folder beside ``output`` and put it in
    place of ``output`` whole: a reader sees the earlier merge or this one, never half of one, and a failure leaves
    nothing behind. The run is read once, from the rows the plan holds (what the folder will hold, byte for byte),
    and handed down rendered: nothing below is asked about it again."""
    rendered = render_run_files(Reading(plan.run, plan.results), plots=plots)
    staging = staging_folder(output)
    discard(staging)  # left by an earlier merge of this process id that was killed
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_run_folder(staging, plan.run, plan.results, plan.telemetry)
        written = write_files(staging, rendered.files, rendered.subfolders)
        publish(staging, output)
    except BaseException:
        discard(staging)
        raise
    names = [staging / name for name in (RUN_FILE, RESULTS_FILE, TELEMETRY_FILE)]
    moved = [output / p.relative_to(staging) for p in [*names, *written]]
    return Merged(tuple(p for p in moved if p.exists()), rendered.problem)
