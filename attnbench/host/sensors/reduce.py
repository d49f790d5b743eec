"""Pure summarising functions: window joining, means, counter deltas, energy, throttle logic. Stdlib only.

Everything here takes plain numbers, so it is tested directly on synthetic samples, without threads or NVML.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterable, Sequence

# NVML averages utilisation over a sample period of 1/6 s to 1 s depending on the product (nvml.h,
# nvmlDeviceGetUtilizationRates). Without a better estimate, assume the shortest: a window shorter than even that
# cannot hold one full utilisation sample.
DEFAULT_UTIL_PERIOD_S = 1 / 6
MIN_SAMPLES = 3  # below this a mean or a max over "samples" says nothing

# Clock-event ("throttle") reason bits, nvmlClocksEventReason* in nvml.h; the values are ABI and never change.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "GpuIdle"),
    (0x002, "ApplicationsClocksSetting"),
    (0x004, "SwPowerCap"),
    (0x008, "HwSlowdown"),
    (0x010, "SyncBoost"),
    (0x020, "SwThermalSlowdown"),
    (0x040, "HwThermalSlowdown"),
    (0x080, "HwPowerBrakeSlowdown"),
    (0x100, "DisplayClockSetting"),
)
# The reasons that mean the board cut clocks for power or heat (as opposed to idling or a clock the user set).
THERMAL_OR_POWER_MASK = 0x004 | 0x008 | 0x020 | 0x040 | 0x080
# A thermal or power reason counts as throttling only once the SM clock actually fell: an H200 under bf16 load
# shows SwPowerCap constantly while its clock holds near the maximum.
THROTTLE_DROP_PCT = 5.0

ENERGY_COUNTER_MODULUS = 2**64  # nvmlDeviceGetTotalEnergyConsumption is an unsigned long long in mJ
# No board draws more than this; a larger "delta" means the counter was reset (driver reload), not used.
MAX_PLAUSIBLE_POWER_W = 10_000.0


def in_window(points: Iterable[tuple[float, float]], start: float, end: float) -> list[tuple[float, float]]:
    """The (time, value) points with ``start <= time <= end``; everything else belongs to another case."""
    return [(t, v) for t, v in points if start <= t <= end]


def mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


def counter_delta(start: int, end: int, modulus: int = ENERGY_COUNTER_MODULUS) -> int:
    """How far a monotonic counter of ``modulus`` states advanced from ``start`` to ``end``, across one wrap."""
    return (end - start) % modulus


def energy_from_counter(start_mj: int, end_mj: int, window_s: float) -> float | None:
    """Joules from two readings of the total-energy counter, or None when the delta is impossible (a reset)."""
    joules = counter_delta(start_mj, end_mj) / 1000.0
    if joules > MAX_PLAUSIBLE_POWER_W * max(window_s, 1e-3):
        return None
    return joules


def energy_from_power(points: Sequence[tuple[float, float]], start: float, end: float) -> float | None:
    """Joules as the integral of sampled power (W) over [start, end]: trapezoids between samples, the first and
    last value held out to the window's edges. Only a fallback: sampled power misses what happens between polls."""
    pts = sorted(in_window(points, start, end))
    if not pts or end <= start:
        return None
    total = pts[0][1] * (pts[0][0] - start) + pts[-1][1] * (end - pts[-1][0])
    for (t0, p0), (t1, p1) in itertools.pairwise(pts):
        total += (p0 + p1) / 2 * (t1 - t0)
    return total


def throttle_reason_names(mask: int) -> list[str]:
    """Names of the reason bits set in ``mask``, in bit order; unknown bits as one hex entry."""
    names = [name for bit, name in THROTTLE_REASONS if mask & bit]
    unknown = mask & ~sum(bit for bit, _ in THROTTLE_REASONS)
    if unknown:
        names.append(f"0x{unknown:x}")
    return names


def reasons_seen(masks: Iterable[int]) -> str:
    """';'-joined reasons set in any of ``masks``, "" if none."""
    combined = 0
    for mask in masks:
        combined |= mask
    return ";".join(throttle_reason_names(combined))


def clock_drop_pct(sm_clocks_mhz: Sequence[float], max_clock_mhz: float | None) -> float | None:
    """How far the mean SM clock sat below the device's maximum, in percent (0 at or above it); None unknown."""
    if not sm_clocks_mhz or not max_clock_mhz or max_clock_mhz <= 0:
        return None
    return max(0.0, 100.0 * (1.0 - statistics.fmean(sm_clocks_mhz) / max_clock_mhz))


def is_throttled(drop_pct: float, masks: Iterable[int]) -> bool:
    """A thermal or power reason fired and the SM clock fell more than ``THROTTLE_DROP_PCT`` below its maximum.

    Neither alone: a clock below the maximum with no such reason is the GPU idling between launches (or a clock
    the user set), and a reason with the clock at its maximum changed nothing the timing could see."""
    return any(mask & THERMAL_OR_POWER_MASK for mask in masks) and drop_pct > THROTTLE_DROP_PCT


def sample_period_s(timestamps_us: Sequence[int], default: float = DEFAULT_UTIL_PERIOD_S) -> float:
    """NVML's utilisation period, estimated as the median spacing of its own samples (at least two needed)."""
    ts = sorted(set(timestamps_us))
    gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(ts)]
    return statistics.median(gaps) if gaps else default


def process_cpu_pct(cpu_s: float, window_s: float, logical_cores: int) -> float | None:
    """A process's CPU time as a share of everything the machine could do in the window: 100 = every core busy."""
    if window_s <= 0 or logical_cores <= 0:
        return None
    return max(0.0, 100.0 * cpu_s / (window_s * logical_cores))  # never a float sum's rounding below 0


def per_core_mean_pct(start: Sequence[tuple[float, float]], end: Sequence[tuple[float, float]]) -> float | None:
    """Mean per-core utilisation from (busy_s, total_s) per core at window start and end; cores whose clock did not
    advance (offline, or too short a window for the kernel's tick) are left out. Each share is held to 0…100: busy
    time is a sum of float fields, so a core that did no work in a short window can read -1.8e-08, which the row's
    reader rightly refuses."""
    shares = [
        min(100.0, max(0.0, 100.0 * (b1 - b0) / (t1 - t0)))
        for (b0, t0), (b1, t1) in zip(start, end, strict=False)
        if t1 - t0 > 0
    ]
    return mean(shares)


def reliability(window_s: float, samples: int, util_period_s: float | None) -> tuple[bool, list[str]]:
    """Whether the window's figures can be trusted, with one note per reason they cannot.

    ``util_period_s`` is NVML's averaging period (None on CPU runs, where no such period applies)."""
    notes: list[str] = []
    if util_period_s is not None and window_s < util_period_s:
        notes.append(
            f"window {window_s:.2f} s is shorter than NVML's utilisation averaging period ({util_period_s:.2f} s): "
            "gpu_util_pct unreliable"
        )
    if samples < MIN_SAMPLES:
        notes.append(f"only {samples} sample(s) in the window (fewer than {MIN_SAMPLES})")
    return not notes, notes
