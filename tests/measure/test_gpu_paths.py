"""On a real GPU (skipped elsewhere; scripts/gpu_check.sh runs them): what the CPU tests check through fakes —
NVML's buffers and settings, the RNN path, the math-SDPA precision, executed FLOPs — read from the hardware."""

from __future__ import annotations

import time

import pytest
import torch

from attnbench.core.cases import TimingPolicy
from attnbench.timing.executor import ExecutorSettings
from tests.support import tiny_case

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
QUICK = TimingPolicy(min_samples=5, min_time_s=0.2, max_case_s=1.0, warmup_max_s=0.2)


def test_the_environment_reads_the_gpus_settings() -> None:
    from attnbench.host.inventory import collect_environment

    env = collect_environment("cuda:0")
    assert env.nvml == "available", env.nvml
    assert env.gpu_power_limit_w is not None and 50 < env.gpu_power_limit_w < 2000, env.gpu_settings_note
    assert env.gpu_max_sm_clock_mhz is not None and env.gpu_mig is not None
    assert env.cudnn_compile is not None and env.gpu_l2_bytes


def test_telemetry_reads_nvml_buffers_on_a_busy_gpu() -> None:
    from attnbench.host.sensors import open_telemetry

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    tel = open_telemetry("cuda:0", "full", 0.1)
    with tel:
        end = time.perf_counter() + 0.6
        while time.perf_counter() < end:
            a @ a
        tel.mark_sampling()
        end = time.perf_counter() + 1.2
        while time.perf_counter() < end:
            a @ a
        torch.cuda.synchronize()
    s = tel.summary(calls=1, tokens_per_call=1)
    # NVML's buffered samples were read, stamped on a clock attnbench knows (an unknown one leaves t_s empty).
    buffered = [r for r in s.raw if "nvml_sample_gpu_util_pct" in r]
    assert buffered and all(r["t_s"] is not None for r in buffered), s.note

    assert s.metrics.get("gpu_util_pct", 0) > 50, s.to_dict()  # type: ignore[operator]
    assert s.metrics.get("power_w") and s.metrics.get("energy_j"), s.to_dict()
    assert 1.0 <= s.metrics.get("gpm_window_s", 0) < s.window_s and s.metrics.get("gpm_reliable") is True  # type: ignore[operator]


def test_rows_on_cuda_say_which_paths_ran() -> None:
    from attnbench.timing.torch_executor import TorchExecutor

    executor = TorchExecutor(ExecutorSettings("cuda", QUICK, telemetry="off"))
    lstm = executor.run(tiny_case("lstm", dtype="float16", device="cuda", d_model=64))
    assert lstm.ok and lstm.extra["rnn_path"] == "cudnn", (lstm.reason, lstm.extra)
    bf16 = executor.run(tiny_case("lstm", dtype="bfloat16", device="cuda", d_model=64))
    assert bf16.ok and bf16.extra["rnn_path"] in ("cudnn", "fused-cell-loop"), bf16.extra
    math = executor.run(tiny_case("sdpa-math", dtype="bfloat16", device="cuda", causal=True, d_model=64, heads=2))
    assert math.ok and math.extra["math_sdp_reduced_precision"] is True
    assert math.extra["executed_flops"] > math.extra["flops"]  # type: ignore[operator]
    assert isinstance(math.extra.get("kernels_per_call"), int), math.extra
