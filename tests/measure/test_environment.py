"""What a run records about its machine: the GPU's settings through a fake pynvml, numerics switches, and old
run.json files reading back."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from attnbench.host.inventory import collect_environment, nvml_environment
from attnbench.host.sensors.faults import TelemetryUnavailable
from attnbench.host.sensors.identity import GpuIdentity
from attnbench.host.sensors.settings import read_settings
from attnbench.results.environment import Environment
from tests.fake_pynvml import FakeGpu, FakeNvml
from tests.support import FIXTURE, ROOT, mentions


def _opened(gpu: FakeGpu) -> tuple[FakeNvml, Any]:
    fake = FakeNvml([gpu])
    fake.nvmlInit()
    return fake, fake.nvmlDeviceGetHandleByUUID(gpu.uuid)


def test_settings_of_an_h200_nvl_at_its_600_w_limit() -> None:
    fake, handle = _opened(
        FakeGpu(
            name="NVIDIA H200 NVL",
            power_limit_mw=600_000,
            power_default_limit_mw=600_000,
            power_limit_range_mw=(200_000, 600_000),
            ecc_mode=(1, 0),
            persistence_mode=0,
        )
    )
    settings = read_settings(fake, handle)
    assert settings.values == {
        "gpu_power_limit_w": 600.0,
        "gpu_power_default_limit_w": 600.0,
        "gpu_power_max_limit_w": 600.0,
        "gpu_max_sm_clock_mhz": 1980,
        "gpu_app_sm_clock_mhz": 1980,
        "gpu_app_mem_clock_mhz": 2619,
        "gpu_persistence_mode": False,
        "gpu_ecc": True,
        "gpu_ecc_pending": False,
        "gpu_mig": False,
        "gpu_mig_pending": False,
    }
    assert settings.unavailable == {} and settings.note == ""


def test_a_mig_slice_says_so() -> None:
    fake, handle = _opened(FakeGpu(mig_mode=(1, 1)))
    assert read_settings(fake, handle).values["gpu_mig"] is True


def test_settings_a_gpu_cannot_report_are_reasons_and_no_mig_support_means_whole() -> None:
    unsupported = {"nvmlDeviceGetEccMode", "nvmlDeviceGetMigMode", "nvmlDeviceGetEnforcedPowerLimit"}
    fake, handle = _opened(FakeGpu(name="NVIDIA GeForce RTX 4090", not_supported=unsupported))
    settings = read_settings(fake, handle)
    assert settings.values["gpu_mig"] is False and "gpu_mig" not in settings.unavailable
    assert settings.unavailable == {
        "gpu_power_limit_w": "NVMLError_NotSupported",
        "gpu_ecc": "NVMLError_NotSupported",
        "gpu_ecc_pending": "NVMLError_NotSupported",
    }
    assert mentions(settings.note, *settings.unavailable, "NVMLError_NotSupported")  # each setting, and why


def test_nvml_environment_reads_driver_and_settings_of_the_torch_device() -> None:
    fake = FakeNvml([FakeGpu(power_limit_mw=650_000)])
    ident = GpuIdentity("cuda:0", fake.gpus[0].uuid, None)
    found = nvml_environment("cuda:0", lambda: fake, lambda d: ident)
    assert found["nvml"] == "available" and found["driver"] == "550.54.15"
    assert found["gpu_power_limit_w"] == 650.0 and found["gpu_mig"] is False
    assert found["gpu_settings_note"] == ""
    assert fake.init_count == 0  # shut down again


def test_nvml_environment_without_nvml_or_device_is_a_reason() -> None:
    assert nvml_environment("cuda:0", lambda: FakeNvml(init_error=9))["nvml"].startswith("unavailable:")

    def unknown(device: str) -> GpuIdentity:
        raise TelemetryUnavailable("cannot query cuda:0 through torch: no device")

    found = nvml_environment("cuda:0", FakeNvml, unknown)
    assert found["nvml"] == "available" and "cannot query cuda:0" in found["gpu_settings_note"]
    assert "gpu_power_limit_w" not in found


def test_environment_records_new_fields_and_old_run_json_reads_back() -> None:
    env = collect_environment("cpu")
    assert env.settings["sdpa_math_reduced_precision"] is True  # torch 2.13 has the switch; every executor turns it on
    data = json.loads(json.dumps(env.to_dict()))
    assert Environment.from_dict(data) == env
    # A run.json written before these fields: the same fingerprint, every new field unknown.
    stored = json.loads((FIXTURE / "run.json").read_text())["environment"]
    old = Environment.from_dict(stored)
    assert old.fingerprint() == stored["fingerprint"]
    assert old.gpu_mig is None and old.cudnn_compile is None and old.gpu_settings_note == ""


def test_a_familys_process_settings_read_back_and_are_stored_as_run_json_always_had_them() -> None:
    """Environment knows no family's setting by name: a committed run's ``sdpa_math_reduced_precision`` reads into
    ``settings`` and is written back flat, where every run.json has it, with the same fingerprint."""
    for path in sorted((ROOT / "results").rglob("run.json")):
        stored = json.loads(path.read_text())["environment"]
        env = Environment.from_dict(stored)
        assert env.settings.get("sdpa_math_reduced_precision") == stored.get("sdpa_math_reduced_precision")
        again = env.to_dict()
        assert {k: v for k, v in stored.items() if k != "flash_attn"}.items() <= again.items()
        assert again["fingerprint"] == stored["fingerprint"]


@pytest.fixture
def math_upcasts() -> Any:
    """torch's default (math upcasts fp16/bf16 to float32) for the test, whatever earlier tests set."""
    before = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed()
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(False)
    yield
    torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(before)


@pytest.mark.slow
def test_sdpa_math_in_bf16_computes_in_bf16_and_the_row_says_so(math_upcasts: None) -> None:
    from torch.utils._python_dispatch import TorchDispatchMode

    from attnbench.core.cases import TimingPolicy
    from attnbench.families.attention.layers import pinned_backend
    from attnbench.families.registry import build_model, make_input
    from attnbench.timing.executor import ExecutorSettings
    from attnbench.timing.torch_executor import TorchExecutor
    from tests.support import QUICK_TIMING, tiny_case

    class MatmulDtypes(TorchDispatchMode):
        seen: set[torch.dtype]

        def __init__(self) -> None:
            super().__init__()
            self.seen = set()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func is torch.ops.aten.bmm.default:
                self.seen.update(a.dtype for a in args if isinstance(a, torch.Tensor))
            return func(*args, **(kwargs or {}))

    case = tiny_case("sdpa-math", dtype="bfloat16")
    # A roomy budget: beside a neighbouring test worker a 0.3 s one left the bf16 case too_slow_for_budget.
    policy = TimingPolicy(**{**QUICK_TIMING, "max_case_s": 2.0})  # type: ignore[arg-type]
    executor = TorchExecutor(ExecutorSettings("cpu", policy, threads=1, telemetry="off"))
    model, x = build_model(case, "cpu", torch.bfloat16), make_input(case, "cpu", torch.bfloat16)
    spy = MatmulDtypes()
    with torch.no_grad(), pinned_backend(model), spy:  # (under inference_mode the spy sees sdpa whole)
        model(x)
    assert spy.seen == {torch.bfloat16}  # torch's default would have run both bmm in float32
    result = executor.run(case)
    assert result.ok and result.extra["math_sdp_reduced_precision"] is True
    assert "math_sdp_reduced_precision" not in executor.run(tiny_case("sdpa-math")).extra  # float32: moot


def test_the_docs_state_the_precision_decision() -> None:
    text = (ROOT / "docs" / "explanation" / "methodology.md").read_text()
    assert "allow_fp16_bf16_reduction_math_sdp" in text


def test_the_thread_pool_variables_are_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 30: how torch's CPU threads wait decides whether a two-thread LSTM is fast or 2.5-3x slower, so a run
    says what the user set; other variables stay out."""
    from attnbench.host.inventory import collect_environment, thread_env

    assert thread_env({"OMP_WAIT_POLICY": "ACTIVE", "KMP_BLOCKTIME": "1", "HOME": "/root", "MKL_NUM_THREADS": "2"}) == (
        "KMP_BLOCKTIME=1 MKL_NUM_THREADS=2 OMP_WAIT_POLICY=ACTIVE"
    )
    assert thread_env({"PATH": "/bin"}) == ""
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    env = collect_environment("cpu")
    assert "OMP_WAIT_POLICY=ACTIVE" in env.thread_env.split()
    assert "thread_env" not in env.fingerprint_fields()  # set on purpose: runs with and without still compare


def test_the_kernel_packages_every_family_names_are_recorded_with_their_versions(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """mamba-ssm's and fla's versions change Mamba-2's and linear attention's numbers as flash-attn's change
    flash-attn's: each family names its packages, and run.json records every one installed (once only flash-attn)."""
    from attnbench.families.catalogue import packages

    named = {p.distribution for p in packages()}
    assert {"flash-attn", "flash-linear-attention", "mamba-ssm"} <= named
    for distribution, version in (("mamba-ssm", "2.2.4"), ("flash-linear-attention", "0.3.1")):
        info = tmp_path / f"{distribution.replace('-', '_')}-{version}.dist-info"  # as pip names it
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    env = collect_environment("cpu")
    assert env.packages == {"flash-linear-attention": "0.3.1", "mamba-ssm": "2.2.4"}
    assert env.to_dict()["packages"] == env.packages and env.fingerprint_fields()["packages"] == env.packages
    bare = Environment.from_dict({**env.to_dict(), "packages": {}})
    assert bare.fingerprint() != env.fingerprint()  # another kernel version: another machine, as another torch
    # An earlier run.json: flash_attn as its own field, no packages key; its fingerprint is the one it was stored with.
    old = {k: v for k, v in env.to_dict().items() if k not in ("packages", "fingerprint")}
    assert Environment.from_dict({**old, "flash_attn": "2.6.3"}).packages == {"flash-attn": "2.6.3"}
    assert Environment.from_dict({**old, "flash_attn": None}).fingerprint() == bare.fingerprint()
