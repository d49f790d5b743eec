"""``attnbench history`` as a library call: the runs read (``results.store``), their history built and its steps
found (``analysis.history``, ``analysis.alerts``), where to look for each step's commit (the run's own config
narrowed to one case: ``config``, the room that may read it; git through ``analysis.bisect``), and the panels, the
bisect hints and the alert rendered (``report``). The command is handed one frozen ``Traced`` and only prints it.
Torch-free."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnbench.analysis.alerts import StepEvent, alert_steps, representative_case, step_events
from attnbench.analysis.bisect import bisect_hint, bisectable, gates_for, noise_floor_for, one_case_sets
from attnbench.analysis.history import History, Metric, build_history
from attnbench.analysis.thresholds import parse_fraction
from attnbench.core.errors import AttnbenchError
from attnbench.core.text import md_code, md_text
from attnbench.core.units import format_percent
from attnbench.report.alerts_md import ALERT_MARKER, Where, render_alert, render_bisect
from attnbench.report.formats import HistoryView
from attnbench.results.files import refuse_foreign
from attnbench.results.store import load_runs

if TYPE_CHECKING:
    from attnbench.report.history_plots import HistoryPlot


@dataclass(frozen=True)
class HistoryRequest:
    """What ``history`` is asked: the run folders (or folders of them) and how to read them; ``figures``: draw the
    panels (an HTML page embeds them; ``plots_dir`` is where they are written); ``bisect``: where to look for each
    step that made things worse; ``alerts``: the steps the newest run confirmed (``--fail-on-step``), found too when
    ``alert`` names the file their alert replaces (one this command wrote), which is removed when there is none."""

    runs: tuple[Path, ...]
    metric: Metric = "median"
    patterns: tuple[str, ...] = ()
    min_change: str | None = None
    repo: Path | None = None
    skip_bad: bool = False
    figures: bool = False
    plots_dir: Path | None = None
    bisect: bool = False
    alerts: bool = False
    alert: Path | None = None


@dataclass(frozen=True)
class Traced:
    """What ``history`` shows: the view its formats render, the run folders it read (no output goes into one), the
    warnings, why there are no panels (``notice``) or the panels written, the bisect hints (markdown, with
    ``bisect``) and the alert (markdown, when the newest run confirmed ``confirmed`` steps that made things
    worse)."""

    view: HistoryView
    reads: tuple[Path, ...]
    warnings: tuple[str, ...] = ()
    notice: str | None = None
    wrote: tuple[Path, ...] = ()
    bisect: str | None = None
    alert: str | None = None
    confirmed: int = 0


def trace(request: HistoryRequest) -> Traced:
    """Read the runs, build their history, find its steps and render what ``request`` asks for; the panels are
    written to ``plots_dir``, and an earlier alert is removed when the newest run confirmed no step. Prints
    nothing; raises ``AttnbenchError`` on bad input, before anything is written."""
    stored, warnings = load_runs(request.runs, skip_bad=request.skip_bad)
    reads = tuple(s.folder for s in stored)
    if request.alert is not None:  # before anything is written: an alert replaces or removes only an alert
        refuse_foreign(request.alert, reads, flag="--alert", marker=ALERT_MARKER, what="an alert", hint=ALERT_HINT)
    change = 0.0 if request.min_change is None else parse_fraction(request.min_change, "--min-change")
    patterns, repo = request.patterns, request.repo
    history = build_history(stored, metric=request.metric, patterns=patterns, min_change=change, repo=repo)
    worse = [e for e in step_events(history) if e.worse] if request.bisect else []
    fresh: list[StepEvent] = []
    if request.alerts or request.alert is not None:
        fresh = alert_steps(stored, history, patterns=patterns, min_change=change, repo=repo)
    # Where to look for a step's commit runs git and reads the run's config: once per step, though --bisect and the
    # alert both name it.
    wheres: dict[tuple[str, int, int], Where] = {}
    for event in [*worse, *fresh]:
        if _place(event) not in wheres:
            wheres[_place(event)] = where_to_look(history, event, repo)
    pictures: list[HistoryPlot] = []
    notice: str | None = None
    if request.figures or request.plots_dir is not None:  # matplotlib and the run plots' modules only then
        from attnbench.report.history_plots import panels_or_notice

        pictures, notice = panels_or_notice(history)
    bisect = render_bisect(worse, [wheres[_place(e)] for e in worse]) if request.bisect else None
    alert = render_alert(history, fresh, [wheres[_place(e)] for e in fresh]) if fresh else None
    wrote: list[Path] = []
    if request.plots_dir is not None:
        from attnbench.report.plots import write_plots

        wrote = write_plots(pictures, request.plots_dir)
    if request.alert is not None and alert is None and request.alert.exists():
        request.alert.unlink()  # an alert of an earlier history must not be posted again (refuse_foreign: ours)
    view = HistoryView(history, [(p.filename, p.png) for p in pictures])
    return Traced(view, reads, (*warnings, *history.warnings), notice, tuple(wrote), bisect, alert, len(fresh))


def _place(event: StepEvent) -> tuple[str, int, int]:
    """A step's place in the history: the case (or the run-level shift), its segment and the run it starts at."""
    return event.key, event.segment, event.position


ALERT_HINT = (
    "--alert names the alert's own file: a new one, or one an earlier 'history --alert' wrote, which is replaced "
    "when the newest run confirms a step and removed when it does not"
)


def where_to_look(history: History, event: StepEvent, repo: Path | None) -> Where:
    """The bisect hint for ``event``, or a sentence saying why there is nothing to bisect. The one-case overrides
    are checked against the run's own config here (a workflow may read configs; analysis may not)."""
    good, bad = event.last_good.run.commit, event.first_bad.run.commit
    if not good or not bad:
        return "the runs record no commit (sweep inside a git checkout to bisect)"
    if good == bad:
        return (
            f"both runs measured commit `{good[:12]}`, so the step is not in the code: the machine, its load or its "
            "software changed"
        )
    case = representative_case(history, event)
    if case is None:
        return "no case of the step has a value on both sides to sweep"
    # One process a side at each commit: the spread the history measured between its runs of this case, or the
    # machine's calibrated floor the last good run recorded, whichever is wider.
    floor = noise_floor_for(history, event.segment, case, event.step)
    recorded = event.last_good.run.calibration
    if floor is not None and recorded is not None and recorded.noise is not None:
        floor = max(floor, recorded.noise.floor)
    run = event.first_bad.run
    hint = None
    if bisectable(event.step.change, floor):
        hint = bisect_hint(
            case,
            good,
            bad,
            config=None if run.config_source.startswith("builtin:") else run.config_source,
            baseline=event.last_good.folder.resolve(),
            gates=gates_for(event.metric, event.step.change),
            noise_floor=floor,
            python=sys.executable,
            repo=repo,
        )
    from attnbench.config.experiment import load_experiment_text, resolved_text  # pydantic: only for a step

    try:
        # The hint holds only if the run's config, as stored (its users key says what each model the user brought
        # was), narrowed by the hint's overrides gives the one case; when it does not, that is what is said.
        stored = resolved_text(run.config)
        pinned = load_experiment_text(stored, run.config_source, one_case_sets(case), force=True, stored=True)
        keys = [c.key for c in pinned.cases(case.device)]
    except AttnbenchError as exc:
        keys, why = [], exc.message
    else:
        why = f"it gives {len(keys)} cases"
    if keys != [case.key]:
        return (
            f"commits `{good[:12]}..{bad[:12]}`; the config cannot be narrowed to {md_code(case.label)} alone "
            f"({md_text(why)})"
        )
    if hint is None:
        return (
            f"commits `{good[:12]}..{bad[:12]}`; one run a commit cannot bisect this step of "
            f"{format_percent(event.step.change)}: {md_code(case.label)} moved ±{format_percent(floor or 0)} between "
            "two runs here, more than the room between half the step and the whole; sweep with timing.processes "
            "(e.g. 5) to bisect by hand"
        )
    return hint
