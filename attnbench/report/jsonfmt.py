"""``--format json``: run metadata plus the summary rows, for scripts."""

from __future__ import annotations

import json
from collections.abc import Sequence

from attnbench.report.rows import summary_rows
from attnbench.results.records import Result, Run


def render_json(run: Run, results: Sequence[Result]) -> str:
    payload = {"run": run.to_dict(), "rows": summary_rows(results, run)}
    return json.dumps(payload, indent=2, allow_nan=False) + "\n"
