"""``history --fail-on-step`` and ``--bisect``: the alert for the steps the newest run confirmed, as markdown for an
issue or a job summary, and where to look for each step's commit. Values in, text out."""

from __future__ import annotations

from collections.abc import Sequence

from attnbench.analysis.alerts import StepEvent
from attnbench.analysis.bisect import BisectHint
from attnbench.analysis.history import History, run_name
from attnbench.core.text import md_code, md_text
from attnbench.core.units import format_change, format_change_interval, plural
from attnbench.report.history_md import METRIC_WORDS, SHIFT_LABEL, step_verdict
from attnbench.results.store import StoredRun

ALERT_MARKER = "<!-- attnbench-history-alert -->"  # lets a workflow find and update its own issue

# What a bisect hint is for an event: the commands, or a sentence saying why there is nothing to bisect.
Where = BisectHint | str


def event_label(event: StepEvent) -> str:
    return f"{SHIFT_LABEL}, {plural(event.cases, 'case')}" if event.case is None else event.case.label


def run_cell(stored: StoredRun, position: int) -> str:
    """``9. run-09 · `c696c51e0123` · 20261203-103257-…``: position, name, commit and id of a run."""
    commit = f" · `{stored.run.commit[:12]}`" if stored.run.commit else ""
    return f"{position}. {md_text(run_name(stored))}{commit} · {md_text(stored.run.run_id)}"


def _rows(events: Sequence[StepEvent]) -> list[str]:
    lines = ["| case | change | 95 % CI | first bad run | last good run |", "| --- | --- | --- | --- | --- |"]
    for e in events:
        cells = [
            md_text(event_label(e)),
            f"{format_change(e.step.change)} {step_verdict(e.step, e.metric)}",
            format_change_interval(e.step.low, e.step.high),
            run_cell(e.first_bad, e.position),
            run_cell(e.last_good, e.good_position),
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return lines


def where_lines(event: StepEvent, where: Where) -> list[str]:
    """The bisect hint of one step, as markdown lines."""
    head = f"- **{md_text(event_label(event))}**"
    if isinstance(where, str):
        return [f"{head}: {where}."]
    count = "" if where.commits is None else f" ({len(where.commits)} commit{'s' if len(where.commits) != 1 else ''})"
    lines = [f"{head}: commits `{where.range}`{count}; bisect on {md_code(where.case.label)}:", "", "  ```bash"]
    return [*lines, f"  {where.start}", f"  {where.run}", "  git bisect reset", "  ```"]


def render_alert(history: History, events: Sequence[StepEvent], where: Sequence[Where]) -> str:
    """The alert: what the newest run confirmed, each step's size and interval, the first bad and last good run with
    their commits, and where to look."""
    newest = history.runs[-1]
    n = len(events)
    commit = f" (`{newest.run.commit[:12]}`)" if newest.run.commit else ""
    lines = [
        ALERT_MARKER,
        f"## attnbench history: a new step in {n} case{'s' if n != 1 else ''} — {METRIC_WORDS[history.metric]}",
        "",
        f"The newest run, **{md_text(run_name(newest))}**{commit}, confirms {'a step' if n == 1 else f'{n} steps'} "
        "that the runs before it did not show (a level moved by more than the noise between runs; two runs at the new "
        "level confirm it):",
        "",
        *_rows(events),
        "",
        "### Where to look",
        "",
    ]
    for event, hint in zip(events, where, strict=True):
        lines += where_lines(event, hint)
    lines += [
        "",
        "A run-level step moved every case together: a change of machine, load or software as often as of code. "
        "The bisect command sweeps one case at each commit and compares it with the last good run "
        "(exit 0 good, 1 bad, 125 skip).",
    ]
    return "\n".join(lines) + "\n"


def render_bisect(events: Sequence[StepEvent], where: Sequence[Where]) -> str:
    """``history --bisect``: each step that made things worse and where to look for it."""
    if not events:
        return "No step made things worse: nothing to bisect.\n"
    lines = ["## Where to look", "", *_rows(events), ""]
    for event, hint in zip(events, where, strict=True):
        lines += where_lines(event, hint)
    return "\n".join(lines) + "\n"
