"""Which peak a row is measured against, its ``pct_of_peak``, and the rows that claim the impossible.

Torch-free: ``report`` computes these from a stored run. A row's peak is, for its dtype, the run's stored
calibration (``attnbench calibrate``) when it has that dtype, else the vendor's dense figure for the run's GPU
(``attnbench.core.peaks``), else none (an empty cell). The source is always named beside the number.

Which dtype's peak that is, the model's family says (``catalogue.peak_dtype``): the row's own dtype, or ``tf32``
where the family's kernels run float32 on TF32 tensor cores by default (cuDNN's LSTM and GRU on CUDA; the family
states why). float32 matmuls elsewhere stay on the FP32 peak: torch's default float32 matmul precision is
"highest" (no TF32), so minGRU, linear attention and Mamba-2 in float32 are held to FP32 like attention.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from attnbench.core.cases import Case
from attnbench.core.peaks import SHORT_NAMES, VendorPeak, vendor_peak
from attnbench.core.units import format_bandwidth, format_flops, format_seconds, to_mib
from attnbench.families.catalogue import peak_dtype
from attnbench.results.calibration import Calibration, foreign
from attnbench.results.records import Result, Run

_TF32_NOTE = " (float32 on TF32 tensor cores, as the model's kernels run it)"


@dataclass(frozen=True)
class Peak:
    flops_per_s: float
    source: str  # "calibrated matmul float32", "vendor NVIDIA H200 SXM bf16 dense"


@dataclass(frozen=True)
class BandwidthPeak:
    """The memory bandwidth a row's GB/s is held against: the calibrated copy (bytes read + written per second),
    else the vendor's DRAM figure."""

    bytes_per_s: float
    source: str  # "calibrated copy", "vendor NVIDIA H200 SXM DRAM"


class PeakTable:
    """The peaks one run's rows are held against."""

    def __init__(self, calibration: Calibration | None, vendor: VendorPeak | None) -> None:
        # A quick calibration measured reduced sizes: no ceiling to hold anything against.
        self.calibration = calibration if calibration is not None and not calibration.quick else None
        self.vendor = vendor

    @classmethod
    def for_run(cls, run: Run | None) -> PeakTable:
        if run is None:
            return cls(None, None)
        calibration = run.calibration
        if calibration is not None and foreign(calibration, run.environment) is not None:
            calibration = None  # another machine's ceilings are no peak of this run's (issue 50 §3.2)
        return cls(calibration, vendor_for(run.environment)[0])

    def for_dtype(self, dtype: str) -> Peak | None:
        """The calibrated figure for ``dtype``, else the vendor's, else None."""
        measured = self.calibration.matmul_for(dtype) if self.calibration else None
        if measured is not None:
            return Peak(measured.flops_per_s, f"calibrated matmul {dtype}")
        flops = self.vendor.flops(dtype) if self.vendor else None
        if self.vendor is not None and flops is not None:
            return Peak(flops, self.vendor.describe(dtype))
        return None

    def bandwidth(self) -> BandwidthPeak | None:
        """The calibrated copy bandwidth, else the vendor's DRAM figure, else None."""
        copy = self.calibration.copy if self.calibration is not None else None
        if copy is not None:
            return BandwidthPeak(copy.bytes_per_s, "calibrated copy")
        if self.vendor is not None:
            return BandwidthPeak(self.vendor.bandwidth_bytes_per_s, f"vendor {self.vendor.name} DRAM")
        return None

    def for_case(self, case: Case) -> Peak | None:
        """The peak ``case``'s matmuls run at: the one for the dtype its family names (``peak_dtype``)."""
        dtype = peak_dtype(case)
        if dtype != case.dtype:
            held = self.for_dtype(dtype)
            if held is not None:
                return Peak(held.flops_per_s, held.source + _TF32_NOTE)
        return self.for_dtype(case.dtype)


MIG_NOTE = (
    "a MIG slice holds a fraction of the GPU's SMs and memory bandwidth, so the whole GPU's vendor peaks do not "
    "apply; run 'attnbench calibrate' on the slice for peaks to hold rows against"
)


def vendor_for(environment: Mapping[str, Any]) -> tuple[VendorPeak | None, str]:
    """The vendor entry a run's rows may be held against, and why there is none where there is none.

    The GPU's name picks the part; its default power limit tells boards of one name apart (H200 NVL at 600 W
    from SXM at 700 W); a MIG slice gets none (``MIG_NOTE``): a slice is not the GPU whose peaks the table holds.
    """
    name = environment.get("gpu_name")
    if environment.get("gpu_mig") is True:
        return None, MIG_NOTE
    power = environment.get("gpu_power_default_limit_w")
    power = power if isinstance(power, int | float) and not isinstance(power, bool) else None
    vendor = vendor_peak(name if isinstance(name, str) else None, power)
    return vendor, "" if vendor is not None or not name else f"no vendor entry matches {name!r}"


def achieved_flops_per_s(result: Result, *, executed: bool = False) -> float | None:
    """The row's analytic FLOPs per call over its median seconds per call, or None when either is missing.

    Useful FLOPs (``flops``: a causal core credited the pairs its mask keeps) unless ``executed``: then the
    work the kernels did (``executed_flops``: the full n² of a core that masks after computing)."""
    flops = result.extra.get("executed_flops" if executed else "flops")
    m = result.measurement
    if not isinstance(flops, int) or isinstance(flops, bool) or m is None or m.median_s <= 0:
        return None
    return flops / m.median_s


def pct_of_peak(result: Result, peak: Peak | None, *, executed: bool = False) -> float | None:
    """Achieved FLOP/s as a percentage of ``peak`` (100 = at the peak); useful FLOPs unless ``executed``."""
    achieved = achieved_flops_per_s(result, executed=executed)
    if achieved is None or peak is None:
        return None
    return 100.0 * achieved / peak.flops_per_s


def achieved_bytes_per_s(result: Result) -> float | None:
    """The row's compulsory bytes per call (``bytes_moved``) over its median seconds per call, or None."""
    moved = result.extra.get("bytes_moved")
    m = result.measurement
    if not isinstance(moved, int) or isinstance(moved, bool) or m is None or m.median_s <= 0:
        return None
    return moved / m.median_s


def pct_of_peak_bw(result: Result, peak: BandwidthPeak | None) -> float | None:
    """Achieved bytes per second as a percentage of the bandwidth ``peak`` (a roofline's sloped ceiling)."""
    achieved = achieved_bytes_per_s(result)
    return None if achieved is None or peak is None else 100.0 * achieved / peak.bytes_per_s


def arithmetic_intensity(result: Result) -> float | None:
    """Useful FLOPs per compulsory byte: where the row sits on a roofline's x axis."""
    flops, moved = result.extra.get("flops"), result.extra.get("bytes_moved")
    if not isinstance(flops, int) or isinstance(flops, bool) or not isinstance(moved, int) or isinstance(moved, bool):
        return None
    return flops / moved if moved > 0 else None


@dataclass(frozen=True)
class Prediction:
    """What the roofline allows one call (Williams, Waterman & Patterson 2009): its FLOPs at the compute peak, its
    compulsory bytes at the memory bandwidth, overlapped perfectly, so the longer of the two."""

    compute_s: float
    memory_s: float

    @property
    def seconds(self) -> float:
        return max(self.compute_s, self.memory_s)

    @property
    def bound(self) -> Literal["compute", "memory"]:
        """Which ceiling the prediction sits under: the likelier cause when a call beats it."""
        return "compute" if self.compute_s >= self.memory_s else "memory"


def predict(result: Result, compute: Peak | None, bandwidth: BandwidthPeak | None) -> Prediction | None:
    """The row's roofline time per call, or None without a FLOP count, a byte count or either peak. The FLOPs are
    those its kernels execute (``executed_flops``: the full n² of a core that masks after computing), which the
    compute ceiling bounds; the useful count where no executed one is stored."""
    flops = result.extra.get("executed_flops", result.extra.get("flops"))
    moved = result.extra.get("bytes_moved")
    if compute is None or bandwidth is None or compute.flops_per_s <= 0 or bandwidth.bytes_per_s <= 0:
        return None
    if not isinstance(flops, int) or isinstance(flops, bool) or not isinstance(moved, int) or isinstance(moved, bool):
        return None
    return Prediction(flops / compute.flops_per_s, moved / bandwidth.bytes_per_s)


def measured_over_predicted(result: Result, prediction: Prediction | None) -> float | None:
    """The row's median over its roofline time: 1 at the roofline, above it slower (the usual case), below it
    faster than the model allows, which means a count or a peak is wrong, or the data came from cache."""
    m = result.measurement
    if prediction is None or m is None or prediction.seconds <= 0 or not result.ok:
        return None
    return m.median_s / prediction.seconds


def prediction_for(table: PeakTable, result: Result) -> Prediction | None:
    """``predict`` with the peaks ``table`` holds the row's case against (its dtype's, or TF32's: ``for_case``)."""
    return predict(result, table.for_case(result.case), table.bandwidth())


def faster_than_roofline(table: PeakTable, results: Iterable[Result]) -> dict[str, tuple[Prediction, float]]:
    """The rows (by case key) that ran faster than their roofline time, each with its prediction and measured /
    predicted (below 1), in run order."""
    found: dict[str, tuple[Prediction, float]] = {}
    for result in results:
        prediction = prediction_for(table, result)
        ratio = measured_over_predicted(result, prediction)
        if prediction is not None and ratio is not None and ratio < 1.0:
            found[result.case.key] = (prediction, ratio)
    return found


def below_roofline_flags(table: PeakTable, results: Iterable[Result]) -> list[str]:
    """One line per ok row that ran faster than its roofline time (measured / predicted below 1), with the cause
    the prediction makes likelier: a memory-bound row's bytes came from cache (a warm cache it fits in) or are
    over-counted; a compute-bound row's FLOPs are over-counted or its peak is below what its kernels reach."""
    lines: list[str] = []
    for result in results:
        prediction = prediction_for(table, result)
        ratio = measured_over_predicted(result, prediction)
        if ratio is None or prediction is None or ratio >= 1.0:
            continue
        cache = result.extra.get("cache")
        if prediction.bound == "memory":
            cause = (
                "memory-bound: its bytes came from cache rather than memory"
                + (" (timed warm: cache: cold would flush them)" if cache == "warm" else "")
                + f", or the bytes formula ({result.extra.get('bytes_formula')}) counts more than it moves"
            )
        else:
            cause = (
                f"compute-bound: the FLOP count ({result.extra.get('flops_formula')}) is more than its kernels do, "
                "or the peak is below what they reach (a calibration on a loaded machine)"
            )
        lines.append(
            f"{result.case.key}: measured {format_seconds(result.measurement.median_s if result.measurement else 0)} "
            f"is {ratio:.2f}× the roofline's {format_seconds(prediction.seconds)}; likelier {cause}"
        )
    return lines


def peak_flags(table: PeakTable, results: Iterable[Result]) -> list[str]:
    """One line per row above 100 % of its peak (``table``'s): physically impossible, so a FLOP formula, a timer
    or a calibration is wrong, and the report must say so rather than print the number as if it were fine."""
    lines: list[str] = []
    for result in results:
        peak = table.for_case(result.case)
        pct = pct_of_peak(result, peak)
        if pct is None or peak is None or pct <= 100.0:
            continue
        achieved = achieved_flops_per_s(result)
        assert achieved is not None  # pct_of_peak returned a number
        formula = result.extra.get("flops_formula") or "unknown formula"
        if peak.source.startswith("calibrated"):
            cause = (
                "the FLOP count, the timing, or a calibration measured on a loaded machine is wrong "
                "(re-measure with 'attnbench calibrate --refresh')"
            )
        else:
            cause = "the FLOP count or the timing is wrong"
        lines.append(
            f"{result.case.key}: {pct:.0f}% of peak ({format_flops(achieved)} achieved, peak "
            f"{format_flops(peak.flops_per_s)} from {peak.source}; FLOPs by {formula}): above 100 % is "
            f"impossible, so {cause}"
        )
    return lines


@dataclass(frozen=True)
class CeilingRow:
    """One line of ``attnbench calibrate``'s table, as text."""

    what: str  # "matmul bfloat16", "copy"
    measured: str
    at: str  # the size that gave it
    vendor: str  # the vendor figure, or why there is none
    ratio: str  # measured / vendor
    used: str  # what pct_of_peak holds rows against for this dtype


def ceiling_rows(calibration: Calibration, vendor: VendorPeak | None) -> list[CeilingRow]:
    """The calibrate table: each measured ceiling beside the vendor's, and which one rows are held against."""
    table = PeakTable(calibration, vendor)
    rows: list[CeilingRow] = []
    for m in calibration.matmul:
        figure = vendor.flops(m.dtype) if vendor else None
        used = table.for_dtype(m.dtype)
        rows.append(
            CeilingRow(
                what=f"matmul {m.dtype}",
                measured=format_flops(m.flops_per_s) + _median_text(m.median_flops_per_s, format_flops, m.converged),
                at=f"n={m.size}",
                vendor=_vendor_text(vendor, figure, m.dtype),
                ratio="—" if not figure else f"{m.flops_per_s / figure:.0%}",
                used="— (quick run)" if used is None else used.source,
            )
        )
    for dtype, reason in calibration.skipped.items():
        vendor_figure = vendor.flops(dtype) if vendor else None
        used = table.for_dtype(dtype)
        rows.append(
            CeilingRow(
                what=f"matmul {dtype}",
                measured=f"not measured: {reason}",
                at="",
                vendor=_vendor_text(vendor, vendor_figure, dtype),
                ratio="—",
                used="none (empty pct_of_peak)" if used is None else used.source,
            )
        )
    copy = calibration.copy
    if copy is not None:
        bandwidth = vendor.bandwidth_bytes_per_s if vendor else None
        rows.append(
            CeilingRow(
                what="copy (read + write)",
                measured=format_bandwidth(copy.bytes_per_s)
                + _median_text(copy.median_bytes_per_s, format_bandwidth, copy.converged),
                at=f"2 × {to_mib(copy.buffer_bytes):.0f} MiB",
                vendor=format_bandwidth(bandwidth) if bandwidth else _no_vendor(vendor),
                ratio="—" if not bandwidth else f"{copy.bytes_per_s / bandwidth:.0%}",
                used="—",
            )
        )
    return rows


def _median_text(median: float | None, fmt: Callable[[float], str], converged: bool) -> str:
    parts = ([] if median is None else [f"median {fmt(median)}"]) + ([] if converged else ["not converged"])
    return f" ({'; '.join(parts)})" if parts else ""


def _no_vendor(vendor: VendorPeak | None) -> str:
    return "— (no vendor entry)" if vendor is None else "—"


def _vendor_text(vendor: VendorPeak | None, figure: float | None, dtype: str) -> str:
    if vendor is None:
        return _no_vendor(None)
    if figure is None:
        return f"— (no {SHORT_NAMES.get(dtype, dtype)} figure)"
    return format_flops(figure)


def vendor_line(device_name: str, vendor: VendorPeak | None, device_type: str, why_none: str = "") -> str:
    """Which vendor entry was matched, and from where; or why none was."""
    if vendor is None and why_none == MIG_NOTE:
        return f"vendor peaks: none: {MIG_NOTE}"
    if vendor is not None:
        return f"vendor peaks: {vendor.name} (matched {device_name!r}); source: {vendor.source}"
    if device_type == "cpu":
        return f"vendor peaks: none for CPUs ({device_name}): the calibrated figures are the peaks pct_of_peak uses"
    return f"vendor peaks: no entry matches {device_name!r}: the calibrated figures are the peaks pct_of_peak uses"
