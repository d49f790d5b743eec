"""Calibration values and cache, vendor peaks, pct_of_peak and its >100 % flag, and the calibrate command."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnbench.analysis.efficiency import (
    MIG_NOTE,
    PeakTable,
    achieved_flops_per_s,
    ceiling_rows,
    pct_of_peak,
    peak_flags,
    vendor_for,
    vendor_line,
)
from attnbench.analysis.reading import Reading
from attnbench.cli import app
from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.errors import ResultsError
from attnbench.core.peaks import PEAK_DTYPES, VENDOR_PEAKS, vendor_peak
from attnbench.core.units import format_bandwidth, format_flops
from attnbench.report.rows import COLUMNS, render_csv, summary_rows
from attnbench.results.calibration import (
    CACHE_ENV,
    Calibration,
    CopyBandwidth,
    MatmulCeiling,
    NoiseFloor,
    cache_dir,
    cache_path,
    load_cached,
    save,
)
from attnbench.results.fields import FieldError
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result, Run
from attnbench.results.store import load_run
from tests.support import FIXTURE, ROOT, mentions, numbers, tiny_case, tiny_config

FP = "0123456789abcdef"
runner = CliRunner()


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own cache folder: never the user's ~/.cache."""
    folder = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(folder))
    return folder


def calibration(fingerprint: str = FP, **changes: object) -> Calibration:
    base = Calibration(
        fingerprint=fingerprint,
        device="cpu",
        device_name="Test CPU",
        created_utc="2026-01-01T00:00:00.000000Z",
        torch="2.13.0+cpu",
        torch_threads=2,
        matmul=(
            MatmulCeiling("float32", 2e11, 2048, ((1024, 1.5e11), (2048, 2e11)), median_flops_per_s=1.8e11),
            MatmulCeiling("bfloat16", 1e12, 1024, ((1024, 1e12), (2048, 8e11)), converged=False),
        ),
        copy=CopyBandwidth(1.1e10, 2 * 2**30, 480 * 2**20),
        skipped={"tf32": "TF32 is a GPU tensor-core mode"},
        notes=("a note",),
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def run_for(environment: dict[str, object], cal: Calibration | None = None) -> Run:
    base = {"device": "cpu", "device_type": "cpu", "gpu_name": None, "cpu_model": "Test CPU"}
    return Run(
        run_id="20260101-000000-test-cpu",
        created_utc="2026-01-01T00:00:00.000000Z",
        config_source="test.yaml",
        config={"name": "test"},
        config_sha256="0" * 64,
        timing=TimingPolicy(),
        environment={**base, **environment},
        calibration=cal,
    )


def fixture_results() -> list[Result]:
    lines = (FIXTURE / "results.jsonl").read_text().splitlines()
    return [Result.from_dict(json.loads(line)) for line in lines if line.strip()]


def row(
    model: str = "vanilla", dtype: str = "float32", device: str = "cpu", flops: int = 10**12, median_s: float = 1.0
) -> Result:
    recurrent = model in ("lstm", "gru")
    case = Case(model, "forward", dtype, device, 2, 64, 32, None if recurrent else 4, 1, recurrent)
    m = Measurement((median_s,) * 10, 1, 3, 0.0, True, "converged", 0.01)
    return Result(case, "ok", measurement=m, extra={"flops": flops, "flops_formula": "attention-v1"})


# --- the Calibration value -----------------------------------------------------------------------------------


def test_round_trip_through_json() -> None:
    cal = calibration()
    back = Calibration.from_dict(json.loads(json.dumps(cal.to_dict())))
    assert back.to_dict() == cal.to_dict()
    assert back.matmul_for("bfloat16") == cal.matmul[1]
    assert back.matmul_for("float16") is None
    assert dict(back.skipped) == {"tf32": "TF32 is a GPU tensor-core mode"}


@pytest.mark.parametrize(
    ("mutate", "key"),
    [
        (lambda d: d.update(extra=1), ""),
        (lambda d: d.pop("matmul"), ""),
        (lambda d: d.update(fingerprint="../../etc"), "fingerprint"),
        (lambda d: d.update(schema_version=99), "schema_version"),
        (lambda d: d["matmul"][0].update(dtype="int8"), "matmul[0].dtype"),
        (lambda d: d["matmul"][0].update(flops_per_s=-1.0), "matmul[0].flops_per_s"),
        (lambda d: d["matmul"][0].update(flops_per_s=0), "matmul[0].flops_per_s"),
        (lambda d: d["matmul"][0].update(by_size=[]), "matmul[0].by_size"),
        (lambda d: d["matmul"][0].update(by_size=[[1024]]), "matmul[0].by_size[0]"),
        (lambda d: d["matmul"].append(dict(d["matmul"][0])), "matmul"),
        (lambda d: d["copy"].update(buffer_bytes="big"), "copy.buffer_bytes"),
        (lambda d: d["matmul"][0].update(median_flops_per_s=float("inf")), "matmul[0].median_flops_per_s"),
        (lambda d: d.update(skipped=["tf32"]), "skipped"),
        (lambda d: d.update(quick="no"), "quick"),
    ],
)
def test_from_dict_is_strict(mutate, key: str) -> None:  # type: ignore[no-untyped-def]
    data = json.loads(json.dumps(calibration().to_dict()))
    mutate(data)
    with pytest.raises(FieldError) as caught:
        Calibration.from_dict(data)
    assert caught.value.key == key


def test_formatting_uses_decimal_prefixes() -> None:
    assert format_flops(7.8e14) == "780 TFLOP/s"
    assert format_flops(1.07e11) == "107 GFLOP/s"
    assert format_bandwidth(4.3e12) == "4.3 TB/s"
    assert format_bandwidth(1.1e10) == "11 GB/s"


# --- the cache -------------------------------------------------------------------------------------------------


def test_cache_is_keyed_by_fingerprint(private_cache: Path) -> None:
    path = save(calibration())
    assert path == private_cache / f"calibration-{FP}.json" == cache_path(FP)
    assert load_cached(FP) == Calibration.from_dict(calibration().to_dict())
    assert load_cached("fedcba9876543210") is None  # another machine: no calibration, not an error
    save(calibration("fedcba9876543210", device_name="Other CPU"))
    assert load_cached(FP).device_name == "Test CPU"  # type: ignore[union-attr]
    assert load_cached("fedcba9876543210").device_name == "Other CPU"  # type: ignore[union-attr]


def test_cache_folder_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cache_dir() == tmp_path / "cache"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "attnbench"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "attnbench"


def test_fingerprint_must_be_hex() -> None:
    with pytest.raises(ValueError):
        cache_path("../escape")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"schema_version": 1}', "missing key"),
        (None, "holds the calibration of machine fedcba9876543210"),
    ],
)
def test_damaged_cache_is_an_error_naming_the_file(private_cache: Path, text: str | None, message: str) -> None:
    path = cache_path(FP)
    path.parent.mkdir(parents=True)
    if text is None:  # a file renamed onto another machine's name
        text = json.dumps(calibration("fedcba9876543210").to_dict())
    path.write_text(text)
    with pytest.raises(ResultsError) as caught:
        load_cached(FP)
    assert str(path) in caught.value.message and message in caught.value.message
    assert "--refresh" in caught.value.hint


# --- vendor peaks ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch_name", "entry"),
    [
        ("NVIDIA H200", "NVIDIA H200 SXM"),
        ("NVIDIA H200 NVL", "NVIDIA H200 NVL"),
        ("NVIDIA H100 80GB HBM3", "NVIDIA H100 SXM"),
        ("NVIDIA H100 PCIe", "NVIDIA H100 PCIe"),
        ("NVIDIA H100 NVL", "NVIDIA H100 NVL"),
        ("NVIDIA A100-SXM4-40GB", "NVIDIA A100 40GB SXM"),
        ("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB SXM"),
        ("NVIDIA A100-PCIE-40GB", "NVIDIA A100 40GB PCIe"),
        ("NVIDIA A100 80GB PCIe", "NVIDIA A100 80GB PCIe"),
        ("NVIDIA GeForce RTX 3090", "NVIDIA GeForce RTX 3090"),
        ("NVIDIA GeForce RTX 4090", "NVIDIA GeForce RTX 4090"),
        ("NVIDIA L4", "NVIDIA L4"),
        ("NVIDIA L40S", "NVIDIA L40S"),
        ("NVIDIA L40", "NVIDIA L40"),
        ("NVIDIA A10", "NVIDIA A10"),
        ("Tesla V100-SXM2-16GB", "NVIDIA V100 SXM2"),
        ("Tesla V100-PCIE-32GB", "NVIDIA V100 PCIe"),
        ("Tesla V100S-PCIE-32GB", "NVIDIA V100S PCIe"),
        ("Tesla T4", "NVIDIA T4"),
    ],
)
def test_vendor_peak_by_torch_device_name(torch_name: str, entry: str) -> None:
    peak = vendor_peak(torch_name)
    assert peak is not None and peak.name == entry


@pytest.mark.parametrize(
    "name",
    [
        None,
        "",
        "Intel(R) Xeon(R) Processor",
        "AMD Instinct MI300X",
        "NVIDIA GH200 480GB",
        "NVIDIA A10G",  # not an A10: a different part
        "NVIDIA GeForce RTX 3090 Ti",
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "Tesla V100-SXM3-32GB",
    ],
)
def test_unknown_devices_have_no_vendor_peak(name: str | None) -> None:
    assert vendor_peak(name) is None


def test_vendor_figures_are_dense_and_sourced() -> None:
    h200 = vendor_peak("NVIDIA H200")
    assert h200 is not None
    assert h200.flops("bfloat16") == pytest.approx(989.5e12)  # 1979 "with sparsity", halved
    assert h200.flops("float32") == pytest.approx(67e12)
    assert h200.bandwidth_bytes_per_s == pytest.approx(4.8e12)
    assert h200.describe("bfloat16") == "vendor NVIDIA H200 SXM bf16 dense"
    v100 = vendor_peak("Tesla V100-SXM2-32GB")
    assert v100 is not None and v100.flops("bfloat16") is None and v100.flops("tf32") is None
    for peak in VENDOR_PEAKS:
        assert set(peak.flops_per_s) <= set(PEAK_DTYPES)
        assert "datasheet" in peak.source or "whitepaper" in peak.source
        # Tensor-core rates above FP32; dense figures stay below 1 PFLOP/s for every part listed.
        for dtype in ("bfloat16", "float16"):
            if peak.flops(dtype) is not None:
                assert peak.flops("float32") < peak.flops(dtype) < 1e15  # type: ignore[operator]


# --- pct_of_peak, its source, and the >100 % flag ----------------------------------------------------------------


def test_pct_of_peak_uses_the_calibration_first() -> None:
    run = run_for({"device_type": "cpu"}, calibration())
    table = PeakTable.for_run(run)
    peak = table.for_case(row().case)
    assert peak is not None and peak.source == "calibrated matmul float32"
    assert achieved_flops_per_s(row(flops=10**11, median_s=1.0)) == pytest.approx(1e11)
    assert pct_of_peak(row(flops=10**11, median_s=1.0), peak) == pytest.approx(50.0)  # 1e11 of 2e11
    assert pct_of_peak(row(flops=10**11, median_s=0.5), peak) == pytest.approx(100.0)


def test_vendor_peak_when_not_calibrated_or_dtype_missing() -> None:
    gpu = {"device_type": "cuda", "gpu_name": "NVIDIA H200"}
    only_fp32 = calibration(  # measured on that GPU: another device's calibration is ignored
        device="cuda:0", device_name="NVIDIA H200", matmul=(MatmulCeiling("float32", 5e13, 8192, ((8192, 5e13),)),)
    )
    only_fp32 = replace(only_fp32, skipped={})
    for cal in (None, only_fp32):
        peak = PeakTable.for_run(run_for(gpu, cal)).for_case(row(dtype="bfloat16", device="cuda:0").case)
        assert peak is not None and peak.source == "vendor NVIDIA H200 SXM bf16 dense"
        assert peak.flops_per_s == pytest.approx(989.5e12)
    calibrated = PeakTable.for_run(run_for(gpu, only_fp32)).for_case(row(device="cuda:0").case)
    assert calibrated is not None and calibrated.source == "calibrated matmul float32"


def test_an_h200_at_600_w_is_held_against_the_nvl_peaks() -> None:
    """Both boards report "NVIDIA H200"; the default power limit (600 W NVL, 700 W SXM) tells them apart."""
    case = row(dtype="bfloat16", device="cuda:0").case
    sxm = {"device_type": "cuda", "gpu_name": "NVIDIA H200", "gpu_power_default_limit_w": 700.0}
    nvl = {**sxm, "gpu_power_default_limit_w": 600.0}
    unknown = {"device_type": "cuda", "gpu_name": "NVIDIA H200"}  # a run.json from before the power limit
    for environment, name, flops in ((sxm, "SXM", 989.5e12), (nvl, "NVL", 835.5e12), (unknown, "SXM", 989.5e12)):
        peak = PeakTable.for_run(run_for(environment)).for_case(case)
        assert peak is not None and peak.source == f"vendor NVIDIA H200 {name} bf16 dense"
        assert peak.flops_per_s == pytest.approx(flops)
    assert vendor_peak("NVIDIA H200", 600.0).name == "NVIDIA H200 NVL"  # type: ignore[union-attr]
    assert vendor_peak("NVIDIA H100 80GB HBM3", 600.0).name == "NVIDIA H100 SXM"  # type: ignore[union-attr]


def test_a_mig_slice_is_not_held_against_the_whole_gpu() -> None:
    mig = {"device_type": "cuda", "gpu_name": "NVIDIA H100 80GB HBM3", "gpu_mig": True}
    case = row(dtype="bfloat16", device="cuda:0").case
    assert PeakTable.for_run(run_for(mig)).for_case(case) is None
    vendor, why = vendor_for(mig)
    assert vendor is None and why == MIG_NOTE
    assert "MIG slice" in vendor_line("NVIDIA H100 80GB HBM3", None, "cuda", why)
    # Its own calibration still applies: it was measured on the slice.
    only_bf16 = calibration(
        device="cuda:0", device_name=mig["gpu_name"], matmul=(MatmulCeiling("bfloat16", 2e14, 8192, ((8192, 2e14),)),)
    )
    only_bf16 = replace(only_bf16, skipped={})
    calibrated = PeakTable.for_run(run_for(mig, only_bf16)).for_case(case)
    assert calibrated is not None and calibrated.source == "calibrated matmul bfloat16"
    whole = PeakTable.for_run(run_for({**mig, "gpu_mig": False})).for_case(case)
    assert whole is not None and whole.source == "vendor NVIDIA H100 SXM bf16 dense"


def test_no_peak_on_a_cpu_without_calibration() -> None:
    table = PeakTable.for_run(run_for({"device_type": "cpu", "gpu_name": None}))
    assert table.for_case(row().case) is None
    assert pct_of_peak(row(), None) is None
    assert PeakTable.for_run(None).for_case(row().case) is None


def test_a_quick_calibration_is_never_a_peak() -> None:
    table = PeakTable.for_run(run_for({}, calibration(quick=True)))
    assert table.for_case(row().case) is None


def test_float32_rnns_on_cuda_are_held_against_tf32() -> None:
    gpu = {"device_type": "cuda", "gpu_name": "NVIDIA A100-SXM4-80GB"}
    table = PeakTable.for_run(run_for(gpu))
    lstm = table.for_case(row("lstm", device="cuda:0").case)
    assert lstm is not None and lstm.flops_per_s == pytest.approx(156e12)
    assert lstm.source.startswith("vendor NVIDIA A100 80GB SXM tf32 dense")
    attention = table.for_case(row("vanilla", device="cuda:0").case)
    assert attention is not None and attention.flops_per_s == pytest.approx(19.5e12)  # matmul stays FP32
    # No TF32 on a V100: the FP32 peak stands.
    v100 = PeakTable.for_run(run_for({"device_type": "cuda", "gpu_name": "Tesla V100-SXM2-16GB"}))
    fallback = v100.for_case(row("lstm", device="cuda:0").case)
    assert fallback is not None and fallback.source == "vendor NVIDIA V100 SXM2 fp32 dense"


@pytest.mark.parametrize("model", ["mamba2", "mingru", "minlstm", "linear-attn"])
def test_float32_recurrences_off_cudnn_are_held_against_fp32(model: str) -> None:
    """Only cuDNN's LSTM and GRU run float32 on TF32 tensor cores by default; a recurrence made of matmuls at torch's
    default float32 precision ("highest") is held to FP32 (Mamba-2 read ~7x low against TF32 on an H200)."""
    table = PeakTable.for_run(run_for({"device_type": "cuda", "gpu_name": "NVIDIA H200"}))
    case = tiny_case(model, device="cuda:0", heads=4, d_model=32)
    peak = table.for_case(case)
    fp32 = table.for_dtype("float32")
    assert peak is not None and fp32 is not None and peak == fp32 and "tf32" not in peak.source
    lstm = table.for_case(tiny_case("lstm", device="cuda:0"))
    assert lstm is not None and lstm.flops_per_s > fp32.flops_per_s  # the LSTM stays on TF32


def test_peak_flags_name_each_impossible_row() -> None:
    run = run_for({"device_type": "cpu"}, calibration())  # float32 peak 2e11
    fine, at_peak = row(flops=10**11), row(flops=2 * 10**11)
    impossible = row("sdpa-flash", flops=3 * 10**11)
    failed = Result(row().case, "oom", reason="out of memory")
    flags = peak_flags(PeakTable.for_run(run), [fine, at_peak, impossible, failed])
    assert len(flags) == 1
    (line,) = flags
    # The row, its % of peak, what it achieved against which peak and FLOP formula, and the command to re-measure.
    assert line.startswith(impossible.case.key) and numbers(line.removeprefix(impossible.case.key))[0] == 150
    assert "300 GFLOP/s" in line and "calibrated matmul float32" in line and "attention-v1" in line
    assert "attnbench calibrate --refresh" in line
    no_peak = PeakTable.for_run(run_for({"device_type": "cpu"}))
    assert peak_flags(no_peak, [impossible]) == []  # no peak, nothing to flag


def test_peak_flags_against_a_vendor_peak() -> None:
    run = run_for({"device_type": "cuda", "gpu_name": "Tesla T4"})
    # 100 TFLOP/s > 65
    (line,) = peak_flags(PeakTable.for_run(run), [row(dtype="float16", device="cuda:0", flops=10**14)])
    assert "vendor NVIDIA T4 fp16 dense" in line and {100, 65} <= set(numbers(line))  # 100 TFLOP/s above 65


# --- the CSV columns ---------------------------------------------------------------------------------------------


def test_csv_columns_come_after_flops_formula() -> None:
    assert COLUMNS[COLUMNS.index("flops_formula") + 1 :][:2] == ("pct_of_peak", "peak_source")


def test_csv_values_from_the_run() -> None:
    results = [row(flops=10**11), row("lstm", flops=None)]  # type: ignore[arg-type]
    with_run = list(csv.DictReader(io.StringIO(render_csv(Reading(run_for({}, calibration()), results)))))
    assert float(with_run[0]["pct_of_peak"]) == pytest.approx(50.0)
    assert with_run[0]["peak_source"] == "calibrated matmul float32"
    assert with_run[1]["pct_of_peak"] == "" and with_run[1]["peak_source"] == ""  # no FLOP count
    without = list(csv.DictReader(io.StringIO(render_csv(Reading(run_for({}), results)))))
    assert without[0]["pct_of_peak"] == "" and without[0]["peak_source"] == ""
    assert summary_rows(results, PeakTable.for_run(run_for({}, calibration())))[0]["pct_of_peak"] == pytest.approx(50.0)


def test_rows_without_a_flop_count_have_no_pct_of_peak() -> None:
    # The stored fixture predates FLOP counts: its rows read back and simply leave both columns empty.
    rows = summary_rows(fixture_results(), PeakTable.for_run(run_for({}, calibration())))
    assert rows and all(r["pct_of_peak"] is None and r["peak_source"] is None for r in rows)


# --- Run.calibration ------------------------------------------------------------------------------------------


def test_run_round_trip_with_and_without_calibration() -> None:
    stored = run_for({})
    assert "calibration" not in stored.to_dict()
    assert Run.from_dict(json.loads(json.dumps(stored.to_dict()))).calibration is None  # absent reads as None
    with_cal = replace(stored, calibration=calibration())
    data = json.loads(json.dumps(with_cal.to_dict()))
    assert data["calibration"]["fingerprint"] == FP
    assert Run.from_dict(data) == Run.from_dict(json.loads(json.dumps(with_cal.to_dict())))
    assert Run.from_dict(data).calibration == Calibration.from_dict(calibration().to_dict())
    data["calibration"]["matmul"][0]["flops_per_s"] = "fast"
    with pytest.raises(FieldError) as caught:
        Run.from_dict(data)
    assert caught.value.key == "calibration.matmul[0].flops_per_s"


# --- ceilings table -----------------------------------------------------------------------------------------------


def test_ceiling_rows_on_a_cpu() -> None:
    rows = {r.what: r for r in ceiling_rows(calibration(), None)}
    # The best and the median FLOP/s, the size it was reached at, no vendor figure, and the peak pct_of_peak uses.
    assert "GFLOP/s" in rows["matmul float32"].measured and numbers(rows["matmul float32"].measured) == [200, 180]
    assert rows["matmul float32"].at == "n=2048"
    assert rows["matmul float32"].vendor.startswith("—") and rows["matmul float32"].ratio == "—"
    assert rows["matmul float32"].used == "calibrated matmul float32"
    assert "TFLOP/s" in rows["matmul bfloat16"].measured and "converged" in rows["matmul bfloat16"].measured
    assert calibration().skipped["tf32"] in rows["matmul tf32"].measured  # why it was skipped
    assert rows["copy (read + write)"].measured == "11 GB/s" and rows["copy (read + write)"].at == "2 × 2048 MiB"
    assert "none for CPUs" in vendor_line("Test CPU", None, "cpu")


def test_ceiling_rows_beside_a_vendor_peak() -> None:
    h200 = vendor_peak("NVIDIA H200")
    cal = calibration(
        device="cuda:0",
        device_name="NVIDIA H200",
        matmul=(MatmulCeiling("bfloat16", 7.8e14, 8192, ((4096, 7e14), (8192, 7.8e14))),),
        copy=CopyBandwidth(4.3e12, 2**30, 60 * 2**20),
        skipped={"float64": "not asked"},
    )
    rows = {r.what: r for r in ceiling_rows(cal, h200)}
    assert rows["matmul bfloat16"].vendor == "990 TFLOP/s" and rows["matmul bfloat16"].ratio == "79%"
    assert rows["copy (read + write)"].vendor == "4.8 TB/s" and rows["copy (read + write)"].ratio == "90%"
    # Not calibrated, so rows of that dtype fall back to the vendor figure; the table says which.
    assert rows["matmul float64"].used == "vendor NVIDIA H200 SXM fp64 dense"
    assert h200 is not None and mentions(vendor_line("NVIDIA H200", h200, "cuda"), h200.name, "'NVIDIA H200'")


# --- measuring, for real, at tiny sizes ---------------------------------------------------------------------


@pytest.mark.slow
def test_calibrate_measures_every_dtype_or_says_why_not() -> None:
    import torch

    from attnbench.host.inventory import collect_environment
    from attnbench.instrument.ceilings import calibrate, plan_for

    plan = replace(plan_for(torch.device("cpu"), quick=True), sizes=(32, 64), copy_bytes=2**22)
    env = collect_environment("cpu")
    cal = calibrate("cpu", ["float32", "tf32", "float64"], env, quick=True, plan=plan)
    assert cal.fingerprint == env.fingerprint() and cal.quick
    assert [m.dtype for m in cal.matmul] == ["float32", "float64"]
    for m in cal.matmul:
        assert [n for n, _ in m.by_size] == [32, 64]
        assert m.flops_per_s == max(rate for _, rate in m.by_size) > 0
        assert m.median_flops_per_s is not None and 0 < m.median_flops_per_s <= m.flops_per_s
    assert "TF32" in cal.skipped["tf32"]
    assert cal.copy is not None and cal.copy.buffer_bytes == 2**22
    assert cal.copy.median_bytes_per_s is not None and 0 < cal.copy.median_bytes_per_s <= cal.copy.bytes_per_s
    assert Calibration.from_dict(json.loads(json.dumps(cal.to_dict()))) == cal


def test_quick_on_a_gpu_times_the_ceiling_sizes_briefly_and_is_a_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU check's calibrate step: the sizes that reach the peak, at most 1 s each, so four dtypes and the copy
    fit in well under a minute, and the result is cached for the sweeps after it (before: reduced sizes that are
    no ceiling, or the full plan, which could outrun the step)."""
    import torch

    from attnbench.instrument.ceilings import QUICK_GPU_NOTE, plan_for

    props = type("Props", (), {"L2_cache_size": 60 * 2**20})()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (140 * 2**30, 141 * 2**30))
    quick, full = plan_for(torch.device("cuda:0"), quick=True), plan_for(torch.device("cuda:0"))
    assert quick.sizes == (4096, 8192) == full.sizes[-2:]
    assert not quick.quick and QUICK_GPU_NOTE in quick.notes  # a ceiling: cached, used by pct_of_peak
    assert quick.copy_bytes == full.copy_bytes == 2**30
    worst_s = 4 * len(quick.sizes) * (quick.policy.max_case_s + quick.policy.warmup_max_s) + quick.policy.max_case_s
    assert worst_s <= 15
    assert plan_for(torch.device("cpu"), quick=True).quick  # a CPU's quick run stays a smoke test


@pytest.mark.slow
def test_calibrate_cli_quick_on_cpu(private_cache: Path) -> None:
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--quick", "--dtype", "float32,bfloat16"])
    assert result.exit_code == 0, result.output
    out = result.output
    for text in ("ceiling", "measured", "vendor peak", "measured / vendor", "pct_of_peak uses"):
        assert text in out
    assert "matmul float32" in out and "matmul bfloat16" in out and "copy (read + write)" in out
    assert "--quick" in out  # why nothing was cached: said, and true
    assert not private_cache.exists() or not list(private_cache.iterdir())


def default_fingerprint() -> str:
    """The fingerprint ``attnbench calibrate --device cpu`` looks its cache up by: the environment at the thread
    count a sweep here runs with by default (``resolve_threads``)."""
    from attnbench.host.devices import resolve_threads, threads_handed_back
    from attnbench.host.inventory import collect_environment

    with threads_handed_back(resolve_threads(None, "cpu")):
        return collect_environment("cpu").fingerprint()


def own_calibration(**changes: object) -> Calibration:
    """``calibration()`` as ``attnbench calibrate --device cpu`` would have measured it here: this machine's
    fingerprint, CPU, torch and default thread count (another's is measured again, issue 50 §3.2)."""
    from attnbench.host.devices import resolve_threads, threads_handed_back
    from attnbench.host.inventory import collect_environment

    with threads_handed_back(resolve_threads(None, "cpu")):  # as calibrate looks it up (default_fingerprint)
        here = collect_environment("cpu")
    own = {"device_name": here.cpu_model, "torch": here.torch, "torch_threads": here.torch_threads}
    return calibration(here.fingerprint(), **{**own, **changes})


def test_calibrate_cli_shows_the_cached_calibration(private_cache: Path) -> None:
    save(own_calibration(skipped={"float16": "skipped in this test"}))
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--noise-processes", "0"])
    assert result.exit_code == 0, result.output
    assert "calibrating" not in result.output  # nothing measured
    # The cached figures, when they were measured, and the flag that measures again (the noise included).
    assert "2026-01-01" in result.output and "--refresh" in result.output and "200 GFLOP/s" in result.output
    shown = json.loads(
        runner.invoke(app, ["calibrate", "--device", "cpu", "--noise-processes", "0", "-f", "json"]).stdout
    )
    assert "noise" not in shown["calibration"] and shown["calibration"]["created_utc"].startswith("2026-01-01")
    assert "--refresh" in shown["origin"]


def test_calibrate_cli_rejects_an_unknown_dtype() -> None:
    result = runner.invoke(app, ["calibrate", "--device", "cpu", "--dtype", "int8"])
    assert result.exit_code == 2
    assert "unknown dtype 'int8'" in result.output and "float32" in result.output


# --- the sweep stores the cached calibration ---------------------------------------------------------------------

SWEEP = tiny_config(
    "tiny-cal",
    models=["vanilla"],
    grid={"batch": [1], "seq_len": [16]},
    d_model=32,
    heads=4,
    # A budget that a call slowed by a neighbouring test worker still fits min_samples into: a too-slow row has no
    # achieved rate, so no peak to be a share of (a fresh-clone CI run saw that at 0.2 s).
    timing={"target_ci": 0.2, "min_samples": 3, "min_time_s": 0.005, "max_case_s": 1.0, "warmup_max_s": 0.02},
    telemetry="off",
)


def _sweep_fingerprint() -> str:
    """The fingerprint the sweep below looks its calibration up by: its environment at the config's one thread."""
    from attnbench.host.devices import threads_handed_back
    from attnbench.host.inventory import collect_environment

    with threads_handed_back(1):
        return collect_environment("cpu").fingerprint()


def _sweep(tmp_path: Path) -> tuple[Path, str]:
    config = tmp_path / "tiny.yaml"
    config.write_text(SWEEP)
    result = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "out").iterdir()
    return folder, result.output


@pytest.mark.slow
def test_sweep_records_the_cached_calibration(tmp_path: Path) -> None:
    from attnbench.host.devices import threads_handed_back
    from attnbench.host.inventory import collect_environment

    with threads_handed_back(1):
        here = collect_environment("cpu")
    # Measured on this machine and stack, as calibrate would have: another's is not copied (issue 50 §3.2).
    save(calibration(_sweep_fingerprint(), device_name=here.cpu_model, torch=here.torch, torch_threads=1))
    folder, _ = _sweep(tmp_path)
    stored = load_run(folder)
    assert stored.run.calibration is not None and stored.run.calibration.device_name == here.cpu_model
    (csv_row,) = csv.DictReader(io.StringIO(render_csv(Reading(stored.run, stored.results))))
    assert csv_row["peak_source"] == "calibrated matmul float32" and float(csv_row["pct_of_peak"]) > 0


@pytest.mark.slow
def test_sweep_without_a_cache_records_none(tmp_path: Path) -> None:
    folder, _ = _sweep(tmp_path)
    assert "calibration" not in json.loads((folder / "run.json").read_text())
    assert load_run(folder).run.calibration is None


@pytest.mark.slow
def test_sweep_with_a_damaged_cache_warns_and_goes_on(tmp_path: Path) -> None:
    path = cache_path(_sweep_fingerprint())
    path.parent.mkdir(parents=True)
    path.write_text("{torn")
    folder, output = _sweep(tmp_path)
    assert f"warning: {path}: not valid JSON" in output and "vendor peaks" in output
    assert load_run(folder).run.calibration is None


# --- torch-free ------------------------------------------------------------------------------------------------


def test_peak_modules_import_without_torch(tmp_path: Path) -> None:
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError('torch is blocked for this test')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker.parent), str(ROOT)])}
    code = (
        "import attnbench.results.calibration, attnbench.core.peaks, attnbench.analysis.efficiency, "
        "attnbench.analysis.selfcheck, attnbench.report.rows, attnbench.cli.device"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert out.returncode == 0, out.stderr


def test_calibrating_one_more_dtype_keeps_the_ones_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The cache is one file per machine: `calibrate --dtype float16` after a float32 calibration must not
    # leave a file that holds float16 alone (sweeps would lose their float32 peak).
    import attnbench.instrument.ceilings

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    asked: list[tuple[str, ...]] = []

    def fake(device: str, wanted: tuple[str, ...], environment: Any, **_: Any) -> Calibration:
        asked.append(tuple(wanted))
        matmul = tuple(MatmulCeiling(d, 1e11, 256, ((256, 1e11),)) for d in wanted)
        return Calibration(
            environment.fingerprint(),
            device,
            environment.cpu_model,
            "2026-12-02T00:00:00Z",
            environment.torch,
            environment.torch_threads,
            matmul,
        )

    monkeypatch.setattr(attnbench.instrument.ceilings, "calibrate", fake)
    noise = NoiseFloor(0.08, 0.02, 3, ("k",), (0.05,), "2026-12-03T00:00:00Z")
    monkeypatch.setattr("attnbench.instrument.noise.measure_noise", lambda *a, **k: noise)
    first = runner.invoke(app, ["calibrate", "--device", "cpu", "--dtype", "float32", "--noise-processes", "3"])
    assert first.exit_code == 0 and "±8 %" in first.output, first.output  # the noise floor measured

    assert runner.invoke(app, ["calibrate", "--device", "cpu", "--dtype", "float16"]).exit_code == 0
    assert asked == [("float32",), ("float16", "float32")]
    # The noise measured with the first dtype is kept when the cache gains a dtype, and not measured again.
    cached = load_cached(next(iter(tmp_path.iterdir())).name.removeprefix("calibration-").removesuffix(".json"))
    assert cached is not None and cached.noise == noise


def test_the_commands_default_noise_processes_is_the_measurements() -> None:
    import inspect

    from attnbench.cli.device import calibrate
    from attnbench.instrument.noise import DEFAULT_PROCESSES

    assert inspect.signature(calibrate).parameters["noise_processes"].default == DEFAULT_PROCESSES == 8


def test_a_cached_calibration_measured_elsewhere_is_not_copied_into_a_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Issue 50 §3.2: a calibration measured on an H100 but filed under this CPU's key was copied into a CPU run
    without a word. It is ignored, saying so; this machine's own is copied as before, and calibrate measures anew."""
    from attnbench.host.inventory import collect_environment
    from attnbench.results.calibration import foreign, save
    from attnbench.sweeps.runner import _cached_calibration

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    environment = collect_environment("cpu")
    ceiling = (MatmulCeiling("float32", 1e15, 4096, ((4096, 1e15),)),)
    own = Calibration(
        environment.fingerprint(),
        "cpu",
        environment.cpu_model,
        "2026-12-02T00:00:00Z",
        environment.torch,
        environment.torch_threads,
        ceiling,
    )
    save(own)
    assert _cached_calibration(environment) == (own, "")
    for elsewhere in (
        replace(own, device="cuda:0", device_name="NVIDIA H100 80GB HBM3"),
        replace(own, torch="1.0.0"),
        replace(own, torch_threads=(environment.torch_threads or 1) + 7),
    ):
        save(elsewhere)  # under this machine's key: the file's fingerprint is this machine's
        calibration, problem = _cached_calibration(environment)
        assert calibration is None and problem and foreign(elsewhere, environment.to_dict()) is not None
