"""Claims 5 (heads, positional encodings) and 6 (path length, GLUE): not performance claims.

What each head attends to, BLEU, path length and GLUE accuracy are properties of trained weights or of the
architecture's graph; a speed benchmark cannot settle them. Their rows say so, and show what the run measured
of their cost where it has the variants: time against the fewest heads (5a), time against ``positional=none``
(5b), both at the group with the longest sequences. Claim 6 is listed so nothing is silently skipped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from attnbench.claims.selection import K, kind, label, option, variation
from attnbench.claims.verdicts import (
    ClaimResult,
    Interval,
    config_for,
    format_signed_pct,
    join_reasons,
    ratio,
    thin_cells,
)
from attnbench.core.cases import Case
from attnbench.results.records import Result, Run


def _cost(x: Interval) -> str:
    """A time ratio as extra cost: '+8 % [+6 to +10 %]'."""
    if not x.bounded:
        return f"{format_signed_pct(x.value - 1)} % (CI unbounded)"
    return f"{format_signed_pct(x.value - 1)} % [{format_signed_pct(x.low - 1)} to {format_signed_pct(x.high - 1)} %]"


def _largest(groups: Mapping[Case, dict[K, Result]]) -> tuple[Case, dict[K, Result]]:
    """The group with the longest sequences (then the largest batch, forward first): where costs show most."""
    return max(groups.items(), key=lambda kv: (kv[0].seq_len, kv[0].batch, kv[0].mode == "forward"))


def claim_heads(results: Sequence[Result]) -> ClaimResult:
    claim = "Multi-head attention: BERT-base's 12 heads each capture a different relation (syntax, coreference, …)"
    figure = "12个注意力头 (12 heads)"
    groups = variation(
        [r for r in results if kind(r.case) == "attention"], lambda c: c.heads, lambda c: replace(c, heads=0)
    )
    why = "what each head attends to is a property of trained weights, not of speed or memory"
    if not groups:
        heads = sorted({r.case.heads for r in results if r.case.heads is not None})
        measured = f"one head count in this run (h={', '.join(map(str, heads))})" if heads else "—"
        return ClaimResult("5a", claim, figure, measured, (), "not a performance claim", why)
    _, by_heads = _largest(groups)
    base_h = min(by_heads)
    base = by_heads[base_h]
    parts = [f"h={h}: {_cost(ratio(r, base))}" for h, r in sorted(by_heads.items()) if h != base_h]
    measured = f"time vs h={base_h}: " + ", ".join(parts) + f" ({label(replace(base.case, heads=None))})"
    keys = tuple(r.case.key for r in by_heads.values())
    return ClaimResult("5a", claim, figure, measured, keys, "not a performance claim", why)


def _positional_value(case: Case) -> str | None:
    value = option(case, "positional")
    return None if value is None else str(value)


def _without_positional(case: Case) -> Case:
    return replace(case, options=tuple(o for o in case.options if o[0] != "positional"))


def claim_positional(run: Run, results: Sequence[Result]) -> ClaimResult:
    claim = (
        "Sinusoidal positional encoding generalises better than learned embeddings (WMT En–De BLEU +0.5–1.0); "
        "RoPE handles distances more flexibly"
    )
    figure = "BLEU +0.5–1.0 (正弦 vs 可学习); RoPE"
    why = "a translation-quality (BLEU) and extrapolation claim: a speed benchmark cannot settle it"
    groups = {k: g for k, g in variation(results, _positional_value, _without_positional).items() if "none" in g}
    if not groups:
        measured = "no positional variants beside positional=none in this run"
        why = f"{why}; {config_for(run)} times each option against none"
        return ClaimResult("5b", claim, figure, measured, (), "not a performance claim", why)
    _, by_option = _largest(groups)
    base = by_option["none"]
    parts = [f"{name} {_cost(ratio(r, base))}" for name, r in sorted(by_option.items()) if name != "none"]
    measured = "time vs positional=none: " + ", ".join(parts) + f" ({label(_without_positional(base.case))})"
    keys = tuple(r.case.key for r in by_option.values())
    thin = thin_cells(by_option.values())
    return ClaimResult("5b", claim, figure, measured, keys, "not a performance claim", join_reasons(why, thin))


def claim_structure() -> list[ClaimResult]:
    """Claim 6: the article's structural and accuracy statements, listed so nothing is silently skipped."""
    return [
        ClaimResult(
            "6a",
            "Long-range dependencies: an RNN's path grows with distance, self-attention's is constant",
            "长程依赖: 随距离衰减 vs 恒定路径长度",
            "—",
            (),
            "not a performance claim",
            "a property of the architecture's graph; claim 1 measures its cost side",
        ),
        ClaimResult(
            "6b",
            "GLUE: at 110 M parameters BERT-base beats an LSTM (CoLA 62.1 vs 45.2, MNLI-m 86.7 vs 72.3, …)",
            "CoLA 62.1/45.2, MNLI-m 86.7/72.3, QQP 91.3/88.5, RTE 70.4/62.1",
            "—",
            (),
            "not a performance claim",
            "task accuracy after training; attnbench measures speed and memory",
        ),
    ]
