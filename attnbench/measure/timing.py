"""The adaptive timing loop, torch-free behind a ``Clock`` seam.

``measure`` decides how many calls to make; a ``Clock`` decides how to time them (perf_counter on CPU, CUDA
events on a GPU — see ``attnbench.measure.clocks``). Tests drive ``measure`` with a seeded fake clock, so the stopping
rule is checked exactly, without a GPU and without wall-clock flakiness.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

from attnbench.core.cases import TimingPolicy
from attnbench.core.stats import median_ci_ranks, summarize
from attnbench.results.measurement import MODIFIED_Z_CUT, NOISY_IQR_REL, Measurement, StopReason


class Clock(Protocol):
    def now(self) -> float:
        """Monotonic wall-clock seconds, for budgets only (never for samples)."""
        ...

    def time(self, fn: Callable[[], object], calls_per_sample: int, samples: int) -> list[float]:
        """Run ``fn`` ``calls_per_sample × samples`` times back to back; return per-call seconds per sample."""
        ...


def _settled(times: list[float], band: float) -> bool:
    centre = statistics.median(times)
    return centre > 0 and all(abs(t - centre) <= band * centre for t in times)


def _still_warming(first: list[float], later: list[float], agree: float) -> bool:
    """The first samples run slower than the later ones, by more than ``agree`` and beyond the later samples'
    own 95 % interval of the median, so machine noise alone does not count as warming."""
    ordered = sorted(later)
    ranks = median_ci_ranks(len(ordered))
    upper = ordered[ranks[1]] if ranks else ordered[-1]
    centre = statistics.median(first)
    return centre > statistics.median(later) * (1 + agree) and centre > upper


def _busy_wait(fn: Callable[[], object], seconds: float) -> Callable[[], object]:
    """``fn`` followed by a spin of ``seconds`` on the host: a known, fixed cost added to each timed call."""

    def slowed() -> object:
        out = fn()
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass
        return out

    return slowed


# The audit moves at most this many blocks of samples into the warm-up before it gives up and says so.
_MAX_AUDIT_MOVES = 5


def measure(
    fn: Callable[[], object],
    clock: Clock,
    policy: TimingPolicy,
    *,
    inject_slowdown: float = 0.0,
    on_sampling: Callable[[], None] | None = None,
) -> Measurement:
    """Warm up, then sample until the median's 95 % CI is within ±``policy.target_ci`` or the budget ends.

    ``inject_slowdown`` (a fraction) adds a busy-wait of that fraction of the warm-up's per-call time to every
    timed call; it exists only so ``compare`` can be validated against a slowdown of known size. ``on_sampling``
    is called once, between warm-up and the first sample (telemetry measured over the sampling phase only).
    """
    start = clock.now()
    warnings: list[str] = []

    # Warm-up: first calls pay for cuDNN plans, kernel JIT, allocator growth and cold caches. Keep calling until
    # the last few calls agree with each other, bounded by the warm-up budget.
    settle_window = max(3, policy.warmup_min_calls)
    warm: list[float] = []
    while True:
        warm += clock.time(fn, 1, 1)
        spent = clock.now() - start
        if len(warm) >= settle_window and _settled(warm[-settle_window:], policy.warmup_settle):
            break
        if spent >= min(policy.warmup_max_s, policy.max_case_s):
            # Calls this slow get fewer warm-up calls than asked for rather than blowing the budget; say so.
            warnings.append(f"warm-up did not settle within {policy.warmup_max_s:g} s ({len(warm)} calls)")
            break
    warmup_s = clock.now() - start
    per_call = statistics.median(warm[-settle_window:])
    # The fastest warm-up call, not the window's median: a warm-up that never settled may hold one slow first
    # call, and the injected cost must be a fraction of the steady-state call (recorded, so it is auditable).
    injected = inject_slowdown * min(warm)
    if injected > 0:
        fn = _busy_wait(fn, injected)

    # Short calls are grouped so that one sample is long against clock resolution and call overhead. A cold
    # cache is flushed before every sample, so there a sample is one call.
    calls = max(1, math.ceil(policy.min_sample_s / per_call)) if per_call > 0 and policy.cache == "warm" else 1
    sample_s = per_call * calls + injected * calls

    audit = policy.warmup_audit
    audited = audit == 0
    gave_up = False  # the first block still runs slow and may not be moved: said once, not checked again
    moved = moves = 0
    samples: list[float] = []
    if on_sampling is not None:
        on_sampling()
    sampling_start = clock.now()
    reason: StopReason = "budget"
    converged = False
    while True:
        remaining = policy.max_case_s - (clock.now() - start)
        if remaining < sample_s and samples:
            break
        needed = max(policy.min_samples, 0 if audited else 2 * audit)
        # Re-check the stopping rule about ten times a second of sampling, never past the budget.
        block = max(1, min(policy.max_samples - len(samples), int(min(0.1, remaining) / sample_s)))
        if len(samples) < needed:
            block = max(block, min(needed - len(samples), max(1, int(remaining / sample_s))))
        samples += clock.time(fn, calls, block)
        summary = summarize(samples)
        sampled_s = clock.now() - sampling_start
        stop = len(samples) >= policy.min_samples and sampled_s >= policy.min_time_s
        stop = stop and summary.ci_halfwidth_rel <= policy.target_ci
        # The audit looks once the first two blocks exist and again whenever the rule would stop: the first
        # block must agree with every sample after it, not just with its neighbour.
        if audit and not gave_up and len(samples) >= 2 * audit and (not audited or stop):
            first, later = samples[:audit], samples[audit:]
            moved_s = sum(first) * calls
            warming = _still_warming(first, later, policy.warmup_agree)
            if warming and moves < _MAX_AUDIT_MOVES and warmup_s + moved_s <= policy.warmup_max_s:
                # Still warming up: these samples belong to the warm-up, and the next ones face the audit.
                samples = samples[audit:]
                moved, moves = moved + audit, moves + 1
                warmup_s += moved_s
                sampling_start += moved_s
                audited = False
                continue
            if warming:
                gave_up = True
                slower = statistics.median(first) / statistics.median(later) - 1
                warnings.append(
                    f"warm-up audit: the first {audit} samples still run {slower:.0%} slower than the "
                    f"{len(later)} after them, after {moved} samples were moved into the warm-up"
                )
            audited = True
        if audited and stop:
            reason, converged = "converged", True
            break
        if len(samples) >= policy.max_samples:
            reason = "max_samples"
            break
        if clock.now() - start >= policy.max_case_s:
            break

    if not audited:
        warnings.append(f"warm-up audit skipped: it needs {2 * audit} samples and {len(samples)} fit the budget")
    summary = summarize(samples)
    if not converged:
        ci = summary.ci_halfwidth_rel
        ci_text = "no CI (too few samples)" if math.isinf(ci) else f"CI ±{ci:.1%}"
        warnings.append(
            f"not converged: {ci_text} after {len(samples)} samples ({reason}); target ±{policy.target_ci:.1%}"
        )
    if summary.iqr_rel > NOISY_IQR_REL:
        warnings.append(f"noisy: IQR is {summary.iqr_rel:.0%} of the median")
    measurement = Measurement(
        samples_s=tuple(samples),
        calls_per_sample=calls,
        warmup_calls=len(warm) + moved * calls,
        warmup_s=warmup_s,
        converged=converged,
        stop_reason=reason,
        target_ci=policy.target_ci,
        warnings=tuple(warnings),
        warmup_moved=moved,
        injected_delay_s=injected,
    )
    mz = measurement.first_sample_mz
    if mz is not None and mz > MODIFIED_Z_CUT:
        return replace(
            measurement,
            warnings=(*measurement.warnings, f"slow first sample: modified z-score {mz:.1f} (cut {MODIFIED_Z_CUT})"),
        )
    return measurement
