"""What ``attnbench selfcheck`` measured: per op, attnbench's median and each reference timer's, a round at a time.

Raw values only; the verdicts on them are ``analysis.selfcheck``'s. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnbench.core.cases import Case

# The reference timers, by the names tables and verdicts use.
TIMER = "torch.utils.benchmark"
DO_BENCH = "triton do_bench"


@dataclass(frozen=True)
class SelfcheckOp:
    """One op of the fixed list: a bare matmul (``case`` None, ``size`` n) or a model forward (``case``)."""

    name: str
    dtype: str
    case: Case | None = None
    size: int | None = None

    @property
    def shape(self) -> str:
        if self.case is None:
            return f"{self.size}×{self.size} · {self.size}×{self.size}"
        c = self.case
        heads = "" if c.heads is None else f" h={c.heads}"
        return f"b={c.batch} n={c.seq_len} d={c.d_model}{heads}"


@dataclass(frozen=True)
class OpTimings:
    """One op's medians, one per round: attnbench's, and each reference timer's (``(timer, medians)`` pairs)."""

    op: SelfcheckOp
    ours_s: tuple[float, ...] = ()
    references: tuple[tuple[str, tuple[float, ...]], ...] = ()
    skipped: str = ""  # why the op could not run here
    # True when the time budget, not the evidence, ended its rounds (a round that could not fit was not started).
    cut_short: bool = False


@dataclass(frozen=True)
class SelfcheckTimings:
    device: str
    device_name: str
    torch: str
    threads: int
    rounds: int
    timers: tuple[str, ...]  # the references used, in column order
    ops: tuple[OpTimings, ...]
    notes: tuple[str, ...] = ()
    budget_s: float | None = None  # the wall-time bound it ran within (None: none)
    elapsed_s: float | None = None  # the wall time its rounds took
