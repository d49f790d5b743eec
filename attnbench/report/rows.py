"""One flat row per result: the ``summary.csv`` contract. Columns are only ever added, never renamed.

Values are SI inside attnbench; this is where they become the units named in the column (ms, MiB).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from attnbench.analysis.efficiency import (
    PeakTable,
    achieved_bytes_per_s,
    achieved_flops_per_s,
    arithmetic_intensity,
    measured_over_predicted,
    pct_of_peak,
    pct_of_peak_bw,
    prediction_for,
)
from attnbench.analysis.reading import Reading
from attnbench.core.cases import Case, packing_text
from attnbench.core.text import csv_cell
from attnbench.core.units import to_mib, to_ms
from attnbench.families.catalogue import case_column_values, kind_of, known, source_of
from attnbench.families.extras import family_columns
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result
from attnbench.results.telemetry import (
    ADDED_METRICS,
    FIRST_METRICS,
    GPM_METRICS,
    GPM_WINDOW_METRICS,
    METRIC_TYPES,
    METRICS,
    NVML_METRICS,
    TelemetrySummary,
)

FAMILY_COLUMNS = family_columns()
_FAMILY_TYPES: dict[str, type] = {spec.name: spec.type for spec, _ in FAMILY_COLUMNS}

# What a case is, as every long-form export names it: the Case fields in their order.
CASE_COLUMNS: tuple[str, ...] = (
    "model",
    "mode",
    "dtype",
    "device",
    "batch",
    "seq_len",
    "d_model",
    "heads",
    "layers",
    "causal",
)

COLUMNS: tuple[str, ...] = (
    *CASE_COLUMNS,
    "status",
    "reason",
    "median_ms",
    "ci95_low_ms",
    "ci95_high_ms",
    "iqr_ms",
    "mean_ms",
    "std_ms",
    "min_ms",
    "samples",
    "converged",
    "tokens_per_s",
    "peak_mem_mib",
    # Added after the first contract, in order of arrival.
    "calls_per_sample",
    "warmup_calls",
    "mem_method",
    "parameters",
    "options",
    "warnings",
    "key",
    # Telemetry (issue 4): every metric, then how far to trust them and why any is empty.
    *FIRST_METRICS,
    "telemetry_source",
    "telemetry_samples",
    "telemetry_reliable",
    "telemetry_note",
    # Analytic work per call (attnbench/flops.py) and the rate achieved at the median.
    "flops",
    "tflops",
    "flops_formula",
    # Achieved FLOP/s as a percentage of the peak for the row's dtype, and which peak that was (peak_use.py).
    "pct_of_peak",
    "peak_source",
    # Timing fidelity (issue 3): the warm-up audit, between-process replicates, and on a GPU the profiled call.
    "warmup_s",
    "warmup_moved",
    "first_sample_mz",
    "replicates",
    "within_process_rel",
    "between_process_rel",
    "kernels_per_call",
    "launch_bound",
    # Issue 12. flops/tflops/pct_of_peak count useful work (a causal core credited the pairs its mask keeps);
    # these count what the kernels executed (the full n² of vanilla and SDPA's math path), against the same peak.
    "executed_flops",
    "executed_tflops",
    "executed_pct_of_peak",
    # Issue 12: telemetry metrics added after the first contract (the size of an SM clock fall; GPM's span).
    *ADDED_METRICS,
    # Decode rows (issue 13): the KV cache or recurrent state a step reads, computed and measured (bytes).
    "state_bytes",
    "state_mem_bytes",
    "state_mem_method",
    # Issue 14: torch.compile's wall time before the timing (compile or flex rows).
    "compile_s",
    # Issue 17: whether other work competed for the machine while the case was timed, and the evidence.
    "contended",
    "contention",
    # Issue 26: which side of the comparison the model joins (recurrent, attention; a user model's entry says) and
    # where the model comes from (built-in, config: a factory entry, plugin <distribution>).
    "kind",
    "source",
    # Issue 27: the bytes one call must move (core.traffic), the bandwidth that achieves, held against the calibrated
    # copy or the vendor's DRAM figure, and useful FLOPs per byte (a roofline's x axis).
    "bytes_moved",
    "bytes_formula",
    "gbps",
    "pct_of_peak_bw",
    "peak_bw_source",
    "arithmetic_intensity",
    # Issue 40: the cache state a row was timed in, and its roofline time: its FLOPs at the compute peak or its bytes
    # at the bandwidth, whichever is longer (the peaks of peak_source and peak_bw_source), the ceiling that sets it,
    # and the measured median over it (below 1: faster than the model allows).
    "cache",
    "predicted_ms",
    "predicted_bound",
    "measured_over_predicted",
    # Issue 41, the serving questions: each mode's parameters (empty where the row has none), the packed lengths, the
    # batch a capacity row found under its budget and the bytes each sequence adds, a verify's parts and how its
    # layers roll back, and the padded batch a packed row is held against (tokens_per_s is the packed call's).
    "prefill_chunk",
    "draft",
    "accept",
    "packing",
    "memory_budget_bytes",
    "capacity_batch",
    "bytes_per_sequence",
    "verify_ms",
    "rollback_ms",
    "rollback_method",
    "padded_ms",
    "padded_tokens_per_s",
    # Issue 50: the numerical check against the family's float64 reference (results.numerics): passed, failed,
    # unchecked or skipped; the largest absolute and relative errors, and the dtype's tolerance the latter is held to.
    "check_status",
    "check_max_abs_err",
    "check_rel_err",
    "check_tol",
    # Issue 52: the dtypes a stateful row kept its KV cache or recurrent state in (empty: as it computes), and the
    # error that costs against the full-precision decode.
    "kv_dtype",
    "state_dtype",
    "kept_error_max",
    "kept_error_mean",
    # Issue 52 later: a KV cache's page (empty: contiguous) and a hybrid's layout (empty: separate pools).
    "page_tokens",
    "hybrid_pages",
    # Issue 52 item 3, mode prefix: its parameters, the prefix positions each request reused and the checkpoints held,
    # the independent prefills' time (median_ms is the shared strategy's time to first token of all requests), and the
    # bytes each strategy holds.
    "prefix_tokens",
    "requests",
    "checkpoint_every",
    "prefix_reused",
    "prefix_checkpoints",
    "independent_ms",
    "prefix_held_bytes",
    "independent_held_bytes",
    # The columns the families declare (families.extras.family_columns): a case's key/value heads and window, the
    # implementation a row ran on (rnn_path, sdpa_kernel, …). A new family's column comes here, after the others.
    *(spec.name for spec, _ in FAMILY_COLUMNS),
)


_INTEGER_COLUMNS = frozenset(
    {
        "page_tokens",
        "batch",
        "seq_len",
        "d_model",
        "heads",
        "layers",
        "samples",
        "calls_per_sample",
        "warmup_calls",
        "parameters",
        "telemetry_samples",
        "flops",
        "warmup_moved",
        "replicates",
        "kernels_per_call",
        "executed_flops",
        "state_bytes",
        "state_mem_bytes",
        "bytes_moved",
        *("prefill_chunk", "draft", "accept", "memory_budget_bytes", "capacity_batch", "bytes_per_sequence"),
        *("prefix_tokens", "requests", "checkpoint_every", "prefix_reused", "prefix_checkpoints"),
        *("prefix_held_bytes", "independent_held_bytes"),
    }
)
_BOOL_COLUMNS = frozenset({"causal", "converged", "telemetry_reliable", "launch_bound", "contended"})
_TEXT_COLUMNS = frozenset(
    {
        *("model", "mode", "dtype", "device", "status", "reason", "mem_method", "options", "warnings", "key"),
        *("telemetry_source", "telemetry_note", "flops_formula", "peak_source", "state_mem_method"),
        *("contention", "kind", "source", "bytes_formula", "peak_bw_source", "cache", "predicted_bound"),
        *("packing", "rollback_method", "check_status", "kv_dtype", "state_dtype", "hybrid_pages"),
    }
)
# The Python type of every column's values (None aside): what the CSV's integer columns and the DataFrames of
# the Python API are typed by. A column added to COLUMNS must be given its type here (a test holds them equal).
COLUMN_TYPES: dict[str, type] = {}
for _column in COLUMNS:
    if _column in METRIC_TYPES:
        COLUMN_TYPES[_column] = METRIC_TYPES[_column]
    elif _column in _FAMILY_TYPES:
        COLUMN_TYPES[_column] = _FAMILY_TYPES[_column]
    elif _column in _INTEGER_COLUMNS:
        COLUMN_TYPES[_column] = int
    elif _column in _BOOL_COLUMNS:
        COLUMN_TYPES[_column] = bool
    else:
        COLUMN_TYPES[_column] = str if _column in _TEXT_COLUMNS else float


# What each column says, for the generated summary.csv reference (docs/): the columns a row's ``extra`` fills take
# their meaning from their declaration (``families.extras``), every other column from here.
COLUMN_MEANINGS: dict[str, str] = {
    "model": "the model's name (a built-in, a plugin's, or a config's own factory entry)",
    "mode": "forward, train (forward + backward), backward, decode (one new token after seq_len of context), or a "
    "serving question: capacity, prefill, verify, prefix",
    "dtype": "the dtype the maths ran in",
    "device": "the device the case ran on: cpu, cuda:N",
    "batch": "sequences per call (capacity: 1, the batch found is capacity_batch; prefix: 1, its requests are "
    "requests; packed: how many sequences)",
    "seq_len": "tokens per sequence; for decode, capacity and verify the context length n; packed: the longest",
    "d_model": "model width",
    "heads": "attention heads (empty for a recurrent model)",
    "layers": "stacked layers or blocks",
    "causal": "causal mask (a unidirectional RNN is causal by construction)",
    "status": "ok, oom, unsupported, error, timeout, crashed, too_slow_for_budget or incorrect (the numerical "
    "check failed: not timed)",
    "reason": "why a row is not ok, in words",
    "median_ms": "median time per call",
    "ci95_low_ms": "lower end of the median's distribution-free 95 % confidence interval",
    "ci95_high_ms": "upper end of the median's 95 % confidence interval",
    "iqr_ms": "interquartile range of the samples",
    "mean_ms": "mean time per call",
    "std_ms": "standard deviation of the samples",
    "min_ms": "fastest sample",
    "samples": "timed samples the statistics rest on",
    "converged": "the median's CI met timing.target_ci within the budget",
    "tokens_per_s": "batch × seq_len ÷ median (batch ÷ median for decode, capacity_batch ÷ median for capacity, "
    "batch × draft ÷ median for verify, the packed lengths' sum ÷ median for a packed row)",
    "peak_mem_mib": "peak memory above the post-setup baseline (CUDA allocator, or resident set on a CPU)",
    "calls_per_sample": "calls grouped into one sample so the clock's resolution does not matter",
    "warmup_calls": "untimed calls before sampling (the audit's moved samples included)",
    "mem_method": "how peak memory was measured",
    "parameters": "the model's parameter count",
    "options": "the case's model options, name=value;…",
    "warnings": "what the measurement noticed (a slow first sample, a warm-up that never settled, …), ';'-joined",
    "key": "the case key rows are matched by across runs (resume, compare, history)",
    "gpu_util_pct": "NVML utilisation, mean: share of time any kernel ran (not SM occupancy)",
    "gpu_util_max_pct": "NVML utilisation, max over the window's samples",
    "mem_util_pct": "memory-controller utilisation (share of time device memory was read or written), mean",
    "gpu_mem_used_max_bytes": "device memory in use by every process, max",
    "power_w": "board power, mean",
    "energy_j": "energy over the window from the total-energy counter (power × time where it is not supported)",
    "joules_per_token": "energy_j ÷ (calls × tokens per call)",
    "sm_clock_mhz": "SM clock, mean",
    "sm_clock_min_mhz": "SM clock, min",
    "sm_clock_max_mhz": "the device's maximum SM clock, the yardstick of throttled",
    "mem_clock_mhz": "memory clock, mean",
    "temp_max_c": "GPU temperature, max",
    "throttle_reasons": "clock-event reasons seen in any sample, ';'-joined",
    "throttled": "a thermal or power reason fired and the SM clock fell more than 5 % below its maximum",
    "gpm_sm_util_pct": "NVML GPM: SM utilisation over the sampling phase (Hopper and newer, telemetry: full)",
    "gpm_sm_occupancy_pct": "NVML GPM: SM occupancy",
    "gpm_tensor_util_pct": "NVML GPM: tensor-core utilisation",
    "gpm_dram_bw_util_pct": "NVML GPM: DRAM bandwidth utilisation",
    "cpu_util_pct": "this process's CPU time ÷ (window × logical cores); 100 = every core busy",
    "cpu_util_per_core_mean_pct": "system-wide mean of per-core utilisation over the window",
    "rss_max_bytes": "this process's resident set, max (sampled)",
    "threads_max": "this process's threads, max (sampled)",
    "telemetry_source": "where the telemetry came from: nvml+psutil, psutil or off",
    "telemetry_samples": "telemetry samples in the window",
    "telemetry_reliable": "false when the window was shorter than NVML's averaging period",
    "telemetry_note": "why a metric is empty, and where each came from",
    "tflops": "flops ÷ median, in TFLOP/s (useful work)",
    "pct_of_peak": "tflops as a percentage of the peak for the row's dtype",
    "peak_source": "which peak pct_of_peak is against: the run's calibration, or a vendor figure",
    "warmup_s": "seconds of warm-up",
    "warmup_moved": "early samples the warm-up audit moved into the warm-up",
    "first_sample_mz": "modified z-score of the first timed sample (above 3.5: flagged slow)",
    "within_process_rel": "spread of the samples within one process, relative to the median",
    "replicates": "the medians the row keeps: one a fresh worker process (timing.processes) or one a round "
    "(timing.rounds); 1 otherwise",
    "between_process_rel": "spread of the medians between replicate processes (timing.processes > 1) or rounds "
    "(timing.rounds > 1)",
    "executed_tflops": "executed_flops ÷ median, in TFLOP/s",
    "executed_pct_of_peak": "executed_tflops as a percentage of the peak",
    "sm_clock_drop_pct": "how far the mean SM clock sat below the device's maximum (0 = at it)",
    "gpm_window_s": "the span GPM covers: the sampling phase, warm-up excluded",
    "gpm_reliable": "false below 1 s: GPM's counters refresh every ~100 ms",
    "contended": "other work competed for the machine while the case was timed: do not trust the timing",
    "contention": "the evidence: which rule fired and the counters behind it",
    "kind": "which side of the comparison the model joins: recurrent, attention, or hybrid (a hybrid stack's own)",
    "source": "where the model comes from: built-in, config (a factory entry) or plugin <distribution>",
    "gbps": "bytes_moved ÷ median, in GB/s (10⁹ bytes per second): the compulsory traffic's achieved bandwidth",
    "pct_of_peak_bw": "gbps as a percentage of the copy bandwidth (calibrated, else the vendor's DRAM figure); above "
    "100 means the bytes came from cache",
    "peak_bw_source": "which bandwidth pct_of_peak_bw is against: the run's calibration, or a vendor figure",
    "arithmetic_intensity": "flops ÷ bytes_moved, FLOPs per byte: where the row sits on the roofline's x axis",
    "cache": "the cache state the calls were timed in: cold (last-level cache flushed before each, untimed) or warm",
    "predicted_ms": "the roofline's time per call: max(executed_flops ÷ the compute peak, bytes_moved ÷ the "
    "bandwidth), against the peaks named in peak_source and peak_bw_source",
    "predicted_bound": "which ceiling sets predicted_ms: compute or memory",
    "measured_over_predicted": "median_ms ÷ predicted_ms: 1 at the roofline, above it slower; below 1 faster than the "
    "model allows (a count or a peak is wrong, or the data stayed in cache)",
    "prefill_chunk": "mode prefill: tokens per chunk the prompt was fed in (0 = the whole prompt at once)",
    "draft": "mode verify: draft tokens one call checks after the context",
    "accept": "mode verify: draft tokens kept, the state rolled back to the context and those",
    "packing": "the lengths of the sequences packed end to end, '+'-joined (batch: how many, seq_len: the longest)",
    "memory_budget_bytes": "mode capacity: the memory budget the batch was held to",
    "capacity_batch": "mode capacity: the largest batch whose decode step at context seq_len fits the budget "
    "(tokens_per_s is capacity_batch ÷ median: the aggregate decode throughput at capacity)",
    "bytes_per_sequence": "mode capacity: the memory one more sequence adds (its state and its share of the step)",
    "prefix_tokens": "mode prefix: the tokens every request's prompt of seq_len begins with, shared",
    "requests": "mode prefix: the requests sharing the prefix, all prefilled to their first token in one row",
    "checkpoint_every": "mode prefix: prefix tokens between a recurrent state's checkpoints (0: none, recomputed)",
    "prefix_reused": "mode prefix: prefix positions each request reused rather than computed (whole pages or the "
    "last checkpoint; 0: the prefix recomputed by every request)",
    "prefix_checkpoints": "mode prefix: recurrent-state checkpoints held, a state's bytes each",
    "independent_ms": "mode prefix: the same requests prefilled independently, each its whole prompt (median; "
    "median_ms is the shared strategy's time to first token of all of them)",
    "prefix_held_bytes": "mode prefix: bytes the shared strategy holds (the prefix's state once, its checkpoints, the "
    "requests' own states), measured",
    "independent_held_bytes": "mode prefix: bytes the independent prefills' states hold, measured",
    "verify_ms": "mode verify: the verify call alone (median; median_ms is verify + rollback)",
    "rollback_ms": "mode verify: the rollback alone (median)",
    "rollback_method": "mode verify: how the layers roll back: truncate (a KV cache), checkpoint (per-token states "
    "kept), replay (a copy restored, the accepted tokens run again)",
    "padded_ms": "packed lengths: the same sequences padded to the longest as one batch, one call (median)",
    "padded_tokens_per_s": "packed lengths: useful tokens per second of the padded call (tokens_per_s: the packed one)",
    "check_status": "the numerical check before timing: passed or failed (against the family's float64 reference), "
    "unchecked (a model you bring without a reference method), skipped (turned off, or a serving question); empty "
    "in rows from before it",
    "check_max_abs_err": "the check's largest absolute difference from the reference (output, and decode state)",
    "check_rel_err": "the check's largest absolute difference over the reference's largest absolute value",
    "check_tol": "the relative error the row's dtype may show (float32 5e-3, bfloat16 0.1, …); above it the row is "
    "incorrect, never timed",
    "kv_dtype": "the dtype the KV cache was stored in, converted to dtype to compute (empty: dtype itself)",
    "state_dtype": "the dtype the recurrent state was stored in between tokens (empty: the family's own)",
    "kept_error_max": "kv_dtype/state_dtype: the largest |output − full precision's| over a 256-token decode",
    "kept_error_mean": "kv_dtype/state_dtype: the mean |output − full precision's| over a 256-token decode",
    "page_tokens": "positions per page of the KV cache, read through a page table (empty: contiguous)",
    "hybrid_pages": "a hybrid's layout: aligned (one page size holding its largest state; empty: separate pools)",
}


# A family's column says what it means where the family declares it.
COLUMN_MEANINGS.update({spec.name: spec.help for spec, _ in FAMILY_COLUMNS if spec.name not in COLUMN_MEANINGS})


def _ms(seconds: float) -> float | None:
    # An interval with too few samples is unbounded; the CSV says "unknown" (empty) rather than inf.
    return to_ms(seconds) if seconds not in (float("inf"), float("-inf")) else None


def case_columns(case: Case) -> dict[str, Any]:
    return {name: getattr(case, name) for name in CASE_COLUMNS}


def options_text(case: Case) -> str:
    return ";".join(f"{k}={v}" for k, v in case.options)


def summary_row(result: Result, peaks: PeakTable | None = None) -> dict[str, Any]:
    """One CSV row. ``peaks`` (from the run: its calibration, its GPU's vendor figures) fills pct_of_peak."""
    case = result.case
    row: dict[str, Any] = {
        **case_columns(case),
        "status": result.status,
        "reason": result.reason,
    }
    if result.measurement is not None:
        row.update(_timing_columns(result, result.measurement))
    if result.memory is not None:
        peak = result.memory.peak_bytes
        row["peak_mem_mib"] = None if peak is None else to_mib(peak)
        row["mem_method"] = result.memory.method
    row["parameters"] = result.parameters
    row["options"] = options_text(case)
    row["key"] = case.key
    row.update(_flops_columns(result, peaks))
    for name in ("kernels_per_call", "launch_bound", "state_mem_method"):
        row[name] = result.extra.get(name)
    row["state_bytes"], row["state_mem_bytes"] = result.state_bytes, result.state_mem_bytes
    row.update({spec.name: result.extra.get(spec.name) for spec, of_case in FAMILY_COLUMNS if not of_case})
    row.update(case_column_values(case))
    row.update(_traffic_columns(result, peaks))
    row["cache"] = result.extra.get("cache")
    prediction = prediction_for(peaks, result) if peaks is not None and result.ok else None
    if prediction is not None:
        row["predicted_ms"], row["predicted_bound"] = to_ms(prediction.seconds), prediction.bound
        row["measured_over_predicted"] = measured_over_predicted(result, prediction)
    row.update(serving_columns(result))
    row.update(_check_and_context_columns(result))
    return {column: row.get(column) for column in COLUMNS}


def _timing_columns(result: Result, m: Measurement) -> dict[str, Any]:
    """The timing's statistics (in ms) and how it was taken."""
    s = m.summary
    return dict(
        median_ms=_ms(s.median),
        ci95_low_ms=_ms(s.ci_low),
        ci95_high_ms=_ms(s.ci_high),
        iqr_ms=_ms(s.iqr),
        mean_ms=_ms(s.mean),
        std_ms=_ms(s.std),
        min_ms=_ms(s.min),
        samples=s.n,
        converged=m.converged,
        tokens_per_s=result.tokens_per_s,
        calls_per_sample=m.calls_per_sample,
        warmup_calls=m.warmup_calls,
        warnings="; ".join(m.warnings),
        warmup_s=m.warmup_s,
        warmup_moved=m.warmup_moved,
        first_sample_mz=m.first_sample_mz,
        replicates=len(m.replicate_medians_s) or 1,
        within_process_rel=m.within_process_rel,
        between_process_rel=m.between_process_rel,
    )


def _flops_columns(result: Result, peaks: PeakTable | None) -> dict[str, Any]:
    """The counted FLOPs, and (an ok row) the rates they give, against the peak when one is known."""
    row: dict[str, Any] = {}
    flops = result.extra.get("flops")
    if isinstance(flops, int) and not isinstance(flops, bool):
        row["flops"] = flops
        row["flops_formula"] = result.extra.get("flops_formula")
        used = peaks.for_case(result.case) if peaks is not None else None
        # A rate only from an ok row: a too-slow row's few warm-up calls are evidence, not a timing.
        for prefix, executed in (("", False), ("executed_", True)) if result.ok else ():
            achieved = achieved_flops_per_s(result, executed=executed)
            if achieved is None:
                continue
            row[f"{prefix}tflops"] = achieved / 1e12
            if used is not None:
                row[f"{prefix}pct_of_peak"] = pct_of_peak(result, used, executed=executed)
                row["peak_source"] = used.source
    executed_count = result.extra.get("executed_flops")
    if isinstance(executed_count, int) and not isinstance(executed_count, bool):
        row["executed_flops"] = executed_count
    return row


def _traffic_columns(result: Result, peaks: PeakTable | None) -> dict[str, Any]:
    """The compulsory bytes, the intensity, and (an ok row, as tflops) the bandwidth reached against the peak's."""
    row: dict[str, Any] = {}
    moved = result.extra.get("bytes_moved")
    if isinstance(moved, int) and not isinstance(moved, bool):
        row["bytes_moved"], row["bytes_formula"] = moved, result.extra.get("bytes_formula")
        row["arithmetic_intensity"] = arithmetic_intensity(result)
        achieved = achieved_bytes_per_s(result) if result.ok else None
        if achieved is not None:
            row["gbps"] = achieved / 1e9
            bandwidth = peaks.bandwidth() if peaks is not None else None
            if bandwidth is not None:
                row["pct_of_peak_bw"], row["peak_bw_source"] = pct_of_peak_bw(result, bandwidth), bandwidth.source
    return row


def _check_and_context_columns(result: Result) -> dict[str, Any]:
    """The numeric check, the model's kind and source, compile time, contention and telemetry."""
    case = result.case
    row: dict[str, Any] = {}
    if result.check is not None:
        check = result.check
        row.update(check_status=check.status, check_max_abs_err=check.max_abs_err, check_rel_err=check.rel_err)
        row["check_tol"] = check.tol
    row["kind"] = kind_of(case) if known(case) else None
    row["source"] = source_of(case)
    compile_s = result.extra.get("compile_s")
    row["compile_s"] = compile_s if isinstance(compile_s, float) else None
    if result.contention is not None:
        c = result.contention
        row["contended"] = c.contended
        row["contention"] = "; ".join([*c.reasons, c.evidence]) if c.reasons else c.evidence
    t = result.telemetry
    if t is not None:
        row.update({name: t.metrics.get(name) for name in METRICS})
        row.update(telemetry_source=t.source, telemetry_samples=t.samples, telemetry_reliable=t.reliable)
        row["telemetry_note"] = telemetry_note(t)
    return row


def serving_columns(result: Result) -> dict[str, Any]:
    """The serving questions' columns of one row (issue 41): empty where the row asked none."""
    case, extra = result.case, result.extra
    row: dict[str, Any] = {name: value for name, value in case.serving if name in COLUMN_TYPES}
    row["packing"] = packing_text(case.packing) if case.packing else None
    for name in ("memory_budget_bytes", "capacity_batch", "bytes_per_sequence", "rollback_method"):
        row[name] = extra.get(name)
    if row["memory_budget_bytes"] is None and case.param("memory_budget"):  # a row that never measured: as asked
        row["memory_budget_bytes"] = case.param("memory_budget")
    for name in ("prefix_reused", "prefix_checkpoints", "prefix_held_bytes", "independent_held_bytes"):
        row[name] = extra.get(name)
    for name in ("verify", "rollback", "padded", "independent"):
        seconds = extra.get(f"{name}_s")
        row[f"{name}_ms"] = to_ms(seconds) if isinstance(seconds, float) else None
    row["padded_tokens_per_s"] = extra.get("padded_tokens_per_s")
    row.update(kv_dtype=case.kept_dtype("kv_dtype"), state_dtype=case.kept_dtype("state_dtype"))
    for name in ("kept_error_max", "kept_error_mean"):
        row[name] = extra.get(name)
    row.update(page_tokens=case.page_tokens or None, hybrid_pages=case.kept_dtype("hybrid_pages"))
    return row


def telemetry_note(t: TelemetrySummary) -> str:
    """The window note, then why each empty metric is empty, with metrics sharing a reason grouped."""
    by_reason: dict[str, list[str]] = {}
    for name, reason in t.unavailable.items():
        by_reason.setdefault(reason, []).append(name)
    parts = [t.note] if t.note else []
    for reason, names in by_reason.items():
        if set(names) >= set(NVML_METRICS):
            rest = [n for n in names if n not in NVML_METRICS]
            parts.append(f"{', '.join(['all GPU metrics', *rest])}: {reason}")
        elif set(GPM_METRICS) <= set(names) <= set(GPM_METRICS + GPM_WINDOW_METRICS):
            parts.append(f"GPM metrics: {reason}")
        else:
            parts.append(f"{', '.join(names)}: {reason}")
    return "; ".join(parts)


def summary_rows(results: Iterable[Result], peaks: PeakTable | None = None) -> list[dict[str, Any]]:
    """Rows for ``results``; with the ``peaks`` of the run they came from (``Reading.peaks``), pct_of_peak,
    peak_source and the roofline's columns are filled in."""
    held = peaks if peaks is not None else PeakTable(None, None)
    return [summary_row(r, held) for r in results]


def render_csv(reading: Reading) -> str:
    """The contract CSV. pandas does the quoting; floats keep 6 significant digits; text cells that a spreadsheet
    would run as a formula are neutralised (``core.text.csv_cell``). A run without a calibration or a known GPU has
    no peak to hold rows against, and pct_of_peak stays empty."""
    import pandas as pd

    rows = [{name: csv_cell(v) for name, v in row.items()} for row in summary_rows(reading.results, reading.peaks)]
    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    # Nullable integers, so an empty cell stays empty instead of turning the column into floats ("2.0").
    for column in (name for name, kind in COLUMN_TYPES.items() if kind is int):
        frame[column] = frame[column].astype("Int64")
    return str(frame.to_csv(index=False, float_format="%.6g", lineterminator="\n"))
