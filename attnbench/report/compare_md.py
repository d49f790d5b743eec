"""``compare``'s renderers: GitHub-flavoured markdown (a PR comment, ``$GITHUB_STEP_SUMMARY``) and the terminal table.

Both use the same cell texts, so they read the same. Pure: a ``Comparison`` in, text or a rich renderable out; rich
is imported only by the terminal table.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from tabulate import tabulate

from attnbench.analysis.compare import VERDICTS, CaseComparison, Comparison, Side, Verdict
from attnbench.analysis.gates import MetricVerdict
from attnbench.core.text import md_cell, md_code, md_text
from attnbench.core.units import (
    format_bandwidth,
    format_bytes,
    format_change,
    format_change_interval,
    format_percent,
    format_rate,
    format_seconds,
)

if TYPE_CHECKING:
    from rich.console import Group

# The order sections are shown in: what needs attention first.
SECTIONS: tuple[Verdict, ...] = ("regressed", "improved", "noisy", "new", "missing", "same")
HEADERS = ("case", "base", "current", "change", "95 % CI", "threshold", "evidence")


def case_text(c: CaseComparison) -> str:
    """The case's label (which names its model options too)."""
    return c.case.label


def time_cell(seconds: float | None, status: str | None) -> str:
    if status is None:
        return "—"
    if status != "ok" or seconds is None:
        return status.upper()
    return format_seconds(seconds)


def change_cell(c: CaseComparison) -> str:
    return "" if c.ratio is None else format_change(c.ratio - 1)


def interval_cell(c: CaseComparison) -> str:
    if c.ci_low is None or c.ci_high is None:
        return "n/a" if c.evidence == "samples" else ""
    return format_change_interval(c.ci_low - 1, c.ci_high - 1)


def evidence_cell(c: CaseComparison) -> str:
    if c.evidence == "processes":
        return f"{c.base_n}/{c.current_n} processes"
    if c.evidence == "samples":
        return f"{c.base_n}/{c.current_n} samples + floor"
    return c.evidence if c.evidence == "status" else ""


def row(c: CaseComparison) -> list[str]:
    return [
        case_text(c),
        time_cell(c.base_s, c.base_status),
        time_cell(c.current_s, c.current_status),
        change_cell(c),
        interval_cell(c),
        format_percent(c.threshold),
        evidence_cell(c),
    ]


def counts_line(comparison: Comparison) -> str:
    counts = comparison.counts()
    parts = [f"{counts[v]} {v}" for v in ("regressed", "improved", "same", "noisy", "new", "missing")]
    if counts["regressed"]:
        parts[0] = f"**{parts[0]}**"
    return " · ".join(parts) + f" ({len(comparison.cases)} cases)"


def contended_lines(comparison: Comparison) -> list[str]:
    """Lines saying how many verdicts contention made ``noisy`` (and on which side), and how many folders of runs
    were judged without their contended runs; nothing when neither."""
    lines = []
    busy = [c for c in comparison.cases if c.contended]
    if busy:
        sides = {side: sum(side in c.contended for c in busy) for side in ("base", "current")}
        where = ", ".join(f"{n} on the {side} side" for side, n in sides.items() if n)
        lines += ["", f"**{len(busy)} cases were timed on a busy machine ({where}): noisy (contended), no verdict.**"]
    spared = [c for c in comparison.cases if any(c.left_out)]
    if spared:
        runs = sum(sum(c.left_out) for c in spared)
        lines += [
            "",
            f"{len(spared)} {'case was judged without its' if len(spared) == 1 else 'cases were judged without their'} "
            f"runs timed on a busy machine ({runs} contended run{'' if runs == 1 else 's'} left out; the others "
            "still made an interval).",
        ]
    return lines


def title(comparison: Comparison) -> str:
    n = comparison.counts()["regressed"]
    if n:
        return f"regression in {n} case{'s' if n != 1 else ''}"
    gated = [g for g in comparison.gates if g.verdict == "regressed"]
    if gated:
        metrics = ", ".join(dict.fromkeys(g.metric for g in gated))
        return f"regression in {metrics} ({len(gated)} case{'s' if len(gated) != 1 else ''})"
    if comparison.regressed and comparison.overall is not None:
        return f"regression overall ({format_change(comparison.overall.ratio - 1)}, every case together)"
    return "no regression"


def overall_lines(comparison: Comparison) -> list[str]:
    """The verdict on every case together (``analysis.compare.Overall``); nothing when the sides have no runs to
    score (fewer than two a side)."""
    o = comparison.overall
    if o is None:
        return []
    verdict = f"**{o.verdict}**" if o.verdict == "regressed" else o.verdict
    line = (
        f"All {o.cases} cases together (one score per run; {o.base_runs} base and {o.current_runs} current runs): "
        f"{format_change(o.ratio - 1)} (95 % CI {format_change_interval(o.ci_low - 1, o.ci_high - 1)}) against "
        f"±{format_percent(o.threshold)} → {verdict}."
    )
    if o.verdict == "noisy" and o.runs_needed > min(o.base_runs, o.current_runs):
        line += (
            f" Runs spread ±{format_percent(o.spread)} here (one score each), so an interval no wider than "
            f"±{format_percent(o.threshold)} needs about {o.runs_needed} runs a side, base and current swept "
            "alternately."
        )
    return ["", line]


GATE_HEADERS = ("metric", "case", "base", "current", "change", "95 % CI", "threshold", "verdict")


def _gate_value(g: MetricVerdict, value: float | None) -> str:
    if value is None:
        return "—"
    if g.metric == "peak_mem":
        return format_bytes(value)
    return format_bandwidth(value) if g.metric == "gbps" else format_rate(value) + " tok/s"


def gate_row(g: MetricVerdict) -> list[str]:
    interval = "" if g.ci_low is None or g.ci_high is None else format_change_interval(g.ci_low - 1, g.ci_high - 1)
    return [
        g.metric,
        g.case.label,
        _gate_value(g, g.base),
        _gate_value(g, g.current),
        "" if g.ratio is None else format_change(g.ratio - 1),
        interval,
        format_percent(g.threshold),
        g.verdict,
    ]


def gate_counts(comparison: Comparison) -> list[str]:
    """``peak_mem: 1 regressed · 7 same`` for each gated metric."""
    lines = []
    for metric in dict.fromkeys(g.metric for g in comparison.gates):
        counts = {v: sum(g.metric == metric and g.verdict == v for g in comparison.gates) for v in VERDICTS}
        parts = [f"{n} {v}" for v, n in counts.items() if n]
        lines.append(f"{metric}: " + " · ".join(parts))
    return lines


def gate_lines(comparison: Comparison) -> list[str]:
    """The other gated metrics: their counts, and a table of every verdict that is not ``same``."""
    if not comparison.gates:
        return []
    lines = ["", "### Other metrics", "", *(f"- {line}" for line in gate_counts(comparison))]
    shown = [g for g in comparison.gates if g.verdict != "same"]
    if shown:
        rows = [[md_cell(cell) for cell in gate_row(g)] for g in shown]
        lines += ["", tabulate(rows, headers=GATE_HEADERS, tablefmt="github", disable_numparse=True)]
    return lines


def _side_cells(side: Side) -> tuple[str, str, str]:
    ids = ", ".join(_code(run_id) for run_id in side.run_ids)
    commits = ", ".join(_code(c[:12]) for c in side.commits)
    return ids, commits, str(len(side.runs))


def environment_line(comparison: Comparison) -> str:
    env = comparison.base.environment
    device = env.get("gpu_name") or env.get("cpu_model") or "?"
    parts = [f"{env.get('device_type', '?')} ({device})", f"torch {env.get('torch', '?')}"]
    if env.get("torch_cuda"):
        parts.append(f"CUDA {env['torch_cuda']}")
    if env.get("device_type") == "cpu":
        parts.append(f"{env.get('torch_threads', '?')} threads")
    parts = [md_text(part) for part in parts]  # the run's environment, as stored
    sha = comparison.base.runs[0].run.config_sha256
    parts.append(f"config sha256 `{sha[:12]}`")
    return " · ".join(parts)


def method_text(comparison: Comparison) -> str:
    """How the verdicts were reached, in words, including which evidence each case rests on."""
    policy = comparison.policy
    evidence = comparison.evidence()
    lines = [
        "Per case, the ratio current/base of the median time per call with a 95 % interval. A case **regressed** "
        f"when the whole interval lies above 1 + threshold ({policy.thresholds.describe()}), **improved** when "
        "it lies below 1 − threshold, is the **same** when it lies inside ±threshold, and **noisy** otherwise. "
        "A status change decides first: ok → failed or out of memory is a regression.",
    ]
    if comparison.gates:
        lines.append(
            f"Also gated: {', '.join(policy.thresholds.gated)}, by the same rule on each metric's ratio in the "
            "direction that is worse (fewer tokens/s or GB/s, more memory): a rate's interval is the time's "
            "inverted; peak memory's is a t interval over the runs' peaks, or the ratio itself with one run a side."
        )
    if evidence.get("processes"):
        lines.append(
            f"Evidence for {evidence['processes']} cases: the spread between processes (one median per process, "
            "Student t on the log medians, variance pooled over both sides)."
        )
    if comparison.overall is not None:
        lines.append(
            "Every case together: one score per run (the mean over cases of its log time against each case's mean "
            "over all runs), the two sides' scores compared by a Student t interval; one question per comparison, "
            "so it **regressed** when the interval excludes no change and the estimate lies above 1 + threshold "
            "(as asv judges a change), and a regression there fails the comparison too."
        )
    if evidence.get("samples"):
        lines.append(
            f"Evidence for {evidence['samples']} cases: one process per side, so the interval is a bootstrap of "
            f"the median ratio over the raw samples ({policy.resamples} resamples), widened by a ±"
            f"{format_percent(policy.noise_floor or 0.0)} noise floor for the variation between processes that "
            f"samples from one process cannot show; the floor is {policy.floor_source}. Measure that variation "
            "instead with `timing.processes` or by comparing folders of repeated runs."
        )
    return " ".join(lines)


def _table(cases: Sequence[CaseComparison]) -> str:
    rows = [row(c) for c in cases]
    return tabulate(
        [[md_cell(cell) for cell in r] for r in rows], headers=HEADERS, tablefmt="github", disable_numparse=True
    )


def _code(text: str) -> str:
    """Stored text as a code span in a table cell."""
    return md_code(text).replace("|", "\\|")


def render_compare_markdown(comparison: Comparison) -> str:
    base_ids, base_commits, base_runs = _side_cells(comparison.base)
    current_ids, current_commits, current_runs = _side_cells(comparison.current)
    lines = [
        f"## attnbench compare: {title(comparison)}",
        "",
        counts_line(comparison),
        *overall_lines(comparison),
        *contended_lines(comparison),
        "",
        "| | base | current |",
        "| --- | --- | --- |",
        f"| path | {_code(str(comparison.base.path))} | {_code(str(comparison.current.path))} |",
        f"| runs | {base_ids} | {current_ids} |",
        f"| commit | {base_commits} | {current_commits} |",
        f"| processes (runs) | {base_runs} | {current_runs} |",
        "",
        f"Measured on {environment_line(comparison)}.",
    ]
    if comparison.allowed:
        allowed = "; ".join(m.describe() for m in comparison.allowed)
        lines += ["", f"**Compared despite differences** (`--allow-mismatch`): {md_cell(allowed)}."]
    lines += ["", method_text(comparison)]
    lines += gate_lines(comparison)
    for verdict in SECTIONS:
        cases = comparison.of(verdict)
        if not cases or verdict == "same":
            continue
        lines += ["", f"### {verdict.capitalize()} ({len(cases)})", ""]
        if verdict in ("new", "missing"):
            lines += [f"- {md_code(case_text(c))}" for c in cases]
            continue
        lines.append(_table(cases))
        notes = [f"- {md_code(case_text(c))}: {md_cell(c.note)}" for c in cases if c.note]
        if notes:
            lines += ["", *notes]
    lines += [
        "",
        f"<details><summary>All {len(comparison.cases)} cases</summary>",
        "",
        tabulate(
            [[md_cell(cell) for cell in [row(c)[0], c.verdict_text, *row(c)[1:]]] for c in comparison.cases],
            headers=(HEADERS[0], "verdict", *HEADERS[1:]),
            tablefmt="github",
            disable_numparse=True,
        ),
        "",
        "</details>",
    ]
    if comparison.warnings:
        lines += ["", "Warnings:", ""] + [f"- {md_cell(w)}" for w in comparison.warnings]
    return "\n".join(lines) + "\n"


_STYLE: dict[str, str] = {"regressed": "bold red", "improved": "green", "noisy": "yellow", "new": "cyan"}


def compare_table(comparison: Comparison) -> Group:
    """The verdicts for a terminal: every case (attention first), then the counts and how they were decided."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"attnbench compare: {title(comparison)}", title_justify="left")
    for header in (HEADERS[0], "verdict", *HEADERS[1:]):
        table.add_column(header, justify="left" if header in ("case", "verdict", "evidence") else "right")
    order = {verdict: i for i, verdict in enumerate(SECTIONS)}
    for c in sorted(comparison.cases, key=lambda c: order[c.verdict]):
        cells = row(c)
        table.add_row(cells[0], Text(c.verdict_text, style=_STYLE.get(c.verdict, "")), *cells[1:])
    lines: list[Table | Text] = [table, Text(counts_line(comparison).replace("**", ""))]
    overall_style = "bold red" if comparison.overall is not None and comparison.overall.verdict == "regressed" else ""
    lines += [Text(line.replace("**", ""), style=overall_style) for line in overall_lines(comparison) if line]
    lines += [Text(line.replace("**", ""), style="yellow") for line in contended_lines(comparison) if line]
    for g in comparison.gates:
        if g.verdict != "same":
            cells = gate_row(g)
            style = _STYLE.get(g.verdict, "")
            lines.append(
                Text(f"{cells[0]} {cells[1]}: {cells[2]} → {cells[3]} ({cells[4]}, {cells[5]}) {g.verdict}", style)
            )
    lines += [Text(line) for line in gate_counts(comparison)]
    lines += [Text(f"  {case_text(c)}: {c.note}", style="italic") for c in comparison.cases if c.note]
    if comparison.allowed:
        lines.append(Text("compared despite: " + "; ".join(m.describe() for m in comparison.allowed), style="yellow"))
    base, current = comparison.base, comparison.current
    lines.append(Text(f"base {', '.join(base.run_ids)} → current {', '.join(current.run_ids)}"))
    lines.append(Text(method_text(comparison).replace("**", "").replace("`", ""), style="dim"))
    return Group(*lines)
