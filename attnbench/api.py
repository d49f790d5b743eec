"""The Python API: stored runs as values and as pandas DataFrames, for notebooks and scripts. Torch-free.

    import attnbench as ab
    runs = ab.load_runs(["results/runs/base", "results/runs/head"])
    df = ab.frame(runs)
    df.pivot_table(index="model", columns="seq_len", values="median_ms")

What is public is ``attnbench.__all__``; a change that breaks it needs a line in CHANGELOG.md.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from attnbench.analysis.compare import Comparison, Policy, compare_paths
from attnbench.analysis.history import History, Metric, build_history
from attnbench.analysis.thresholds import Thresholds, parse_fraction, thresholds_from, with_fail_on
from attnbench.core.errors import AttnbenchError, ResultsError
from attnbench.report import frames
from attnbench.results import store
from attnbench.results.store import StoredRun

if TYPE_CHECKING:
    import pandas as pd

RunsLike = StoredRun | str | Path | Iterable[StoredRun | str | Path]


class RunSkipped(UserWarning):
    """``load_runs(..., skip_bad=True)`` left a run folder out: it does not read (the message says why)."""


def load_run(path: str | Path) -> StoredRun:
    """One run folder: its metadata (``.run``), rows (``.results``) and what reading it warned about."""
    return store.load_run(path)


def load_runs(paths: str | Path | Iterable[str | Path], *, skip_bad: bool = False) -> list[StoredRun]:
    """Every run in ``paths`` — each a run folder or a folder of run folders — in the order given. A folder that
    does not read raises ``ResultsError`` naming the file and what is wrong; with ``skip_bad`` it is left out
    with a ``RunSkipped`` warning instead (Python's ``warnings``). What reading a run warned about (a torn last
    line) stays on its ``StoredRun.warnings``."""
    given = [paths] if isinstance(paths, str | Path) else list(paths)
    runs, messages = store.load_runs(given, skip_bad=skip_bad)
    for message in messages:
        if message.startswith(store.SKIPPED):
            warnings.warn(message, RunSkipped, stacklevel=2)
    return runs


def _runs(runs: RunsLike) -> list[StoredRun]:
    if isinstance(runs, StoredRun):
        return [runs]
    if isinstance(runs, str | Path):
        return load_runs(runs)
    out: list[StoredRun] = []
    for item in runs:
        out += [item] if isinstance(item, StoredRun) else load_runs(item)
    if not out:
        raise ResultsError("no runs given", hint="pass run folders, or what load_runs returned")
    return out


def frame(runs: RunsLike) -> pd.DataFrame:
    """One row per case and run: every summary.csv column, typed, each case option as a column, and the run's
    ``run_id``, ``started_utc``, ``git_commit``, ``label`` and ``device_name``. ``runs``: stored runs or paths."""
    return frames.frame(_runs(runs))


def samples_frame(runs: RunsLike) -> pd.DataFrame:
    """One row per raw timing sample (seconds per call), with the run and the case it belongs to."""
    return frames.samples_frame(_runs(runs))


def history(
    runs: RunsLike,
    *,
    metric: Metric = "median",
    cases: str | Iterable[str] = (),
    min_change: float | str = 0.0,
    repo: str | Path | None = None,
) -> History:
    """The runs in history order, cut where the environment changes, with each case's series and step changes
    (``History.cases[i].fit.steps``). ``cases``: a shell pattern on the case key or label, or several;
    ``min_change``: the smallest step reported, a fraction (0.05) or a percentage ("5%")."""
    return build_history(
        _runs(runs),
        metric=metric,
        patterns=_patterns(cases),
        min_change=_fraction(min_change, "min_change"),
        repo=None if repo is None else Path(repo),
    )


def compare(
    base: str | Path,
    current: str | Path,
    *,
    fail_on: str | Iterable[str] = (),
    thresholds: Mapping[str, object] | None = None,
    noise_floor: float | str | None = None,
    allow_mismatch: Iterable[str] = (),
) -> Comparison:
    """CURRENT judged against BASE exactly as ``attnbench compare`` judges them: each a run folder or a folder of
    runs. ``fail_on`` as ``--fail-on`` (``"median:5%"``, ``"peak_mem:10%"``; its gates are judged too),
    ``thresholds`` as a ``--thresholds`` file's mapping, ``noise_floor`` as ``--noise-floor`` (0.05 or "5%").
    ``Comparison.regressed`` and ``.exit_code`` are the CLI's verdict; runs that are not comparable raise
    ``NotComparableError`` (exit 3), a missing base ``NoBaselineError`` (exit 4)."""
    gates = [fail_on] if isinstance(fail_on, str) else list(fail_on)
    limits = (
        thresholds_from(dict(thresholds), Path("thresholds"), gates)
        if thresholds is not None
        else with_fail_on(Thresholds(), gates)
    )
    floor = None if noise_floor is None else _fraction(noise_floor, "noise_floor", below=10.0)
    allowed = [allow_mismatch] if isinstance(allow_mismatch, str) else list(allow_mismatch)
    policy = Policy(thresholds=limits, noise_floor=floor, allow_mismatch=frozenset(allowed))
    return compare_paths(Path(base), Path(current), policy)


def _patterns(cases: str | Iterable[str]) -> tuple[str, ...]:
    """One pattern or several: a string is one pattern, not a list of its characters."""
    if isinstance(cases, str):
        return (cases,)
    patterns = tuple(cases)
    if not all(isinstance(p, str) for p in patterns):
        raise AttnbenchError("cases: give shell patterns as strings", hint='e.g. cases="lstm*" or ["lstm*", "sdpa*"]')
    return patterns


def _fraction(value: object, name: str, *, below: float = 1.0) -> float:
    """A fraction given as a number (0.05) or a percentage ("5%"), in [0, below)."""
    if isinstance(value, str):
        return parse_fraction(value, name, below=below)
    if isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value < below:
        return float(value)
    raise AttnbenchError(f"{name}: {value!r} is not a fraction from 0 to {below}", hint=f'e.g. {name}=0.05 or "5%"')
