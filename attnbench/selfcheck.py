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
  single call (no batching), after ~25 ms of warm-up, for ~100 ms, zeroing a 256 MB buffer before each call so
  L2 starts cold; it returns milliseconds. attnbench keeps L2 warm, so a small op whose data fits in L2 may read
  a little faster here than under do_bench; at ≥ 100 µs that difference is within the gate.

The timers run interleaved — rounds of A, B (, C), the order rotating each round — and the verdict uses the
median of the per-round ratios (attnbench / reference), so drift of a shared, noisy machine cancels rather
than landing on whichever timer ran last. An op whose reference median is ≥ 100 µs must agree within ±5 %
(torch.utils.benchmark) or ±3 % (do_bench); shorter ops are shown but not gated.

This module is importable without torch (the report's values and rendering are pure); the measuring functions
import torch when called.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from attnbench.cases import Case, TimingPolicy
from attnbench.units import format_seconds

if TYPE_CHECKING:
    import torch

TIMER = "torch.utils.benchmark"
DO_BENCH = "triton do_bench"
TOLERANCE: dict[str, float] = {TIMER: 0.05, DO_BENCH: 0.03}
GATE_MIN_S = 100e-6  # ops shorter than this are shown, not gated: per-call overheads differ by design
# Per-round ratios spread wider than this (max − min) say the machine drifted or was loaded during the check.
NOISY_SPREAD = 0.20
ROUNDS, QUICK_ROUNDS = 7, 2
# blocked_autorange's min_run_time per round: its default, and a quarter of it for a quick smoke test.
MIN_RUN_TIME_S, QUICK_MIN_RUN_TIME_S = 0.2, 0.05
Progress = Callable[[str], None]


@dataclass(frozen=True)
class SelfcheckOp:
    """One op of the fixed list: a bare matmul (``case`` None, ``size`` n) or a model forward (``case``)."""

    name: str
    dtype: str
    case: Case | None = None
    size: int | None = None

    @property
    def shape(self) -> str:
        if self.case is None:
            return f"{self.size}×{self.size} · {self.size}×{self.size}"
        c = self.case
        heads = "" if c.heads is None else f" h={c.heads}"
        return f"b={c.batch} n={c.seq_len} d={c.d_model}{heads}"


@dataclass(frozen=True)
class Reference:
    """One reference timer's medians for one op, a round at a time, beside ours."""

    timer: str
    medians_s: tuple[float, ...]
    ours_s: tuple[float, ...]

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.timer]

    @property
    def median_s(self) -> float:
        return statistics.median(self.medians_s)

    @property
    def ratios(self) -> tuple[float, ...]:
        """attnbench / reference in each round: > 1 means attnbench reports the op slower."""
        return tuple(o / r for o, r in zip(self.ours_s, self.medians_s, strict=True))

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def gated(self) -> bool:
        return self.median_s >= GATE_MIN_S

    @property
    def failed(self) -> bool:
        return self.gated and abs(self.ratio - 1.0) > self.tolerance

    @property
    def noisy(self) -> bool:
        return self.gated and max(self.ratios) - min(self.ratios) > NOISY_SPREAD


@dataclass(frozen=True)
class OpCheck:
    op: SelfcheckOp
    ours_s: tuple[float, ...] = ()  # attnbench's median in each round
    references: tuple[Reference, ...] = ()
    skipped: str = ""  # why the op could not run here

    @property
    def ours_median_s(self) -> float | None:
        return statistics.median(self.ours_s) if self.ours_s else None

    @property
    def verdict(self) -> str:
        if self.skipped:
            return f"skipped: {self.skipped}"
        failed = [r for r in self.references if r.failed]
        if failed:
            parts = [f"{r.timer} {r.ratio - 1:+.1%} > ±{r.tolerance:.0%}" for r in failed]
            return "FAIL (" + "; ".join(parts) + ")"
        if not any(r.gated for r in self.references):
            return f"not gated (< {format_seconds(GATE_MIN_S)})"
        return "ok"


@dataclass(frozen=True)
class SelfcheckReport:
    device: str
    device_name: str
    torch: str
    threads: int
    rounds: int
    timers: tuple[str, ...]  # the references used, in column order
    checks: tuple[OpCheck, ...]
    notes: tuple[str, ...] = ()

    @property
    def failures(self) -> list[OpCheck]:
        return [c for c in self.checks if any(r.failed for r in c.references)]


def table_rows(report: SelfcheckReport) -> tuple[list[str], list[list[str]]]:
    """Header and rows of the selfcheck table, as text (the CLI's rich table and the markdown share them)."""
    header = ["op", "shape", "dtype", "attnbench"]
    for timer in report.timers:
        header += [timer, f"ratio vs {timer} (rounds min–max)"]
    header.append("verdict")
    rows: list[list[str]] = []
    for check in report.checks:
        ours = check.ours_median_s
        row = [check.op.name, check.op.shape, check.op.dtype, "—" if ours is None else format_seconds(ours)]
        by_timer = {r.timer: r for r in check.references}
        for timer in report.timers:
            ref = by_timer.get(timer)
            if ref is None:
                row += ["—", "—"]
                continue
            low, high = min(ref.ratios), max(ref.ratios)
            row += [format_seconds(ref.median_s), f"{ref.ratio:.3f} ({low:.3f}–{high:.3f})"]
        row.append(check.verdict)
        rows.append(row)
    return header, rows


def noise_note(report: SelfcheckReport) -> str | None:
    """A warning when rounds disagreed widely: the verdict then says more about the machine than the timer."""
    noisy = [c for c in report.checks if any(r.noisy for r in c.references)]
    if not noisy:
        return None
    names = ", ".join(f"{c.op.name} {c.op.shape}" for c in noisy)
    return (
        f"noisy machine: per-round ratios spread by more than {NOISY_SPREAD:.0%} for {len(noisy)} gated ops "
        f"({names}); other load or frequency changes were at work, so rerun on a quiet machine before trusting "
        "the verdict either way"
    )


def summary_line(report: SelfcheckReport) -> str:
    gated = sum(1 for c in report.checks if any(r.gated for r in c.references))
    if report.failures:
        names = ", ".join(f"{c.op.name} {c.op.shape}" for c in report.failures)
        return f"selfcheck FAILED: {len(report.failures)} of {gated} gated ops disagree ({names})"
    return f"selfcheck passed: {gated} gated ops agree within tolerance"


def render_markdown(report: SelfcheckReport) -> str:
    header, rows = table_rows(report)
    noise = noise_note(report)
    notes = [*report.notes, *([noise] if noise else [])]
    gates = " / ".join(f"±{TOLERANCE[t]:.0%} against {t}" for t in report.timers)
    lines = [
        f"# attnbench selfcheck — {report.device} ({report.device_name})",
        "",
        f"torch {report.torch}, {report.threads} threads, {report.rounds} interleaved rounds per op. Each cell is "
        "the median of the per-round medians; a ratio is attnbench / reference, the median of the per-round "
        f"ratios (min–max over rounds). Gate: ops whose reference median is ≥ {format_seconds(GATE_MIN_S)} must "
        f"agree within {gates}.",
        "",
        "| " + " | ".join(header) + " |",
        "| " + " | ".join("---" for _ in header) + " |",
        *("| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows),
        "",
        *(f"- {note}" for note in notes),
        *([""] if notes else []),
        f"**{summary_line(report)}**",
        "",
    ]
    return "\n".join(lines)


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
            return [matmul(half, 1024), attention("sdpa-flash", half, 2, 256, 256, 4), lstm("float16", 2, 64, 256)]
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
    """The default policy; a quick run caps each measurement at 2 s so it stays a smoke test."""
    return replace(TimingPolicy(), max_case_s=2.0) if quick else TimingPolicy()


def run_selfcheck(
    device: str, *, quick: bool = False, rounds: int | None = None, progress: Progress | None = None
) -> SelfcheckReport:
    """Time every op of ``ops_for(device)`` with attnbench and the references, interleaved, and compare."""
    import torch

    from attnbench.environment import collect_environment

    dev = torch.device(device)
    rounds = rounds or (QUICK_ROUNDS if quick else ROUNDS)
    policy = policy_for(quick)
    timers = [TIMER]
    notes: list[str] = []
    do_bench: Callable[..., float] | None = None
    if dev.type == "cuda":
        try:
            from triton.testing import do_bench as triton_do_bench
        except ImportError as exc:
            notes.append(f"triton does not import ({exc}): the do_bench comparison is skipped")
        else:
            do_bench = triton_do_bench
            timers.append(DO_BENCH)
    environment = collect_environment(device)
    # As the executor does: torch's long-lived objects out of the collector, so a collection that lands inside
    # a timed call walks only this run's garbage (torch.utils.benchmark disables gc while timing instead).
    gc.freeze()
    checks: list[OpCheck] = []
    ops = [_on_device(op, device) for op in ops_for(dev.type, quick=quick)]
    for index, op in enumerate(ops, start=1):
        if progress:
            progress(f"[{index}/{len(ops)}] {op.name} {op.shape} {op.dtype}: {rounds} rounds")
        min_run_time = QUICK_MIN_RUN_TIME_S if quick else MIN_RUN_TIME_S
        checks.append(_check_op(op, dev, policy, rounds, min_run_time, timers, do_bench))
    if quick:
        notes.append("quick run: tiny ops, each attnbench measurement capped at 2 s: a smoke test, not a verdict")
    return SelfcheckReport(
        device=device,
        device_name=environment.gpu_name or environment.cpu_model,
        torch=environment.torch or "unknown",
        threads=torch.get_num_threads(),
        rounds=rounds,
        timers=tuple(timers),
        checks=tuple(checks),
        notes=tuple(notes),
    )


def _on_device(op: SelfcheckOp, device: str) -> SelfcheckOp:
    return op if op.case is None else replace(op, case=replace(op.case, device=device))


def _check_op(
    op: SelfcheckOp,
    dev: torch.device,
    policy: TimingPolicy,
    rounds: int,
    min_run_time: float,
    timers: list[str],
    do_bench: Callable[..., float] | None,
) -> OpCheck:
    import torch
    from torch.utils.benchmark import Timer

    from attnbench.clocks import clock_for
    from attnbench.models import probe
    from attnbench.timing import measure

    if op.case is not None:
        reason = probe(op.case, str(dev))
        if reason is not None:
            return OpCheck(op, skipped=reason)
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
        for r in range(rounds):
            # Rotate the order each round so no timer always runs first (or right after another's warm-up).
            for name in names[r % len(names) :] + names[: r % len(names)]:
                medians[name].append(runners[name]())
    ours_s = tuple(medians["attnbench"])
    references = tuple(Reference(t, tuple(medians[t]), ours_s) for t in timers)
    return OpCheck(op, ours_s, references)


@contextlib.contextmanager
def _built(op: SelfcheckOp, dev: torch.device) -> Iterator[Callable[[], object]]:
    """The op as a no-argument callable, its inputs and weights made outside any timed region."""
    import torch

    from attnbench.models import build_model, make_input, torch_dtype

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

            yield forward
    finally:
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
