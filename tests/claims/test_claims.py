"""``attnbench claims``: every verdict of every claim on synthetic rows, a golden table, and the CLI on a stored run.

Synthetic rows have exact medians (every sample equal, or a chosen spread), so each verdict follows from the
documented rules in the docstrings of attnbench/claims/ and nothing else.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.claims import ClaimResult, ClaimsReport, evaluate_claims, ratio
from attnbench.claims.decode import FLAT_MAX, GROWS_MIN
from attnbench.claims.sequential import PARALLEL_MAX, SEQUENTIAL_MIN
from attnbench.cli import app
from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.units import MIB
from attnbench.report.claims_md import claims_table, render_claims_json, render_claims_markdown
from attnbench.results.measurement import Measurement
from attnbench.results.records import Memory, Result, Run
from attnbench.results.telemetry import TelemetrySummary
from tests.support import FIXTURE, GOLDEN, numbers

LENGTHS = (128, 256, 512, 1024, 2048)
RECURRENT = {"lstm", "gru", "mingru", "minlstm", "mamba2"}

CPU_ENV = {"device": "cpu", "device_type": "cpu", "cpu_model": "AMD EPYC", "torch_threads": 2, "torch": "2.13.0"}
GPU_ENV = {"device": "cuda:0", "device_type": "cuda", "gpu_name": "NVIDIA H200", "torch": "2.13.0"}


def make_run(environment: Mapping[str, object] = GPU_ENV) -> Run:
    return Run(
        run_id="synthetic",
        created_utc="2026-12-02T00:00:00Z",
        config_source="synthetic",
        config={},
        config_sha256="0" * 64,
        timing=TimingPolicy(),
        environment=dict(environment),
        state="complete",
    )


def telemetry(level: str = "full", reliable: bool = True, **metrics: float) -> TelemetrySummary:
    return TelemetrySummary(
        source="nvml+psutil" if level != "off" else "off",
        level=level,
        interval_s=0.02,
        window_s=1.0,
        samples=50,
        reliable=reliable,
        note="" if reliable else "window 0.05 s is shorter than NVML's averaging period",
        metrics=metrics,
        unavailable={},
    )


def row(
    model: str,
    n: int,
    seconds: float,
    *,
    mode: str = "forward",
    batch: int = 1,
    dtype: str = "float16",
    device: str = "cuda",
    d_model: int = 768,
    heads: int = 12,
    options: Sequence[tuple[str, object]] = (),
    peak: int | None = None,
    method: str = "cuda-allocator",
    parameters: int | None = None,
    spread: float = 0.0,
    converged: bool = True,
    tele: TelemetrySummary | None = None,
    extra: Mapping[str, object] | None = None,
    status: str = "ok",
    reason: str = "",
) -> Result:
    recurrent = model in RECURRENT
    case = Case(
        model,
        mode,  # type: ignore[arg-type]
        dtype,
        device,
        batch,
        n,
        d_model,
        None if recurrent else heads,
        1,
        recurrent,
        tuple(sorted(options)),  # type: ignore[arg-type]
    )
    if status != "ok":
        return Result(case, status, reason=reason or "why")  # type: ignore[arg-type]
    # 21 samples spread evenly over ±spread around the median: the median is exact and the CI of the median
    # (ranks 5..15) is ±spread/2 of it.
    samples = tuple(seconds * (1 + spread * (i - 10) / 10) for i in range(21))
    m = Measurement(samples, 1, 3, 0.0, converged, "converged" if converged else "budget", 0.01)
    memory = None if peak is None else Memory(peak, method)
    return Result(
        case,
        "ok",
        measurement=m,
        memory=memory,
        parameters=parameters,
        extra=dict(extra or {}),
        telemetry=tele,
    )


def curve(
    model: str, exponent: float, *, base: float = 1e-4, memory: float | None = None, **kw: object
) -> list[Result]:
    """One row per length with time ∝ n^exponent (and peak memory ∝ n^memory when given)."""
    out = []
    for n in LENGTHS:
        scale = n / LENGTHS[0]
        peak = None if memory is None else int(64 * MIB * scale**memory)
        out.append(row(model, n, base * scale**exponent, peak=peak, **kw))  # type: ignore[arg-type]
    return out


def claims(results: Sequence[Result], environment: Mapping[str, object] = GPU_ENV) -> list[ClaimResult]:
    return list(evaluate_claims(make_run(environment), results).claims)


def only(results: Sequence[Result], claim_id: str, environment: Mapping[str, object] = GPU_ENV) -> ClaimResult:
    (found,) = [c for c in claims(results, environment) if c.claim_id == claim_id]
    return found


def by_variant(results: Sequence[Result], claim_id: str, variant: str) -> ClaimResult:
    (found,) = [c for c in claims(results) if c.claim_id == claim_id and c.claim.endswith(f": {variant}")]
    return found


UNDERUSED = telemetry(gpu_util_pct=99.0, gpm_sm_util_pct=10.0, gpm_dram_bw_util_pct=5.0)
BUSY = telemetry(gpu_util_pct=100.0, gpm_sm_util_pct=90.0, gpm_dram_bw_util_pct=40.0)


# ---------------------------------------------------------------------------------------------------------------
# Claim 1: sequential steps and memory


def test_1a_recurrent_time_linear_in_n_on_an_underused_device_is_supported() -> None:
    c = only(curve("lstm", 1.0, tele=UNDERUSED), "1a")
    assert c.verdict == "supported" and "room to spare" in c.why
    assert "n^1.00 [1.00–1.00]" in c.measured and "n=128–2048" in c.measured
    assert len(c.evidence_cases) == len(LENGTHS)


def test_1a_parallel_scan_rnn_contradicts_the_premise() -> None:
    results = curve("mingru", 0.1, options=[("scan", "parallel")]) + curve(
        "mingru", 1.0, options=[("scan", "sequential")], tele=UNDERUSED
    )
    parallel = by_variant(results, "1a", "mingru scan=parallel")
    assert parallel.verdict == "contradicted"
    assert PARALLEL_MAX in numbers(parallel.why) and "scan=parallel" in parallel.why  # the rule, and the scan
    assert by_variant(results, "1a", "mingru scan=sequential").verdict == "supported"


def test_1a_default_scan_is_named_in_the_row() -> None:
    # The catalogue's default scan for mingru is parallel: the row must say so even when the case does not.
    (c,) = [c for c in claims(curve("mingru", 0.1)) if c.claim_id == "1a"]
    assert c.claim.endswith("mingru scan=parallel")


def test_1a_linear_growth_on_a_busy_device_is_inconclusive() -> None:
    # A parallel scan on a saturated device also grows ∝ n: its work does. Growth alone proves nothing there.
    c = only(curve("mingru", 1.0, tele=BUSY), "1a")
    assert c.verdict == "inconclusive" and SEQUENTIAL_MIN in numbers(c.why) and "busy" in c.why
    assert only(curve("lstm", 1.0), "1a").verdict == "inconclusive"  # no telemetry: load unknown


def test_1a_two_lengths_are_inconclusive() -> None:
    c = only(curve("lstm", 1.0)[:2], "1a")
    assert c.verdict == "inconclusive"
    assert "only 2 usable lengths" in c.why and "[no CI]" in c.measured


def test_1a_slope_in_the_undecided_band_is_inconclusive() -> None:
    wobble = (1.0, 1.6, 1.3, 2.8, 2.3)  # a slope near 0.65 with a wide CI
    results = [row("lstm", n, 1e-4 * w * (n / 128) ** 0.3) for n, w in zip(LENGTHS, wobble, strict=True)]
    c = only(results, "1a")
    assert c.verdict == "inconclusive" and "undecided band 0.5–0.8" in c.why


def test_1a_mostly_noisy_points_are_inconclusive() -> None:
    c = only(curve("lstm", 1.0, spread=0.3), "1a")
    assert c.verdict == "inconclusive" and "5 of 5 points are noisy" in c.why


def test_1_picks_batch_1_forward_over_larger_batches_and_train() -> None:
    results = curve("lstm", 0.2, batch=8) + curve("lstm", 1.0, tele=UNDERUSED) + curve("lstm", 0.2, mode="train")
    c = only(results, "1a")
    assert "forward b=1" in c.measured and c.verdict == "supported"


def test_1_shows_kernels_per_call_when_rows_carry_the_profile() -> None:
    results = [
        row("lstm", n, 1e-4 * n / 128, extra={"kernels_per_call": 2 * n + 3})
        for n in LENGTHS  # a couple of kernels per step: ∝ n
    ]
    c = only(results, "1a")
    kernels = numbers(c.measured.split("kernels/call", 1)[1])
    assert kernels[:4] == [259, 128, 4099, 2048] and kernels[4] in (0.99, 1.0)  # first and last, and ∝ n


def test_1_reads_the_older_kernel_launches_key() -> None:
    results = [row("lstm", n, 1e-4 * n / 128, extra={"kernel_launches": 7}) for n in LENGTHS]
    assert numbers(only(results, "1a").measured.split("kernels/call", 1)[1])[:5] == [7, 128, 7, 2048, 0.0]


def test_1b_flat_attention_latency_is_supported() -> None:
    assert only(curve("sdpa-flash", 0.1, tele=BUSY), "1b").verdict == "supported"


def test_1_leaves_windows_and_linear_attention_to_their_own_section() -> None:
    # A window of W keys and linear attention change the complexity the article's claims state: neither is judged.
    rows = [
        *curve("sdpa-flash", 0.1, tele=BUSY),
        *curve("sdpa-flash", 1.0, tele=UNDERUSED, options=(("window", 64),)),
        *curve("linear-attn", 2.0, tele=UNDERUSED),
    ]
    judged = [c.claim for c in claims(rows) if c.claim_id in ("1a", "1b", "1c", "1d")]
    assert judged and not any("window" in claim or "linear-attn" in claim for claim in judged)


def test_1_does_not_judge_mamba2_as_the_articles_rnn() -> None:
    """Mamba-2 trains by its chunked (parallel) form: neither the RNN the article's claim 1a means nor its
    attention. It was once read as "the RNN" (its kind is recurrent) and its flat forward curve "contradicted" 1a;
    its family gives it no role in the claims now, so no claim row names it, in forward or decode."""
    rows = [
        *curve("lstm", 1.0, tele=UNDERUSED),
        *curve("mamba2", 0.1, tele=UNDERUSED),
        *curve("mamba2", 0.0, tele=UNDERUSED, mode="decode"),
    ]
    results = claims(rows)
    assert any(c.claim_id == "1a" and "lstm" in c.claim for c in results)
    assert not any("mamba2" in c.claim for c in results)


def test_1b_growth_on_an_underused_gpu_contradicts() -> None:
    c = only(curve("vanilla", 1.0, tele=UNDERUSED), "1b")
    assert c.verdict == "contradicted" and "underused throughout" in c.why


def test_1b_growth_on_a_busy_device_is_inconclusive() -> None:
    c = only(curve("vanilla", 1.0, tele=BUSY), "1b")
    assert c.verdict == "inconclusive" and "the device was busy" in c.why


def test_1b_growth_without_telemetry_is_inconclusive() -> None:
    c = only(curve("vanilla", 1.0), "1b")
    assert c.verdict == "inconclusive" and "unknown load" in c.why


def test_1b_growth_on_a_busy_cpu_is_inconclusive() -> None:
    busy_cpu = telemetry(level="basic", cpu_util_pct=99.0)
    results = curve("vanilla", 1.0, device="cpu", dtype="float32", tele=busy_cpu)
    c = only(results, "1b", CPU_ENV)
    assert c.verdict == "inconclusive" and "busy" in c.why


def test_1b_underused_by_peak_when_gpm_is_missing() -> None:
    # 1 GFLOP per call at 1e-4 s… = 10 TFLOP/s, about 1 % of an H200's 989.5 fp16 dense: underused.
    no_gpm = telemetry(level="basic", gpu_util_pct=99.0)
    results = curve("vanilla", 1.0, tele=no_gpm, extra={"flops": 10**9})
    assert only(results, "1b").verdict == "contradicted"


def test_1c_vanilla_memory_quadratic_is_supported_and_flash_linear_contradicts() -> None:
    results = curve("vanilla", 1.0, memory=2.0) + curve("sdpa-flash", 1.0, memory=1.0)
    vanilla, flash = by_variant(results, "1c", "vanilla"), by_variant(results, "1c", "sdpa-flash")
    assert vanilla.verdict == "supported" and "n^2.00" in vanilla.measured
    assert flash.verdict == "contradicted" and "never materialises" in flash.why


def test_1c_linear_vanilla_memory_blames_short_lengths() -> None:
    c = by_variant(curve("vanilla", 1.0, memory=1.0), "1c", "vanilla")
    assert c.verdict == "contradicted" and "n×d activations" in c.why


def test_1c_memory_in_between_is_inconclusive() -> None:
    wobble = (1.0, 2.1, 1.4, 4.0, 2.6)
    results = [
        row("vanilla", n, 1e-4, peak=int(64 * MIB * w * (n / 128) ** 1.2)) for n, w in zip(LENGTHS, wobble, strict=True)
    ]
    assert by_variant(results, "1c", "vanilla").verdict == "inconclusive"


def test_1c_tiny_rss_peaks_are_inconclusive() -> None:
    results = [
        row("vanilla", n, 1e-4, device="cpu", dtype="float32", peak=4096 * n // 128, method="rss-hwm") for n in LENGTHS
    ]
    c = next(c for c in claims(results, CPU_ENV) if c.claim_id == "1c")
    assert c.verdict == "inconclusive" and "RSS page granularity" in c.why


def test_1d_recurrent_memory_fixed_or_growing() -> None:
    assert only(curve("lstm", 1.0, memory=0.0), "1d").verdict == "supported"
    grows = only(curve("lstm", 1.0, memory=1.0), "1d")
    assert grows.verdict == "contradicted" and "returns all n outputs" in grows.why


def test_1_not_measurable_without_a_length_sweep() -> None:
    results = [row("lstm", 512, 1e-3), row("vanilla", 512, 1e-3)]
    (c,) = [c for c in claims(results) if c.claim_id.startswith("1")]
    assert c.verdict == "not measurable" and "configs/claims.yaml" in c.why


# ---------------------------------------------------------------------------------------------------------------
# Claim 1 from the generation side: decode rows


DECODE_LENGTHS = (1024, 4096, 16384, 65536)


def decode_curve(
    model: str,
    exponent: float,
    *,
    state: float = 0.0,
    held: float | None = None,
    method: str = "resident-pages",
    spread: float = 0.0,
) -> list[Result]:
    """Decode rows with time per token ∝ n^exponent and a state of 1 MiB × (n/1024)^state bytes (measured ∝
    n^held, or 0 B when ``held`` is None: smaller than the method resolves)."""
    out = []
    for n in DECODE_LENGTHS:
        scale = n / DECODE_LENGTHS[0]
        computed = int(MIB * scale**state)
        measured = 0 if held is None else int(MIB * scale**held)
        extra = {"state_bytes": computed, "state_mem_bytes": measured, "state_mem_method": method}
        out.append(row(model, n, 1e-4 * scale**exponent, mode="decode", extra=extra, spread=spread))
    return out


def decoded(results: Sequence[Result], claim_id: str) -> list[ClaimResult]:
    return [c for c in claims(results) if c.claim_id == claim_id and "decode" in c.claim]


def test_1a_decode_flat_per_token_cost_is_supported_and_growth_contradicts() -> None:
    (flat,) = decoded(decode_curve("lstm", 0.01), "1a")
    assert flat.verdict == "supported" and FLAT_MAX in numbers(flat.why)
    assert numbers(flat.measured)[0] == 0.01 and "decode b=1" in flat.measured
    (grows,) = decoded(decode_curve("lstm", 1.0), "1a")
    assert grows.verdict == "contradicted"
    (between,) = decoded(decode_curve("lstm", 0.5), "1a")
    assert between.verdict == "inconclusive" and "0.3–0.7" in between.why


def test_decode_rows_on_noisy_points_say_what_the_exponent_alone_would_conclude() -> None:
    (row,) = decoded(decode_curve("lstm", 0.0, spread=0.5), "1a")
    assert row.verdict == "inconclusive"
    # The verdict the exponent alone would give, by its rule, and why it does not stand: 4 of 4 points noisy.
    assert "supported" in row.why and numbers(row.why)[:3] == [FLAT_MAX, 4, 4]


def test_1b_decode_growing_per_token_cost_is_supported_and_flat_contradicts() -> None:
    (grows,) = decoded(decode_curve("sdpa-flash", 0.9, state=1.0, held=1.0), "1b")
    assert grows.verdict == "supported" and GROWS_MIN in numbers(grows.why)
    assert numbers(grows.measured)[-3:] == [0.9, 16384, 65536]  # the top of the range, where the cache read dominates
    (flat,) = decoded(decode_curve("sdpa-flash", 0.05), "1b")
    assert flat.verdict == "contradicted" and FLAT_MAX in numbers(flat.why)
    (between,) = decoded(decode_curve("sdpa-flash", 0.4), "1b")
    assert between.verdict == "inconclusive"


def test_1d_decode_judges_the_state_against_the_kv_cache() -> None:
    rows = decode_curve("lstm", 0.0) + decode_curve("sdpa", 0.9, state=1.0, held=1.0)
    (fixed,) = decoded(rows, "1d")
    assert fixed.verdict == "supported" and "computed" in fixed.why  # judged on the computed bytes
    # lstm's state, computed and as resident pages measured it, against sdpa's KV cache from first to last n.
    state, cache = fixed.measured.split("sdpa", 1)
    assert "1 MiB" in state and "0 B" in state and "resident-pages" in state and {4} <= set(numbers(state))
    assert "1 MiB" in cache and "64 MiB" in cache and 1.0 in numbers(cache)
    (measured,) = decoded(decode_curve("gru", 0.0, held=0.0, method="cuda-allocator"), "1d")
    assert measured.verdict == "supported" and "cuda-allocator" in measured.measured
    (grows,) = decoded(decode_curve("gru", 0.0, state=1.0, held=1.0, method="cuda-allocator"), "1d")
    assert grows.verdict == "contradicted"


def test_1d_decode_a_state_of_a_few_pages_is_judged_on_its_computed_bytes() -> None:
    rows = decode_curve("mingru", 0.0)
    pages = [4096, 8192, 4096, 8192]  # 1 KiB straddling one page or two: where it sits, not how large it is
    rows = [
        replace(r, extra={**r.extra, "state_bytes": 1024, "state_mem_bytes": b})
        for r, b in zip(rows, pages, strict=True)
    ]
    (row,) = decoded(rows, "1d")
    assert row.verdict == "supported" and "computed" in row.why
    assert all(said in row.measured for said in ("1 KiB", "4 KiB", "8 KiB", "resident-pages"))
    (thin,) = decoded(rows[:2], "1d")
    assert thin.verdict == "inconclusive" and "a slope needs ≥ 3" in thin.why


def test_decode_rows_follow_the_whole_sequence_rows_of_their_claim_and_stay_out_of_the_others() -> None:
    rows = curve("lstm", 1.0, memory=0.0) + decode_curve("lstm", 0.0) + curve("vanilla", 0.2, memory=2.0)
    rows += decode_curve("vanilla", 0.9, state=1.0, held=1.0)
    ids = [(c.claim_id, "decode" in c.claim) for c in claims(rows) if c.claim_id[0] == "1"]
    assert ids == [("1a", False), ("1a", True), ("1b", False), ("1b", True), ("1c", False), ("1d", False), ("1d", True)]
    only_decode = claims(decode_curve("lstm", 0.0) + decode_curve("vanilla", 1.0, state=1.0, held=1.0))
    assert {c.claim_id for c in only_decode if c.claim_id[0] == "1"} == {"1a", "1b", "1d"}
    assert all(not any("decode" in key for key in c.evidence_cases) for c in only_decode if c.claim_id[0] != "1")


# ---------------------------------------------------------------------------------------------------------------
# Claim 2: GPU utilisation


def util_rows(rnn: float, attention: float) -> list[Result]:
    # 2·10¹⁰ FLOP in 1 ms = 20 TFLOP/s: 2.0 % of an H200's 989.5 fp16 dense; 3·10¹¹ FLOP: 30.3 %.
    lstm = telemetry(gpu_util_pct=rnn, gpm_sm_util_pct=8.0, gpm_tensor_util_pct=1.0)
    vanilla = telemetry(gpu_util_pct=attention, gpm_sm_util_pct=75.0, gpm_tensor_util_pct=40.0)
    return [
        row("lstm", 512, 1e-3, mode="train", batch=32, tele=lstm, extra={"flops": 2 * 10**10, "kernel_busy_s": 3e-4}),
        row("lstm", 128, 1e-3, mode="forward", batch=2, tele=telemetry(gpu_util_pct=5.0)),  # not representative
        row("vanilla", 512, 1e-3, mode="train", batch=32, tele=vanilla, extra={"flops": 3 * 10**11}),
    ]


def test_2_in_range_is_supported_and_the_largest_train_case_is_used() -> None:
    results = util_rows(35.0, 80.0)
    rnn, attention = only(results, "2a"), only(results, "2b")
    assert (rnn.verdict, attention.verdict) == ("supported", "supported")
    # NVML 35 %, SM 8 %, tensor 1 %, 2.0 % of the vendor's peak, and kernels busy 0.3 ms of a 1 ms call: 30 %.
    assert numbers(rnn.measured)[:5] == [35, 8, 1, 2.0, 30]
    assert "vendor NVIDIA H200 SXM fp16 dense" in rnn.measured  # the peak it is a percentage of
    assert "train b=32" in rnn.measured
    assert len(rnn.evidence_cases) == 1
    # The SM figure of attention is 75 %: the row says which other metric would also fit the article.
    assert "GPM SM util" in attention.why


def test_2_beyond_in_the_claimed_direction_is_supported() -> None:
    results = util_rows(12.0, 99.0)
    assert (only(results, "2a").verdict, only(results, "2b").verdict) == ("supported", "supported")


def test_2_other_side_is_contradicted_and_margins_are_inconclusive() -> None:
    results = util_rows(97.0, 50.0)
    assert (only(results, "2a").verdict, only(results, "2b").verdict) == ("contradicted", "contradicted")
    results = util_rows(43.0, 67.0)
    assert (only(results, "2a").verdict, only(results, "2b").verdict) == ("inconclusive", "inconclusive")


def test_2_models_that_disagree_are_inconclusive() -> None:
    results = [
        *util_rows(35.0, 80.0),
        row("gru", 512, 0.001, mode="train", batch=32, tele=telemetry(gpu_util_pct=95.0)),
    ]
    assert only(results, "2a").verdict == "inconclusive"


def test_2_percent_of_peak_beside_nvml() -> None:
    # 2·10¹² FLOP in 1 ms = 2 PFLOP/s would be impossible; 10¹⁰ FLOP in 1 ms = 10 TFLOP/s ≈ 1.0 % of 989.5.
    results = [
        row("vanilla", 512, 1e-3, mode="train", tele=telemetry(gpu_util_pct=80.0), extra={"flops": 10**10}),
    ]
    c = only(results, "2b")
    assert 1.0 in numbers(c.measured) and "vendor NVIDIA H200 SXM fp16 dense" in c.measured


def test_2_unreliable_telemetry_is_inconclusive_and_off_is_not_measurable() -> None:
    shaky = [row("lstm", 512, 1e-3, tele=telemetry(reliable=False, gpu_util_pct=35.0))]
    c = only(shaky, "2a")
    assert c.verdict == "inconclusive" and "not reliable" in c.why
    off = [row("lstm", 512, 1e-3, tele=telemetry(level="off"))]
    c = only(off, "2a")
    assert c.verdict == "not measurable" and "--telemetry" in c.why


def test_2_nvml_missing_on_a_gpu_run_is_not_measurable_with_its_reason() -> None:
    t = TelemetrySummary(
        source="nvml+psutil",
        level="basic",
        interval_s=0.02,
        window_s=1.0,
        samples=50,
        reliable=True,
        note="",
        metrics={},
        unavailable={"gpu_util_pct": "NVML: not supported on this device"},
    )
    c = only([row("lstm", 512, 1e-3, tele=t)], "2a")
    assert c.verdict == "not measurable" and t.unavailable["gpu_util_pct"] in c.why  # the reason, passed on
    bare = only([row("lstm", 512, 1e-3)], "2a")
    assert bare.verdict == "not measurable" and "no telemetry" in bare.why


def test_2_a_reliable_row_speaks_for_its_model_before_a_larger_unreliable_one() -> None:
    results = [
        row("lstm", 2048, 1e-3, batch=64, tele=telemetry(reliable=False, gpu_util_pct=99.0)),
        row("lstm", 512, 1e-3, batch=8, tele=telemetry(gpu_util_pct=33.0)),
    ]
    c = only(results, "2a")
    assert c.verdict == "supported" and "b=8 n=512" in c.measured


def test_2_cpu_run_is_not_measurable_and_shows_cpu_util() -> None:
    results = [row("lstm", 512, 1e-3, device="cpu", tele=telemetry(level="basic", cpu_util_pct=98.0))]
    c = only(results, "2a", CPU_ENV)
    assert c.verdict == "not measurable" and "cpu_util_pct" in c.why
    assert "cpu_util_pct" in c.measured and numbers(c.measured)[:2] == [98, 1]  # 98 % over 1 case


# ---------------------------------------------------------------------------------------------------------------
# Claim 3: BERT-base vs LSTM-110M, training

BERT = [("positional", "learned"), ("preset", "bert-base"), ("scope", "model")]
LSTM110 = [("match", "params"), ("preset", "lstm-110m"), ("scope", "model")]


def training(lstm_s: float, bert_s: float, *, lstm_params: int = 108_500_000, **kw: object) -> list[Result]:
    return [
        row("lstm", 512, lstm_s, mode="train", batch=8, options=LSTM110, parameters=lstm_params, **kw),  # type: ignore[arg-type]
        row("sdpa-flash", 512, bert_s, mode="train", batch=8, options=BERT, parameters=108_900_000, **kw),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize(
    ("lstm_s", "verdict", "why"),
    [
        (0.6, "supported", "within 5–8×"),
        (1.0, "supported", "faster than claimed"),
        (0.2, "contradicted", "below 5× (still faster)"),
        (0.05, "contradicted", "below 5× (not faster)"),
    ],
)
def test_3_ratio_against_5_to_8(lstm_s: float, verdict: str, why: str) -> None:
    c = only(training(lstm_s, 0.1), "3")
    assert c.verdict == verdict and why in c.why
    assert "lstm (lstm-110m)" in c.measured and "sdpa-flash (bert-base)" in c.measured
    assert "108.5 M" in c.measured and "108.9 M" in c.measured


def test_3_interval_straddling_5_is_inconclusive() -> None:
    c = only(training(0.5, 0.1, spread=0.2), "3")  # 5.0× with a ±10 % CI on each median
    assert c.verdict == "inconclusive" and "straddles 5×" in c.why


def test_3_noisy_cell_is_inconclusive() -> None:
    c = only(training(0.6, 0.1, converged=False), "3")
    assert c.verdict == "inconclusive" and "would be supported" in c.why


def test_3_not_measurable_cases() -> None:
    assert "no model-scope rows" in only([row("lstm", 512, 1.0, mode="train")], "3").why
    mismatched = only(training(0.6, 0.1, lstm_params=50_000_000), "3")
    assert mismatched.verdict == "not measurable" and "not the same size" in mismatched.why
    oom = [
        row("lstm", 512, 1.0, mode="train", batch=8, options=LSTM110, status="oom", reason="CUDA out of memory"),
        row("sdpa-flash", 512, 0.1, mode="train", batch=8, options=BERT, parameters=108_900_000),
    ]
    c = only(oom, "3")
    assert c.verdict == "not measurable" and "oom (CUDA out of memory)" in c.why


def test_3_scaled_down_pair_says_so() -> None:
    c = only(
        [
            *training(0.6, 0.1, lstm_params=12_000_000)[:1],
            row("sdpa-flash", 512, 0.1, mode="train", batch=8, options=BERT, parameters=12_500_000),
        ],
        "3",
    )
    assert c.verdict == "supported" and "scaled down" in c.why


# ---------------------------------------------------------------------------------------------------------------
# Claim 4: FlashAttention at n = 2048


def flash_pair(
    vanilla_s: float, flash_s: float, vanilla_peak: int, flash_peak: int, n: int = 2048, **kw: object
) -> list[Result]:
    return [
        row("vanilla", n, vanilla_s, batch=4, peak=vanilla_peak, **kw),  # type: ignore[arg-type]
        row("sdpa-flash", n, flash_s, batch=4, peak=flash_peak, **kw),  # type: ignore[arg-type]
    ]


def test_4_faster_and_leaner_is_supported() -> None:
    results = flash_pair(4e-3, 1e-3, 1000 * MIB, 250 * MIB)
    speed, memory = only(results, "4a"), only(results, "4b")
    assert speed.verdict == "supported" and "4.00× [4.00–4.00]" in speed.measured
    assert memory.verdict == "supported" and "−75 %" in memory.measured
    assert "NVIDIA H200" in speed.why and "RTX 3090" in speed.why  # this run's GPU is not the article's
    assert "n=2048" in speed.measured


def test_4_slower_and_heavier_is_contradicted() -> None:
    results = flash_pair(2e-3, 1e-3, 1000 * MIB, 700 * MIB)
    assert (only(results, "4a").verdict, only(results, "4b").verdict) == ("contradicted", "contradicted")


def test_4_interval_straddling_3_is_inconclusive() -> None:
    results = flash_pair(3e-3, 1e-3, 1000 * MIB, 250 * MIB, spread=0.2)
    c = only(results, "4a")
    assert c.verdict == "inconclusive" and "straddles 3×" in c.why


def test_4_nearest_length_and_vanilla_oom_are_said() -> None:
    results = flash_pair(4e-3, 1e-3, 1000 * MIB, 250 * MIB, n=1024)
    assert {2048, 1024} <= set(numbers(only(results, "4a").why))  # the length asked for, and the nearest
    results += [row("vanilla", 2048, 0, batch=4, status="oom"), row("sdpa-flash", 2048, 3e-3, batch=4, peak=MIB)]
    why = only(results, "4a").why
    assert "vanilla oom" in why and {2048, 1024} <= set(numbers(why))


def test_4_memory_too_small_for_rss_is_inconclusive() -> None:
    results = flash_pair(4e-3, 1e-3, 2 * MIB, MIB // 2, method="rss-hwm", device="cpu", dtype="float32")
    c = only(results, "4b", CPU_ENV)
    assert c.verdict == "inconclusive" and "RSS cannot resolve" in c.why


def test_4_flash_attn_gets_its_own_rows_and_unsupported_is_not_measurable() -> None:
    results = [
        *flash_pair(0.004, 0.001, 1000 * MIB, 250 * MIB),
        row("flash-attn", 2048, 0, batch=4, status="unsupported", reason="flash_attn is not installed"),
    ]
    rows = [c for c in claims(results) if c.claim_id == "4a"]
    assert [c.verdict for c in rows] == ["supported", "not measurable"]
    assert results[-1].reason in rows[1].why and "flash-attn vs vanilla" in rows[1].claim


def test_4_not_measurable_without_a_pair() -> None:
    c = only([row("vanilla", 2048, 1e-3)], "4a")
    assert c.verdict == "not measurable" and "sdpa-flash" in c.why


# ---------------------------------------------------------------------------------------------------------------
# Claims 5 and 6: measured where they can be, never a verdict on a performance basis


def test_5_heads_and_positional_costs_are_shown_without_a_verdict() -> None:
    results = [
        row("vanilla", 512, 1.0e-3, heads=1),
        row("vanilla", 512, 1.2e-3, heads=12),
        row("sdpa-flash", 512, 1.00e-3, options=[("positional", "none")]),
        row("sdpa-flash", 512, 1.02e-3, options=[("positional", "sinusoidal")]),
        row("sdpa-flash", 512, 1.10e-3, options=[("positional", "rope")]),
    ]
    heads, positional = only(results, "5a"), only(results, "5b")
    assert heads.verdict == positional.verdict == "not a performance claim"
    assert numbers(heads.measured.split("h=12", 1)[1])[:3] == [20, 20, 20]  # +20 % [+20 to +20 %]
    assert "rope +10 %" in positional.measured and "sinusoidal +2 %" in positional.measured
    assert "BLEU" in positional.why


def test_5_default_positional_counts_as_none() -> None:
    # A case that leaves positional at the catalogue default (none) is the baseline for one that sets it.
    results = [row("vanilla", 512, 1e-3), row("vanilla", 512, 1.5e-3, options=[("positional", "learned")])]
    assert "learned +50 %" in only(results, "5b").measured


def test_6_structure_and_accuracy_rows_are_listed() -> None:
    rows = {c.claim_id: c for c in claims([])}
    assert rows["6a"].verdict == rows["6b"].verdict == "not a performance claim"
    assert "CoLA 62.1/45.2" in rows["6b"].article_figure


def test_every_claim_appears_even_on_an_empty_run() -> None:
    ids = [c.claim_id for c in claims([])]
    assert ids == ["1", "2a", "2b", "3", "4a", "4b", "5a", "5b", "6a", "6b"]


def test_ratio_interval_is_conservative() -> None:
    a, b = row("lstm", 64, 2.0, spread=0.2), row("lstm", 64, 1.0, spread=0.2)
    x = ratio(a, b)
    assert x.value == pytest.approx(2.0)
    assert x.low == pytest.approx(1.8 / 1.1) and x.high == pytest.approx(2.2 / 0.9)


# ---------------------------------------------------------------------------------------------------------------
# Rendering


def synthetic_report() -> ClaimsReport:
    results = (
        curve("lstm", 1.0, memory=1.0, tele=UNDERUSED)
        + curve("mingru", 0.1, memory=1.0, tele=UNDERUSED)
        + curve("vanilla", 0.6, memory=2.0, tele=BUSY, extra={"flops": 10**9})
        + curve("sdpa-flash", 0.1, memory=1.0, tele=BUSY)
        + util_rows(97.0, 92.0)
        + training(0.6, 0.1)
        + flash_pair(4e-3, 1e-3, 1200 * MIB, 300 * MIB, d_model=1024)
        + [row("vanilla", 512, 1.2e-3, heads=1, d_model=512), row("vanilla", 512, 1.3e-3, heads=8, d_model=512)]
    )
    return evaluate_claims(make_run(), results)


def test_golden_markdown() -> None:
    text = render_claims_markdown(synthetic_report())
    path = GOLDEN / "claims-synthetic.md"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), "claims-synthetic.md changed; rerun with UPDATE_GOLDEN=1 if that is intended"


def test_markdown_escapes_pipes_and_lists_cases() -> None:
    text = render_claims_markdown(synthetic_report())
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert all(line.count(" | ") == 5 for line in table)  # six cells, no stray pipe
    assert "<details><summary>" in text and "</details>" in text
    assert "`model=lstm|mode=forward" in text


def test_json_round_trips_every_row() -> None:
    report = synthetic_report()
    data = json.loads(render_claims_json(report))
    assert data["device"].startswith("cuda:0 (NVIDIA H200)")
    assert [c["claim_id"] for c in data["claims"]] == [c.claim_id for c in report.claims]
    assert {c["verdict"] for c in data["claims"]} >= {"supported", "contradicted", "not a performance claim"}


def test_rich_table_renders() -> None:
    from rich.console import Console

    console = Console(width=200, record=True, color_system=None)
    report = synthetic_report()
    console.print(claims_table(report))
    text = console.export_text()
    assert "synthetic" in text and all(f"│ {c.claim_id} " in text for c in report.claims)
    for verdict, count in Counter(c.verdict for c in report.claims).items():
        assert f"{count} {verdict}" in text  # the verdicts counted under the table


# ---------------------------------------------------------------------------------------------------------------
# The command on a stored run

runner = CliRunner()


def test_cli_on_the_tiny_cpu_fixture_marks_what_a_cpu_run_cannot_measure() -> None:
    result = runner.invoke(app, ["claims", str(FIXTURE), "--format", "json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["claims"]
    not_measurable = {c["claim_id"]: c["why"] for c in rows if c["verdict"] == "not measurable"}
    assert set(not_measurable) == {"2a", "2b", "3"}
    assert not_measurable["2a"] == not_measurable["2b"] and "cpu_util_pct" in not_measurable["2a"]
    assert "no model-scope rows" in not_measurable["3"] and "configs/claims-cpu.yaml" in not_measurable["3"]
    # Two lengths per model: every slope is thin; flash at n=64 stands in for n=2048, and says so.
    assert all(c["verdict"] == "inconclusive" for c in rows if c["claim_id"][0] == "1")
    (speed,) = [c for c in rows if c["claim_id"] == "4a"]
    assert {2048, 64} <= set(numbers(speed["why"]))


def test_cli_formats_and_output_file(tmp_path: Path) -> None:
    table = runner.invoke(app, ["claims", str(FIXTURE)])
    assert table.exit_code == 0, table.output
    assert "not measurable here" in table.stdout and "verdicts:" in table.stdout
    target = tmp_path / "claims.md"
    written = runner.invoke(app, ["claims", str(FIXTURE), "--format", "md", "-o", str(target)])
    assert written.exit_code == 0, written.output
    heading = target.read_text().splitlines()[0]
    assert heading.startswith("# ") and json.loads((FIXTURE / "run.json").read_text())["run_id"] in heading

    dash = runner.invoke(app, ["claims", str(FIXTURE), "--format", "md", "-o", "-"])
    assert dash.stdout == target.read_text()


def test_cli_bad_run_is_a_clean_error(tmp_path: Path) -> None:
    result = runner.invoke(app, ["claims", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert "no such run folder" in result.output and "Traceback" not in result.output


def test_1c_memory_verdicts_rest_on_memory_not_on_timing_noise() -> None:
    """Issue 17, item 6: a clean n² peak stays "supported" however noisy the timings of those cases were."""
    noisy = curve("vanilla", 1.0, memory=2.0, spread=0.5, converged=False)
    assert by_variant(noisy, "1c", "vanilla").verdict == "supported"
    assert only(curve("lstm", 1.0, memory=0.0, spread=0.5, converged=False), "1d").verdict == "supported"
    assert only(curve("lstm", 1.0, spread=0.5, converged=False), "1a").verdict == "inconclusive"  # time: still


def test_a_hybrid_stack_is_placed_between_its_members_and_their_mix() -> None:
    from attnbench.claims.hybrid import placements
    from attnbench.families.hybrid.spec import HybridModel

    def timed(model: str, seconds: float, **kw: object) -> Result:
        r = row(model, 4096, seconds, mode="decode", device="cpu", dtype="float32", **kw)  # type: ignore[arg-type]
        return replace(r, case=replace(r.case, layers=4))

    stack = timed("gdn-3to1", 2e-3)
    stack = replace(
        stack, case=replace(stack.case, definition=HybridModel(("mamba2",) * 3 + ("sdpa-flash",)).definition())
    )
    (placed,) = placements([timed("mamba2", 1e-3), timed("sdpa-flash", 5e-3), stack])
    assert placed.position == "between" and placed.share == {"mamba2": 3, "sdpa-flash": 1}
    assert placed.mix_s == pytest.approx(2e-3)  # ¾ of 1 ms and ¼ of 5 ms: the stack took exactly its members' mix
    assert placements([timed("mamba2", 1e-3), stack]) == []  # sdpa-flash did not run beside it: no placement
    slow = replace(stack, measurement=timed("x", 9e-3).measurement)
    assert [p.position for p in placements([timed("mamba2", 1e-3), timed("sdpa-flash", 5e-3), slow])] == ["slower"]
