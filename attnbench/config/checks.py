"""Checks any section of a config may need: names from a closed set, no repeats, lengths inherited from the grid.

Below ``options``, ``decoding``, ``users`` and ``experiment``, which all use them; it imports only the schema and
``messages``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from attnbench.config.messages import Context, Path_, did_you_mean
from attnbench.config.model import GridModel
from attnbench.core.cases import KEY_SEPARATORS
from attnbench.core.units import MAX_INTEGER

__all__ = ["check_names", "check_option_value", "check_unique", "inherited_lengths"]


def check_names(values: list[str], allowed: Sequence[str], what: str, path: Path_, ctx: Context) -> None:
    """Every name in ``values`` is one of ``allowed``, and none is listed twice."""
    for i, value in enumerate(values):
        if value not in allowed:
            raise ctx.error(
                f"unknown {what} {value!r}; valid: {', '.join(allowed)}",
                ctx.item(path, i),
                hint=did_you_mean(value, allowed),
            )
    check_unique(values, what, path, ctx)


def check_option_value(value: Any, what: str, path: Path_, ctx: Context) -> None:
    """A model option's name or value that every stored row can hold and read back: a number finite and at most
    ``MAX_INTEGER`` in size (the bound of every reader; ``.inf`` is not JSON), text without the characters a case's
    key is joined with (``name=value|name=value``: two cases would share one key)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        if not math.isfinite(value) or abs(value) > MAX_INTEGER:
            shown = json.dumps(value) if math.isfinite(value) and abs(value) < 1e30 else f"{value:g}"
            raise ctx.error(
                f"{what} must be a finite number of at most 2**62 in size, got {shown}",
                path,
                hint="stored rows are read back only within these bounds; give a smaller value",
            )
    elif isinstance(value, str) and any(c in value for c in KEY_SEPARATORS):
        raise ctx.error(
            f"{what} {value!r} holds {' or '.join(repr(c) for c in KEY_SEPARATORS)}, which a case's key "
            "(name=value|…) is joined with",
            path,
            hint="use other characters, e.g. '-' or ':'",
        )


def check_unique(values: Sequence[Any], what: str, path: Path_ | None, ctx: Context) -> None:
    """No value is listed twice (``1`` and ``true`` differ); ``path=None`` (an axis left at its default) passes."""
    seen: set[Any] = set()
    for i, value in enumerate(values):
        if (type(value), value) in seen and path is not None:
            shown = repr(value) if isinstance(value, str) else json.dumps(value)
            raise ctx.error(f"{what} {shown} is listed twice", ctx.item(path, i))
        seen.add((type(value), value))


def inherited_lengths(
    section: str,
    batch: list[int] | None,
    seq_len: list[int] | None,
    grid: GridModel,
    ctx: Context,
    *,
    example_batch: int,
) -> tuple[list[int], list[int]]:
    """A section's batch sizes and lengths (presets, decode), each the grid's where the section leaves it out;
    checked for repeats at whichever key they came from."""
    batches = batch or grid.batch
    if batches is None:
        raise ctx.error(
            f"{section} need{'s' * (section == 'decode')} batch sizes: the grid has tokens, not batch, to inherit",
            (section,),
            hint=f"add {section}.batch, e.g. batch: [{example_batch}]",
        )
    lengths = seq_len or grid.seq_len
    check_unique(batches, "batch", (section, "batch") if batch is not None else ("grid", "batch"), ctx)
    check_unique(lengths, "seq_len", (section, "seq_len") if seq_len is not None else ("grid", "seq_len"), ctx)
    return batches, lengths
