"""Claim 1: RNN/LSTM need O(n) sequential steps, self-attention O(1); attention memory grows with n², an RNN's is
fixed. Read from the exponent k of seq_len ([k_low, k_high] its 95 % CI) of each model variant's curve.

The curve: at the smallest batch present with ≥ 3 lengths, forward mode when there is one. Growth in n tells
sequential depth from total work only while the device has room to spare, so "underused" is part of the rules:
at every point GPM SM and DRAM-bandwidth utilisation < 50 % (else < 10 % of peak FLOP/s; on a CPU, process
utilisation < 50 %).

- Recurrent (1a): supported if k_low ≥ 0.8 on an underused device (time follows n although there was room: each
  step waits for the last); contradicted if k_high ≤ 0.5 (time did not follow n: the steps ran in parallel, as a
  minGRU scan can); k_low ≥ 0.8 on a busy device is inconclusive (its work grows ∝ n too).
- Attention (1b): supported if k_high ≤ 0.5 (more positions cost little more time); contradicted if k_low ≥ 0.8
  on an underused device; growth on a busy one is inconclusive.
- Memory: attention "∝ n²" (1c) supported if k_low ≥ 1.7, contradicted if k_high ≤ 1.3; recurrent "fixed" (1d)
  supported if k_high ≤ 0.3, contradicted if k_low ≥ 0.7.

Kernels per call (the executor's profile, ``extra["kernels_per_call"]``) are shown where rows carry them.

These rows read whole-sequence modes; decode rows give claim 1 its generation side (``claims.decode``), placed
after the rows of the same claim.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnbench.analysis.efficiency import PeakTable
from attnbench.analysis.scaling import PowerLaw, fit_power_law
from attnbench.claims.decode import decode_rows
from attnbench.claims.selection import (
    Series,
    article_variant,
    describe_series,
    kind,
    option,
    parallel_recurrence,
    pct_of_peak,
    series,
    variant,
)
from attnbench.claims.verdicts import (
    GPU_CONFIG,
    MIN_SLOPE_POINTS,
    RSS_MIN_BYTES,
    ClaimResult,
    Verdict,
    config_for,
    exponent_text,
    few_points,
    not_measurable,
    thin_slope,
    undecided,
)
from attnbench.core.cases import Case, OptionValue
from attnbench.core.units import format_bytes, format_seconds
from attnbench.families.catalogue import MODELS, claim_role
from attnbench.results.records import Result, Run

SEQUENTIAL_MIN = 0.8
PARALLEL_MAX = 0.5
QUADRATIC_MIN, QUADRATIC_NOT = 1.7, 1.3
FIXED_MAX, FIXED_NOT = 0.3, 0.7
UNDERUSED_UTIL_PCT = 50.0
UNDERUSED_PEAK_PCT = 10.0


def _slope_series(results: Sequence[Result]) -> list[Series]:
    """Per model variant (model + options), the curve claim 1 reads: forward when present, the smallest batch
    with ≥ 3 lengths (else the one with most lengths). Variants with a single length cannot show a slope, and
    positional variants are left to claim 5 where the model also ran without one."""
    by_variant: dict[tuple[str, tuple[tuple[str, OptionValue], ...]], list[Series]] = {}
    curves = [
        s for s in series(results) if len(s.points) >= 2 and s.shape.mode != "decode" and article_variant(s.shape)
    ]
    # Positional encodings are claim 5's business: a model's positional=none curve speaks for it when it has one.
    plain = {s.shape.model for s in curves if option(s.shape, "positional") in (None, "none")}
    for s in curves:
        if s.shape.model not in plain or option(s.shape, "positional") in (None, "none"):
            by_variant.setdefault((s.shape.model, s.shape.options), []).append(s)
    chosen = []
    for variants in by_variant.values():
        forward = [s for s in variants if s.shape.mode == "forward"] or variants
        enough = [s for s in forward if len(s.points) >= MIN_SLOPE_POINTS]
        pool = enough or forward
        chosen.append(min(pool, key=lambda s: (s.shape.batch if enough else -len(s.points), s.shape.batch)))
    return chosen


def kernels_per_call(r: Result) -> int | None:
    """Device kernels one call queued, from the executor's profile (``kernels_per_call``; older rows may say
    ``kernel_launches``): the sequential depth a recurrent model pays per step, where the profiler sees it."""
    for name in ("kernels_per_call", "kernel_launches"):
        value = r.extra.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _launches(s: Series) -> str:
    """'; kernels/call 259 at n=128 → 4099 at n=2048 (∝ n^1.00 […])' when the rows carry the profile."""
    known = [(r.case.seq_len, k) for r in s.points if (k := kernels_per_call(r)) is not None]
    if not known:
        return ""
    text = f"; kernels/call {known[0][1]} at n={known[0][0]} → {known[-1][1]} at n={known[-1][0]}"
    fit = fit_power_law([n for n, _ in known], [c for _, c in known])
    return text + (f" (∝ {exponent_text(fit)})" if fit is not None and fit.points >= MIN_SLOPE_POINTS else "")


# ---------------------------------------------------------------------------------------------------------------
# Latency: sequential depth


def _busy(peaks: PeakTable, r: Result) -> bool | None:
    """Was the device busy during this case? None when the run cannot tell."""
    t = r.telemetry
    m = t.metrics if t is not None else {}
    if r.case.device.startswith("cpu"):
        util = m.get("cpu_util_pct")
        return None if not isinstance(util, float | int) else util >= UNDERUSED_UTIL_PCT
    sm, dram = m.get("gpm_sm_util_pct"), m.get("gpm_dram_bw_util_pct")
    if isinstance(sm, float | int) and isinstance(dram, float | int):
        return max(sm, dram) >= UNDERUSED_UTIL_PCT
    pct = pct_of_peak(peaks, r)
    return None if pct is None else pct >= UNDERUSED_PEAK_PCT


def _load(busy: Sequence[bool | None]) -> str:
    return "busy" if any(busy) else "of unknown load (no GPM, peak or utilisation reading)"


def _recurrent_steps(shape: Case, fit: PowerLaw, busy: Sequence[bool | None]) -> tuple[Verdict, str]:
    lo, hi = fit.exponent_low, fit.exponent_high
    role = claim_role(shape)
    mode = "".join(f"; {name}={value}" for name, value in role.shown) if role is not None else ""
    if hi <= PARALLEL_MAX:
        why = f"time barely grew with n (k ≤ {PARALLEL_MAX}): the steps did not run one after another{mode}"
        if parallel_recurrence(shape):
            why += "; a parallel scan removes the sequential dependency the premise rests on"
        return "contradicted", why
    if lo < SEQUENTIAL_MIN:
        return "inconclusive", undecided(PARALLEL_MAX, SEQUENTIAL_MIN) + mode
    if busy and all(b is False for b in busy):
        return "supported", (
            f"time grew in step with n (k ≥ {SEQUENTIAL_MIN}) while the device had room to spare: each step "
            f"waited for the last{mode}"
        )
    return "inconclusive", (
        f"time grew in step with n (k ≥ {SEQUENTIAL_MIN}), as sequential steps predict, but the device was "
        f"{_load(busy)}: total work, which also grows ∝ n, predicts the same{mode}"
    )


def _attention_steps(fit: PowerLaw, busy: Sequence[bool | None]) -> tuple[Verdict, str]:
    lo, hi = fit.exponent_low, fit.exponent_high
    if hi <= PARALLEL_MAX:
        return "supported", f"more positions cost little more time (k ≤ {PARALLEL_MAX}): they ran in parallel"
    if lo <= PARALLEL_MAX:
        return "inconclusive", undecided(PARALLEL_MAX, SEQUENTIAL_MIN)
    if lo >= SEQUENTIAL_MIN and busy and all(b is False for b in busy):
        return "contradicted", f"time grew with n (k ≥ {SEQUENTIAL_MIN}) although the device was underused throughout"
    return "inconclusive", (
        f"time grew with n (k > {PARALLEL_MAX}) but the device was {_load(busy)}: that growth is total work, not "
        f"sequential depth; a GPU at batch 1 separates the two ({GPU_CONFIG})"
    )


def _latency_row(peaks: PeakTable, s: Series) -> ClaimResult:
    recurrent = kind(s.shape) == "recurrent"
    if recurrent:
        cid, claim = "1a", f"RNN/LSTM need O(n) sequential steps: {variant(s.shape)}"
        figure = "O(n) 逐次计算 (step after step)"
    else:
        cid, claim = "1b", f"Self-attention needs O(1) sequential steps: {variant(s.shape)}"
        figure = "O(1) 并行计算 (all positions at once)"
    fit = fit_power_law(s.lengths, [r.median_s for r in s.points])
    keys = tuple(r.case.key for r in s.points)
    if fit is None:
        return ClaimResult(
            cid, claim, figure, f"no slope ({describe_series(s)})", keys, "inconclusive", "no usable fit"
        )
    times = f"{format_seconds(s.points[0].median_s)} → {format_seconds(s.points[-1].median_s)}"
    measured = f"time ∝ {exponent_text(fit)}, {times} ({describe_series(s)}){_launches(s)}"
    thin = thin_slope(fit, s.points)
    verdict: Verdict
    if thin:
        verdict, why = "inconclusive", thin
    elif recurrent:
        verdict, why = _recurrent_steps(s.shape, fit, [_busy(peaks, r) for r in s.points])
    else:
        verdict, why = _attention_steps(fit, [_busy(peaks, r) for r in s.points])
    return ClaimResult(cid, claim, figure, measured, keys, verdict, why)


# ---------------------------------------------------------------------------------------------------------------
# Peak memory against n


def _fixed_memory(fit: PowerLaw) -> tuple[Verdict, str]:
    lo, hi = fit.exponent_low, fit.exponent_high
    if hi <= FIXED_MAX:
        return "supported", f"peak barely moved with n (k ≤ {FIXED_MAX})"
    if lo >= FIXED_NOT:
        return "contradicted", (
            f"peak grew with n (k ≥ {FIXED_NOT}): the hidden state is fixed-size, but the layer returns all n "
            "outputs (and train keeps n steps of activations)"
        )
    return "inconclusive", undecided(FIXED_MAX, FIXED_NOT)


def _quadratic_memory(fit: PowerLaw, model: str) -> tuple[Verdict, str]:
    lo, hi = fit.exponent_low, fit.exponent_high
    if lo >= QUADRATIC_MIN:
        return "supported", f"peak grew ≈ n² (k ≥ {QUADRATIC_MIN}): the n×n scores are materialised"
    if hi <= QUADRATIC_NOT:
        cause = (
            "the n×d activations still outweigh the n×n scores at these lengths (n not yet large against d_model/heads)"
            if model == "vanilla"
            else "this kernel never materialises the n×n scores (FlashAttention-style tiling)"
        )
        return "contradicted", f"peak grew ≤ n^{QUADRATIC_NOT}: {cause}"
    return "inconclusive", undecided(QUADRATIC_NOT, QUADRATIC_MIN)


def _memory_row(s: Series) -> ClaimResult | None:
    """1c/1d from the same curve as the latency row; None when fewer than 2 lengths have a nonzero peak."""
    points = [r for r in s.points if r.memory is not None and r.memory.peak_bytes]
    peaks = [r.memory.peak_bytes or 0 for r in points if r.memory is not None]
    fit = fit_power_law([r.case.seq_len for r in points], peaks)
    if fit is None:
        return None
    method = points[0].memory.method if points[0].memory is not None else "?"
    measured = (
        f"peak memory ∝ {exponent_text(fit)}, {format_bytes(peaks[0])} → {format_bytes(peaks[-1])} "
        f"({describe_series(Series(s.shape, tuple(points)))}, {method})"
    )
    thin = few_points(fit)  # a peak is measured on its own: the timing's noise is no reason to doubt it
    if not thin and method == "rss-hwm" and max(peaks) < RSS_MIN_BYTES:
        thin = f"peaks below {format_bytes(RSS_MIN_BYTES)}: RSS page granularity and allocator caching dominate"
    recurrent = kind(s.shape) == "recurrent"
    if recurrent:
        cid, claim, figure = "1d", f"RNN/LSTM memory is fixed: {variant(s.shape)}", "内存占用: 固定 (fixed)"
    else:
        cid, claim = "1c", f"Self-attention memory grows with n²: {variant(s.shape)}"
        figure = "内存占用: 与序列长度平方相关 (∝ n²)"
    verdict: Verdict
    if thin:
        verdict, why = "inconclusive", thin
    elif recurrent:
        verdict, why = _fixed_memory(fit)
    else:
        verdict, why = _quadratic_memory(fit, s.shape.model)
    return ClaimResult(cid, claim, figure, measured, tuple(r.case.key for r in points), verdict, why)


def claim_sequential(run: Run, results: Sequence[Result], peaks: PeakTable | None = None) -> list[ClaimResult]:
    """Claim 1: latency and peak-memory exponents of seq_len, per model variant; then the decode view (``peaks``:
    the run's, derived once by ``evaluate_claims``; derived here when not given)."""
    chosen = _slope_series(results)
    decode_latency, decode_memory = decode_rows(results)
    if not chosen and not (decode_latency or decode_memory):
        return [
            not_measurable(
                "1",
                "RNN/LSTM need O(n) sequential steps, self-attention O(1); attention memory grows with n²",
                "O(n) vs O(1); memory 固定 vs ∝ n²",
                f"no model ran at two or more lengths with everything else fixed; sweep seq_len at batch 1 "
                f"({config_for(run)})",
            )
        ]
    # Recurrent rows first (the premise), attention after; within each, catalogue order.
    order = {name: i for i, name in enumerate(MODELS)}
    chosen.sort(key=lambda s: (kind(s.shape) != "recurrent", order.get(s.shape.model, len(order)), s.shape.options))
    held = peaks if peaks is not None else PeakTable.for_run(run)
    rows = [_latency_row(held, s) for s in chosen] + decode_latency
    memory = [row for row in (_memory_row(s) for s in chosen) if row is not None] + decode_memory
    # 1a before 1b, and 1c (attention ∝ n²) before 1d (RNN fixed), as the article's table reads; decode rows after
    # the whole-sequence rows of the same claim (a stable sort).
    by_id = lambda row: row.claim_id  # noqa: E731
    return sorted(rows, key=by_id) + sorted(memory, key=by_id)
