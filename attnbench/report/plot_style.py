"""What every plot of a run shares: the colours and markers, a device's name, a file-name slug, and stored text made
plain before a figure is drawn (``plain_texts``)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from attnbench.core.text import safe_text
from attnbench.results.records import Run

if TYPE_CHECKING:
    from matplotlib.figure import Figure

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
    return f"{name} (CPU, {threads} thread{'' if threads == 1 else 's'})" if threads else f"{name} (CPU)"


def line_style(index: int) -> tuple[str, str, str]:
    """Colour, marker and line style of the row with colour index ``index``."""
    return COLOURS[index % len(COLOURS)], MARKERS[index % len(MARKERS)], "-" if index < len(COLOURS) else "--"


def plain_texts(fig: Figure) -> None:
    """Every text of ``fig`` shown as it was typed, whatever a stored run put in it (a model's name, a label, a run
    id), called before the figure is drawn: a control character becomes a visible escape (``safe_text``; matplotlib
    would hand ESC and BEL, glyphs no font has, to its missing-glyph warning, which reaches the terminal raw), and a
    ``$`` a dollar sign (``\\$``), not the start of mathtext, where an unknown command stops the drawing."""
    from matplotlib.text import Text

    for text in fig.findobj(Text):
        raw = text.get_text()
        shown = safe_text(raw).replace("$", r"\$")
        if shown != raw:
            text.set_text(shown)
