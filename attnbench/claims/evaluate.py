"""``evaluate_claims``: every claim of the article against one run, in the article's order, as a ``ClaimsReport``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from attnbench.analysis.efficiency import PeakTable
from attnbench.claims.descriptive import claim_heads, claim_positional, claim_structure
from attnbench.claims.flash import claim_flash
from attnbench.claims.hybrid import hybrid_notes
from attnbench.claims.selection import latest_rows
from attnbench.claims.sequential import claim_sequential
from attnbench.claims.training import claim_training
from attnbench.claims.utilisation import NVML_NOTE, claim_utilisation
from attnbench.claims.verdicts import ClaimResult
from attnbench.core.cases import SERVING_PARAMS
from attnbench.core.units import count_of
from attnbench.results.records import Result, Run

ARTICLE_HARDWARE = "RTX 3090 (named for claim 4 only; the other claims name no hardware, a GPU implied)"
INTERVALS_NOTE = (
    "Ratios carry the conservative interval of the two medians' 95 % CIs; exponents the 95 % CI of a log-log "
    "least-squares fit. The verdict rules are in the docstrings of attnbench/claims/."
)


@dataclass(frozen=True)
class ClaimsReport:
    """Every claim's rows for one run, with the hardware both sides used."""

    run_id: str
    device: str  # what this run measured on, in words
    article_hardware: str
    claims: tuple[ClaimResult, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "device": self.device,
            "article_hardware": self.article_hardware,
            "claims": [c.to_dict() for c in self.claims],
            "notes": list(self.notes),
        }


def _device_words(run: Run) -> str:
    env = run.environment
    device = env.get("device") or "?"
    name = env.get("gpu_name") or env.get("cpu_model") or "unknown hardware"
    parts = [f"{device} ({name})"]
    if env.get("device_type") == "cpu" and env.get("torch_threads"):
        parts.append(count_of(env["torch_threads"], "thread"))
    if env.get("torch"):
        parts.append(f"torch {env['torch']}")
    return ", ".join(parts)


def evaluate_claims(run: Run, results: Sequence[Result]) -> ClaimsReport:
    """Every claim of the article against this run, in the article's order."""
    # The serving questions (issue 41: a capacity, prefill or verify row, a packed call) are not the article's.
    results = [r for r in latest_rows(results) if r.case.mode not in SERVING_PARAMS and not r.case.packing]
    # Decode rows speak to claim 1 only (``claims.decode``): the other claims are about a whole sequence's work.
    whole = [r for r in results if r.case.mode != "decode"]
    peaks = PeakTable.for_run(run)  # once for every claim that holds a row against its peak
    rows = [
        *claim_sequential(run, results, peaks),
        *claim_utilisation(run, whole, peaks),
        *claim_training(run, whole),
        *claim_flash(run, whole),
        claim_heads(whole),
        claim_positional(run, whole),
        *claim_structure(),
    ]
    notes = (NVML_NOTE, INTERVALS_NOTE, *hybrid_notes(results))
    return ClaimsReport(run.run_id, _device_words(run), ARTICLE_HARDWARE, tuple(rows), notes)
