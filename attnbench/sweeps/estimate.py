"""How long a sweep's cases will likely take, told before any is measured (``sweep --dry-run``, issue 51).

``timing.max_case_s`` bounds a case, and the cases times that bound is what a sweep can cost at most; but a config
whose slowest cases need a large budget (serving-cpu's capacity steps: 20 s) charged every fast case the same, and
said "up to 58 min" for a sweep that took 9. The likely time counts each case as what it should take instead:

- the case's own duration in the newest earlier run of the same config on the same device under ``--out``, when
  there is one (building, warm-up, sampling and the memory pass: everything its row's ``duration_s`` holds);
- otherwise a case that converges: half the longest warm-up, the shortest sampling and ``CASE_OVERHEAD_S``,
  never above ``max_case_s`` (with ``timing.rounds``, each round's share, a warm-up a round); a capacity case
  searches a batch over the whole memory budget and times a step that touches all of it, and spends its budget,
  so it is counted at ``max_case_s``.

Torch-free: it reads the config's policy and stored rows only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.errors import ResultsError
from attnbench.host.devices import device_slug
from attnbench.results.store import load_run
from attnbench.sweeps.rounds import block_policy

__all__ = ["CASE_OVERHEAD_S", "SweepEstimate", "case_guess_s", "estimate_sweep"]

# Building the model and inputs, the probe and the memory pass around a converging case: 0.3–0.8 s a case in the
# lab's committed CPU runs (results/), whose converging cases took 0.1–2 s in all.
CASE_OVERHEAD_S = 0.5


@dataclass(frozen=True)
class SweepEstimate:
    """The likely time of a sweep's cases, the most their warm-up and sampling may take, and what it rests on."""

    likely_s: float
    most_s: float
    earlier_run: str | None = None  # the run folder whose durations it used
    known: int = 0  # how many of the cases that run timed


def case_guess_s(case: Case, timing: TimingPolicy) -> float:
    """What a case with no earlier duration should take (module notes)."""
    if case.mode == "capacity":
        return timing.max_case_s
    return min(timing.max_case_s, timing.warmup_max_s / 2 + timing.min_time_s + CASE_OVERHEAD_S)


def _rounds_guess_s(case: Case, timing: TimingPolicy) -> float:
    """A case with no earlier duration, in ``timing.rounds`` blocks of a round's share (``sweeps.rounds``)."""
    if timing.rounds <= 1:
        return case_guess_s(case, timing)
    return timing.rounds * case_guess_s(case, block_policy(timing))


def _earlier_durations(out: Path, name: str, device: str) -> tuple[str | None, dict[str, float]]:
    """The newest run folder in ``out`` a sweep of config ``name`` on ``device`` wrote, and its rows' durations by
    case key; nothing where there is none or it does not read (an estimate is never worth an error)."""
    pattern = re.compile(rf"^\d{{8}}-\d{{6}}-{re.escape(name)}-{re.escape(device_slug(device))}(-\d+)?$")
    try:
        folders = sorted(p for p in out.iterdir() if pattern.match(p.name) and p.is_dir() and not p.is_symlink())
    except OSError:
        return None, {}
    for folder in reversed(folders):
        try:
            stored = load_run(folder)
        except ResultsError:
            continue
        found = {r.case.key: r.duration_s for r in stored.results if r.duration_s is not None and r.duration_s > 0}
        if found:
            return folder.name, found
    return None, {}


def estimate_sweep(
    todo: Sequence[Case], timing: TimingPolicy, *, out: Path, name: str, device: str, workers: int = 1
) -> SweepEstimate:
    """The likely and the longest time of ``todo`` (module notes); ``workers`` share the cases (``--devices``)."""
    earlier, durations = _earlier_durations(out, name, device)
    known = [durations[c.key] for c in todo if c.key in durations]
    # timing.rounds: each case is visited that many times, each visit warming up again on its share of the budget.
    guessed = sum(_rounds_guess_s(c, timing) for c in todo if c.key not in durations)
    share = timing.processes / max(1, workers)  # a stored duration already holds every process of its case
    return SweepEstimate(
        sum(known) / max(1, workers) + guessed * share,
        len(todo) * timing.max_case_s * share,
        earlier if known else None,
        len(known),
    )
