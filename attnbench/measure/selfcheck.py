"""``attnbench selfcheck``: our timer against the timers the field already trusts (issue 3, item 6).

Each op of a fixed list is timed, in one process, by attnbench (``timing.measure`` with ``clocks.clock_for`` and
the default ``TimingPolicy``, under ``torch.inference_mode`` as the executor times a forward) and by the
references:

* ``torch.utils.benchmark.Timer(...).blocked_autorange(min_run_time=…)`` with ``num_threads`` set to torch's
  real thread count (Timer's default is 1). It picks a block size — calls per timed block, powers of 10 —
  until timer overhead is ≤ 0.01 % of a block (or a block exceeds min_run_time), then times blocks until
  min_run_time has passed; its timer synchronises the accelerator at both ends of each block. ``.median`` is the
  median over blocks of block time / number_per_run.
* on a GPU, ``triton.testing.do_bench(fn, return_mode="median")`` when triton imports: CUDA events around every
  single call (no batching), after ~25 ms of warm-up, for ~100 ms; it returns milliseconds. Left alone it zeroes
  a 256 MiB buffer before each call, so L2 starts cold and the host launches the call while the memset runs
  (which hides its launch cost), where attnbench's default keeps L2 warm with calls back to back. To compare
  like with like, do_bench runs here with its flush turned off (``flush_free``): both timers see warm L2 and
  back-to-back calls, as a sweep's default ``cache: warm`` does. (attnbench's ``cache: cold`` waits for its
  flush before the start event, so it would read do_bench's hidden launch latency as a disagreement.)

The timers run interleaved — rounds of A, B (, C), the order rotating each round — and the verdict uses the
median of the per-round ratios (attnbench / reference), so drift of a shared, noisy machine cancels rather
than landing on whichever timer ran last. An op whose reference median is ≥ 100 µs must agree within ±5 %
(torch.utils.benchmark) or ±3 % (do_bench); shorter ops are shown but not gated.

The values and verdicts are ``analysis.selfcheck`` (torch-free); this module measures, importing torch when called.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from attnbench.core.cases import Case, TimingPolicy
from attnbench.measure.events import Progress
from attnbench.results.selfcheck import DO_BENCH, TIMER, OpTimings, SelfcheckOp, SelfcheckTimings

if TYPE_CHECKING:
    import torch

ROUNDS, QUICK_ROUNDS = 7, 3
MAX_ROUNDS_FACTOR = 3  # an op that is still inconclusive gets rounds added, up to this many times the rounds asked

# blocked_autorange's min_run_time per round: its default, and a quarter of it for a quick run.
MIN_RUN_TIME_S, QUICK_MIN_RUN_TIME_S = 0.2, 0.05
QUICK_MAX_CASE_S = 1.0  # each attnbench measurement of a quick run


def ops_for(device_type: str, *, quick: bool = False) -> list[SelfcheckOp]:
    """The fixed list: a matmul, sdpa-flash, vanilla attention and an LSTM, at a few sizes each."""
    device = "cuda:0" if device_type == "cuda" else "cpu"

    def matmul(dtype: str, n: int) -> SelfcheckOp:
        return SelfcheckOp("matmul", dtype, size=n)

    def attention(model: str, dtype: str, batch: int, seq_len: int, d_model: int, heads: int) -> SelfcheckOp:
        case = Case(model, "forward", dtype, device, batch, seq_len, d_model, heads, 1, False)
        return SelfcheckOp(model, dtype, case)

    def lstm(dtype: str, batch: int, seq_len: int, d_model: int) -> SelfcheckOp:
        case = Case("lstm", "forward", dtype, device, batch, seq_len, d_model, None, 1, True)
        return SelfcheckOp("lstm", dtype, case)

    if device_type == "cuda":
        half = "bfloat16"  # FLASH_ATTENTION has no float32 kernel on CUDA
        if quick:
            # One op per family, each ≥ 100 µs on a datacentre GPU so the gate applies: a verdict that fits a
            # short GPU lease (~30 s on an H200), not a smoke test.
            return [
                matmul(half, 4096),
                attention("sdpa-flash", half, 8, 2048, 1024, 16),
                attention("vanilla", half, 8, 1024, 1024, 16),
                lstm("float16", 16, 256, 1024),
            ]
        return [
            matmul(half, 4096),
            matmul(half, 8192),
            attention("sdpa-flash", half, 8, 1024, 1024, 16),
            attention("sdpa-flash", half, 8, 4096, 1024, 16),
            attention("vanilla", half, 8, 1024, 1024, 16),
            attention("vanilla", half, 8, 4096, 1024, 16),
            lstm("float16", 16, 256, 1024),
            lstm("float16", 16, 1024, 1024),
        ]
    if quick:
        return [
            matmul("float32", 64),
            attention("sdpa-flash", "float32", 1, 32, 32, 2),
            attention("vanilla", "float32", 1, 32, 32, 2),
            lstm("float32", 1, 16, 32),
        ]
    return [
        matmul("float32", 64),  # ~10 µs: shown, not gated
        matmul("float32", 256),
        matmul("float32", 512),
        attention("sdpa-flash", "float32", 2, 256, 256, 4),
        attention("sdpa-flash", "float32", 2, 512, 256, 4),
        attention("vanilla", "float32", 2, 256, 256, 4),
        attention("vanilla", "float32", 2, 512, 256, 4),
        lstm("float32", 4, 64, 256),
        lstm("float32", 4, 256, 256),
    ]


def policy_for(quick: bool) -> TimingPolicy:
    """The default policy; a quick run caps each measurement at ``QUICK_MAX_CASE_S``."""
    return replace(TimingPolicy(), max_case_s=QUICK_MAX_CASE_S) if quick else TimingPolicy()


def run_selfcheck(
    device: str,
    *,
    quick: bool = False,
    rounds: int | None = None,
    progress: Progress | None = None,
    decided: Callable[[OpTimings], bool] | None = None,
    max_rounds: int | None = None,
) -> SelfcheckTimings:
    """Time every op of ``ops_for(device)`` with attnbench and the references, interleaved, ``rounds`` rounds each;
    then, while ``decided`` (the verdict's rule, ``analysis.selfcheck.decided``) says an op's rounds cannot tell it
    from the tolerance yet, one more round of that op, up to ``max_rounds`` (default ``MAX_ROUNDS_FACTOR × rounds``)."""
    import torch

    from attnbench.measure.environment import collect_environment

    dev = torch.device(device)
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    max_rounds = max(rounds, max_rounds or MAX_ROUNDS_FACTOR * rounds)
    policy = policy_for(quick)
    timers = [TIMER]
    notes: list[str] = []
    do_bench: Callable[..., float] | None = None
    if dev.type == "cuda":
        try:
            from triton import runtime
            from triton.testing import do_bench as triton_do_bench
        except ImportError as exc:
            notes.append(f"triton does not import ({exc}): the do_bench comparison is skipped")
        else:
            driver = getattr(getattr(runtime, "driver", None), "active", None)
            if driver is None or not hasattr(driver, "get_empty_cache_for_benchmark"):
                notes.append(
                    "this triton's do_bench cannot run without its L2 flush: the do_bench comparison is skipped"
                )
            else:
                do_bench = flush_free(triton_do_bench, driver)
                timers.append(DO_BENCH)
                notes.append(
                    "do_bench ran with its 256 MiB L2 flush turned off, so it and attnbench (cache: warm) both time "
                    "warm-L2, back-to-back calls"
                )
    environment = collect_environment(device)
    # As the executor does: torch's long-lived objects out of the collector, so a collection that lands inside
    # a timed call walks only this run's garbage (torch.utils.benchmark disables gc while timing instead).
    gc.freeze()
    checks: list[OpTimings] = []
    ops = [_on_device(op, device) for op in ops_for(dev.type, quick=quick)]
    for index, op in enumerate(ops, start=1):
        if progress:
            progress(f"[{index}/{len(ops)}] {op.name} {op.shape} {op.dtype}: {rounds} rounds")
        min_run_time = QUICK_MIN_RUN_TIME_S if quick else MIN_RUN_TIME_S
        check = _check_op(op, dev, policy, (rounds, max_rounds), min_run_time, timers, do_bench, decided)
        if progress and len(check.ours_s) > rounds:
            progress(f"[{index}/{len(ops)}] {op.name}: {len(check.ours_s)} rounds to reach a verdict")
        checks.append(check)
    if quick and dev.type == "cuda":
        notes.append(f"quick run: one op per family, each attnbench measurement capped at {QUICK_MAX_CASE_S:g} s")
    elif quick:
        notes.append(
            f"quick run: tiny ops, each attnbench measurement capped at {QUICK_MAX_CASE_S:g} s: a smoke test, "
            "not a verdict"
        )
    return SelfcheckTimings(
        device=device,
        device_name=environment.gpu_name or environment.cpu_model,
        torch=environment.torch or "unknown",
        threads=torch.get_num_threads(),
        rounds=rounds,
        timers=tuple(timers),
        ops=tuple(checks),
        notes=tuple(notes),
    )


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
    op: SelfcheckOp,
    dev: torch.device,
    policy: TimingPolicy,
    rounds: tuple[int, int],  # (at least, at most)
    min_run_time: float,
    timers: list[str],
    do_bench: Callable[..., float] | None,
    decided: Callable[[OpTimings], bool] | None = None,
) -> OpTimings:
    import torch
    from torch.utils.benchmark import Timer

    from attnbench.measure.clocks import clock_for
    from attnbench.measure.models import probe
    from attnbench.measure.timing import measure

    if op.case is not None:
        reason = probe(op.case, str(dev))
        if reason is not None:
            return OpTimings(op, skipped=reason)
    clock = clock_for(dev)
    with _built(op, dev) as fn, torch.inference_mode():
        # Timer's default num_threads is 1; compare like with like.
        timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())

        def ours() -> float:
            return measure(fn, clock, policy).median_s

        def reference_timer() -> float:
            return float(timer.blocked_autorange(min_run_time=min_run_time).median)

        def reference_do_bench() -> float:
            assert do_bench is not None
            return float(do_bench(fn, return_mode="median")) / 1e3  # do_bench answers in milliseconds

        runners: dict[str, Callable[[], float]] = {"attnbench": ours, TIMER: reference_timer}
        if DO_BENCH in timers:
            runners[DO_BENCH] = reference_do_bench
        names = list(runners)
        medians: dict[str, list[float]] = {name: [] for name in names}

        def so_far() -> OpTimings:
            return OpTimings(op, tuple(medians["attnbench"]), tuple((t, tuple(medians[t])) for t in timers))

        least, most = rounds
        r = 0
        while r < least or (r < most and decided is not None and not decided(so_far())):
            # Rotate the order each round so no timer always runs first (or right after another's warm-up).
            for name in names[r % len(names) :] + names[: r % len(names)]:
                medians[name].append(runners[name]())
            r += 1
    return so_far()


@contextlib.contextmanager
def _built(op: SelfcheckOp, dev: torch.device) -> Iterator[Callable[[], object]]:
    """The op as a no-argument callable, its inputs and weights made outside any timed region."""
    import torch

    from attnbench.measure.models import build_model, make_input, pinned_backend, torch_dtype

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

            with pinned_backend(model):  # as the executor times it: a forced backend set once, not per call
                yield forward
    finally:
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
