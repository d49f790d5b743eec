"""The adaptive timing loop, torch-free behind a ``Clock`` seam (DESIGN §7).

``measure`` decides how many calls to make; a ``Clock`` decides how to time them (perf_counter on CPU, CUDA
events on a GPU — see ``attnbench.clocks``). Tests drive ``measure`` with a seeded fake clock, so the stopping
rule is checked exactly, without a GPU and without wall-clock flakiness.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from typing import Protocol

from attnbench.cases import TimingPolicy
from attnbench.measurement import NOISY_IQR_REL, Measurement, StopReason
from attnbench.stats import summarize


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


def measure(fn: Callable[[], object], clock: Clock, policy: TimingPolicy) -> Measurement:
    """Warm up, then sample until the median's 95 % CI is within ±``policy.target_ci`` or the budget ends."""
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

    # Short calls are grouped so that one sample is long against clock resolution and call overhead.
    calls = max(1, math.ceil(policy.min_sample_s / per_call)) if per_call > 0 else 1
    sample_s = per_call * calls

    samples: list[float] = []
    sampling_start = clock.now()
    reason: StopReason = "budget"
    converged = False
    while True:
        remaining = policy.max_case_s - (clock.now() - start)
        if remaining < sample_s and samples:
            break
        # Re-check the stopping rule about ten times a second of sampling, never past the budget.
        block = max(1, min(policy.max_samples - len(samples), int(min(0.1, remaining) / sample_s)))
        if len(samples) < policy.min_samples:
            block = max(block, min(policy.min_samples - len(samples), max(1, int(remaining / sample_s))))
        samples += clock.time(fn, calls, block)
        summary = summarize(samples)
        sampled_s = clock.now() - sampling_start
        if (
            len(samples) >= policy.min_samples
            and sampled_s >= policy.min_time_s
            and summary.ci_halfwidth_rel <= policy.target_ci
        ):
            reason, converged = "converged", True
            break
        if len(samples) >= policy.max_samples:
            reason = "max_samples"
            break
        if clock.now() - start >= policy.max_case_s:
            break

    summary = summarize(samples)
    if not converged:
        ci = summary.ci_halfwidth_rel
        ci_text = "no CI (too few samples)" if math.isinf(ci) else f"CI ±{ci:.1%}"
        warnings.append(
            f"not converged: {ci_text} after {len(samples)} samples ({reason}); target ±{policy.target_ci:.1%}"
        )
    if summary.iqr_rel > NOISY_IQR_REL:
        warnings.append(f"noisy: IQR is {summary.iqr_rel:.0%} of the median")
    return Measurement(
        samples_s=tuple(samples),
        calls_per_sample=calls,
        warmup_calls=len(warm),
        warmup_s=warmup_s,
        converged=converged,
        stop_reason=reason,
        target_ci=policy.target_ci,
        warnings=tuple(warnings),
    )
