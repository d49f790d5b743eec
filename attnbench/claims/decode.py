"""Claim 1 from the generation side, on decode rows (one new token per sequence at context n).

Generating n tokens takes n steps whatever the model; what differs is what one step costs as the context grows. A
recurrent model carries a fixed-size state, so its step costs the same at any n: its O(n) sequential steps are n
steps of O(1). Attention keeps K and V of every position and each step reads them all, so a step grows ∝ n: its
"O(1) sequential steps" hold for a whole sequence given at once, not for generating one.

The curve: per model variant, the decode rows at the smallest batch with ≥ 3 context lengths (else the most
lengths); k is the exponent of n of the time per token ([k_low, k_high] its 95 % CI).

- 1a (decode), recurrent, "each token costs the same at any n": supported if k_high ≤ 0.3, contradicted if
  k_low ≥ 0.7.
- 1b (decode), attention, "each token's cost grows with n": supported if k_low ≥ 0.5, contradicted if k_high ≤ 0.3
  (flat: at these n the cache read is small beside the step's fixed work).
- 1d (decode), recurrent, "memory is fixed", on the state a step reads: the measured state's exponent where the
  method reads it at ≥ 3 lengths (supported if k_high ≤ 0.3, contradicted if k_low ≥ 0.7); where it reads 0 B
  (a method that cannot see so small a state), the computed bytes, which a test holds equal to the allocated
  tensors, and the row says so. The KV cache of the attention variant of the same shape is shown beside it, measured.

Anything else is inconclusive, and so is a curve thin on evidence (``verdicts.thin_slope``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from attnbench.analysis.scaling import PowerLaw, fit_power_law
from attnbench.claims.selection import Series, describe_series, family, series, variant
from attnbench.claims.verdicts import MIN_SLOPE_POINTS, ClaimResult, Verdict, exponent_text, thin_slope, undecided
from attnbench.core.units import format_bytes, format_seconds
from attnbench.results.records import Result

FLAT_MAX, FLAT_NOT = 0.3, 0.7
GROWS_MIN = 0.5
_RECURRENT_FIGURE = "O(n) 逐次计算 (step after step)"
_ATTENTION_FIGURE = "O(1) 并行计算 (all positions at once)"
_MEMORY_FIGURE = "内存占用: 固定 (fixed)"


def _decode_series(results: Sequence[Result]) -> list[Series]:
    """Per model variant, the decode curve the claims read (see the module notes)."""
    by_variant: dict[str, list[Series]] = {}
    for s in series(results):
        if s.shape.mode == "decode" and len(s.points) >= 2:
            by_variant.setdefault(variant(s.shape), []).append(s)
    chosen = []
    for curves in by_variant.values():
        enough = [s for s in curves if len(s.points) >= MIN_SLOPE_POINTS]
        chosen.append(min(enough, key=lambda s: s.shape.batch) if enough else max(curves, key=lambda s: len(s.points)))
    return chosen


def _flat(fit: PowerLaw, what: str) -> tuple[Verdict, str]:
    if fit.exponent_high <= FLAT_MAX:
        return "supported", f"{what} did not grow with the context (k ≤ {FLAT_MAX})"
    if fit.exponent_low >= FLAT_NOT:
        return "contradicted", f"{what} grew with the context (k ≥ {FLAT_NOT})"
    return "inconclusive", undecided(FLAT_MAX, FLAT_NOT)


def _top(s: Series) -> str:
    """'; n^1.04 at n=4096–16384': the slope of the two longest contexts, where attention's cache read dominates."""
    if len(s.points) < MIN_SLOPE_POINTS:
        return ""
    last = s.points[-2:]
    fit = fit_power_law([r.case.seq_len for r in last], [r.median_s for r in last])
    return "" if fit is None else f"; n^{fit.exponent:.2f} at n={last[0].case.seq_len}–{last[1].case.seq_len}"


def _latency_row(s: Series) -> ClaimResult:
    recurrent = family(s.shape.model) == "recurrent"
    if recurrent:
        cid, figure = "1a", _RECURRENT_FIGURE
        claim = (
            f"RNN/LSTM decode: each new token costs the same at any context n (a fixed-size state): {variant(s.shape)}"
        )
    else:
        cid, figure = "1b", _ATTENTION_FIGURE
        claim = (
            "Self-attention decode: each new token reads the whole KV cache, so its cost grows with n (O(1) steps "
            f"hold for a whole sequence only): {variant(s.shape)}"
        )
    fit = fit_power_law(s.lengths, [r.median_s for r in s.points])
    keys = tuple(r.case.key for r in s.points)
    if fit is None:
        return ClaimResult(
            cid, claim, figure, f"no slope ({describe_series(s)})", keys, "inconclusive", "no usable fit"
        )
    measured = (
        f"time per token ∝ {exponent_text(fit)}, {format_seconds(s.points[0].median_s)} → "
        f"{format_seconds(s.points[-1].median_s)} ({describe_series(s)}{_top(s)})"
    )
    thin = thin_slope(fit, s.points)
    verdict: Verdict
    if thin:
        verdict, why = "inconclusive", thin
    elif recurrent:
        verdict, why = _flat(fit, "the step's time")
        if verdict == "supported":
            why += ": n tokens are n equal steps"
    elif fit.exponent_low >= GROWS_MIN:
        verdict, why = (
            "supported",
            (
                f"time per token grew with the context (k ≥ {GROWS_MIN}): generating is one step per token for "
                "attention too, and each step reads all n cached keys and values"
            ),
        )
    elif fit.exponent_high <= FLAT_MAX:
        verdict, why = (
            "contradicted",
            (
                f"time per token stayed flat (k ≤ {FLAT_MAX}): at these n the cache read is small beside the step's "
                "fixed work (projections, call overhead); longer contexts would show it"
            ),
        )
    else:
        verdict, why = "inconclusive", undecided(FLAT_MAX, GROWS_MIN)
    return ClaimResult(cid, claim, figure, measured, keys, verdict, why)


def _shape(s: Series) -> tuple[str, int, int, int, str]:
    c = s.shape
    return c.dtype, c.batch, c.d_model, c.layers, c.device


def _kv_cache(s: Series, attention: Sequence[Series]) -> str:
    """' vs sdpa's KV cache 258 KiB → 32 MiB (∝ n^1.00 […], measured)' for the attention curve of the same shape
    with the most lengths; '' when there is none."""
    same = [a for a in attention if _shape(a) == _shape(s)]
    if not same:
        return ""
    a = max(same, key=lambda c: len(c.points))
    held = [(r.case.seq_len, r.state_mem_bytes) for r in a.points if r.state_mem_bytes]
    if len(held) < 2:
        return ""
    fit = fit_power_law([n for n, _ in held], [float(b) for _, b in held])
    slope = "" if fit is None else f", ∝ {exponent_text(fit)}"
    return (
        f"; vs {variant(a.shape)}'s KV cache {format_bytes(held[0][1])} → {format_bytes(held[-1][1])} (measured{slope})"
    )


def _memory_row(s: Series, attention: Sequence[Series]) -> ClaimResult | None:
    computed = [(r.case.seq_len, r.state_bytes) for r in s.points if r.state_bytes is not None]
    if len(computed) < 2:
        return None
    claim = (
        f"RNN/LSTM memory is fixed (decode: the state a step reads, against attention's KV cache): {variant(s.shape)}"
    )
    keys = tuple(r.case.key for r in s.points)
    method = str(s.points[0].extra.get("state_mem_method", "?"))
    held = [(r.case.seq_len, r.state_mem_bytes) for r in s.points if r.state_mem_bytes]
    fit = fit_power_law([n for n, _ in held], [float(b) for _, b in held]) if len(held) >= MIN_SLOPE_POINTS else None
    lengths = describe_series(replace(s, points=tuple(r for r in s.points if r.state_bytes is not None)))
    sizes = sorted({b for _, b in computed if b is not None})
    size = format_bytes(sizes[0]) if len(sizes) == 1 else f"{format_bytes(sizes[0])} → {format_bytes(sizes[-1])}"
    verdict: Verdict
    if fit is not None:
        measured = f"state ∝ {exponent_text(fit)} measured ({method}), {size} computed ({lengths})"
        verdict, why = _flat(fit, "the measured state")
    else:
        computed_fit = fit_power_law([n for n, _ in computed], [float(b or 0) for _, b in computed])
        assert computed_fit is not None  # ≥ 2 distinct lengths, positive bytes
        measured = (
            f"state {size} at every n (computed; measured 0 B at {len(s.points) - len(held)} of "
            f"{len(s.points)} lengths, {method}) ({lengths})"
        )
        verdict, why = _flat(computed_fit, "the state")
        why += f"; judged on the computed bytes: the measured state is smaller than what {method} resolves"
    return ClaimResult("1d", claim, _MEMORY_FIGURE, measured + _kv_cache(s, attention), keys, verdict, why)


def decode_rows(results: Sequence[Result]) -> tuple[list[ClaimResult], list[ClaimResult]]:
    """Claim 1's decode rows: (1a/1b latency rows, 1d memory rows), recurrent variants first; none without decode."""
    chosen = _decode_series(results)
    chosen.sort(key=lambda s: family(s.shape.model) != "recurrent")
    attention = [s for s in chosen if family(s.shape.model) == "attention"]
    memory = [_memory_row(s, attention) for s in chosen if family(s.shape.model) == "recurrent"]
    return [_latency_row(s) for s in chosen], [row for row in memory if row is not None]
