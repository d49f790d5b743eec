"""``attnbench merge SHARD_RUN... -o RUN``: the shards of a sweep joined into one run folder (needs no torch).

Exit codes: 0 merged, 2 refused (different configs, conflicting rows, an incomplete set without --partial, bad
input), 3 the environments are not comparable (unless --allow-mismatch).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from attnbench.cli.common import (
    LATEST_HELP,
    PlotsOpt,
    handles_errors,
    plots_wanted,
    print_warnings,
    print_wrote,
    runs_alias,
    stdout,
)

if TYPE_CHECKING:
    from attnbench.analysis.merge import MergePlan

AllowMismatchOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-mismatch",
        help="Merge although this environment key differs between the runs (repeatable): device_type, cpu_model, "
        "gpu_name, driver_major, torch, torch_cuda, cudnn, torch_threads, packages, attnbench, git_commit.",
        show_default=False,
    ),
]


@handles_errors
def merge(
    runs: Annotated[
        list[Path],
        typer.Argument(
            help=f"Shard run folders (sweep --shard i/N), or folders that hold them; {LATEST_HELP}",
            show_default=False,
            callback=runs_alias,
        ),
    ],
    output: Annotated[Path, typer.Option("-o", "--output", help="The merged run folder to write.", show_default=False)],
    partial: Annotated[
        bool, typer.Option("--partial", help="Merge an incomplete set: say what is missing instead of refusing.")
    ] = False,
    allow_mismatch: AllowMismatchOpt = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Print only the paths written.")] = False,
    plots: PlotsOpt = None,
) -> None:
    """Join the shards of one sweep into one run folder that report, compare and claims read as any run.

    Refuses shards of different configs, a case with two different rows, environments that differ (exit 3,
    unless --allow-mismatch) and, without --partial, an incomplete set. Never writes to its inputs; merging the
    same inputs again gives the same folder.
    """
    from attnbench.workflows import merge as merging

    draw_plots = plots_wanted(plots)
    plan = merging.plan(runs, output, partial=partial, allow_mismatch=allow_mismatch or (), command=tuple(sys.argv))
    print_warnings(plan.warnings)
    merged = merging.write(plan, output, plots=draw_plots)
    if not quiet:
        stdout.print(merge_summary(plan, output), markup=False, highlight=False)
    print_wrote(merged.paths)
    if merged.problem is not None:
        print_warnings([merged.problem])


def merge_summary(plan: MergePlan, output: Path) -> str:
    """What was merged, and what is missing: the lines a person reads after a merge."""
    shards = sorted({str(s.shard) for s in plan.run.merged_from if s.shard is not None})
    what = f"{len(plan.sources)} run(s)" + (f" (shards {', '.join(shards)})" if shards else "")
    total = f" of {plan.expected}" if plan.expected is not None else ""
    lines = [f"merged {what} of {plan.run.config_source}: {len(plan.results)}{total} cases → {output}"]
    hosts = sorted({s.hostname for s in plan.run.merged_from if s.hostname})
    if len(hosts) > 1:
        lines.append(f"measured on {len(hosts)} hosts: {', '.join(hosts)}")
    if plan.duplicates:
        lines.append(f"{plan.duplicates} identical row(s) given twice were kept once")
    lines += [f"allowed: {m.describe('first run', 'another')}" for m in plan.allowed]
    lines += [f"left out: {text}" for text in plan.skipped]
    lines += [f"missing: {gap}" for gap in plan.gaps()]
    if not plan.complete:
        lines.append("partial: the merged run is marked interrupted; rerun the merge once the shards are finished")
    return "\n".join(lines)
