"""``attnbench claims``: the claims table as markdown (for a commit or a PR), as JSON, and as a rich table.

Pure: each renderer takes a ``ClaimsReport`` and returns text or a renderable. rich is imported only by the
terminal renderer, so markdown and JSON render anywhere.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import TYPE_CHECKING

from attnbench.claims import VERDICTS, ClaimResult, ClaimsReport, Verdict
from attnbench.core.text import md_cell, md_code, md_text

if TYPE_CHECKING:
    from rich.console import Group

HEADERS = ("#", "claim", "article", "measured (cases, 95 % CI)", "verdict", "why")
_COLOURS: dict[Verdict, str] = {
    "supported": "green",
    "contradicted": "red",
    "inconclusive": "yellow",
    "not measurable": "dim",
    "not a performance claim": "blue",
}


def verdict_text(claim: ClaimResult) -> str:
    """The verdict as the table prints it ("not measurable" reads "not measurable here")."""
    return "not measurable here" if claim.verdict == "not measurable" else claim.verdict


def totals(report: ClaimsReport) -> str:
    """'3 supported · 2 contradicted · …' in the fixed verdict order, leaving out verdicts with no rows."""
    counts = Counter(c.verdict for c in report.claims)
    return " · ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v])


def render_claims_markdown(report: ClaimsReport) -> str:
    lines = [
        f"# The article's claims against run {md_code(report.run_id)}",
        "",
        f"Measured on **{md_text(report.device)}**; the article: {report.article_hardware}.",
        "",
        f"Verdicts: {totals(report)}.",
        "",
        "| " + " | ".join(HEADERS) + " |",
        "|" + "|".join("---" for _ in HEADERS) + "|",
    ]
    for c in report.claims:
        verdict = f"**{verdict_text(c)}**"
        cells = (c.claim_id, c.claim, c.article_figure, c.measured, verdict, c.why)
        lines.append("| " + " | ".join(md_cell(x) for x in cells) + " |")
    if report.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in report.notes]
    used = [c for c in report.claims if c.evidence_cases]
    if used:
        lines += ["", "<details><summary>Cases each row used</summary>", ""]
        for c in used:
            keys = ", ".join(md_code(key) for key in c.evidence_cases)
            lines.append(f"- **{c.claim_id}** {md_cell(c.claim)}: {keys}")
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def render_claims_json(report: ClaimsReport) -> str:
    return json.dumps(report.to_dict(), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def claims_table(report: ClaimsReport) -> Group:
    """The same rows for a terminal, in four columns so they read at 80 characters: the article's figure under
    the claim, the reason under the verdict (in colour)."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    table = Table(
        title=f"the article's claims against run {report.run_id}",
        caption=f"measured on {report.device}; the article: {report.article_hardware}",
        title_justify="left",
        show_lines=True,
        expand=True,
    )
    table.add_column("#", no_wrap=True)
    table.add_column("claim · article", ratio=3, overflow="fold")
    table.add_column("measured (cases, 95 % CI)", ratio=4, overflow="fold")
    table.add_column("verdict · why", ratio=3)
    for c in report.claims:
        claim = Text(c.claim)
        claim.append(f"\narticle: {c.article_figure}", style="dim")
        verdict = Text(verdict_text(c), style=f"bold {_COLOURS[c.verdict]}")
        verdict.append(f"\n{c.why}", style="dim")
        table.add_row(c.claim_id, claim, Text(c.measured), verdict)
    parts: list[Table | Text] = [table, Text(f"verdicts: {totals(report)}")]
    parts += [Text(f"note: {note}", style="italic") for note in report.notes]
    return Group(*parts)
