"""Capacity under a memory budget (``mode: capacity``, issue 41): for each model and context n, the batch whose decode
step fits the budget, the bytes each sequence adds, and the tokens per second all of them decode together; and from
which n a recurrent model serves more tokens per second than attention does.

Pure Python, torch-free. The curves and their crossovers are ``analysis.scaling``'s (``group_curves``; a capacity
row's time per token is its step's median over the batch it found, ``Result.tokens_per_call``), so the table, the
plot (``report.capacity_plots``) and the crossover lines describe the same rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnbench.analysis.scaling import (
    LEFT_OUT,
    SLOWER,
    Crossover,
    CrossoverLine,
    CurveGroup,
    crossovers,
    good_evidence,
    group_crossover_lines,
    group_curves,
)
from attnbench.core.units import format_bytes
from attnbench.results.records import Result

__all__ = ["CapacityCurve", "CapacityPoint", "CapacityTable", "capacity_tables"]


@dataclass(frozen=True)
class CapacityPoint:
    """One model at one context n: the batch found and the aggregate tokens/s at it, or why there is none."""

    n: int
    status: str
    batch: int | None = None
    bytes_per_sequence: int | None = None
    tokens_per_s: float | None = None
    capped: bool = False  # a lower bound: the search's largest batch, or one that did not settle
    good: bool = False  # the timing is evidence enough for a crossover (``scaling.good_evidence``)

    @property
    def untimed(self) -> bool:
        """The batch was found (memory) but its step has no timing (``status`` says why: too slow, an error)."""
        return self.batch is not None and self.tokens_per_s is None


@dataclass(frozen=True)
class CapacityCurve:
    """One model's capacity along n (a row of the table, a line of the plot)."""

    label: str
    model: str
    points: tuple[CapacityPoint, ...]


@dataclass(frozen=True)
class CapacityTable:
    """The capacity rows of one kind of device, dtype and size, under one budget."""

    title: str
    budget_bytes: int | None  # None: the rows measured none (every one failed before the search)
    seq_lens: tuple[int, ...]
    curves: tuple[CapacityCurve, ...]
    # Each attention curve against each recurrent (or hybrid) one: where tokens/s at capacity cross.
    crossings: tuple[CrossoverLine, ...]

    @property
    def crossovers(self) -> tuple[str, ...]:
        """Each pair's crossover in words; where no length of a pair is evidence enough (noisy or timed on a busy
        machine), what every timed length says, marked indicative: a capacity's batches differ by orders of
        magnitude, which the noise of a shared machine does not turn around."""
        return tuple(line.text if line.seq_lens else self._indicative(line) for line in self.crossings)

    def crossing_points(self) -> list[tuple[float, bool, str]]:
        """Where tokens/s cross, for the plot: (n, indicative, the pair's later curve: the recurrent one) of every
        crossing of every pair."""
        points = [(c.x, False, line.b) for line in self.crossings for c in line.crossings]
        for line in self.crossings:
            if not line.seq_lens:
                points += [(c.x, True, line.b) for c in self._rates_cross(line)[1]]
        return points

    def _rates_cross(
        self, line: CrossoverLine
    ) -> tuple[list[int], list[Crossover], dict[int, float], dict[int, float]]:
        """The lengths both curves of ``line`` timed, where their tokens/s cross, and the two rates by length."""
        rates = {c.label: {p.n: p.tokens_per_s for p in c.points if p.tokens_per_s} for c in self.curves}
        a, b = rates.get(line.a, {}), rates.get(line.b, {})
        ns = sorted(set(a) & set(b))
        found = crossovers(ns, [1 / a[n] for n in ns], [1 / b[n] for n in ns]) if ns else []
        return ns, found, a, b

    def _indicative(self, line: CrossoverLine) -> str:
        ns, found, a, b = self._rates_cross(line)
        if not ns:
            return line.text
        if found:
            parts = []
            for c in found:
                faster, slower = (line.b, line.a) if c.direction == SLOWER else (line.a, line.b)
                where = f"n ≈ {c.x:.0f} (between {c.low_x:.0f} and {c.high_x:.0f})"
                parts.append(f"{faster} serves more tokens/s under the memory budget than {slower} from {where}")
            text = ", then ".join(parts)
        else:
            more, fewer = (line.a, line.b) if a[ns[0]] > b[ns[0]] else (line.b, line.a)
            text = f"{more} serves more tokens/s than {fewer} throughout n={ns[0]}–{ns[-1]}"
        return f"{text} (indicative: every length's timing is {LEFT_OUT})"


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _point(n: int, result: Result) -> CapacityPoint:
    """The capacity is a measurement of memory, found before the step was timed: a row whose timing ran out of
    budget (or otherwise failed after the search) still holds the batch it found, and keeps it here; only its
    tokens/s is missing, and ``status`` says why."""
    extra = result.extra
    timed = result.is_timed
    return CapacityPoint(
        n,
        result.status,
        _int(extra.get("capacity_batch")),
        _int(extra.get("bytes_per_sequence")),
        result.tokens_per_s if timed else None,
        # A lower bound either way: the search's largest batch, or one that did not settle (``capacity_unsettled``).
        extra.get("capacity_capped") is True or bool(extra.get("capacity_unsettled")),
        timed and good_evidence(result),
    )


def _budget(group: CurveGroup) -> int | None:
    found = (_int(r.extra.get("memory_budget_bytes")) for c in group.curves for r in c.results.values())
    budgets = [budget for budget in found if budget is not None]
    return max(budgets) if budgets else None


def capacity_tables(results: Sequence[Result]) -> list[CapacityTable]:
    """One table per group of capacity rows (kind of device, dtype, d_model, layers), models in the order the
    results first name them."""
    tables = []
    for group in group_curves([r for r in results if r.case.mode == "capacity"]):
        budget = _budget(group)
        under = f" · budget {format_bytes(budget)}" if budget is not None else ""
        title = f"capacity · {group.dtype} · {group.device} · d_model {group.d_model} · layers {group.layers}{under}"
        curves = tuple(
            CapacityCurve(c.label, c.model, tuple(_point(n, r) for n, r in sorted(c.results.items())))
            for c in group.curves
        )
        tables.append(CapacityTable(title, budget, group.seq_lens, curves, tuple(group_crossover_lines(group))))
    return tables
