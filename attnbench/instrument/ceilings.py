"""Measures a device's ceilings for ``attnbench calibrate`` (imports torch).

Two figures, both timed with attnbench's own ``measure()`` and clocks, so a ceiling and a benchmark row share
one stopwatch:

* dense matmul FLOP/s per dtype: ``torch.mm`` of two random (never zero: some hardware and libraries shortcut
  zeros) n×n matrices into a preallocated output, 2·n³ FLOPs per call, at each of a few sizes, the best size
  reported;
* copy bandwidth: one buffer copied into another, (bytes read + bytes written) per call, each buffer several
  times the last-level cache (CPU L3, GPU L2) so the copy streams from memory.

A ceiling is the rate of the fastest sample — STREAM's "best rate" convention: other work on the machine only
ever adds time — with the median's rate kept beside it, so a reader sees how far apart the two were.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import torch

from attnbench.core.cases import TimingPolicy
from attnbench.core.errors import AttnbenchError
from attnbench.core.peaks import PEAK_DTYPES
from attnbench.core.units import GIB, MIB, format_bandwidth, format_flops, to_mib
from attnbench.families.registry import torch_dtype
from attnbench.results.calibration import Calibration, CopyBandwidth, MatmulCeiling
from attnbench.results.environment import Environment
from attnbench.results.files import utc_now
from attnbench.results.measurement import Measurement
from attnbench.sweeps.events import Progress
from attnbench.timing.adaptive import Clock, measure
from attnbench.timing.clocks import clock_for

DEFAULT_DTYPES: dict[str, tuple[str, ...]] = {
    "cuda": ("float32", "tf32", "bfloat16", "float16"),
    "cpu": ("float32", "bfloat16", "float16"),
}


@dataclass(frozen=True)
class Plan:
    """What to time on one device: matmul sizes, the copy buffer, the timing policy."""

    sizes: tuple[int, ...]
    copy_bytes: int
    cache_bytes: int | None
    policy: TimingPolicy
    # Once a size's median call takes this long, larger sizes are skipped: the rate has long stopped growing and
    # each doubling costs 8× (a slow fp16 path on a CPU would otherwise take minutes).
    max_call_s: float
    quick: bool = False  # reduced sizes: a smoke test, not a ceiling (never cached, never a peak)
    notes: tuple[str, ...] = ()


# Sampling until the median's CI is within ±2 % (±1 % on a GPU, which is quieter) is plenty for a ceiling; the
# budget keeps a whole calibration to well under a minute on a small CPU.
_CPU_POLICY = TimingPolicy(target_ci=0.02, min_samples=8, min_time_s=0.3, max_case_s=4.0, warmup_max_s=1.0)
_GPU_POLICY = TimingPolicy(
    target_ci=0.01, min_samples=20, min_time_s=0.5, max_case_s=5.0, warmup_min_calls=10, warmup_max_s=2.0
)
_QUICK_POLICY = TimingPolicy(target_ci=0.05, min_samples=3, min_time_s=0.01, max_case_s=1.0, warmup_max_s=0.2)
# --quick on a GPU: the sizes that reach a datacentre GPU's matmul ceiling, each timed briefly. A ceiling is the
# fastest sample (STREAM's best rate), which a few dozen samples find as well as a few hundred.
_QUICK_GPU_POLICY = TimingPolicy(
    target_ci=0.02, min_samples=10, min_time_s=0.1, max_case_s=1.0, warmup_min_calls=5, warmup_max_s=0.5
)
QUICK_GPU_NOTE = "quick: the ceiling sizes, each timed for at most 1 s (the rate is the fastest sample)"


def plan_for(device: torch.device, *, quick: bool = False) -> Plan:
    """Sizes for this device: large enough to reach the ceiling, small enough to finish quickly."""
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        l2 = getattr(props, "L2_cache_size", None) or None
        free, _ = torch.cuda.mem_get_info(device)
        # 16× the L2 (at least 1 GiB per buffer), but never more than a quarter of what is free for both.
        want = max(GIB, 16 * (l2 or 0))
        copy = min(want, free // 8)
        short = () if copy >= want else (f"copy buffer limited to {to_mib(copy):.0f} MiB by free GPU memory",)
        if quick:  # still a ceiling, cached and used by sweeps: it fits a short GPU lease
            return Plan((4096, 8192), copy, l2, _QUICK_GPU_POLICY, 0.25, notes=(*short, QUICK_GPU_NOTE))
        return Plan((2048, 4096, 8192), copy, l2, _GPU_POLICY, 0.25, notes=short)
    llc = _cpu_llc_bytes()
    if quick:
        return Plan((128, 256), 32 * MIB, llc, _QUICK_POLICY, 0.05, quick=True)
    sizes = (1024, 2048, 4096) if (os.cpu_count() or 1) >= 16 else (1024, 2048)
    want = max(256 * MIB, 4 * (llc or 0))
    copy = min(want, 4 * GIB, _available_bytes() // 8)
    notes: tuple[str, ...] = ()
    if llc and copy < 4 * llc:
        notes = (
            f"copy buffer is {to_mib(copy):.0f} MiB, only {copy / llc:.1f}× the {to_mib(llc):.0f} MiB last-level "
            "cache (memory is short): the bandwidth may read high",
        )
    return Plan(sizes, copy, llc, _CPU_POLICY, 0.5, notes=notes)


def _cpu_llc_bytes() -> int | None:
    """The largest CPU cache Linux reports (sysfs), in bytes; None elsewhere."""
    sizes = []
    for index in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"):
        try:
            text = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1024, "M": MIB, "G": GIB}
        if text[-1:] in units and text[:-1].isdigit():
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes) if sizes else None


def _available_bytes() -> int:
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        return 8 * GIB


@contextlib.contextmanager
def _float32_precision(precision: str) -> Iterator[None]:
    """Pin torch's float32 matmul precision ("highest" = true FP32, "high" = TF32 allowed), then restore it."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def unsupported(device: torch.device, dtype: str) -> str | None:
    """Why ``dtype`` cannot be calibrated on ``device``, or None. Probed with a tiny matmul."""
    if dtype not in PEAK_DTYPES:
        return f"unknown dtype (one of: {', '.join(PEAK_DTYPES)})"
    if dtype == "tf32":
        if device.type != "cuda":
            return "TF32 is a GPU tensor-core mode"
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            return f"TF32 needs compute capability ≥ 8.0; this GPU has {major}.{minor}"
    if dtype == "bfloat16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bfloat16 support"
    data = torch.float32 if dtype == "tf32" else torch_dtype(dtype)
    try:
        a = torch.ones(16, 16, device=device, dtype=data)
        torch.mm(a, a)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except (RuntimeError, NotImplementedError) as exc:
        first = str(exc).strip().splitlines()
        return f"no {dtype} matmul here ({type(exc).__name__}: {first[0] if first else ''})"
    return None


def measure_matmul(
    device: torch.device, dtype: str, plan: Plan, clock: Clock, progress: Progress | None = None
) -> MatmulCeiling:
    """``torch.mm`` FLOP/s for ``dtype`` at each of ``plan.sizes`` (until one is slower than ``plan.max_call_s``)."""
    generator = torch.Generator(device=device).manual_seed(0)
    rates: list[tuple[int, float]] = []
    medians: dict[int, float] = {}
    converged = True
    with _float32_precision("high" if dtype == "tf32" else "highest"):
        for n in plan.sizes:
            try:
                m = _time_mm(n, device, dtype, generator, clock, plan.policy)
            except torch.cuda.OutOfMemoryError:
                break  # the sizes below this one stand; a bigger product does not fit
            rate, medians[n] = 2 * n**3 / m.summary.min, 2 * n**3 / m.median_s
            rates.append((n, rate))
            converged = converged and m.converged
            if progress:
                progress(f"matmul {dtype} n={n}: {format_flops(rate)} (median {format_flops(medians[n])})")
            if m.median_s > plan.max_call_s:
                break
    if not rates:
        raise AttnbenchError(
            f"calibrate: not even a {plan.sizes[0]}² {dtype} matmul fits in memory on {device}",
            hint="free the device (other processes?) and retry",
        )
    best_n, best = max(rates, key=lambda pair: pair[1])
    return MatmulCeiling(dtype, best, best_n, tuple(rates), medians[best_n], converged)


def _time_mm(
    n: int, device: torch.device, dtype: str, generator: torch.Generator, clock: Clock, policy: TimingPolicy
) -> Measurement:
    """One size; the matrices are freed when this returns."""
    data = torch.float32 if dtype == "tf32" else torch_dtype(dtype)
    a = torch.randn(n, n, device=device, dtype=data, generator=generator)
    b = torch.randn(n, n, device=device, dtype=data, generator=generator)
    out = torch.empty(n, n, device=device, dtype=data)

    def step() -> object:
        return torch.mm(a, b, out=out)

    return measure(step, clock, policy)


def measure_copy(device: torch.device, plan: Plan, clock: Clock, progress: Progress | None = None) -> CopyBandwidth:
    """Bandwidth of ``dst.copy_(src)`` over two ``plan.copy_bytes`` buffers."""
    n = plan.copy_bytes
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    # Touch every page of both before timing (fresh CPU pages are lazily mapped, possibly onto one zero page).
    src.fill_(0x5A)
    dst.fill_(0xA5)

    def step() -> object:
        return dst.copy_(src)

    m = measure(step, clock, plan.policy)
    rate, median = 2 * n / m.summary.min, 2 * n / m.median_s
    if progress:
        progress(f"copy 2 × {to_mib(n):.0f} MiB: {format_bandwidth(rate)} (median {format_bandwidth(median)})")
    return CopyBandwidth(rate, n, plan.cache_bytes, median, m.converged)


def calibrate(
    device: str,
    dtypes: Sequence[str],
    environment: Environment,
    *,
    quick: bool = False,
    plan: Plan | None = None,
    progress: Progress | None = None,
) -> Calibration:
    """Measure every dtype in ``dtypes`` that runs on ``device`` (the rest are recorded as skipped, with why),
    then the copy bandwidth."""
    dev = torch.device(device)
    plan = plan or plan_for(dev, quick=quick)
    clock = clock_for(dev)
    ceilings: list[MatmulCeiling] = []
    skipped: dict[str, str] = {}
    for dtype in dict.fromkeys(dtypes):
        reason = unsupported(dev, dtype)
        if reason is not None:
            skipped[dtype] = reason
            continue
        ceilings.append(measure_matmul(dev, dtype, plan, clock, progress))
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the next dtype's matrices, and the copy buffers, get the memory back
    copy = measure_copy(dev, plan, clock, progress)
    notes = list(plan.notes)
    if plan.quick:
        notes.append("quick run: reduced sizes, a smoke test rather than a ceiling; not cached")
    not_converged = [c.dtype for c in ceilings if not c.converged] + ([] if copy.converged else ["copy"])
    if not_converged:
        notes.append(f"not converged within the budget (noisy machine?): {', '.join(not_converged)}")
    return Calibration(
        fingerprint=environment.fingerprint(),
        device=device,
        device_name=environment.gpu_name or environment.cpu_model,
        created_utc=utc_now(),
        torch=environment.torch,
        torch_threads=environment.torch_threads,
        matmul=tuple(ceilings),
        copy=copy,
        skipped=MappingProxyType(skipped),
        notes=tuple(notes),
        quick=plan.quick,
    )
