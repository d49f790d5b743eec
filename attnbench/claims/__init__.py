"""The article's claims (``shared/seed``: "Self-Attention的并行计算革命"), each checked against one stored run.

Reads stored results only, never torch. ``evaluate_claims`` turns a run into ``ClaimResult`` rows; the
renderers (``attnbench.report.claims_md``) only lay them out.

One module per job; each claim's verdict rules are in its module's docstring:

- ``verdicts``: the verdict vocabulary, ``ClaimResult``, ratio intervals and the thin-evidence rules.
- ``selection``: which rows count (the later of two rows of one case), curves, variations, row readings.
- ``sequential`` (claim 1: O(n) vs O(1) steps, memory against n) with ``decode`` (claim 1 from the generation
  side: per-token cost and state against the context n), ``utilisation`` (claim 2: GPU utilisation),
  ``training`` (claim 3: BERT-base vs an LSTM of its size), ``flash`` (claim 4: FlashAttention at n = 2048),
  ``descriptive`` (claims 5–6: heads, positional encodings, structure, GLUE; costs shown, no verdict).
- ``evaluate``: every claim in the article's order, as a ``ClaimsReport``.
"""

from __future__ import annotations

from attnbench.claims.descriptive import claim_heads, claim_positional, claim_structure
from attnbench.claims.evaluate import ARTICLE_HARDWARE, ClaimsReport, evaluate_claims
from attnbench.claims.flash import claim_flash
from attnbench.claims.selection import option, pct_of_peak, peak_of
from attnbench.claims.sequential import claim_sequential, kernels_per_call
from attnbench.claims.training import claim_training
from attnbench.claims.utilisation import NVML_NOTE, claim_utilisation, kernel_busy_pct
from attnbench.claims.verdicts import (
    CPU_CONFIG,
    GPU_CONFIG,
    VERDICTS,
    ClaimResult,
    Interval,
    Verdict,
    noisy,
    ratio,
)

__all__ = [
    "ARTICLE_HARDWARE",
    "CPU_CONFIG",
    "GPU_CONFIG",
    "NVML_NOTE",
    "VERDICTS",
    "ClaimResult",
    "ClaimsReport",
    "Interval",
    "Verdict",
    "claim_flash",
    "claim_heads",
    "claim_positional",
    "claim_sequential",
    "claim_structure",
    "claim_training",
    "claim_utilisation",
    "evaluate_claims",
    "kernel_busy_pct",
    "kernels_per_call",
    "noisy",
    "option",
    "pct_of_peak",
    "peak_of",
    "ratio",
]
