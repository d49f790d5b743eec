"""What every plot of a run shares: the colours and markers, a device's name, a file-name slug."""

from __future__ import annotations

import re

from attnbench.core.text import safe_text
from attnbench.results.records import Run

# matplotlib's tab10, spelled out so colours are fixed without importing a colormap.
COLOURS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)
MARKERS = ("o", "s", "^", "D", "v", "P", "*", "h", "<", ">")


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "run"


def device_name(run: Run) -> str:
    env = run.environment
    if env.get("gpu_name"):
        return safe_text(str(env["gpu_name"]), lines=False)
    name = safe_text(str(env.get("cpu_model") or env.get("device") or "?"), lines=False)
    threads = env.get("torch_threads")
    return f"{name} (CPU, {threads} threads)" if threads else f"{name} (CPU)"


def line_style(index: int) -> tuple[str, str, str]:
    """Colour, marker and line style of the row with colour index ``index``."""
    return COLOURS[index % len(COLOURS)], MARKERS[index % len(MARKERS)], "-" if index < len(COLOURS) else "--"
