"""``attnbench selfcheck``'s table: header and rows as text (shared by the CLI's rich table), markdown, and the
same as data for ``--format json``."""

from __future__ import annotations

from typing import Any

from attnbench.analysis.selfcheck import GATE_MIN_S, TOLERANCE, SelfcheckReport, noise_note, summary_line
from attnbench.core.units import format_seconds, plural


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
            if ref is None or not ref.ratios:  # no such timer here, or no round ran
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
    rounds = plural(timings.rounds, "paired round")
    lines = [
        f"# attnbench selfcheck — {timings.device} ({timings.device_name})",
        "",
        f"torch {timings.torch}, {plural(timings.threads, 'thread')}, {rounds} per op. Each cell is "
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


def selfcheck_dict(report: SelfcheckReport) -> dict[str, Any]:
    """``selfcheck --format json``: each op's verdict with attnbench's and every reference's median per call (s)
    and the ratio's 95 % interval over the rounds. Layout ``attnbench.selfcheck/1``."""
    timings = report.timings
    ops = []
    for check in report.checks:
        references = []
        for ref in check.references:
            interval = ref.interval
            references.append(
                {
                    "timer": ref.timer,
                    "median_s": ref.median_s if ref.ratios else None,  # None: no round ran
                    "ratio": ref.ratio if ref.ratios else None,
                    "ratio_ci95": None if interval is None else list(interval),
                    "ratios": list(ref.ratios),
                    "tolerance": ref.tolerance,
                    "outcome": ref.outcome,
                }
            )
        ops.append(
            {
                "op": check.op.name,
                "shape": check.op.shape,
                "dtype": check.op.dtype,
                "attnbench_median_s": check.ours_median_s,
                "outcome": check.outcome,
                "verdict": check.verdict,
                "skipped": check.skipped or None,
                "references": references,
            }
        )
    return {
        "schema": "attnbench.selfcheck/1",
        "device": timings.device,
        "device_name": timings.device_name,
        "torch": timings.torch,
        "threads": timings.threads,
        "rounds": timings.rounds,
        "budget_s": timings.budget_s,
        "elapsed_s": timings.elapsed_s,
        "gate_min_s": GATE_MIN_S,
        "tolerance": TOLERANCE,
        "exit_code": report.exit_code,
        "summary": summary_line(report),
        "notes": [*timings.notes, *([note] if (note := noise_note(report)) else [])],
        "ops": ops,
    }
