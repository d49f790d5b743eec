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
  method reads it at ≥ 3 lengths and it reaches 64 KiB (supported if k_high ≤ 0.3, contradicted if k_low ≥ 0.7);
  a smaller state (a few KiB: the page or two it straddles decides its reading) or one read as 0 B is judged on
  its computed bytes, which a test holds equal to the allocated tensors, and the row says so. The KV cache of
  the attention variant of the same shape is shown beside it, measured.

Anything else is inconclusive, and so is a curve thin on evidence (``verdicts.thin_slope``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from attnbench.analysis.scaling import PowerLaw, fit_power_law
from attnbench.claims.selection import Series, article_variant, describe_series, kind, series, variant
from attnbench.claims.verdicts import MIN_SLOPE_POINTS, ClaimResult, Verdict, exponent_text, thin_slope, undecided
from attnbench.core.units import KIB, format_bytes, format_seconds
from attnbench.results.records import Result

FLAT_MAX, FLAT_NOT = 0.3, 0.7
GROWS_MIN = 0.5
# Below this a measured state is a few pages, and which pages it straddles (one or two for 1 KiB) moves the reading
# more than its size: such a state is judged on its computed bytes (resident pages only: CUDA's allocator counts
# the state's own blocks).
PAGE_SCALE = 64 * KIB
# What each way of measuring a state reads, in the words a row's reader needs.
_METHOD_READS = {
    "resident-pages": "the pages it sits in",
    "cuda-allocator": "the caching allocator's blocks it held, in 512 B steps",
}
_RECURRENT_FIGURE = "O(n) 逐次计算 (step after step)"
_ATTENTION_FIGURE = "O(1) 并行计算 (all positions at once)"
_MEMORY_FIGURE = "内存占用: 固定 (fixed)"


def _decode_series(results: Sequence[Result]) -> list[Series]:
    """Per model variant, the decode curve the claims read (see the module notes)."""
    by_variant: dict[str, list[Series]] = {}
    for s in series(results):
        if s.shape.mode == "decode" and len(s.points) >= 2 and article_variant(s.shape):
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


def _latency_verdict(fit: PowerLaw, recurrent: bool) -> tuple[Verdict, str]:
    if recurrent:
        verdict, why = _flat(fit, "the step's time")
        return verdict, why + (": n tokens are n equal steps" if verdict == "supported" else "")
    if fit.exponent_low >= GROWS_MIN:
        return "supported", (
            f"time per token grew with the context (k ≥ {GROWS_MIN}): generating is one step per token for attention "
            "too, and each step reads all n cached keys and values"
        )
    if fit.exponent_high <= FLAT_MAX:
        return "contradicted", (
            f"time per token stayed flat (k ≤ {FLAT_MAX}): at these n the cache read is small beside the step's fixed "
            "work (projections, call overhead); longer contexts would show it"
        )
    return "inconclusive", undecided(FLAT_MAX, GROWS_MIN)


def _latency_row(s: Series) -> ClaimResult:
    recurrent = kind(s.shape) == "recurrent"
    if recurrent:
        cid, figure = "1a", _RECURRENT_FIGURE
        claim = "RNN/LSTM decode: each new token costs the same at any context n (a fixed-size state): "
    else:
        cid, figure = "1b", _ATTENTION_FIGURE
        claim = (
            "Self-attention decode: each new token reads the whole KV cache, so its cost grows with n (O(1) steps "
            "hold for a whole sequence only): "
        )
    claim += variant(s.shape)
    fit = fit_power_law(s.lengths, [r.median_s for r in s.points])
    keys = tuple(r.case.key for r in s.points)
    if fit is None:
        measured = f"no slope ({describe_series(s)})"
        return ClaimResult(cid, claim, figure, measured, keys, "inconclusive", "no usable fit")
    times = f"{format_seconds(s.points[0].median_s)} → {format_seconds(s.points[-1].median_s)}"
    measured = f"time per token ∝ {exponent_text(fit)}, {times} ({describe_series(s)}{_top(s)})"
    verdict, why = _latency_verdict(fit, recurrent)
    thin = thin_slope(fit, s.points)
    if thin:  # say what the exponent alone would conclude: the reader may trust the fit more than the rule does
        why = f"would be {verdict} ({why}), but {thin}" if verdict != "inconclusive" else thin
        verdict = "inconclusive"
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


def _measured_text(held: Sequence[int], points: int, method: str) -> str:
    """'measured 0 B at 8 of 8 lengths' or 'measured 4 KiB–8 KiB, the page or two it sits in'."""
    if not held:
        return f"measured 0 B at {points} of {points} lengths, {method}"
    low, high = format_bytes(min(held)), format_bytes(max(held))
    reads = _METHOD_READS.get(method, "as measured")
    return f"measured {low if low == high else f'{low}–{high}'} ({method}: {reads})"


def _memory_row(s: Series, attention: Sequence[Series]) -> ClaimResult | None:
    points = [r for r in s.points if r.state_bytes is not None]
    if len(points) < 2:
        return None
    claim = "RNN/LSTM memory is fixed (decode: the state a step reads, against attention's KV cache): "
    claim += variant(s.shape)
    keys = tuple(r.case.key for r in points)
    method = str(points[0].extra.get("state_mem_method", "?"))
    held = [(r.case.seq_len, r.state_mem_bytes) for r in points if r.state_mem_bytes]
    sizes = sorted({r.state_bytes or 0 for r in points})
    size = format_bytes(sizes[0]) if len(sizes) == 1 else f"{format_bytes(sizes[0])} → {format_bytes(sizes[-1])}"
    lengths = describe_series(replace(s, points=tuple(points)))
    verdict: Verdict
    paged = method == "resident-pages"
    if len(held) >= MIN_SLOPE_POINTS and (not paged or max(b for _, b in held) >= PAGE_SCALE):
        fit = fit_power_law([n for n, _ in held], [float(b) for _, b in held])
        assert fit is not None  # ≥ 3 distinct lengths, positive bytes
        measured = f"state ∝ {exponent_text(fit)} measured ({method}), {size} computed ({lengths})"
        verdict, why = _flat(fit, "the measured state")
    else:
        computed = fit_power_law([r.case.seq_len for r in points], [float(r.state_bytes or 0) for r in points])
        assert computed is not None  # ≥ 2 distinct lengths, positive bytes
        measured = f"state {size} at every n (computed; {_measured_text([b for _, b in held], len(points), method)})"
        measured += f" ({lengths})"
        if computed.points < MIN_SLOPE_POINTS:
            verdict, why = "inconclusive", thin_slope(computed, points)
        else:
            verdict, why = _flat(computed, "the state")
            if paged:
                why += (
                    f"; judged on the computed bytes: a state of a few pages reads as the pages it straddles, which "
                    f"says where it sits rather than how large it is ({method})"
                )
    return ClaimResult("1d", claim, _MEMORY_FIGURE, measured + _kv_cache(s, attention), keys, verdict, why)


def decode_rows(results: Sequence[Result]) -> tuple[list[ClaimResult], list[ClaimResult]]:
    """Claim 1's decode rows: (1a/1b latency rows, 1d memory rows), recurrent variants first; none without decode."""
    chosen = _decode_series(results)
    chosen.sort(key=lambda s: kind(s.shape) != "recurrent")
    attention = [s for s in chosen if kind(s.shape) == "attention"]
    memory = [_memory_row(s, attention) for s in chosen if kind(s.shape) == "recurrent"]
    return [_latency_row(s) for s in chosen], [row for row in memory if row is not None]
