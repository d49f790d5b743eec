"""The comparison table people read: rows = model, columns = seq_len, one table per mode/dtype/shape.

Decode rows have tables of their own (their mode differs): columns are then the context length n, a cell the time
of one step, and the speed-ups are against the first recurrent model as everywhere.

Pure Python, derived once per run (``analysis.reading.Reading.tables``), so every renderer draws the same tables. Which
results form a row is ``attnbench.analysis.scaling.group_curves``'s call, so every fitted line and crossover describes
exactly one row of one table.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnbench.analysis.scaling import (
    CrossoverLine,
    Curve,
    CurveGroup,
    ScalingLine,
    asked,
    good_evidence,
    group_crossover_lines,
    group_curves,
    group_scaling_laws,
)
from attnbench.families.catalogue import is_recurrent
from attnbench.results.records import Result


@dataclass(frozen=True)
class Cell:
    result: Result
    speedup: float | None  # baseline median / this median: > 1 means faster than the baseline
    base: Result | None = None  # the baseline row's result this speed-up is against (same batch, same n)
    # The speed-up rests on a time that is no evidence (noisy or contended, either side): a best estimate, shown
    # marked rather than withheld; fits, crossovers and claims still leave it out.
    estimate: bool = False

    @property
    def median_s(self) -> float | None:
        return self.result.median_s if self.result.is_timed else None

    @property
    def noisy(self) -> bool:
        m = self.result.measurement
        return m is not None and m.noisy


@dataclass(frozen=True)
class PivotTable:
    title: str
    seq_lens: tuple[int, ...]
    batch_for_seq: dict[int, int] | None  # set when batch is tied to seq_len (a constant-tokens grid)
    rows: tuple[tuple[str, dict[int, Cell]], ...]
    baseline: str | None
    crossings: tuple[CrossoverLine, ...] = ()  # attention vs recurrent, and every row vs the baseline
    scaling: tuple[ScalingLine, ...] = ()  # how each row's time and peak memory grow with seq_len
    mode: str = ""

    @property
    def decode(self) -> bool:
        """Rows of decode steps: time per token at context n, and the state each step reads."""
        return self.mode == "decode"

    @property
    def crossovers(self) -> tuple[str, ...]:
        """Where the rows' time curves cross, in words."""
        return tuple(line.text for line in self.crossings)

    def is_baseline(self, label: str) -> bool:
        """Whether a row (by its label, which starts with the model) is of the baseline model."""
        return bool(self.baseline) and label.split()[0] == self.baseline


def _speedups(group: CurveGroup, baseline_model: str | None) -> tuple[list[tuple[str, dict[int, Cell]]], bool]:
    """Cells with their speed-up against the first baseline row of the same batch (like with like)."""
    # Like with like: the same batch, and the same serving question (prefill chunk, drafts) where one is asked.
    base_for_batch: dict[tuple[int | None, tuple[tuple[str, int], ...]], Curve] = {}
    for curve in group.curves:
        if baseline_model and curve.model == baseline_model:
            base_for_batch.setdefault((curve.batch, asked(curve)), curve)
    rows = []
    for curve in group.curves:
        ref = base_for_batch.get((curve.batch, asked(curve)))
        base = ref.results if ref is not None and ref is not curve else {}
        cells: dict[int, Cell] = {}
        for n, r in curve.results.items():
            b = base.get(n)
            speedup, estimate = None, False
            if b is not None and b.is_timed and r.is_timed:
                # Per token: the same as per call but where each found its own batch (a capacity row).
                speedup = (b.median_s / b.tokens_per_call) / (r.median_s / r.tokens_per_call)
                estimate = not (good_evidence(b) and good_evidence(r))
            cells[n] = Cell(r, speedup, b if speedup is not None else None, estimate)
        rows.append((curve.label, cells))
    return rows, bool(base_for_batch)


def pivot_tables(results: Sequence[Result], baseline_model: str | None = None) -> list[PivotTable]:
    """Group results by mode/dtype/device/d_model/layers; rows are models (with what else varies)."""
    if baseline_model is None:
        baseline_model = next((r.case.model for r in results if is_recurrent(r.case)), None)
    tables = []
    for group in group_curves(results):
        rows, has_baseline = _speedups(group, baseline_model)
        batch = f", batch {group.batches[0]}" if len(group.batches) == 1 else ""
        if group.mode == "capacity":  # each row times the batch its search found (capacity_batch), not case.batch
            batch = ", batch found per row"
        title = (
            f"{group.mode} · {group.dtype} · {group.device} · d_model {group.d_model}{batch} · layers {group.layers}"
        )
        crossings = tuple(group_crossover_lines(group, baseline_model))
        tables.append(
            PivotTable(
                title=title,
                seq_lens=group.seq_lens,
                batch_for_seq=dict(group.batch_for_seq) if group.batch_for_seq is not None else None,
                rows=tuple(rows),
                baseline=baseline_model if has_baseline else None,
                crossings=crossings,
                scaling=tuple(group_scaling_laws(group)),
                mode=group.mode,
            )
        )
    return tables
