"""Claim 3: BERT-base trains 5–8× faster than an LSTM of the same size (110 M parameters).

Read from ``scope=model`` rows in train mode with the same device, dtype, batch and seq_len, parameter counts
within 10 % (the LSTM nearest in size stands in when several ran): t_lstm / t_attention is supported if its low
end ≥ 5, contradicted if its high end < 5. A pair that is not the article's 110 M says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnbench.claims.selection import kind, option
from attnbench.claims.verdicts import (
    ClaimResult,
    Interval,
    Verdict,
    config_for,
    format_times,
    join_reasons,
    not_measurable,
    ratio,
    speedup_verdict,
)
from attnbench.core.cases import Case
from attnbench.core.units import format_seconds
from attnbench.results.records import Result, Run

TRAIN_SPEEDUP = (5.0, 8.0)
SAME_SIZE = 0.10
ARTICLE_PARAMETERS = 110e6

CLAIM = "BERT-base trains 5–8× faster than an LSTM of the same size (110 M parameters)"
FIGURE = "训练速度可提升5-8倍 (5–8×)"


def _params(n: int | None) -> str:
    return "?" if n is None else f"{n / 1e6:.1f} M"


def _name(case: Case) -> str:
    preset = option(case, "preset")
    return f"{case.model} ({preset})" if preset not in (None, "", "none") else case.model


def _training_why(verdict: Verdict, x: Interval) -> str:
    low, high = TRAIN_SPEEDUP
    if verdict == "contradicted":
        return f"below {low:g}× ({'still faster' if x.low > 1 else 'not faster'})"
    if x.low > high:
        return f"faster than claimed (> {high:g}×)"
    return f"within {low:g}–{high:g}×" if x.high <= high else f"at least {low:g}×"


def _article_size(*rows: Result) -> str:
    """A note when the pair is not the article's 110 M parameters (a scaled-down CPU config)."""
    sizes = [r.parameters for r in rows if r.parameters is not None]
    if sizes and all(abs(p - ARTICLE_PARAMETERS) <= SAME_SIZE * ARTICLE_PARAMETERS for p in sizes):
        return ""
    return f"scaled down: {' / '.join(_params(p) for p in sizes)} parameters, not the article's 110 M"


def _train_pair(attention: Result, lstm: Result) -> ClaimResult:
    at = f"train b={attention.case.batch} n={attention.case.seq_len} {attention.case.dtype}"
    keys = (lstm.case.key, attention.case.key)
    sizes = (
        f"params {_name(lstm.case)} {_params(lstm.parameters)} vs {_name(attention.case)} "
        f"{_params(attention.parameters)}"
    )
    broken = [x for x in (lstm, attention) if not x.is_timed]
    if broken:
        why = "; ".join(f"{_name(x.case)}: {x.status} ({x.reason})" for x in broken)
        return ClaimResult("3", CLAIM, FIGURE, f"{sizes} ({at})", keys, "not measurable", why)
    if lstm.parameters is None or attention.parameters is None:
        return ClaimResult("3", CLAIM, FIGURE, f"{sizes} ({at})", keys, "not measurable", "parameter counts missing")
    if abs(lstm.parameters - attention.parameters) > SAME_SIZE * max(lstm.parameters, attention.parameters):
        why = f"not the same size: parameter counts differ by more than {SAME_SIZE * 100:.0f} %"
        return ClaimResult("3", CLAIM, FIGURE, f"{sizes} ({at})", keys, "not measurable", why)
    x = ratio(lstm, attention)
    measured = (
        f"{_name(lstm.case)} {format_seconds(lstm.median_s)} vs {_name(attention.case)} "
        f"{format_seconds(attention.median_s)} per step → {format_times(x)} ({at}; {sizes})"
    )
    verdict, why = speedup_verdict(x, TRAIN_SPEEDUP[0], (lstm, attention))
    why = join_reasons(why or _training_why(verdict, x), _article_size(lstm, attention))
    return ClaimResult("3", CLAIM, FIGURE, measured, keys, verdict, why)


def claim_training(run: Run, results: Sequence[Result]) -> list[ClaimResult]:
    """Claim 3: BERT-base trains 5–8× faster than an LSTM of its size (110 M parameters)."""
    hint = (
        "it needs attention and lstm rows at scope=model in train mode with the same batch and seq_len, e.g. the "
        f"presets bert-base and lstm-110m ({config_for(run)})"
    )
    whole = [r for r in results if option(r.case, "scope") == "model"]
    if not whole:
        return [not_measurable("3", CLAIM, FIGURE, f"no model-scope rows (scope=model) in this run; {hint}")]
    train = [r for r in whole if r.case.mode == "train"]
    attention = [r for r in train if kind(r.case) == "attention"]
    lstms: dict[tuple[str, str, int, int], list[Result]] = {}
    for r in train:
        if r.case.model == "lstm":
            # The kind of device: a --devices sweep spreads a pair over GPUs of one model (measure.pool's rule).
            lstms.setdefault((r.case.device.split(":")[0], r.case.dtype, r.case.batch, r.case.seq_len), []).append(r)
    if not attention or not lstms:
        lacking = "an attention model" if not attention else "an lstm"
        return [not_measurable("3", CLAIM, FIGURE, f"the model-scope train rows lack {lacking}; {hint}")]
    out = []
    for a in attention:
        candidates = lstms.get((a.case.device.split(":")[0], a.case.dtype, a.case.batch, a.case.seq_len), [])
        if candidates:
            # The LSTM nearest in size stands in for "the same size" (lstm-110m when both are there).
            lstm = min(candidates, key=lambda r: abs((r.parameters or 0) - (a.parameters or 0)))
            out.append(_train_pair(a, lstm))
    if not out:
        why = f"no lstm and attention model-scope train rows share device, dtype, batch and seq_len; {hint}"
        return [not_measurable("3", CLAIM, FIGURE, why)]
    return out
