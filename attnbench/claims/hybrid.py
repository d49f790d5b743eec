"""Where a hybrid stack sits between its members: a note beside the article's claims, which are about an RNN and
attention and say nothing of a mix of them.

For each hybrid stack and mode, at the longest length where the stack and every member of its pattern ran as
models of their own with the same shape (dtype, device, batch, n, d_model, layers), the note gives the stack's
median beside its members', and what the mix of them predicts: each member's time weighted by its share of the
stack's blocks (a 3:1 stack is ¾ of the one and ¼ of the other). A stack faster than that mix shares work its
members do apart (or its members' times include a per-model cost it pays once); slower, it pays for something
the mix does not (a state handed between different kinds of block, more kernels).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from attnbench.core.cases import Case
from attnbench.core.units import format_seconds
from attnbench.families.catalogue import HYBRID, family_of, known
from attnbench.families.hybrid.spec import HybridModel, stack_of
from attnbench.results.records import Result

__all__ = ["Placement", "hybrid_notes", "placements"]

Position = Literal["between", "faster", "slower"]


def _shape(case: Case) -> Case:
    """What a member's row must share with the stack's: everything but the model and its options."""
    return replace(case, model="", options=(), definition=None, heads=None, causal=True)


def _stack(case: Case) -> HybridModel | None:
    """The hybrid stack ``case`` defines, or None (a built-in model's case, a user's)."""
    return stack_of(case) if known(case) and family_of(case) is HYBRID else None


@dataclass(frozen=True)
class Placement:
    """One hybrid stack's row beside its members' rows at the same shape, and the mix of them it is held to."""

    row: Result
    members: dict[str, Result]
    share: dict[str, int]  # blocks of the pattern each member fills

    @property
    def mix_s(self) -> float:
        """Each member's median weighted by its share of the stack's blocks."""
        total = sum(self.share.values())
        return sum(self.members[m].median_s * n / total for m, n in self.share.items())

    @property
    def position(self) -> Position:
        times = [r.median_s for r in self.members.values()]
        if self.row.median_s < min(times):
            return "faster"
        return "slower" if self.row.median_s > max(times) else "between"

    def text(self) -> str:
        where = {"between": "between its members", "faster": "faster than every member"}
        pattern = ", ".join(f"{n}×{m}" for m, n in self.share.items())
        beside = ", ".join(f"{m} {format_seconds(r.median_s)}" for m, r in self.members.items())
        case = self.row.case
        return (
            f"{case.model} ({pattern}) {case.mode} n={case.seq_len} b={case.batch}: "
            f"{format_seconds(self.row.median_s)}, {where.get(self.position, 'slower than every member')} ({beside}); "
            f"the mix of its members by their share of its blocks predicts {format_seconds(self.mix_s)} "
            f"({self.row.median_s / self.mix_s:.2f}× that)"
        )


def placements(results: Sequence[Result]) -> list[Placement]:
    """One placement per hybrid stack and mode that has its members beside it (see the module notes)."""
    timed = [r for r in results if r.is_timed]
    plain = {(r.case.model, _shape(r.case)): r for r in timed if r.case.definition is None}
    found: list[Placement] = []
    stacks = sorted({(r.case.model, r.case.mode) for r in timed if _stack(r.case) is not None})
    for name, mode in stacks:
        rows = [r for r in timed if r.case.model == name and r.case.mode == mode and _stack(r.case) is not None]
        for row in sorted(rows, key=lambda r: (r.case.seq_len, r.case.batch), reverse=True):
            stack = _stack(row.case)
            assert stack is not None
            share = dict(Counter(stack.pattern))
            members = {m: plain.get((m, _shape(row.case))) for m in share}
            if all(r is not None for r in members.values()):
                found.append(Placement(row, {m: r for m, r in members.items() if r is not None}, share))
                break
    return found


def hybrid_notes(results: Sequence[Result]) -> tuple[str, ...]:
    """The placements as the claims report's notes."""
    return tuple(p.text() for p in placements(results))
