"""How one pivot cell reads as text; shared by the markdown and terminal renderers."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from attnbench.analysis.consistency import TrainCheck
from attnbench.analysis.pivot import Cell, PivotTable
from attnbench.analysis.reading import Reading
from attnbench.core.units import count_of, format_bytes, format_seconds, to_mib
from attnbench.results.records import Result, Run

# A status in a table cell, short enough for a narrow column.
STATUS_TEXT = {
    "oom": "OOM",
    "unsupported": "n/a",
    "error": "error",
    "timeout": "timeout",
    "crashed": "crashed",
    "too_slow_for_budget": "too slow",
    "incorrect": "wrong",
}


def status_text(cell: Cell) -> str:
    """A cell's status as a table shows it in place of a time."""
    return STATUS_TEXT.get(cell.result.status, cell.result.status)


LEGEND = (
    "Median time per call; in brackets the speed-up against {baseline} at the same length (> 1× = faster). "
    "~ marks a noisy cell (IQR above 10 % of the median, or the CI target was not reached). Crossovers and fits use "
    "only cells that converged or whose CI is within ±5 %, and that were not timed on a busy machine; a speed-up "
    "marked ? rests on a cell that is not: a best estimate."
)
DECODE_LEGEND = (
    "Per-token latency: the median time of one decode step, which produces the next token of every sequence in "
    "the batch with n tokens already in the KV cache or recurrent state (filled by a prefill outside the timing; "
    "tokens/s = batch ÷ this time)."
)
SPEEDUP_LEGEND = (
    " In brackets the speed-up against {baseline} at the same n (> 1× = faster; ? = a best estimate from a noisy or "
    "contended cell). ~ marks a noisy cell (IQR above 10 % of the median, or the CI target was not reached)."
)
STATE_LEGEND = (
    "The KV cache (attention) or recurrent state a step reads: computed from shapes and dtype / measured "
    "({methods}: on a CPU the resident pages backing it, so a state smaller than a page reads that page; on a GPU "
    "the caching allocator's bytes):"
)
CROSSOVER_LEGEND = (
    "Where the time curves cross (interpolated on log-log between the two measured lengths around the crossing):"
)
SCALING_LEGEND = (
    "How cost grows with n (least-squares slope on log-log over the lengths that ran; 95 % CI from the t-distribution):"
)


CONTENDED_MARK = "!"  # before a cell's time: the case ran on a busy machine (the headline lists why)
ESTIMATE_MARK = "?"  # after a speed-up: it rests on a noisy or contended time, a best estimate
# Said once, under the busy-machine headline: what would turn the marked estimates into evidence.
WHAT_TO_DO = (
    "To tell them apart: sweep again at a quieter moment, with fewer threads competing (`--set threads=1`), in rounds "
    "that spread the load over every case alike (`--set timing.rounds=3`), or with more samples a case (a larger "
    "`timing.max_case_s`); the speed-ups and crossovers marked ? are best estimates until then."
)


def contention_lines(results: Sequence[Result]) -> tuple[str, list[str]]:
    """The headline ("3 of 32 cases ran on a busy machine …") and one line per contended case naming its evidence;
    ("", []) when no timed case was contended."""
    timed = [r for r in results if r.measurement is not None]  # too_slow_for_budget rows were timed too
    busy = [r for r in timed if r.contended]
    if not busy:
        return "", []
    headline = (
        f"{len(busy)} of {len(timed)} cases ran on a busy machine (marked {CONTENDED_MARK}): their timings are not "
        "reliable: fits leave them out, speed-ups and crossovers from them are marked estimates, and compare draws no "
        f"verdict from them. {WHAT_TO_DO}"
    )
    return headline, [f"{r.case.label}: {'; '.join(r.contention.reasons)}" for r in busy if r.contention is not None]


def time_text(cell: Cell | None, speedup: bool = True) -> str:
    """``!~1.23 ms (0.85×)``: the median, ! when contended, ~ when noisy, and (unless ``speedup`` is False) the
    speed-up."""
    if cell is None:
        return ""
    mark = CONTENDED_MARK if cell.result.contended else ""
    if cell.median_s is None:
        return mark + status_text(cell)
    text = mark + ("~" if cell.noisy else "") + format_seconds(cell.median_s)
    if speedup and cell.speedup is not None:
        text += f" ({cell.speedup:.2f}×{ESTIMATE_MARK if cell.estimate else ''})"
    return text


def speedup_text(cell: Cell | None) -> str:
    """``~0.85×``: the speed-up alone, for a table of its own; a cell without a timing says why."""
    if cell is None:
        return ""
    if cell.median_s is None:
        return status_text(cell)
    if cell.speedup is None:
        return ""
    return ("~" if cell.noisy else "") + f"{cell.speedup:.2f}×" + (ESTIMATE_MARK if cell.estimate else "")


def time_legend(table: PivotTable, baseline: str) -> str:
    """What a table's time cells mean; ``baseline`` is the baseline's name as the format marks it up."""
    if not table.decode:
        return LEGEND.format(baseline=baseline) if table.baseline else "Median time per call; ~ marks a noisy cell."
    noisy = " ~ marks a noisy cell (IQR above 10 % of the median, or the CI target was not reached)."
    return DECODE_LEGEND + (SPEEDUP_LEGEND.format(baseline=baseline) if table.baseline else noisy)


def state_legend(table: PivotTable) -> str:
    methods = sorted(
        {
            str(c.result.extra.get("state_mem_method", "?"))
            for _, cells in table.rows
            for c in cells.values()
            if c.result.ok
        }
    )
    return STATE_LEGEND.format(methods=", ".join(methods) or "not measured")


def state_text(cell: Cell | None) -> str:
    """'258 KiB / 260 KiB': a decode step's state, computed / measured."""
    if cell is None:
        return ""
    r = cell.result
    if not r.ok:
        return status_text(cell)
    computed = "?" if r.state_bytes is None else format_bytes(r.state_bytes)
    measured = "?" if r.state_mem_bytes is None else format_bytes(r.state_mem_bytes)
    return f"{computed} / {measured}"


def memory_text(cell: Cell | None) -> str:
    if cell is None:
        return ""
    memory = cell.result.memory
    if not cell.result.ok:
        return status_text(cell)
    if memory is None or memory.peak_bytes is None:
        return "?"
    return f"{to_mib(memory.peak_bytes):.1f}"


def column_headers(table: PivotTable) -> list[str]:
    if table.batch_for_seq:
        return [f"n={n} (b={table.batch_for_seq[n]})" for n in table.seq_lens]
    return [f"n={n}" for n in table.seq_lens]


def environment_line(
    run: Run, code: Callable[[str], str] = lambda s: f"`{s}`", text: Callable[[str], str] = str
) -> str:
    """One line naming where a run was measured. ``code`` marks the device id, ``text`` escapes the rest: the
    markdown and html headers share the facts and differ only in markup."""
    env = run.environment
    device = env.get("gpu_name") or env.get("cpu_model") or "?"
    parts = [
        f"device {code(str(env.get('device', '?')))} ({text(str(device))})",
        f"torch {text(str(env.get('torch', '?')))}",
    ]
    if env.get("device_type") == "cpu":
        parts.append(text(count_of(env.get("torch_threads"), "thread")))
    if env.get("torch_cuda"):
        parts.append(f"CUDA {text(str(env['torch_cuda']))}")
    if env.get("driver"):
        parts.append(f"driver {text(str(env['driver']))}")
    parts.append(f"python {text(str(env.get('python', '?')))}")
    return " · ".join(parts)


@dataclass(frozen=True)
class RunChecks:
    """The run's self-consistency checks, for every renderer to mark up alike: train / (forward + backward)
    where a case ran all three modes, and rows above 100 % of their peak FLOP/s (impossible)."""

    summary: str  # the train checks' one-line summary ("" when no case ran all three modes)
    flagged: tuple[TrainCheck, ...]
    over_peak: tuple[str, ...]
    below_roofline: tuple[str, ...] = ()  # rows faster than their roofline time, with the likelier cause

    def __bool__(self) -> bool:
        return bool(self.summary or self.over_peak or self.below_roofline)


# How the renderers introduce the rows that beat their roofline time.
BELOW_ROOFLINE = "Faster than the roofline allows"
BELOW_ROOFLINE_NOTE = "(measured / predicted below 1: a count or a peak is wrong, or the data stayed in cache)"


def run_checks(reading: Reading) -> RunChecks:
    flagged = tuple(c for c in reading.train_checks if c.flagged)
    summary = reading.train_summary + (", flagged:" if flagged else ".") if reading.train_summary else ""
    return RunChecks(summary, flagged, reading.over_peak, reading.below_roofline)
