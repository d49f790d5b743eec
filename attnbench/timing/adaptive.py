"""The adaptive timing loop, torch-free behind a ``Clock`` seam.

``measure`` decides how many calls to make; a ``Clock`` decides how to time them (perf_counter on CPU, CUDA
events on a GPU — see ``attnbench.timing.clocks``). Tests drive ``measure`` with a seeded fake clock, so the stopping
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
from attnbench.core.units import format_seconds
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


TOO_SLOW = "too slow for the budget"  # how the warning that makes a row too_slow_for_budget begins
RUN_ONCE = "run once (sweep --run-once): one call timed after the warm-up, for a profiler; no CI, not for compare"


def _too_slow(sample_s: float, policy: TimingPolicy, left_s: float, *, taken: int | None = None) -> str:
    need = sample_s * policy.min_samples
    got = "" if taken is None else f"; only {taken} fitted"
    return (
        f"{TOO_SLOW}: a sample takes {format_seconds(sample_s)}, so timing.min_samples = {policy.min_samples} "
        f"needs {format_seconds(need)} and timing.max_case_s = {policy.max_case_s:g} s (warm-up and samples) "
        f"left {format_seconds(max(0.0, left_s))}{got}; raise timing.max_case_s or lower timing.min_samples"
    )


# The audit moves at most this many blocks of samples into the warm-up before it gives up and says so.
_MAX_AUDIT_MOVES = 5


def measure(
    fn: Callable[[], object],
    clock: Clock,
    policy: TimingPolicy,
    *,
    inject_slowdown: float = 0.0,
    on_sampling: Callable[[], None] | None = None,
    timed: Callable[[Callable[[], object]], Callable[[], object]] | None = None,
    once: bool = False,
) -> Measurement:
    """Warm up, then sample until the median's 95 % CI is within ±``policy.target_ci`` or the budget ends.

    ``inject_slowdown`` (a fraction) adds a busy-wait of that fraction of the warm-up's per-call time to every
    timed call; it exists only so ``compare`` can be validated against a slowdown of known size. ``on_sampling``
    is called once, between warm-up and the first sample (telemetry measured over the sampling phase only).
    ``timed`` wraps the function for the timed calls only, not the warm-up's (an NVTX range that an ``nsys`` or
    ``ncu`` run filters on). ``once`` times a single call after the warm-up, for a profiler: a row, not a
    measurement to compare (``stop_reason`` "run_once", never converged).
    """
    start = clock.now()
    warnings: list[str] = []

    # Warm-up: first calls pay for cuDNN plans, kernel JIT, allocator growth and cold caches. Keep calling until
    # the last few calls agree with each other, bounded by the warm-up budget — at most half the case's budget,
    # so that the samples always get the other half.
    settle_window = max(3, policy.warmup_min_calls)
    warm_budget = min(policy.warmup_max_s, policy.max_case_s / 2)
    warm: list[float] = []
    while True:
        warm += clock.time(fn, 1, 1)
        spent = clock.now() - start
        if len(warm) >= settle_window and _settled(warm[-settle_window:], policy.warmup_settle):
            break
        # A second call always, unless the first alone spent the case's budget: a first call pays one-time costs
        # (a cold start), and the estimate of a call below must not rest on that one.
        if spent >= warm_budget and (len(warm) >= 2 or spent >= policy.max_case_s):
            # Calls this slow get fewer warm-up calls than asked for rather than blowing the budget; say so.
            warnings.append(f"warm-up did not settle within {warm_budget:g} s ({len(warm)} calls)")
            break
    warmup_s = clock.now() - start
    per_call = statistics.median(warm[-settle_window:])
    # What a sample costs beyond its timed calls: a cold cache's flush before it (tens of ms on a CPU, against a
    # decode step's tens of µs) and the loop's own overhead. The budget pays for it, so the blocks below are sized
    # by the whole cost: sized by the timed calls alone, a block of 5 000 flushed samples took minutes.
    untimed = max(0.0, (warmup_s - sum(warm)) / len(warm))
    # The fastest warm-up call, not the window's median: a warm-up that never settled may hold one slow first
    # call, and the injected cost must be a fraction of the steady-state call (recorded, so it is auditable).
    injected = inject_slowdown * min(warm)
    if injected > 0:
        fn = _busy_wait(fn, injected)
    if timed is not None:
        fn = timed(fn)
    if once:
        if on_sampling is not None:
            on_sampling()
        return Measurement(
            samples_s=tuple(clock.time(fn, 1, 1)),
            calls_per_sample=1,
            warmup_calls=len(warm),
            warmup_s=warmup_s,
            converged=False,
            stop_reason="run_once",
            target_ci=policy.target_ci,
            warnings=(*warnings, RUN_ONCE),
            injected_delay_s=injected,
        )

    # Short calls are grouped so that one sample is long against clock resolution and call overhead. A cold
    # cache is flushed before every sample, so there a sample is one call.
    grouped = per_call > 0 and policy.cache != "cold"
    calls = max(1, math.ceil(policy.min_sample_s / per_call)) if grouped else 1
    sample_s = per_call * calls + injected * calls
    left_s = policy.max_case_s - (clock.now() - start)
    # The fastest warm-up call is the estimate: a first call that paid for a cold start must not condemn the case;
    # if later calls are slower after all, the loop below runs out of budget and says so then.
    fastest_sample_s = (min(warm) + injected) * calls
    if (fastest_sample_s + untimed) * policy.min_samples > left_s:
        # min_samples of these calls do not fit in what the budget has left: one or two samples would make a row
        # that looks timed and is not. The warm-up's calls are kept as the evidence, and the row says why.
        warnings.append(_too_slow(fastest_sample_s + untimed, policy, left_s))
        return Measurement(
            samples_s=tuple(warm),
            calls_per_sample=1,
            warmup_calls=0,
            warmup_s=0.0,
            converged=False,
            stop_reason="too_slow_for_budget",
            target_ci=policy.target_ci,
            warnings=tuple(warnings),
            injected_delay_s=injected,
        )

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
        cost_s = sample_s + untimed  # what one more sample takes of the budget
        if remaining < cost_s and samples:
            break
        needed = max(policy.min_samples, 0 if audited else 2 * audit)
        # Re-check the stopping rule about ten times a second of sampling, never past the budget; the first time as
        # soon as timing.min_time_s has passed, when that is sooner (the rule cannot stop before it, and a short
        # min_time_s, as in a quick check, is kept rather than rounded up to a tenth of a second).
        until_min_s = policy.min_time_s - (clock.now() - sampling_start)
        step_s = min(0.1, remaining, until_min_s) if until_min_s > 0 else min(0.1, remaining)
        block = max(1, min(policy.max_samples - len(samples), int(step_s / cost_s)))
        if len(samples) < needed:
            block = max(block, min(needed - len(samples), max(1, int(remaining / cost_s))))
        block_start = clock.now()
        taken = clock.time(fn, calls, block)
        untimed = max(0.0, (clock.now() - block_start - sum(taken) * calls) / len(taken))
        samples += taken
        # From here the samples themselves say how long the next one takes, not the warm-up's median: a warm-up that
        # did not settle may hold a cold first call, and that estimate ended the loop with most of the budget unspent.
        sample_s = statistics.median(samples) * calls
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
    if len(samples) < policy.min_samples:
        # The calls ran slower than the warm-up promised (or the audit moved samples out): the budget ran out first.
        reason = "too_slow_for_budget"
        left_s = policy.max_case_s - (clock.now() - start)
        warnings.append(_too_slow(statistics.median(samples) * calls, policy, left_s, taken=len(samples)))
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
