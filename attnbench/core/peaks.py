"""Vendor peak figures for the GPUs people benchmark on (issue 3, item 1). Pure Python.

Dense figures only: NVIDIA's datasheets print tensor-core rates "with sparsity" (2:4 structured sparsity), which
no dense matmul reaches; where a datasheet gives only that figure it is halved here, and the entry says so. The
FP16/BF16 figures are the rates with FP32 accumulation, which is what a torch matmul asks cuBLAS for (on GeForce
cards the FP16-accumulate rate is twice that and unreachable from torch). ``float64`` is the FP64 tensor-core
rate where the part has one (A100, H100, H200: cuBLAS DGEMM uses it), else the FP64 vector rate. A dtype the
part does not run at all (BF16 and TF32 on Volta and Turing) or that the datasheet does not state is absent:
"no vendor figure", never a guess.

Memory bandwidth is the datasheet's DRAM figure in decimal bytes per second, to be compared with a copy's bytes
read plus bytes written per second.

CPUs have no entry: their peaks depend on the SKU, the clocks under load and the instruction set in use, so for
a CPU the calibrated figure (``attnbench calibrate``) is the peak, and the report says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

# What each key means; "tf32" is float32 data run on TF32 tensor cores (torch: float32 matmul precision "high",
# and cuDNN RNNs by default).
PEAK_DTYPES: tuple[str, ...] = ("float64", "float32", "tf32", "bfloat16", "float16")
SHORT_NAMES: Mapping[str, str] = MappingProxyType(
    {"float64": "fp64", "float32": "fp32", "tf32": "tf32", "bfloat16": "bf16", "float16": "fp16"}
)

_T = 1e12  # FLOP/s per TFLOP/s
_G = 1e9  # bytes/s per GB/s (vendors use decimal units)


@dataclass(frozen=True)
class VendorPeak:
    """One part's dense peaks. ``pattern`` is matched (case-insensitively) against torch's device name."""

    name: str
    pattern: str
    flops_per_s: Mapping[str, float]
    bandwidth_bytes_per_s: float
    source: str

    def flops(self, dtype: str) -> float | None:
        return self.flops_per_s.get(dtype)

    def describe(self, dtype: str) -> str:
        """How a report names this peak: ``vendor NVIDIA H200 SXM bf16 dense``."""
        return f"vendor {self.name} {SHORT_NAMES.get(dtype, dtype)} dense"


def _entry(
    name: str,
    pattern: str,
    bandwidth_gb_s: float,
    source: str,
    *,
    fp64: float | None = None,
    fp32: float,
    tf32: float | None = None,
    bf16: float | None = None,
    fp16: float | None = None,
) -> VendorPeak:
    tflops = {"float64": fp64, "float32": fp32, "tf32": tf32, "bfloat16": bf16, "float16": fp16}
    flops = {dtype: value * _T for dtype, value in tflops.items() if value is not None}
    return VendorPeak(name, pattern, MappingProxyType(flops), bandwidth_gb_s * _G, source)


_HALVED = "tensor-core figures are the datasheet's sparsity figures halved"

# First match wins, so a specific pattern (H100 NVL, A100 PCIe 80GB) comes before the general one. Torch names
# these parts e.g. "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-40GB",
# "NVIDIA A100 80GB PCIe", "NVIDIA GeForce RTX 4090", "Tesla V100-SXM2-16GB", "Tesla T4".
VENDOR_PEAKS: tuple[VendorPeak, ...] = (
    _entry(
        "NVIDIA H200 NVL",
        r"\bH200\b.*\bNVL\b",
        4800,
        f"NVIDIA H200 Tensor Core GPU datasheet (H200 NVL column; {_HALVED})",
        fp64=60,
        fp32=60,
        tf32=417.5,
        bf16=835.5,
        fp16=835.5,
    ),
    _entry(
        "NVIDIA H200 SXM",
        r"\bH200\b",
        4800,
        f"NVIDIA H200 Tensor Core GPU datasheet (H200 SXM column; {_HALVED})",
        fp64=67,
        fp32=67,
        tf32=494.5,
        bf16=989.5,
        fp16=989.5,
    ),
    _entry(
        "NVIDIA H100 NVL",
        r"\bH100\b.*\bNVL\b",
        3900,
        f"NVIDIA H100 Tensor Core GPU datasheet (H100 NVL column; {_HALVED})",
        fp64=60,
        fp32=60,
        tf32=417.5,
        bf16=835.5,
        fp16=835.5,
    ),
    _entry(
        "NVIDIA H100 PCIe",
        r"\bH100\b.*\bPCIe\b",
        2000,
        f"NVIDIA H100 Tensor Core GPU datasheet (H100 PCIe column; {_HALVED})",
        fp64=51,
        fp32=51,
        tf32=378,
        bf16=756,
        fp16=756,
    ),
    _entry(
        "NVIDIA H100 SXM",
        r"\bH100\b",
        3350,
        f"NVIDIA H100 Tensor Core GPU datasheet (H100 SXM column; {_HALVED})",
        fp64=67,
        fp32=67,
        tf32=494.5,
        bf16=989.5,
        fp16=989.5,
    ),
    _entry(
        "NVIDIA A100 80GB PCIe",
        r"\bA100\b(?=.*\bPCIe\b)(?=.*\b80\s?GB\b)",
        1935,
        "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB PCIe column; dense figures)",
        fp64=19.5,
        fp32=19.5,
        tf32=156,
        bf16=312,
        fp16=312,
    ),
    _entry(
        "NVIDIA A100 40GB PCIe",
        r"\bA100\b.*\bPCIe\b",
        1555,
        "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB PCIe column; dense figures)",
        fp64=19.5,
        fp32=19.5,
        tf32=156,
        bf16=312,
        fp16=312,
    ),
    _entry(
        "NVIDIA A100 80GB SXM",
        r"\bA100\b.*\b80\s?GB\b",
        2039,
        "NVIDIA A100 Tensor Core GPU datasheet (A100 80GB SXM column; dense figures)",
        fp64=19.5,
        fp32=19.5,
        tf32=156,
        bf16=312,
        fp16=312,
    ),
    _entry(
        "NVIDIA A100 40GB SXM",
        r"\bA100\b",
        1555,
        "NVIDIA A100 Tensor Core GPU datasheet (A100 40GB SXM column; dense figures)",
        fp64=19.5,
        fp32=19.5,
        tf32=156,
        bf16=312,
        fp16=312,
    ),
    _entry(
        "NVIDIA GeForce RTX 4090",
        r"\bRTX\s?4090\b(?!\s*(Ti|D|Laptop|Mobile)\b)",
        1008,
        "NVIDIA Ada GPU Architecture whitepaper, appendix (GeForce RTX 4090; FP16/BF16 with FP32 accumulate, dense)",
        fp32=82.6,
        tf32=82.6,
        bf16=165.2,
        fp16=165.2,
    ),
    _entry(
        "NVIDIA GeForce RTX 3090",
        r"\bRTX\s?3090\b(?!\s*(Ti|Laptop|Mobile)\b)",
        936,
        "NVIDIA Ampere GA102 GPU Architecture whitepaper (GeForce RTX 3090; FP16/BF16 with FP32 accumulate, dense)",
        fp32=35.6,
        tf32=35.6,
        bf16=71,
        fp16=71,
    ),
    _entry(
        "NVIDIA L40S",
        r"\bL40S\b",
        864,
        f"NVIDIA L40S GPU datasheet ({_HALVED})",
        fp32=91.6,
        tf32=183,
        bf16=362,
        fp16=362,
    ),
    _entry(
        "NVIDIA L40",
        r"\bL40\b",
        864,
        f"NVIDIA L40 GPU datasheet ({_HALVED})",
        fp32=90.5,
        tf32=90.5,
        bf16=181,
        fp16=181,
    ),
    _entry(
        "NVIDIA L4",
        r"\bL4\b",
        300,
        f"NVIDIA L4 Tensor Core GPU datasheet ({_HALVED})",
        fp32=30.3,
        tf32=60,
        bf16=121,
        fp16=121,
    ),
    _entry(
        "NVIDIA A10",
        r"\bA10\b",
        600,
        f"NVIDIA A10 Tensor Core GPU datasheet ({_HALVED})",
        fp32=31.2,
        tf32=62.5,
        bf16=125,
        fp16=125,
    ),
    _entry(
        "NVIDIA V100S PCIe",
        r"\bV100S\b",
        1134,
        "NVIDIA Tesla V100 GPU datasheet (V100S PCIe column; tensor performance is FP16)",
        fp64=8.2,
        fp32=16.4,
        fp16=130,
    ),
    _entry(
        "NVIDIA V100 PCIe",
        r"\bV100\b.*\bPCIe\b",
        900,
        "NVIDIA Tesla V100 GPU datasheet (V100 PCIe column; tensor performance is FP16)",
        fp64=7,
        fp32=14,
        fp16=112,
    ),
    _entry(
        "NVIDIA V100 SXM2",
        r"\bV100\b.*\bSXM2\b",
        900,
        "NVIDIA Tesla V100 GPU datasheet (V100 SXM2 column; tensor performance is FP16)",
        fp64=7.8,
        fp32=15.7,
        fp16=125,
    ),
    _entry(
        "NVIDIA T4",
        r"\bT4\b",
        320,
        "NVIDIA T4 Tensor Core GPU datasheet (mixed-precision FP16/FP32 tensor figure)",
        fp32=8.1,
        fp16=65,
    ),
)

_COMPILED = tuple((re.compile(p.pattern, re.IGNORECASE), p) for p in VENDOR_PEAKS)
_BY_NAME = {p.name: p for p in VENDOR_PEAKS}

# Parts whose boards a device name does not always tell apart, told apart by their default power limit instead
# (NVML ``nvmlDeviceGetPowerManagementDefaultLimit``): (the entry a name matches, the lower-power sibling, the
# sibling's board power in W). NVIDIA H200 datasheet: SXM up to 700 W, NVL up to 600 W.
_POWER_SIBLINGS: tuple[tuple[str, str, float], ...] = (("NVIDIA H200 SXM", "NVIDIA H200 NVL", 600.0),)


def vendor_peak(device_name: str | None, default_power_limit_w: float | None = None) -> VendorPeak | None:
    """The table entry for torch's name of a device (``torch.cuda.get_device_name``), or None: an unknown part,
    or a CPU (no device name). ``default_power_limit_w``, when known, picks the lower-power sibling of a part
    whose name both boards share (an H200 at 600 W is an NVL)."""
    if not device_name:
        return None
    for pattern, peak in _COMPILED:
        if pattern.search(device_name):
            return _by_power(peak, default_power_limit_w)
    return None


def _by_power(peak: VendorPeak, default_power_limit_w: float | None) -> VendorPeak:
    if default_power_limit_w is None:
        return peak
    for name, sibling, board_w in _POWER_SIBLINGS:
        if peak.name == name and default_power_limit_w <= board_w + 1.0:  # NVML reports mW; allow rounding
            return _BY_NAME[sibling]
    return peak
