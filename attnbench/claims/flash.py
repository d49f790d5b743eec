"""Claim 4: FlashAttention runs inference more than 3× faster than vanilla attention at n = 2048 and cuts its
memory by 60 % (the article's RTX 3090).

Each of ``sdpa-flash`` and ``flash-attn`` against ``vanilla``, forward, same everything else, at n = 2048 or the
nearest length both ran (half precision and the larger batch preferred). Speed-up (4a): supported if its low
end ≥ 3 ("3倍以上", more than 3×), contradicted if its high end < 3. Memory reduction 1 − flash/vanilla (4b):
supported if ≥ 55 % (the article's "60 %" rounded to tens), contradicted below; peaks measured by different
methods are not compared.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from attnbench.claims.selection import label
from attnbench.claims.verdicts import (
    RSS_MIN_BYTES,
    ClaimResult,
    Verdict,
    config_for,
    format_signed_pct,
    format_times,
    join_reasons,
    not_measurable,
    ratio,
    speedup_verdict,
)
from attnbench.core.units import format_bytes, format_seconds
from attnbench.results.records import Result, Run

FLASH_MODELS = ("sdpa-flash", "flash-attn")
FLASH_SEQ_LEN = 2048
FLASH_SPEEDUP = 3.0
FLASH_MEMORY_CUT = 0.60
FLASH_MEMORY_SUPPORTED = 0.55

SPEED_FIGURE = "推理速度可提升3倍以上 (> 3×, RTX 3090)"
MEMORY_FIGURE = "内存占用减少60% (−60 %, RTX 3090)"


def _flash_pairs(results: Sequence[Result], model: str) -> list[tuple[Result, Result]]:
    """(vanilla, model) forward rows that differ only in the model."""
    vanilla = {r.case: r for r in results if r.case.model == "vanilla" and r.case.mode == "forward"}
    pairs = []
    for r in results:
        if r.case.model == model and r.case.mode == "forward":
            base = vanilla.get(replace(r.case, model="vanilla"))
            if base is not None:
                pairs.append((base, r))
    return pairs


def _closest(pairs: Sequence[tuple[Result, Result]]) -> tuple[Result, Result]:
    """The pair nearest the article's setting: n nearest 2048 (longer on a tie), half precision, larger batch."""
    return min(
        pairs,
        key=lambda p: (
            abs(math.log(p[1].case.seq_len / FLASH_SEQ_LEN)),
            -p[1].case.seq_len,
            p[1].case.dtype not in ("float16", "bfloat16"),
            -p[1].case.batch,
        ),
    )


def _memory_cut(base: Result, flash: Result) -> tuple[str, Verdict, str]:
    bm, fm = base.memory, flash.memory
    if bm is None or fm is None or bm.peak_bytes is None or fm.peak_bytes is None:
        return "peak memory not recorded", "not measurable", "a row has no peak memory"
    if bm.method != fm.method:
        return "—", "not measurable", f"peaks measured differently ({bm.method} vs {fm.method})"
    if bm.peak_bytes <= 0:
        return "vanilla peak 0 B", "inconclusive", "vanilla's peak is below what the method resolves"
    cut = 1 - fm.peak_bytes / bm.peak_bytes
    change = f"{format_signed_pct(-cut)} %"
    text = f"peak {format_bytes(bm.peak_bytes)} → {format_bytes(fm.peak_bytes)}: {change} ({bm.method})"
    if bm.method == "rss-hwm" and bm.peak_bytes < RSS_MIN_BYTES:
        return text, "inconclusive", f"peaks below {format_bytes(RSS_MIN_BYTES)}: RSS cannot resolve them"
    if cut >= FLASH_MEMORY_SUPPORTED:
        rounded = f"the article's {FLASH_MEMORY_CUT * 100:.0f} % rounded to tens"
        return text, "supported", f"cut ≥ {FLASH_MEMORY_SUPPORTED * 100:.0f} % ({rounded})"
    return text, "contradicted", f"cut < {FLASH_MEMORY_SUPPORTED * 100:.0f} %"


def _compared_where(run: Run, pairs: Sequence[tuple[Result, Result]], n: int) -> str:
    """Why this pair is not quite the article's setting: another length, another GPU ("" when it is)."""
    notes = []
    if n != FLASH_SEQ_LEN:
        # Either side may be the one that failed at the article's length (vanilla OOM, or the flash kernel).
        lost = [x for pair in pairs if pair[0].case.seq_len == FLASH_SEQ_LEN for x in pair if not x.is_timed]
        notes.append(
            f"{lost[0].case.model} {lost[0].status} at n={FLASH_SEQ_LEN}, so compared at n={n}"
            if lost
            else f"n={FLASH_SEQ_LEN} not in this run: nearest n={n}"
        )
    gpu = str(run.environment.get("gpu_name") or "")
    if "3090" not in gpu:
        notes.append(f"on {gpu or 'a CPU'}, not the article's RTX 3090")
    return "; ".join(notes)


def claim_flash(run: Run, results: Sequence[Result]) -> list[ClaimResult]:
    """Claim 4: FlashAttention vs vanilla at n = 2048, forward: > 3× faster, memory −60 %."""
    out: list[ClaimResult] = []
    for model in FLASH_MODELS:
        speed_claim = f"FlashAttention ({model} vs vanilla): inference > 3× faster at n = {FLASH_SEQ_LEN}"
        mem_claim = f"FlashAttention ({model} vs vanilla): memory −60 % at n = {FLASH_SEQ_LEN}"
        pairs = _flash_pairs(results, model)
        if not pairs:
            continue
        ok = [(b, f) for b, f in pairs if b.is_timed and f.is_timed]
        if not ok:
            reasons = sorted({f"{x.case.model}: {x.status} ({x.reason})" for p in pairs for x in p if not x.is_timed})
            keys = tuple(x.case.key for p in pairs for x in p)
            out += [
                ClaimResult("4a", speed_claim, SPEED_FIGURE, "—", keys, "not measurable", "; ".join(reasons)),
                ClaimResult("4b", mem_claim, MEMORY_FIGURE, "—", keys, "not measurable", "; ".join(reasons)),
            ]
            continue
        base, flash = _closest(ok)
        where = label(flash.case).replace(f"{model} ", "", 1)
        tail = _compared_where(run, pairs, flash.case.seq_len)
        keys = (base.case.key, flash.case.key)
        x = ratio(base, flash)
        speed = (
            f"vanilla {format_seconds(base.median_s)} vs {model} {format_seconds(flash.median_s)} → "
            f"{format_times(x)} ({where})"
        )
        verdict, why = speedup_verdict(x, FLASH_SPEEDUP, (base, flash))
        why = why or (f"≥ {FLASH_SPEEDUP:g}×" if verdict == "supported" else f"< {FLASH_SPEEDUP:g}×")
        out.append(ClaimResult("4a", speed_claim, SPEED_FIGURE, speed, keys, verdict, join_reasons(why, tail)))
        text, mverdict, mwhy = _memory_cut(base, flash)
        out.append(
            ClaimResult("4b", mem_claim, MEMORY_FIGURE, f"{text} ({where})", keys, mverdict, join_reasons(mwhy, tail))
        )
    if not out:
        why = (
            "no forward sdpa-flash/flash-attn rows matched by vanilla (same shape and options); run them side by "
            f"side at n={FLASH_SEQ_LEN} ({config_for(run)})"
        )
        return [
            not_measurable("4a", f"FlashAttention: inference > 3× faster at n = {FLASH_SEQ_LEN}", SPEED_FIGURE, why),
            not_measurable("4b", f"FlashAttention: memory −60 % at n = {FLASH_SEQ_LEN}", MEMORY_FIGURE, why),
        ]
    return out
