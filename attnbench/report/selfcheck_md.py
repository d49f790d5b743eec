"""``attnbench selfcheck``'s table: header and rows as text (shared by the CLI's rich table), and markdown."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attnbench.core.units import format_seconds

if TYPE_CHECKING:
    pass
from attnbench.analysis.selfcheck import GATE_MIN_S, TOLERANCE, SelfcheckReport, noise_note, summary_line


def table_rows(report: SelfcheckReport) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the selfcheck table, as text (the CLI's rich table and the markdown share them)."""
    header = ["op", "shape", "dtype", "attnbench"]
    for timer in report.timings.timers:
        header += [timer, f"ratio vs {timer} (rounds min–max)"]
    header.append("verdict")
    rows: list[list[str]] = []
    for check in report.checks:
        ours = check.ours_median_s
        row = [check.op.name, check.op.shape, check.op.dtype, "—" if ours is None else format_seconds(ours)]
        by_timer = {r.timer: r for r in check.references}
        for timer in report.timings.timers:
            ref = by_timer.get(timer)
            if ref is None:
                row += ["—", "—"]
                continue
            low, high = min(ref.ratios), max(ref.ratios)
            row += [format_seconds(ref.median_s), f"{ref.ratio:.3f} ({low:.3f}–{high:.3f})"]
        row.append(check.verdict)
        rows.append(row)
    return header, rows


def render_markdown(report: SelfcheckReport) -> str:
    header, rows = table_rows(report)
    noise = noise_note(report)
    timings = report.timings
    notes = [*timings.notes, *([noise] if noise else [])]
    gates = " / ".join(f"±{TOLERANCE[t]:.0%} against {t}" for t in timings.timers)
    lines = [
        f"# attnbench selfcheck — {timings.device} ({timings.device_name})",
        "",
        f"torch {timings.torch}, {timings.threads} threads, {timings.rounds} interleaved rounds per op. Each cell is "
        "the median of the per-round medians; a ratio is attnbench / reference, the median of the per-round "
        f"ratios (min–max over rounds). Gate: ops whose attnbench median is ≥ {format_seconds(GATE_MIN_S)} pass "
        f"when the 95 % interval of the ratio over rounds lies within {gates}, fail when it lies beyond, and are "
        "inconclusive otherwise (rounds are added first, within a budget).",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows),
        "",
        *(f"- {note}" for note in notes),
        *([""] if notes else []),
        f"**{summary_line(report)}**",
        "",
    ]
    return "\n".join(lines)
