"""Shared prefixes (``mode: prefix``, issue 52): for each model and prompt, the time until all M requests that share
a P-token prefix have their first token and the memory they hold, with the prefix shared (a cache read by reference,
a state restored from checkpoints) against M independent prefills, both measured in the same row.

Pure Python, torch-free; rows grouped as every other table's (``analysis.scaling.group_curves``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnbench.analysis.scaling import good_evidence, group_curves
from attnbench.results.records import Result

__all__ = ["PrefixPoint", "PrefixTable", "prefix_tables"]


@dataclass(frozen=True)
class PrefixPoint:
    """One prefix row: its model's label, each request's prompt n, and both strategies' time and bytes held."""

    label: str
    n: int
    status: str
    requests: int
    shared_s: float | None = None  # the row's median: the prefix shared, to every request's first token
    independent_s: float | None = None  # M independent prefills, timed in the same row
    shared_bytes: int | None = None
    independent_bytes: int | None = None
    reused: int | None = None  # prefix tokens not computed again per request
    good: bool = False  # the shared timing is evidence enough (``scaling.good_evidence``)

    @property
    def speedup(self) -> float | None:
        """How many times sooner the M first tokens come with the prefix shared."""
        if self.shared_s is None or self.independent_s is None or self.shared_s <= 0:
            return None
        return self.independent_s / self.shared_s

    @property
    def held_over_one(self) -> float | None:
        """The shared strategy's bytes held over one request's (the independent prefills' ÷ M): 1 where the prefix
        costs nothing more than one request, M where nothing is shared."""
        if self.shared_bytes is None or not self.independent_bytes or self.requests < 1:
            return None
        return self.shared_bytes / (self.independent_bytes / self.requests)


@dataclass(frozen=True)
class PrefixTable:
    """The prefix rows of one kind of device, dtype and size."""

    title: str
    points: tuple[PrefixPoint, ...]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _point(label: str, n: int, result: Result) -> PrefixPoint:
    extra, timed = result.extra, result.is_timed
    independent = extra.get("independent_s")
    return PrefixPoint(
        label,
        n,
        result.status,
        result.case.param("requests"),
        result.median_s if timed else None,
        float(independent) if timed and isinstance(independent, int | float) else None,
        _int(extra.get("prefix_held_bytes")),
        _int(extra.get("independent_held_bytes")),
        _int(extra.get("prefix_reused")),
        timed and good_evidence(result),
    )


def prefix_tables(results: Sequence[Result]) -> list[PrefixTable]:
    """One table per group of prefix rows (kind of device, dtype, d_model, layers), rows in the order the results
    first name them, each curve's prompts ascending."""
    tables = []
    for group in group_curves([r for r in results if r.case.mode == "prefix"]):
        title = f"prefix · {group.dtype} · {group.device} · d_model {group.d_model} · layers {group.layers}"
        points = tuple(_point(c.label, n, r) for c in group.curves for n, r in sorted(c.results.items()))
        tables.append(PrefixTable(title, points))
    return tables
