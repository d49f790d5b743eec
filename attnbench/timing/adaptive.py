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
from dataclasses import dataclass, replace
from typing import Any, Protocol

from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.stats import median_ci_ranks, summarize
from attnbench.core.units import format_seconds
from attnbench.results.measurement import MODIFIED_Z_CUT, NOISY_IQR_REL, Measurement, StopReason
from attnbench.results.records import Result


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


def timed_row(case: Case, measurement: Measurement, **fields: Any) -> Result:
    """The row of a case that was timed: too_slow_for_budget with the warning that says why, else ok; ``fields``
    are the rest of the ``Result`` (memory, parameters, extra, telemetry, contention)."""
    if measurement.stop_reason == "too_slow_for_budget":
        reason = next((w for w in measurement.warnings if w.startswith(TOO_SLOW)), "")
        return Result(case, "too_slow_for_budget", reason=reason, measurement=measurement, **fields)
    return Result(case, "ok", measurement=measurement, **fields)


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
    decided: bool = False,
) -> Measurement:
    """Warm up, then sample until the median's 95 % CI is within ±``policy.target_ci`` or the budget ends.

    ``inject_slowdown`` (a fraction) adds a busy-wait of that fraction of the warm-up's per-call time to every
    timed call; it exists only so ``compare`` can be validated against a slowdown of known size. ``on_sampling``
    is called once, between warm-up and the first sample (telemetry measured over the sampling phase only).
    ``timed`` wraps the function for the timed calls only, not the warm-up's (an NVTX range that an ``nsys`` or
    ``ncu`` run filters on). ``once`` times a single call after the warm-up, for a profiler: a row, not a
    measurement to compare (``stop_reason`` "run_once", never converged). ``decided``: another run decided this
    case fits its budget (``sweep --budget-from``), so the budget is stretched to what ``min_samples`` samples need
    (``decided_policy``) instead of refusing the case.

    Four phases, each its own function: ``warm_up``, then (unless ``once``) the check that ``min_samples`` samples
    fit what the budget has left (``budget_refusal``), the sampling with its warm-up audit (``Sampling``), and the
    verdict on what was sampled (``verdict``).
    """
    start = clock.now()
    warm = warm_up(fn, clock, policy, start)
    # The fastest warm-up call, not the window's median: a warm-up that never settled may hold one slow first
    # call, and the injected cost must be a fraction of the steady-state call (recorded, so it is auditable).
    injected = inject_slowdown * min(warm.times)
    if injected > 0:
        fn = _busy_wait(fn, injected)
    if timed is not None:
        fn = timed(fn)
    if once:
        if on_sampling is not None:
            on_sampling()
        return run_once(fn, clock, policy, warm, injected)
    # Short calls are grouped so that one sample is long against clock resolution and call overhead. A cold
    # cache is flushed before every sample, so there a sample is one call.
    per_call = warm.per_call_s
    grouped = per_call > 0 and policy.cache != "cold"
    calls = max(1, math.ceil(policy.min_sample_s / per_call)) if grouped else 1
    if decided:
        policy = decided_policy(clock, policy, start, warm, calls, injected)
    refused = budget_refusal(clock, policy, start, warm, calls, injected)
    if refused is not None:
        return refused
    if on_sampling is not None:
        on_sampling()
    sampling = Sampling(fn, clock, policy, start, warm.warmup_s, calls, (per_call + injected) * calls, warm.untimed_s)
    sampling.run()
    return verdict(sampling, warm, injected)


@dataclass
class Warmup:
    """What the warm-up left: its calls' times, how long it took, the per-call time it settled at, what it noticed."""

    times: list[float]
    warmup_s: float
    per_call_s: float
    warnings: list[str]
    # What a call cost beyond its timed part: a cold cache's flush before it (tens of ms on a CPU, against a decode
    # step's tens of µs) and the loop's own overhead. The budget pays for it, so samples are budgeted by their whole
    # cost: by the timed calls alone, a block of 5 000 flushed samples took minutes.
    untimed_s: float = 0.0


def warm_up(fn: Callable[[], object], clock: Clock, policy: TimingPolicy, start: float) -> Warmup:
    """First calls pay for cuDNN plans, kernel JIT, allocator growth and cold caches. Keep calling until the last
    few calls agree with each other, bounded by the warm-up budget — at most half the case's budget, so that the
    samples always get the other half."""
    settle_window = max(3, policy.warmup_min_calls)
    warm_budget = min(policy.warmup_max_s, policy.max_case_s / 2)
    warm: list[float] = []
    warnings: list[str] = []
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
    untimed_s = max(0.0, (warmup_s - sum(warm)) / len(warm))
    return Warmup(warm, warmup_s, statistics.median(warm[-settle_window:]), warnings, untimed_s)


def run_once(
    fn: Callable[[], object], clock: Clock, policy: TimingPolicy, warm: Warmup, injected: float
) -> Measurement:
    """One call timed after the warm-up (``sweep --run-once``)."""
    return Measurement(
        samples_s=tuple(clock.time(fn, 1, 1)),
        calls_per_sample=1,
        warmup_calls=len(warm.times),
        warmup_s=warm.warmup_s,
        converged=False,
        stop_reason="run_once",
        target_ci=policy.target_ci,
        warnings=(*warm.warnings, RUN_ONCE),
        injected_delay_s=injected,
    )


# How far past what min_samples samples need a decided case's budget reaches: room for calls that run slower than
# the fastest warm-up call promised.
DECIDED_HEADROOM = 2.0


def decided_policy(
    clock: Clock, policy: TimingPolicy, start: float, warm: Warmup, calls: int, injected: float
) -> TimingPolicy:
    """``policy`` with its budget stretched, where it is short, to what ``min_samples`` samples of these calls need
    (twice the fastest warm-up's estimate, ``DECIDED_HEADROOM``): for a case whose budget another run decided."""
    fastest_sample_s = (min(warm.times) + injected) * calls + warm.untimed_s
    needed = (clock.now() - start) + DECIDED_HEADROOM * fastest_sample_s * policy.min_samples
    return replace(policy, max_case_s=max(policy.max_case_s, needed))


def budget_refusal(
    clock: Clock, policy: TimingPolicy, start: float, warm: Warmup, calls: int, injected: float
) -> Measurement | None:
    """A too-slow measurement when ``min_samples`` samples of these calls cannot fit in what the budget has left
    (one or two samples would make a row that looks timed and is not), else None. The fastest warm-up call is the
    estimate: a first call that paid for a cold start must not condemn the case; if later calls are slower after
    all, the sampling runs out of budget and says so then. The warm-up's calls are kept as the evidence."""
    left_s = policy.max_case_s - (clock.now() - start)
    fastest_sample_s = (min(warm.times) + injected) * calls + warm.untimed_s
    if fastest_sample_s * policy.min_samples <= left_s:
        return None
    return Measurement(
        samples_s=tuple(warm.times),
        calls_per_sample=1,
        warmup_calls=0,
        warmup_s=0.0,
        converged=False,
        stop_reason="too_slow_for_budget",
        target_ci=policy.target_ci,
        warnings=(*warm.warnings, _too_slow(fastest_sample_s, policy, left_s)),
        injected_delay_s=injected,
    )


class Sampling:
    """The sampling phase: blocks of samples until the stopping rule holds, with the warm-up audit.

    The audit looks once the first two blocks of ``policy.warmup_audit`` samples exist and again whenever the rule
    would stop: the first block must agree with every sample after it, not just with its neighbour. While it runs
    slower, it is moved into the warm-up (at most ``_MAX_AUDIT_MOVES`` times, within the warm-up's budget)."""

    def __init__(
        self,
        fn: Callable[[], object],
        clock: Clock,
        policy: TimingPolicy,
        start: float,
        warmup_s: float,
        calls: int,
        sample_s: float,
        untimed_s: float = 0.0,
    ) -> None:
        self.fn, self.clock, self.policy, self.start, self.calls = fn, clock, policy, start, calls
        self.warmup_s = warmup_s
        self.sample_s = sample_s  # the next sample's expected length
        self.untimed_s = untimed_s  # what a sample costs the budget beyond its timed calls (a cold cache's flush)
        self.samples: list[float] = []
        self.audited = policy.warmup_audit == 0
        self.gave_up = False  # the first block still runs slow and may not be moved: said once, not checked again
        self.moved = self.moves = 0
        self.warnings: list[str] = []
        self.reason: StopReason = "budget"
        self.converged = False
        self.sampling_start = clock.now()

    def run(self) -> None:
        policy = self.policy
        while True:
            remaining = policy.max_case_s - (self.clock.now() - self.start)
            if remaining < self.sample_s + self.untimed_s and self.samples:
                break
            block_start = self.clock.now()
            taken = self.clock.time(self.fn, self.calls, self._block(remaining))
            self.untimed_s = max(0.0, (self.clock.now() - block_start - sum(taken) * self.calls) / len(taken))
            self.samples += taken
            # From here the samples themselves say how long the next one takes, not the warm-up's median: a warm-up
            # that did not settle may hold a cold first call, and that estimate ended the loop with most of the
            # budget unspent.
            self.sample_s = statistics.median(self.samples) * self.calls
            sampled_s = self.clock.now() - self.sampling_start
            stop = len(self.samples) >= policy.min_samples and sampled_s >= policy.min_time_s
            stop = stop and summarize(self.samples).ci_halfwidth_rel <= policy.target_ci
            if self._audit_moves(stop):
                continue
            if self.audited and stop:
                self.reason, self.converged = "converged", True
                break
            if len(self.samples) >= policy.max_samples:
                self.reason = "max_samples"
                break
            if self.clock.now() - self.start >= policy.max_case_s:
                break

    def _block(self, remaining: float) -> int:
        """How many samples to take before the rule is asked again: about a tenth of a second of them, never past
        the budget; the first time as soon as timing.min_time_s has passed when that is sooner (the rule cannot
        stop before it, and a short min_time_s, as in a quick check, is kept rather than rounded up); at least
        what the rule and the audit need, when the budget has room for it."""
        policy, taken = self.policy, len(self.samples)
        needed = max(policy.min_samples, 0 if self.audited else 2 * policy.warmup_audit)
        until_min_s = policy.min_time_s - (self.clock.now() - self.sampling_start)
        step_s = min(0.1, remaining, until_min_s) if until_min_s > 0 else min(0.1, remaining)
        cost_s = self.sample_s + self.untimed_s  # what one more sample takes of the budget
        block = max(1, min(policy.max_samples - taken, int(step_s / cost_s)))
        if taken < needed:
            block = max(block, min(needed - taken, max(1, int(remaining / cost_s))))
        return block

    def _audit_moves(self, stop: bool) -> bool:
        """Audit the first block when it is due; True when it was moved into the warm-up (sample on)."""
        audit = self.policy.warmup_audit
        if not audit or self.gave_up or len(self.samples) < 2 * audit or (self.audited and not stop):
            return False
        first, later = self.samples[:audit], self.samples[audit:]
        moved_s = sum(first) * self.calls
        warming = _still_warming(first, later, self.policy.warmup_agree)
        if warming and self.moves < _MAX_AUDIT_MOVES and self.warmup_s + moved_s <= self.policy.warmup_max_s:
            # Still warming up: these samples belong to the warm-up, and the next ones face the audit.
            self.samples = self.samples[audit:]
            self.moved, self.moves = self.moved + audit, self.moves + 1
            self.warmup_s += moved_s
            self.sampling_start += moved_s
            self.audited = False
            return True
        if warming:
            self.gave_up = True
            slower = statistics.median(first) / statistics.median(later) - 1
            self.warnings.append(
                f"warm-up audit: the first {audit} samples still run {slower:.0%} slower than the "
                f"{len(later)} after them, after {self.moved} samples were moved into the warm-up"
            )
        self.audited = True
        return False


def verdict(sampling: Sampling, warm: Warmup, injected: float) -> Measurement:
    """The measurement of what was sampled, with every warning the phases noticed and the verdict's own: a
    skipped audit, too few samples for the budget, no convergence, a noisy spread, a slow first sample."""
    policy, samples, calls = sampling.policy, sampling.samples, sampling.calls
    warnings = [*warm.warnings, *sampling.warnings]
    reason = sampling.reason
    if not sampling.audited:
        warnings.append(
            f"warm-up audit skipped: it needs {2 * policy.warmup_audit} samples and {len(samples)} fit the budget"
        )
    if len(samples) < policy.min_samples:
        # The calls ran slower than the warm-up promised (or the audit moved samples out): the budget ran out first.
        reason = "too_slow_for_budget"
        left_s = policy.max_case_s - (sampling.clock.now() - sampling.start)
        warnings.append(_too_slow(statistics.median(samples) * calls, policy, left_s, taken=len(samples)))
    summary = summarize(samples)
    if not sampling.converged:
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
        warmup_calls=len(warm.times) + sampling.moved * calls,
        warmup_s=sampling.warmup_s,
        converged=sampling.converged,
        stop_reason=reason,
        target_ci=policy.target_ci,
        warnings=tuple(warnings),
        warmup_moved=sampling.moved,
        injected_delay_s=injected,
    )
    mz = measurement.first_sample_mz
    if mz is not None and mz > MODIFIED_Z_CUT:
        return replace(
            measurement,
            warnings=(*measurement.warnings, f"slow first sample: modified z-score {mz:.1f} (cut {MODIFIED_Z_CUT})"),
        )
    return measurement
