"""``attnbench selfcheck``: our timer against the timers the field already trusts (issue 3, item 6).

Each op of a fixed list is timed, in one process, by attnbench (``timing.adaptive.measure`` with
``clocks.clock_for``, under ``torch.inference_mode`` as the executor times a forward) and by the references, in
**paired rounds**: a round is one short block of each timer on the same callable and inputs, back to back (the
order alternating), and its ratio attnbench / reference compares neighbours in time. A shared, noisy machine
drifts over seconds and minutes, and a two-thread CPU process may be fast or slow as a whole (issue 30): both
timers of a round see the same state of the machine and the process, so drift cancels in the ratio, and many
short rounds give a tight interval in the time a few long ones took (issue 38: long interleaved rounds, each a
whole measurement of seconds, left 7 of 8 ops undecided after two minutes on a quiet 2-core VM).

* attnbench: ``measure`` with a block's policy (``block_policy``: sampling for one block's time, no CI target,
  a short warm-up as the op is warm already), after one full measurement that warms the op up and says how long a
  call is. Every timer's block is the same length, at least ``CALLS_PER_BLOCK`` calls of the op (at 50 ms,
  blocked_autorange's median of a 20 ms op rested on two or three calls), times the same closure, and starts after
  the same ``PRIME_CALLS`` untimed calls; the order rotates each round.
* the whole check runs in ``host.memory.steady_heap``: the written-out attention's n×n buffers (three of 8 MiB a
  call at b=2, n=512) went back to the kernel after each call and were faulted in again, zeroed, by the next —
  hundreds to a thousand page faults a call, as many as what the timer did between calls left free — which spread
  that op's per-round ratios 2–4 times as wide as the LSTM's in the same minutes (issue 50 §4,
  ``results/selfcheck-vanilla-spread-cpu.md``); no other op faulted a page.
* ``torch.utils.benchmark.Timer(...).blocked_autorange(min_run_time=block)`` with ``num_threads`` set to torch's
  real thread count (Timer's default is 1). It picks a block size — calls per timed block, powers of 10 —
  until timer overhead is ≤ 0.01 % of a block (or a block exceeds min_run_time), then times blocks until
  min_run_time has passed; its timer synchronises the accelerator at both ends of each block. ``.median`` is the
  median over blocks of block time / number_per_run.
* on a GPU, ``triton.testing.do_bench(fn, return_mode="median")`` when triton imports: CUDA events around every
  single call (no batching), after a short warm-up, for about a block's time; it returns milliseconds. Left alone
  it zeroes a 256 MiB buffer before each call, so L2 starts cold and the host launches the call while the memset runs
  (which hides its launch cost), where attnbench's default keeps L2 warm with calls back to back. To compare
  like with like, do_bench runs here with its flush turned off (``flush_free``): both timers see warm L2 and
  back-to-back calls, as a sweep's default ``cache: warm`` does. (attnbench's ``cache: cold`` waits for its
  flush before the start event, so it would read do_bench's hidden launch latency as a disagreement.)

The verdict uses the median of the per-round ratios (attnbench / reference) and their interval. An op whose
reference median is ≥ 100 µs must agree within ±5 % (torch.utils.benchmark) or ±3 % (do_bench); shorter ops are
shown but not gated.

The values and verdicts are ``analysis.selfcheck`` (torch-free); this module measures, importing torch when called.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from attnbench.core.cases import TimingPolicy
from attnbench.families.references import EXPLICIT_ATTENTION, FUSED_ATTENTION, STEPWISE_RECURRENCE, reference_case
from attnbench.results.selfcheck import DO_BENCH, TIMER, OpTimings, SelfcheckOp, SelfcheckTimings
from attnbench.sweeps.events import Progress

if TYPE_CHECKING:
    import torch

    from attnbench.timing.adaptive import Clock

ROUNDS, QUICK_ROUNDS = 12, 4
MAX_ROUNDS_FACTOR = 10  # an op that is still inconclusive gets rounds added, up to this many times the rounds asked
# The wall time the whole check may take by default: a self-check that runs past a few minutes is not run. Rounds
# are checked against it before they start (one that would not fit is not started), so it is a bound, not a wish.
DEFAULT_BUDGET_S = 120.0
# The first pass gives each op this share of what is left per op; the rest is for the rounds undecided ops need.
FIRST_PASS_SHARE = 0.7

# Each timer's block in a round (blocked_autorange's min_run_time; attnbench's sampling time): short, so that the two
# blocks of a round are neighbours in time; long against a call and the clock's resolution.
MIN_RUN_TIME_S, QUICK_MIN_RUN_TIME_S = 0.05, 0.02
QUICK_MAX_CASE_S = 1.0  # the warm-up measurement of a quick run
# The warm-up measurement of a full run: the default policy's 10 s would let one slow op's warm-up eat the budget.
MAX_CASE_S = 2.0
# Calls of the op in each timer's block at least (its length is the longer of this and ``MIN_RUN_TIME_S``), and the
# untimed calls before each block, the same for every timer.
CALLS_PER_BLOCK, PRIME_CALLS = 8, 1


def ops_for(device_type: str, *, quick: bool = False) -> list[SelfcheckOp]:
    """The fixed list: a matmul, sdpa-flash, vanilla attention and an LSTM, at a few sizes each. Each model's case
    is made by its family (``reference_case``: whether it carries heads, whether it is causal)."""
    device = "cuda:0" if device_type == "cuda" else "cpu"

    def matmul(dtype: str, n: int) -> SelfcheckOp:
        return SelfcheckOp("matmul", dtype, size=n)

    def model(name: str, dtype: str, batch: int, seq_len: int, d_model: int, heads: int) -> SelfcheckOp:
        return SelfcheckOp(name, dtype, reference_case(name, "forward", dtype, device, batch, seq_len, d_model, heads))

    fused, explicit, stepwise = FUSED_ATTENTION, EXPLICIT_ATTENTION, STEPWISE_RECURRENCE
    if device_type == "cuda":
        half = "bfloat16"  # FLASH_ATTENTION has no float32 kernel on CUDA
        if quick:
            # One op per family, each ≥ 100 µs on a datacentre GPU so the gate applies: a verdict that fits a
            # short GPU lease (~30 s on an H200), not a smoke test.
            return [
                matmul(half, 4096),
                model(fused, half, 8, 2048, 1024, 16),
                model(explicit, half, 8, 1024, 1024, 16),
                model(stepwise, "float16", 16, 256, 1024, 16),
            ]
        return [
            matmul(half, 4096),
            matmul(half, 8192),
            *(model(name, half, 8, n, 1024, 16) for name in (fused, explicit) for n in (1024, 4096)),
            *(model(stepwise, "float16", 16, n, 1024, 16) for n in (256, 1024)),
        ]
    if quick:
        return [
            matmul("float32", 64),
            *(model(name, "float32", 1, 32 if name != stepwise else 16, 32, 2) for name in (fused, explicit, stepwise)),
        ]
    return [
        matmul("float32", 64),  # ~10 µs: shown, not gated
        matmul("float32", 256),
        matmul("float32", 512),
        *(model(name, "float32", 2, n, 256, 4) for name in (fused, explicit) for n in (256, 512)),
        *(model(stepwise, "float32", 4, n, 256, 4) for n in (64, 256)),
    ]


def policy_for(quick: bool) -> TimingPolicy:
    """The warm-up measurement's policy: the default, capped at ``MAX_CASE_S`` (quick: ``QUICK_MAX_CASE_S``)."""
    return replace(TimingPolicy(), max_case_s=QUICK_MAX_CASE_S if quick else MAX_CASE_S)


def block_policy(block_s: float) -> TimingPolicy:
    """attnbench's measurement in one round: about ``block_s`` of samples (at least five), no CI target to chase (the
    rounds' spread is the interval), one warm-up call (the op is warm), no audit (the warm-up measurement had one)."""
    return TimingPolicy(
        target_ci=1.0,
        min_samples=5,
        min_time_s=block_s,
        max_case_s=4 * block_s + 0.5,
        warmup_min_calls=1,
        warmup_max_s=block_s,
        warmup_audit=0,
        process_warmup_s=0.0,
    )


def run_selfcheck(
    device: str,
    *,
    quick: bool = False,
    rounds: int | None = None,
    progress: Progress | None = None,
    decided: Callable[[OpTimings], bool] | None = None,
    max_rounds: int | None = None,
    budget_s: float | None = DEFAULT_BUDGET_S,
    now: Callable[[], float] = time.monotonic,
) -> SelfcheckTimings:
    """Time every op of ``ops_for(device)`` with attnbench and the references, interleaved, ``rounds`` rounds each;
    then, while ``decided`` (the verdict's rule, ``analysis.selfcheck.decided``) says an op's rounds cannot tell it
    from the tolerance yet, more rounds of the undecided ops in turn, up to ``max_rounds`` each (default
    ``MAX_ROUNDS_FACTOR × rounds``).

    All within ``budget_s`` of wall time (None: no bound): the first pass gives each op ``FIRST_PASS_SHARE`` of
    what is left per op, the second pass what remains; a round is started only when it will end before its slice
    does (by the op's slowest round so far, or before any, by the most a round can take), and an op whose rounds
    the budget ended says so (``OpTimings.cut_short``). The ops run inside ``steady_heap``: no timer's calls pay
    the kernel's first touch of a large buffer freed by the call before."""
    import torch

    from attnbench.host.inventory import collect_environment
    from attnbench.host.memory import steady_heap

    dev = torch.device(device)
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    max_rounds = max(rounds, max_rounds or MAX_ROUNDS_FACTOR * rounds)
    timers, do_bench, notes = _references(dev)
    environment = collect_environment(device)
    # As the executor does: torch's long-lived objects out of the collector, so a collection that lands inside
    # a timed call walks only this run's garbage (torch.utils.benchmark disables gc while timing instead).
    gc.freeze()
    started = now()
    deadline = None if budget_s is None else started + budget_s
    ops = [_on_device(op, device) for op in ops_for(dev.type, quick=quick)]
    min_run_time = QUICK_MIN_RUN_TIME_S if quick else MIN_RUN_TIME_S

    def check(op: OpTimings, least: int, most: int, until: float | None) -> OpTimings:
        return _check_op(op, dev, policy_for(quick), (least, most), min_run_time, timers, do_bench, decided, until, now)

    with steady_heap() as steady:
        checks = _first_pass(check, ops, rounds, deadline, progress, now)
        if decided is not None:
            checks = _second_pass(check, checks, decided, max_rounds, deadline, progress, now)
    if deadline is not None:  # the budget, not the evidence, ended every op still undecided
        checks = [
            replace(c, cut_short=True)
            if decided is not None and not c.skipped and not decided(c) and len(c.ours_s) < max_rounds
            else c
            for c in checks
        ]
    return SelfcheckTimings(
        device=device,
        device_name=environment.gpu_name or environment.cpu_model,
        torch=environment.torch or "unknown",
        threads=torch.get_num_threads(),
        rounds=rounds,
        timers=tuple(timers),
        ops=tuple(checks),
        notes=(*notes, *_run_notes(quick, dev.type, steady)),
        budget_s=budget_s,
        elapsed_s=now() - started,
    )


Check = Callable[[OpTimings, int, int, "float | None"], OpTimings]  # (op so far, least, most, until) → op


def _first_pass(
    check: Check,
    ops: list[SelfcheckOp],
    rounds: int,
    deadline: float | None,
    progress: Progress | None,
    now: Callable[[], float],
) -> list[OpTimings]:
    """``rounds`` rounds of each op in turn, each op within ``FIRST_PASS_SHARE`` of what is left per op."""
    checks: list[OpTimings] = []
    for index, op in enumerate(ops, start=1):
        if progress:
            progress(f"[{index}/{len(ops)}] {op.name} {op.shape} {op.dtype}: {rounds} rounds")
        until = None if deadline is None else now() + FIRST_PASS_SHARE * (deadline - now()) / (len(ops) - index + 1)
        checks.append(check(OpTimings(op), rounds, rounds, until))
    return checks


def _second_pass(
    check: Check,
    checks: list[OpTimings],
    decided: Callable[[OpTimings], bool],
    max_rounds: int,
    deadline: float | None,
    progress: Progress | None,
    now: Callable[[], float],
) -> list[OpTimings]:
    """The undecided ops, a round at a time in turn, while rounds and the budget last."""
    checks = list(checks)
    while deadline is None or now() < deadline:
        undecided = [i for i, c in enumerate(checks) if not c.skipped and not decided(c) and len(c.ours_s) < max_rounds]
        progressed = False
        for i in undecided:
            before = len(checks[i].ours_s)
            checks[i] = check(checks[i], before + 1, before + 1, deadline)
            progressed = progressed or len(checks[i].ours_s) > before
            if progress:
                progress(f"[{i + 1}/{len(checks)}] {checks[i].op.name}: {len(checks[i].ours_s)} rounds")
        if not progressed:  # nothing left to decide, or no round fits what is left of the budget
            break
    return checks


def _references(dev: torch.device) -> tuple[list[str], Callable[..., float] | None, list[str]]:
    """The reference timers this device has (torch.utils.benchmark always; triton's do_bench on a GPU where it
    imports and can run without its flush), that do_bench, and notes on what was skipped or changed."""
    if dev.type != "cuda":
        return [TIMER], None, []
    try:
        from triton import runtime
        from triton.testing import do_bench as triton_do_bench
    except ImportError as exc:
        return [TIMER], None, [f"triton does not import ({exc}): the do_bench comparison is skipped"]
    driver = getattr(getattr(runtime, "driver", None), "active", None)
    if driver is None or not hasattr(driver, "get_empty_cache_for_benchmark"):
        return (
            [TIMER],
            None,
            ["this triton's do_bench cannot run without its L2 flush: the do_bench comparison is skipped"],
        )
    note = (
        "do_bench ran with its 256 MiB L2 flush turned off, so it and attnbench (cache: warm) both time "
        "warm-L2, back-to-back calls"
    )
    return [TIMER, DO_BENCH], flush_free(triton_do_bench, driver), [note]


def _run_notes(quick: bool, device_type: str, steady: bool) -> list[str]:
    notes = [] if steady else ["malloc could not be tuned here: an op's large buffers may be faulted in anew each call"]
    if quick and device_type == "cuda":
        notes.append(f"quick run: one op per family, each attnbench measurement capped at {QUICK_MAX_CASE_S:g} s")
    elif quick:
        notes.append(
            f"quick run: tiny ops, each attnbench measurement capped at {QUICK_MAX_CASE_S:g} s: a smoke test, "
            "not a verdict"
        )
    return notes


def flush_free(do_bench: Callable[..., float], driver: Any, device: str = "cuda") -> Callable[..., float]:
    """triton's ``do_bench`` with its L2 flush turned off, so it times warm-L2 calls back to back, as attnbench's
    default does.

    do_bench asks ``driver.get_empty_cache_for_benchmark()`` for its 256 MiB buffer and zeroes it before every
    call; for the duration of one call, the driver hands it an empty buffer instead, whose ``zero_`` launches
    nothing. Its timing loop (events around each call, warm-up, estimate, median) is untouched."""
    import torch

    def empty() -> object:
        return torch.empty(0, dtype=torch.int32, device=device)

    def timed(fn: Callable[[], object], **kwargs: Any) -> float:
        driver.get_empty_cache_for_benchmark = empty  # an instance attribute: it shadows the method
        try:
            return do_bench(fn, **kwargs)
        finally:
            del driver.get_empty_cache_for_benchmark

    return timed


def _on_device(op: SelfcheckOp, device: str) -> SelfcheckOp:
    return op if op.case is None else replace(op, case=replace(op.case, device=device))


def _check_op(
    so_far_: OpTimings,
    dev: torch.device,
    policy: TimingPolicy,
    rounds: tuple[int, int],  # (at least, at most) rounds in all, those of ``so_far_`` included
    min_run_time: float,
    timers: list[str],
    do_bench: Callable[..., float] | None,
    decided: Callable[[OpTimings], bool] | None = None,
    until: float | None = None,
    now: Callable[[], float] = time.monotonic,
) -> OpTimings:
    """More rounds of one op, from the rounds it has: while fewer than ``rounds[0]``, or, up to ``rounds[1]``, while
    ``decided`` says no; none that would end after ``until``. Every timer's block in a round is ``block_s`` long,
    at least ``CALLS_PER_BLOCK`` of the op's calls, and starts after the same untimed call (``runners``)."""
    import torch

    from attnbench.families.registry import probe
    from attnbench.timing.adaptive import measure
    from attnbench.timing.clocks import clock_for

    op = so_far_.op
    if so_far_.skipped or (until is not None and now() >= until):
        return so_far_
    if op.case is not None:
        reason = probe(op.case, str(dev))
        if reason is not None:
            return OpTimings(op, skipped=reason)
    clock = clock_for(dev)
    with _built(op, dev) as fn, torch.inference_mode():
        if so_far_.ours_s:  # built again for more rounds: one block warms it, its call time is the rounds' median
            call_s = statistics.median(so_far_.ours_s)
            warm = block_policy(block_s_for(call_s, min_run_time))
        else:  # one full measurement warms the op up, and says how long a call is: the rounds' blocks are short
            call_s, warm = 0.0, policy
        if until is None or now() + warm.max_case_s < until:
            warmed = measure(fn, clock, warm).median_s
            call_s = call_s or warmed
        block_s = block_s_for(call_s, min_run_time)
        return _rounds(so_far_, runners(fn, clock, block_s, timers, do_bench), rounds, block_s, decided, until, now)


def block_s_for(call_s: float, min_run_time: float) -> float:
    """Each timer's block in a round: ``min_run_time``, or ``CALLS_PER_BLOCK`` calls of the op when longer, so that
    neither timer's median of a round rests on a call or two (blocked_autorange times a 20 ms op 3 times in 50 ms)."""
    return max(min_run_time, CALLS_PER_BLOCK * call_s)


def runners(
    fn: Callable[[], object], clock: Clock, block_s: float, timers: list[str], do_bench: Callable[..., float] | None
) -> dict[str, Callable[[], float]]:
    """Each timer's block in a round, by name, attnbench's first: the same closure ``fn``, the same block length,
    the same thread count, each after ``PRIME_CALLS`` untimed calls of ``fn`` (so no block starts in the state
    another timer's block left, a warm-up or a garbage collection of its own). Each returns a median call in
    seconds."""
    import torch
    from torch.utils.benchmark import Timer

    from attnbench.timing.adaptive import measure

    block = block_policy(block_s)
    # Timer's default num_threads is 1; compare like with like.
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())

    def primed(run: Callable[[], float]) -> Callable[[], float]:
        def block_of() -> float:
            for _ in range(PRIME_CALLS):
                fn()
            return run()

        return block_of

    def reference_do_bench() -> float:
        assert do_bench is not None
        rep_ms = max(1.0, block_s * 1e3)
        return float(do_bench(fn, warmup=1, rep=rep_ms, return_mode="median")) / 1e3  # milliseconds

    named: dict[str, Callable[[], float]] = {
        "attnbench": primed(lambda: measure(fn, clock, block).median_s),
        TIMER: primed(lambda: float(timer.blocked_autorange(min_run_time=block_s).median)),
    }
    if DO_BENCH in timers:
        named[DO_BENCH] = primed(reference_do_bench)
    return named


def _rounds(
    so_far_: OpTimings,
    runners: dict[str, Callable[[], float]],
    rounds: tuple[int, int],
    block_s: float,
    decided: Callable[[OpTimings], bool] | None,
    until: float | None,
    now: Callable[[], float],
) -> OpTimings:
    """Rounds of the ``runners`` (attnbench's, then the references in ``timers`` order) appended to ``so_far_``."""
    op, names = so_far_.op, list(runners)
    medians: dict[str, list[float]] = {"attnbench": list(so_far_.ours_s)}
    medians.update({name: list(values) for name, values in so_far_.references})
    for name in names:
        medians.setdefault(name, [])

    def so_far() -> OpTimings:
        return OpTimings(op, tuple(medians["attnbench"]), tuple((t, tuple(medians[t])) for t in names[1:]))

    least, most = rounds
    r = len(medians["attnbench"])
    # Until a round of this op has run, what one can take at most: attnbench's block budget and each reference's
    # run time, twice (blocked_autorange may overrun it by a block); after, the slowest round seen.
    slowest, measured = block_policy(block_s).max_case_s + 2 * block_s * (len(names) - 1), False
    while r < least or (r < most and decided is not None and not decided(so_far())):
        began = now()
        if until is not None and began + slowest > until:
            break  # the round would not end within the budget: not started
        # Rotate the order each round so no timer always runs first (or right after another's block).
        for name in names[r % len(names) :] + names[: r % len(names)]:
            medians[name].append(runners[name]())
        took = now() - began
        slowest, measured = (max(slowest, took), True) if measured else (took, True)
        r += 1
    return so_far()


@contextlib.contextmanager
def _built(op: SelfcheckOp, dev: torch.device) -> Iterator[Callable[[], object]]:
    """The op as a no-argument callable, its inputs and weights made outside any timed region."""
    import torch

    from attnbench.families.registry import build_model, call_context, make_input, torch_dtype

    torch.manual_seed(0)
    dtype = torch_dtype(op.dtype)
    try:
        if op.case is None:
            assert op.size is not None
            n = op.size
            a = torch.randn(n, n, device=dev, dtype=dtype)
            b = torch.randn(n, n, device=dev, dtype=dtype)
            out = torch.empty(n, n, device=dev, dtype=dtype)

            def matmul() -> object:
                return torch.mm(a, b, out=out)

            yield matmul
        else:
            model = build_model(op.case, str(dev), dtype).eval()
            x = make_input(op.case, str(dev), dtype)

            def forward() -> object:
                return model(x)

            with call_context(op.case, model):  # as the executor times it: a forced backend set once, not per call
                yield forward
    finally:
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()


# What judging, printing the table and the interpreter's exit take after the last round: the command's budget holds
# it too. On a loaded 2-core VM the whole command ended 2.5–3.7 s after its last round (issue 50 §4).
RENDER_S = 4.0


def process_age_s() -> float:
    """Seconds the command has run before the check: since this process started (Python's start-up and imports
    included) when the process is the command (``attnbench …``, ``python -m attnbench …``), else 0 — a command
    invoked inside a longer-lived process (a test session, a notebook) starts its budget where it is called."""
    import psutil

    program = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else ""
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if program != "attnbench" and getattr(main, "name", "") != "attnbench.__main__":
        return 0.0
    return max(0.0, time.time() - psutil.Process().create_time())
