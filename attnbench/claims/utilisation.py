"""Claim 2: RNN/LSTM keep the GPU 30–40 % utilised, self-attention 70–90 %.

Read as NVML ``gpu_util_pct`` (the metric the article's figure reads as) at each model's largest case with
reliable telemetry (train mode when present). RNN/LSTM (lstm, gru, 2a): supported ≤ 40 %, contradicted > 45 %;
attention (2b): supported ≥ 70 %, contradicted < 65 %; the 5-point margins are NVML's sampling. Models that
disagree, or a reading in a margin: inconclusive. GPM SM / tensor utilisation, % of peak FLOP/s (``peak_use``)
and the profiled kernel-busy share of the call are shown beside it. A CPU run shows ``cpu_util_pct`` and is not
measurable.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnbench.analysis.efficiency import PeakTable
from attnbench.claims.selection import kind, label, pct_of_peak, peak_of
from attnbench.claims.verdicts import GPU_CONFIG, ClaimResult, Verdict, not_measurable
from attnbench.core.units import format_pct
from attnbench.results.records import Result, Run

RNN_UTIL = (30.0, 40.0)
ATTENTION_UTIL = (70.0, 90.0)
UTIL_MARGIN = 5.0  # what NVML's sampling earns
CLASSIC_RNNS = ("lstm", "gru")

NVML_NOTE = (
    "The article's 30–40 % / 70–90 % read as NVML utilization.gpu, what nvidia-smi shows: the share of time in "
    "which any kernel ran. One small kernel keeps it at 100 %, so it measures occupancy of the timeline, not of "
    "the chip; GPM SM utilisation, tensor-core utilisation and % of peak FLOP/s say how much of the chip worked."
)


def kernel_busy_pct(r: Result) -> float | None:
    """Share of a call's median time in which the profiled kernels kept the device busy (``kernel_busy_s``):
    NVML's "any kernel running" measured per call instead of sampled."""
    busy = r.extra.get("kernel_busy_s")
    if not r.is_timed or not isinstance(busy, int | float) or isinstance(busy, bool) or r.median_s <= 0:
        return None
    return 100.0 * min(1.0, busy / r.median_s)


def _representative(rows: Sequence[Result]) -> Result:
    """The case the article's utilisation figure is most like: training, as much work per call as ran."""
    train = [r for r in rows if r.case.mode == "train"] or list(rows)
    return max(train, key=lambda r: (r.case.tokens, r.case.d_model, r.case.layers))


def _util_line(peaks: PeakTable, r: Result) -> str:
    """'lstm: NVML 97 % · SM 12 % · tensor 0 % · 0.8 % of peak (vendor … tf32 dense) · kernels busy 31 % of the
    call (the case)'."""
    m = r.telemetry.metrics if r.telemetry is not None else {}
    peak, pct = peak_of(peaks, r), pct_of_peak(peaks, r)
    if peak is None:
        of_peak = "% of peak n/a (no peak for this device and dtype)"
    elif pct is None:
        of_peak = "% of peak n/a (no FLOP count in the row)"
    else:
        of_peak = f"{pct:.1f} % of peak ({peak.source})"
    busy = kernel_busy_pct(r)
    profiled = "" if busy is None else f" · kernels busy {busy:.0f} % of the call"
    return (
        f"{r.case.model}: NVML {format_pct(m.get('gpu_util_pct'))} · SM {format_pct(m.get('gpm_sm_util_pct'))} · "
        f"tensor {format_pct(m.get('gpm_tensor_util_pct'))} · {of_peak}{profiled} ({label(r.case)})"
    )


def _util_verdict(value: float, claimed: tuple[float, float], high_is_claimed: bool) -> Verdict:
    lo, hi = claimed
    if high_is_claimed:
        return "supported" if value >= lo else "contradicted" if value < lo - UTIL_MARGIN else "inconclusive"
    return "supported" if value <= hi else "contradicted" if value > hi + UTIL_MARGIN else "inconclusive"


def _also_in_range(peaks: PeakTable, reps: Sequence[Result], claimed: tuple[float, float]) -> str:
    """Which of the other metrics would fall in the article's range."""
    names = {"gpm_sm_util_pct": "GPM SM util", "gpm_tensor_util_pct": "tensor util"}
    hits = []
    for name, words in names.items():
        values = [r.telemetry.metrics.get(name) for r in reps if r.telemetry is not None]
        if values and all(isinstance(v, int | float) and claimed[0] <= v <= claimed[1] for v in values):
            hits.append(words)
    pcts = [pct_of_peak(peaks, r) for r in reps]
    if pcts and all(p is not None and claimed[0] <= p <= claimed[1] for p in pcts):
        hits.append("% of peak")
    return f"; {', '.join(hits)} would fall in the article's range" if hits else ""


def _util_row(
    peaks: PeakTable,
    cid: str,
    family_rows: Sequence[Result],
    claim: str,
    figure: str,
    claimed: tuple[float, float],
    high: bool,
) -> ClaimResult:
    by_model: dict[str, list[Result]] = {}
    for r in family_rows:
        by_model.setdefault(r.case.model, []).append(r)
    # A window too short for NVML's averaging says little; a model's reliable rows speak for it when it has any.
    trusted = {m: [r for r in rows if r.telemetry is not None and r.telemetry.reliable] for m, rows in by_model.items()}
    reps = [_representative(trusted[m] or rows) for m, rows in by_model.items()]
    keys = tuple(r.case.key for r in reps)
    measured = "; ".join(_util_line(peaks, r) for r in reps)
    unreliable = [r for r in reps if r.telemetry is None or not r.telemetry.reliable]
    values = [r.telemetry.metrics.get("gpu_util_pct") for r in reps if r.telemetry is not None]
    if unreliable:
        notes = "; ".join(f"{r.case.model}: {r.telemetry.note if r.telemetry else 'none'}" for r in unreliable)
        return ClaimResult(cid, claim, figure, measured, keys, "inconclusive", f"telemetry not reliable ({notes})")
    if len(values) != len(reps) or not all(isinstance(v, int | float) for v in values):
        reasons = {r.telemetry.unavailable.get("gpu_util_pct", "") for r in reps if r.telemetry is not None}
        why = f"NVML utilisation unavailable: {'; '.join(sorted(x for x in reasons if x)) or 'not recorded'}"
        return ClaimResult(cid, claim, figure, measured, keys, "not measurable", why)
    verdicts = {_util_verdict(float(v), claimed, high) for v in values if isinstance(v, int | float)}
    verdict: Verdict = verdicts.pop() if len(verdicts) == 1 else "inconclusive"
    side = f"≥ {claimed[0]:.0f} %" if high else f"≤ {claimed[1]:.0f} %"
    why = {
        "supported": f"NVML time-utilisation {side} at each model's largest case",
        "contradicted": f"NVML time-utilisation outside {claimed[0]:.0f}–{claimed[1]:.0f} % by more than "
        f"{UTIL_MARGIN:.0f} points, on the other side",
        "inconclusive": "models disagree, or a reading lies within the 5-point margin of the range",
    }[verdict]
    return ClaimResult(cid, claim, figure, measured, keys, verdict, why + _also_in_range(peaks, reps, claimed))


def _cpu_util(rows: Sequence[Result]) -> str:
    values = [
        float(v)
        for r in rows
        if r.telemetry is not None and isinstance(v := r.telemetry.metrics.get("cpu_util_pct"), int | float)
    ]
    if not values:
        return "—"
    span = f"{min(values):.0f}" if round(min(values)) == round(max(values)) else f"{min(values):.0f}–{max(values):.0f}"
    cases = f"{len(values)} case{'s' * (len(values) != 1)}"
    return f"cpu_util_pct {span} % over {cases} (process; 100 = every core)"


def claim_utilisation(run: Run, results: Sequence[Result], peaks: PeakTable | None = None) -> list[ClaimResult]:
    """Claim 2: NVML time-utilisation (the article's metric) beside GPM SM/tensor utilisation and % of peak
    (``peaks``: the run's, derived once by ``evaluate_claims``; derived here when not given)."""
    held = peaks if peaks is not None else PeakTable.for_run(run)
    timed = [r for r in results if r.is_timed]
    sides = (
        (
            "2a",
            "RNN/LSTM keep the GPU 30–40 % utilised",
            "GPU利用率 30–40 %",
            [r for r in timed if r.case.model in CLASSIC_RNNS],
            RNN_UTIL,
            False,
        ),
        (
            "2b",
            "Self-attention keeps the GPU 70–90 % utilised",
            "GPU利用率 70–90 %",
            [r for r in timed if kind(r.case) == "attention"],
            ATTENTION_UTIL,
            True,
        ),
    )
    any_gpu = any(not r.case.device.startswith("cpu") for _, _, _, rows, _, _ in sides for r in rows)
    out = []
    for cid, claim, figure, rows, claimed, high in sides:
        # A row without telemetry cannot speak for its model's utilisation.
        on_gpu = [r for r in rows if not r.case.device.startswith("cpu") and r.telemetry is not None]
        if not any_gpu:
            cpu = [r for r in rows if r.case.device.startswith("cpu")]
            why = "CPU run; cpu_util_pct shown instead" if cpu else f"no timed rows of this family ({GPU_CONFIG})"
            keys = tuple(r.case.key for r in cpu)
            out.append(ClaimResult(cid, claim, figure, _cpu_util(cpu), keys, "not measurable", why))
        elif not on_gpu and any(not r.case.device.startswith("cpu") for r in rows):
            out.append(
                not_measurable(
                    cid, claim, figure, "no telemetry in this family's GPU rows; rerun with --telemetry basic"
                )
            )
        elif not on_gpu:
            out.append(not_measurable(cid, claim, figure, f"no timed GPU rows of this family ({GPU_CONFIG})"))
        elif all(r.telemetry is None or r.telemetry.level == "off" for r in on_gpu):
            out.append(not_measurable(cid, claim, figure, "telemetry was off; rerun with --telemetry basic (or full)"))
        else:
            out.append(_util_row(held, cid, on_gpu, claim, figure, claimed, high))
    return out
