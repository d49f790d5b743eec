"""Stored runs as pandas DataFrames, for notebooks and scripts: one row per case and run, or per raw sample.

``frame`` holds every ``summary.csv`` column (same names, same units: ms, MiB), typed — numbers as numbers
(nullable ``Int64`` for counts, ``float64`` with NaN for measurements), booleans as pandas' nullable
``boolean``, text as ``string`` — plus each case option as a column of its own (named as the option: ``scope``,
``positional``, ``scan``, …; empty where a model has no such option) and what identifies the run: ``run_id``,
``started_utc`` (a UTC timestamp), ``git_commit`` (the benchmarked checkout, when the sweep ran in one),
``label`` and ``device_name`` (the GPU's name, else the CPU model).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench.analysis.reading import Reading
from attnbench.core.errors import AttnbenchError
from attnbench.families.catalogue import MODELS, source_of
from attnbench.report.rows import COLUMN_TYPES, COLUMNS, summary_rows
from attnbench.report.samples import COLUMNS as SAMPLE_COLUMNS
from attnbench.report.samples import sample_rows
from attnbench.results.records import Result, Run
from attnbench.results.store import StoredRun

if TYPE_CHECKING:
    import pandas as pd

# What identifies the run a row came from, first in every frame.
RUN_COLUMNS: tuple[str, ...] = ("run_id", "started_utc", "git_commit", "label", "device_name")
# Every option any model takes, in catalogue order, with its type: a column each in ``frame``. An option name
# means one thing, of one type, in every model that takes it (a test holds the catalogue to that).
OPTION_TYPES: dict[str, type] = {o.name: o.type for spec in MODELS.values() for o in spec.options}
# Options summary.csv already has a column for, resolved (heads_kv: the count, = heads where left at 0), are not
# repeated raw beside it.
OPTION_COLUMNS: tuple[str, ...] = tuple(name for name in OPTION_TYPES if name not in COLUMNS)

_PANDAS_DTYPES = {int: "Int64", float: "float64", bool: "boolean", str: "string"}


def _run_columns(stored: StoredRun) -> dict[str, Any]:
    environment = stored.run.environment
    return {
        "run_id": stored.run.run_id,
        "started_utc": stored.run.created_utc,
        "git_commit": stored.run.commit,
        "label": stored.run.label,
        "device_name": environment.get("gpu_name") or environment.get("cpu_model"),
    }


def frame(runs: Sequence[StoredRun]) -> pd.DataFrame:
    """One row per case and run, runs in the order given, cases in each run's order."""
    import pandas as pd

    rows = []
    own = _user_option_types(runs)
    for stored in runs:
        identity = _run_columns(stored)
        for result, row in zip(stored.results, summary_rows(stored.results, Reading.of(stored).peaks), strict=True):
            options = _typed_options(result.case.options, {**OPTION_TYPES, **own})
            rows.append({**identity, **row, **{name: options.get(name) for name in (*OPTION_COLUMNS, *own)}})
    table = pd.DataFrame(rows, columns=[*RUN_COLUMNS, *COLUMNS, *OPTION_COLUMNS, *own])
    for column, kind in COLUMN_TYPES.items():
        table[column] = table[column].astype(_PANDAS_DTYPES[kind])  # type: ignore[call-overload]
    for name in ("run_id", "git_commit", "label", "device_name"):
        table[name] = table[name].astype("string")
    table["started_utc"] = pd.to_datetime(table["started_utc"], utc=True, format="ISO8601")
    for name, kind in {**OPTION_TYPES, **own}.items():
        table[name] = table[name].astype(_PANDAS_DTYPES[kind])  # type: ignore[call-overload]
    return table


def _typed_options(options: tuple[tuple[str, Any], ...], types: dict[str, type]) -> dict[str, Any]:
    """The options whose value is of its column's type (a user model's option may share a name, not a type)."""
    return {
        name: value
        for name, value in options
        if type(value) is types.get(name) or (types.get(name) is float and type(value) is int)
    }


def _user_option_types(runs: Sequence[StoredRun]) -> dict[str, type]:
    """A column for each option of a user model that no built-in option names, typed by its first value; an
    option whose values disagree in type stays in the options text only."""
    found: dict[str, type] = {}
    mixed: set[str] = set()
    for stored in runs:
        for result in stored.results:
            if source_of(result.case) == "built-in":  # a user's model's options: its own, named by nothing built in
                continue
            for name, value in result.case.options:
                if name in OPTION_TYPES or name in COLUMNS or name in RUN_COLUMNS:
                    continue
                if found.setdefault(name, type(value)) is not type(value):
                    mixed.add(name)
    return {name: kind for name, kind in found.items() if name not in mixed}


def samples_frame(runs: Sequence[StoredRun]) -> pd.DataFrame:
    """One row per raw timing sample: the run, the case (key, fields, options text, status), the sample's index
    in the order taken, its ``seconds`` per call and ``calls_per_sample``."""
    import pandas as pd

    rows = [{**_run_columns(stored), **row} for stored in runs for row in sample_rows(stored.run, stored.results)]
    columns = [*RUN_COLUMNS, *(c for c in SAMPLE_COLUMNS if c != "run_id")]
    table = pd.DataFrame(rows, columns=columns)
    for column in columns:
        kind = COLUMN_TYPES.get(column)
        if column == "seconds":
            table[column] = table[column].astype("float64")
        elif column in ("sample", "calls_per_sample"):
            table[column] = table[column].astype("Int64")
        elif kind is not None:
            table[column] = table[column].astype(_PANDAS_DTYPES[kind])  # type: ignore[call-overload]
        elif column != "started_utc":
            table[column] = table[column].astype("string")
    table["started_utc"] = pd.to_datetime(table["started_utc"], utc=True, format="ISO8601")
    return table


def parquet_missing() -> str | None:
    """Why Parquet cannot be written here, or None when it can."""
    try:
        import pyarrow  # noqa: F401
    except ImportError as exc:
        return f"writing Parquet needs pyarrow ({exc.name or exc} is not installed)"
    return None


def write_parquet(table: pd.DataFrame, path: Path, *, instead: str) -> None:
    """``table`` as a Parquet file; without pyarrow an error whose hint installs it or names ``instead``."""
    reason = parquet_missing()
    if reason is not None:
        raise AttnbenchError(f"-o {path}: {reason}", hint=f"pip install pyarrow, or {instead}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        table.to_parquet(path, index=False)
    except OSError as exc:
        raise AttnbenchError(f"cannot write {path}: {exc.strerror or exc}", hint="choose another -o path") from None


def write_samples_parquet(run: Run, results: Sequence[Result], path: Path) -> None:
    """``report -f samples -o FILE.parquet``: the samples export's columns, as Parquet."""
    import pandas as pd

    table = pd.DataFrame(list(sample_rows(run, results)), columns=list(SAMPLE_COLUMNS))
    table["heads"] = table["heads"].astype("Int64")  # recurrent rows have none; keep the column integer
    write_parquet(table, path, instead="write JSON lines (-o FILE.jsonl) or CSV (-o FILE.csv)")
