"""``--format json``: run metadata plus the summary rows, for scripts."""

from __future__ import annotations

import json

from attnbench.analysis.reading import Reading
from attnbench.report.rows import summary_rows


def render_json(reading: Reading) -> str:
    """The run's metadata and its summary rows, as the CSV holds them."""
    payload = {"run": reading.run.to_dict(), "rows": summary_rows(reading.results, reading.peaks)}
    return json.dumps(payload, indent=2, allow_nan=False) + "\n"
