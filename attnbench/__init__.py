"""attnbench: measure recurrent networks against self-attention across sequence lengths, honestly.

The command line is ``attnbench`` (``attnbench --help``). From Python, stored runs read without torch::

    import attnbench as ab
    runs = ab.load_runs(["results/runs/base", "results/runs/head"])
    table = ab.frame(runs).pivot_table(index="model", columns="seq_len", values="median_ms")

and one case is timed as a sweep times it (torch needed): ``row = ab.measure("lstm", seq_len=256, device="cpu")``.

``__all__`` is the public API; breaking it needs a line in CHANGELOG.md. Importing this package stays cheap
(the CLI starts here): the API's modules, and pandas with them, are imported on first use.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Kineto (torch.profiler: the probes' operator names, the kernel counts) writes a "USDT: profiler_start" and a
# "profiler_stop" line to stderr around every profile from torch 2.13 on: noise between a sweep's progress lines.
# 6 is above every level it logs at; read once, when torch loads, so it is set here, before any room of the package
# imports torch. A user's own setting wins.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

__all__ = [
    "Case",
    "History",
    "Result",
    "Run",
    "RunSkipped",
    "StoredRun",
    "__version__",
    "compare",
    "frame",
    "history",
    "load_run",
    "load_runs",
    "measure",
    "samples_frame",
]

# Where each public name lives; imported when first asked for (PEP 562).
_HOMES = {
    "Case": "attnbench.core.cases",
    "History": "attnbench.analysis.history",
    "Result": "attnbench.results.records",
    "Run": "attnbench.results.records",
    "StoredRun": "attnbench.results.store",
    "RunSkipped": "attnbench.api",
    "compare": "attnbench.api",
    "frame": "attnbench.api",
    "history": "attnbench.api",
    "load_run": "attnbench.api",
    "load_runs": "attnbench.api",
    "measure": "attnbench.workflows.measure",
    "samples_frame": "attnbench.api",
}

if TYPE_CHECKING:
    from attnbench.analysis.history import History
    from attnbench.api import RunSkipped, compare, frame, history, load_run, load_runs, samples_frame
    from attnbench.core.cases import Case
    from attnbench.results.records import Result, Run
    from attnbench.results.store import StoredRun
    from attnbench.workflows.measure import measure


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'attnbench' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
