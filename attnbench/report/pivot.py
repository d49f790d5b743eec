"""The comparison table people read: rows = model, columns = seq_len, one table per mode/dtype/shape.

Pure Python. Both the markdown and the terminal renderers draw from ``pivot_tables``, so they always agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attnbench.catalogue import is_recurrent
from attnbench.measurement import NOISY_IQR_REL
from attnbench.results import Result

_STATUS_TEXT = {"oom": "OOM", "unsupported": "n/a", "error": "error", "timeout": "timeout", "crashed": "crashed"}


@dataclass(frozen=True)
class Cell:
    result: Result
    speedup: float | None  # baseline median / this median: > 1 means faster than the baseline

    @property
    def median_s(self) -> float | None:
        m = self.result.measurement
        return m.median_s if m is not None and self.result.ok else None

    @property
    def noisy(self) -> bool:
        m = self.result.measurement
        return m is not None and (m.summary.iqr_rel > NOISY_IQR_REL or not m.converged)

    @property
    def status_text(self) -> str:
        return _STATUS_TEXT.get(self.result.status, self.result.status)


@dataclass(frozen=True)
class PivotTable:
    title: str
    seq_lens: tuple[int, ...]
    batch_for_seq: dict[int, int] | None  # set when batch is tied to seq_len (a constant-tokens grid)
    rows: tuple[tuple[str, dict[int, Cell]], ...]
    baseline: str | None
    crossovers: tuple[str, ...]


def _row_label(result: Result, varying: set[str]) -> str:
    case = result.case
    parts = [case.model]
    if "heads" in varying and case.heads is not None:
        parts.append(f"h={case.heads}")
    if "causal" in varying and not is_recurrent(case.model):
        parts.append("causal" if case.causal else "full")
    if "batch" in varying:
        parts.append(f"b={case.batch}")
    parts += [f"{k}={v}" for k, v in case.options]
    return " ".join(parts)


def _crossovers(
    rows: Sequence[tuple[str, dict[int, Cell]]], reference: dict[str, str | None], seq_lens: Sequence[int]
) -> list[str]:
    """Where each row stops (or starts) being faster than its baseline row, in words."""
    lines = []
    for label, cells in rows:
        baseline = reference.get(label)
        if baseline is None or label == baseline:
            continue
        points = [(n, cells[n].speedup) for n in seq_lens if n in cells and cells[n].speedup is not None]
        if not points:
            continue
        segments: list[tuple[bool, int, int]] = []  # (faster?, first n, last n)
        for n, speedup in points:
            faster = speedup is not None and speedup > 1
            if segments and segments[-1][0] == faster:
                segments[-1] = (faster, segments[-1][1], n)
            else:
                segments.append((faster, n, n))
        if len(segments) == 1:
            word = "faster" if segments[0][0] else "slower"
            lines.append(f"{label} is {word} than {baseline} at every length measured")
            continue
        parts = []
        for faster, first, last in segments:
            word = "faster" if faster else "slower"
            span = f"n={first}" if first == last else f"n={first}–{last}"
            parts.append(f"{word} at {span}")
        lines.append(f"{label} vs {baseline}: " + ", ".join(parts))
    return lines


def pivot_tables(results: Sequence[Result], baseline_model: str | None = None) -> list[PivotTable]:
    """Group results by mode/dtype/device/d_model/layers; rows are models (with what else varies)."""
    groups: dict[tuple[object, ...], list[Result]] = {}
    for r in results:
        c = r.case
        groups.setdefault((c.mode, c.dtype, c.device, c.d_model, c.layers), []).append(r)
    if baseline_model is None:
        baseline_model = next((r.case.model for r in results if is_recurrent(r.case.model)), None)
    tables = []
    for (mode, dtype, device, d_model, layers), members in groups.items():
        seq_lens = tuple(sorted({r.case.seq_len for r in members}))
        batches_by_seq: dict[int, set[int]] = {}
        for r in members:
            batches_by_seq.setdefault(r.case.seq_len, set()).add(r.case.batch)
        distinct_batches = set().union(*batches_by_seq.values())
        tied = len(distinct_batches) > 1 and all(len(b) == 1 for b in batches_by_seq.values())
        varying = {
            name
            for name in ("heads", "causal", "batch")
            if len({getattr(r.case, name) for r in members if not is_recurrent(r.case.model)}) > 1
        }
        if tied:
            varying.discard("batch")
        elif len(distinct_batches) > 1:
            varying.add("batch")
        rows: dict[str, dict[int, Result]] = {}
        batch_of: dict[str, int | None] = {}
        for r in members:
            label = _row_label(r, varying)
            rows.setdefault(label, {})[r.case.seq_len] = r
            batch_of[label] = r.case.batch if "batch" in varying else None
        # One baseline row per batch (when batch varies): a speed-up only compares like with like.
        base_for_batch: dict[int | None, str] = {}
        for label in rows:
            if baseline_model and label.split()[0] == baseline_model:
                base_for_batch.setdefault(batch_of[label], label)
        reference = {label: base_for_batch.get(batch_of[label]) for label in rows}
        table_rows = []
        for label, cells in rows.items():
            ref_label = reference[label]
            base = rows[ref_label] if ref_label is not None and ref_label != label else {}
            out: dict[int, Cell] = {}
            for n, r in cells.items():
                ref = base.get(n)
                speedup = None
                if ref is not None and ref.ok and r.ok and ref.measurement and r.measurement:
                    speedup = ref.measurement.median_s / r.measurement.median_s
                out[n] = Cell(r, speedup)
            table_rows.append((label, out))
        batch_text = "" if tied else f", batch {sorted(distinct_batches)[0]}" if len(distinct_batches) == 1 else ""
        title = f"{mode} · {dtype} · {device} · d_model {d_model}{batch_text} · layers {layers}"
        tables.append(
            PivotTable(
                title=title,
                seq_lens=seq_lens,
                batch_for_seq={n: next(iter(b)) for n, b in batches_by_seq.items()} if tied else None,
                rows=tuple(table_rows),
                baseline=baseline_model if base_for_batch else None,
                crossovers=tuple(_crossovers(table_rows, reference, seq_lens)),
            )
        )
    return tables
