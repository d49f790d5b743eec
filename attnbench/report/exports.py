"""Exports for the dashboards teams already run: github-action-benchmark and Bencher. Torch-free.

Both name a benchmark by ``Case.key``, the id that matches rows across runs, so a dashboard's history follows
a case from run to run and never mixes two. Only cases with a timing are exported: an OOM or an unsupported
backend has no value to chart (it is in ``summary.csv`` with its reason).

``--format gab``: github-action-benchmark's ``customSmallerIsBetter`` input, a JSON array of
``{"name", "unit", "value", "range"?, "extra"?}`` (its README, "Generic JSON format"; ``BenchmarkResult`` in
``src/extract.ts``). Every entry must be smaller-is-better, because the action flags any entry that grows, so
tokens/s (bigger is better) is written into ``extra`` rather than as an entry of its own. The action reads a
``range`` of the form ``± <number>``; the 95 % CI of the median is not symmetric, so ``range`` carries its wider
side and ``extra`` the exact bounds.

``--format bmf``: Bencher Metric Format, ``{benchmark: {measure: {"value", "lower_value"?, "upper_value"?}}}``
(bencher.dev/docs/reference/bencher-metric-format). ``latency`` and ``throughput`` are Bencher's built-in
measures, whose units are fixed: nanoseconds and operations per second (an operation here is one token). Peak
memory goes to a measure of our own, ``peak-memory-bytes``, named with its unit because Bencher creates it on
first sight without one.

Decode rows export as any other (latency = one step, throughput = batch ÷ its median), plus the state a step
reads where it was measured: ``|metric=state_memory`` (MiB) and ``state-memory-bytes``, so a dashboard tracks
a KV cache that grows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

from attnbench.analysis.pivot import Cell
from attnbench.core.units import format_rate, to_mib, to_ms
from attnbench.results.records import Result

GAB_TOOL = "customSmallerIsBetter"
BMF_LATENCY = "latency"  # built-in: nanoseconds
BMF_THROUGHPUT = "throughput"  # built-in: operations (tokens) per second
BMF_MEMORY = "peak-memory-bytes"
BMF_STATE = "state-memory-bytes"


def _round(x: float) -> float:
    """Six significant digits: far below the noise of any timing, and stable text in a dashboard's history."""
    return x if isinstance(x, int) else float(f"{x:.6g}")


def _timed(results: Sequence[Result]) -> list[Result]:
    return [r for r in results if r.is_timed]


def left_out(results: Sequence[Result]) -> int:
    """How many cases an export skips for want of a timing."""
    return len(results) - len(_timed(results))


def _peak_bytes(result: Result) -> int | None:
    return None if result.memory is None else result.memory.peak_bytes


def _gab_extra(result: Result) -> str:
    m = result.measurement
    assert m is not None
    s = m.summary
    lines = []
    if math.isfinite(s.ci_low) and math.isfinite(s.ci_high):
        lines.append(f"95% CI of the median: {to_ms(s.ci_low):.6g} to {to_ms(s.ci_high):.6g} ms")
    else:
        lines.append("95% CI of the median: too few samples for one")
    lines.append(f"samples: {s.n} ({m.calls_per_sample} call{'s' if m.calls_per_sample != 1 else ''} each)")
    if s.n == 1:
        lines.append("IQR: 1 sample, no spread")  # not "0.0 % (noisy)": one sample says nothing about spread
    else:
        noisy = Cell(result, None).noisy  # the tables' own rule, so a dashboard and the tables agree on "noisy"
        lines.append(f"IQR: {s.iqr_rel:.1%} of the median{' (noisy)' if noisy else ''}")
    if result.tokens_per_s is not None:
        lines.append(f"tokens/s: {format_rate(result.tokens_per_s)}")
    lines.append(f"converged: {'yes' if m.converged else 'no'}")
    return "\n".join(lines)


def gab_entries(results: Sequence[Result]) -> list[dict[str, Any]]:
    """One latency entry (ms) and, where memory was measured, one peak-memory entry (MiB) per timed case."""
    entries: list[dict[str, Any]] = []
    for r in _timed(results):
        m = r.measurement
        assert m is not None
        s = m.summary
        latency: dict[str, Any] = {
            "name": f"{r.case.key}|metric=latency",
            "unit": "ms",
            "value": _round(to_ms(s.median)),
        }
        if math.isfinite(s.ci_halfwidth_rel):
            latency["range"] = f"± {_round(to_ms(s.ci_halfwidth_rel * s.median))}"
        latency["extra"] = _gab_extra(r)
        entries.append(latency)
        peak = _peak_bytes(r)
        if peak is not None:
            assert r.memory is not None
            entries.append(
                {
                    "name": f"{r.case.key}|metric=peak_memory",
                    "unit": "MiB",
                    "value": _round(to_mib(peak)),
                    "extra": f"peak memory of one call above the post-setup baseline ({r.memory.method})",
                }
            )
        held = r.state_mem_bytes
        if held is not None:
            entries.append(
                {
                    "name": f"{r.case.key}|metric=state_memory",
                    "unit": "MiB",
                    "value": _round(to_mib(held)),
                    "extra": f"KV cache or recurrent state a decode step reads, measured "
                    f"({r.extra.get('state_mem_method')}); computed: {r.state_bytes} bytes",
                }
            )
    return entries


def render_gab(results: Sequence[Result]) -> str:
    return json.dumps(gab_entries(results), indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _metric(value: float, low: float | None = None, high: float | None = None) -> dict[str, float]:
    """A BMF metric; the bounds only when both are finite (too few samples give an unbounded interval)."""
    metric = {"value": _round(value)}
    if low is not None and high is not None and math.isfinite(low) and math.isfinite(high):
        metric["lower_value"] = _round(low)
        metric["upper_value"] = _round(high)
    return metric


def bmf_document(results: Sequence[Result]) -> dict[str, dict[str, dict[str, float]]]:
    """Benchmark = case key; measures: latency (ns, CI of the median as bounds), throughput (tokens/s, the same
    CI turned over) and peak memory (bytes) where it was measured."""
    document: dict[str, dict[str, dict[str, float]]] = {}
    for r in _timed(results):
        m = r.measurement
        assert m is not None
        s = m.summary
        measures = {BMF_LATENCY: _metric(s.median * 1e9, s.ci_low * 1e9, s.ci_high * 1e9)}
        tokens = r.tokens_per_call
        if s.median > 0:
            bounded = math.isfinite(s.ci_low) and math.isfinite(s.ci_high) and s.ci_low > 0
            low, high = (tokens / s.ci_high, tokens / s.ci_low) if bounded else (None, None)
            measures[BMF_THROUGHPUT] = _metric(tokens / s.median, low, high)
        peak = _peak_bytes(r)
        if peak is not None:
            measures[BMF_MEMORY] = _metric(peak)
        if r.state_mem_bytes is not None:
            measures[BMF_STATE] = _metric(r.state_mem_bytes)
        document[r.case.key] = measures
    return document


def render_bmf(results: Sequence[Result]) -> str:
    return json.dumps(bmf_document(results), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
