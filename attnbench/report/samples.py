"""``--format samples``: every raw timing sample of a run in long form, one row per sample. Torch-free.

results.jsonl already keeps the raw samples, but nested in each row; this flattens them for pandas, R or a
spreadsheet. Columns: the run id, the case key and its fields, the case's status, the sample's index, its
``seconds`` (per call: a sample averages ``calls_per_sample`` back-to-back calls) and ``calls_per_sample``.

Containers, chosen by the output file's name so that the same command always writes the same thing:
- JSON lines (the default, and what ``-o -`` prints): one object per line, floats at full precision;
- ``-o FILE.csv``: CSV with the same columns;
- ``-o FILE.parquet``: Parquet (``report.frames``), only where pyarrow is importable (an optional dependency;
  without it this is an error with a hint, never a JSON file under a .parquet name).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Iterator, Sequence
from typing import Any

from attnbench.core.text import csv_cell
from attnbench.report.rows import CASE_COLUMNS, case_columns, options_text
from attnbench.results.records import Result, Run

COLUMNS: tuple[str, ...] = (
    "run_id",
    "key",
    *CASE_COLUMNS,
    "options",
    "status",
    "sample",
    "seconds",
    "calls_per_sample",
)


def sample_rows(run: Run, results: Sequence[Result]) -> Iterator[dict[str, Any]]:
    """One dict per raw sample, cases in run order, samples in the order they were taken (index from 0)."""
    for r in results:
        m = r.measurement
        if m is None:
            continue
        c = r.case
        fixed = {
            "run_id": run.run_id,
            "key": c.key,
            **case_columns(c),
            "options": options_text(c),
            "status": r.status,
        }
        for index, seconds in enumerate(m.samples_s):
            yield {**fixed, "sample": index, "seconds": seconds, "calls_per_sample": m.calls_per_sample}


def render_samples_jsonl(run: Run, results: Sequence[Result]) -> str:
    return "".join(json.dumps(row, allow_nan=False) + "\n" for row in sample_rows(run, results))


def render_samples_csv(run: Run, results: Sequence[Result]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
    writer.writeheader()
    # repr() of a float round-trips exactly, so a CSV reader gets back the very seconds that were measured.
    # Text cells a spreadsheet would run as a formula are neutralised (core.text.csv_cell); numbers pass unchanged.
    rows = sample_rows(run, results)
    writer.writerows({k: ("" if v is None else csv_cell(v)) for k, v in row.items()} for row in rows)
    return out.getvalue()
