"""The published models' section of ``summary.md`` (issue 49): for each model a run's preset rows belong to, the
decode state its whole stack pays per sequence and per token of context, and where its own recurrent mixer crosses
its own attention mixer (``analysis.presets``)."""

from __future__ import annotations

from tabulate import tabulate

from attnbench.analysis.presets import PresetsSection
from attnbench.core.text import md_cell, md_text
from attnbench.core.units import format_bytes

__all__ = ["presets_markdown"]

LEGEND = (
    "Decode state of the whole published stack (every layer, the families' formulas, in the rows' dtype; a 16-bit "
    "model's recurrent memory in float32): what one sequence holds whatever its length, what each token of context "
    "adds, and the total at 8192 and 131072 tokens. Below, where each model's own recurrent mixer crosses its own "
    "attention mixer (one layer of each, as the rows above time them)."
)
CONTEXTS = (8192, 131072)


def presets_markdown(section: PresetsSection | None) -> list[str]:
    """The section's markdown lines; none for a run without published presets' rows."""
    if section is None:
        return []
    rows = []
    for name, state in section.states:
        if state is None:  # said, not dropped: the table lists every model the run has rows of
            rows.append([md_cell(name), "not counted: a mixer's family is not in this release", *[""] * 4])
            continue
        mixers = ", ".join(f"{m.label} × {m.layers}" for m in state.mixers)
        rows.append(
            [
                md_cell(name),
                md_cell(mixers),
                format_bytes(state.per_sequence_bytes),
                format_bytes(state.per_token_bytes),
                *(format_bytes(state.at(n)) for n in CONTEXTS),
            ]
        )
    headers = ["model", "layers", "per sequence", "per token", *(f"at n={n}" for n in CONTEXTS)]
    lines = ["", "## Published models: decode state and their own crossovers", "", LEGEND, ""]
    lines.append(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    if section.crossings:
        lines += [""] + [f"- {md_text(c.text())}" for c in section.crossings]
    return lines
