"""What a GPU was set to while a run measured it: power limits, clocks, persistence, ECC and MIG mode (NVML).

These decide whether a row can be trusted or reproduced — an H200 NVL (600 W) and an H200 SXM (700 W) carry the
same name, application clocks cap what a kernel may reach, and a MIG slice holds a fraction of the GPU's SMs and
memory bandwidth, so it must not be held against the full GPU's peaks. They are read once per run, outside every
timed window, into ``Environment`` (run.json). Each reading that fails is left out with its reason; none raises.

Units as NVML gives them become the units in the field names: power mW → W, clocks MHz. Locked clocks
(``nvidia-smi -lgc``) have no NVML getter; the ``ApplicationsClocksSetting`` clock-event reason and an SM clock
below its maximum under load (each row's telemetry) are the only signs of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from attnbench.host.sensors.nvml import describe

Setting = float | int | bool | None


@dataclass(frozen=True)
class GpuSettings:
    """The settings that could be read (``values``, Environment field names) and why the others could not."""

    values: dict[str, Setting] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)

    @property
    def note(self) -> str:
        """ "name: reason; …" for the settings left out, grouped by reason."""
        by_reason: dict[str, list[str]] = {}
        for name, reason in self.unavailable.items():
            by_reason.setdefault(reason, []).append(name)
        return "; ".join(f"{', '.join(names)}: {reason}" for reason, names in by_reason.items())


def _mode(pair: Any, index: int) -> bool:
    # nvmlDeviceGetEccMode / GetMigMode return [current, pending]; 1 = enabled (NVML_FEATURE_ENABLED, MIG_ENABLE).
    return bool(int(pair[index]))


def read_settings(nvml: Any, handle: Any) -> GpuSettings:
    """Every setting of ``GpuSettings`` from NVML for ``handle`` (the parent GPU, also under MIG)."""
    h = nvml
    app_clock = getattr(nvml, "NVML_CLOCK_ID_APP_CLOCK_TARGET", 1)
    readings: dict[str, Callable[[], Setting]] = {
        # The limit the driver enforces after every limiter (in-band, out-of-band, board), and the board's own.
        "gpu_power_limit_w": lambda: h.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
        "gpu_power_default_limit_w": lambda: h.nvmlDeviceGetPowerManagementDefaultLimit(handle) / 1000.0,
        "gpu_power_max_limit_w": lambda: h.nvmlDeviceGetPowerManagementLimitConstraints(handle)[1] / 1000.0,
        "gpu_max_sm_clock_mhz": lambda: int(h.nvmlDeviceGetMaxClockInfo(handle, h.NVML_CLOCK_SM)),
        # The clocks applications run at unless over spec (nvmlDeviceGetApplicationsClock is deprecated in CUDA 13).
        "gpu_app_sm_clock_mhz": lambda: int(h.nvmlDeviceGetClock(handle, h.NVML_CLOCK_SM, app_clock)),
        "gpu_app_mem_clock_mhz": lambda: int(h.nvmlDeviceGetClock(handle, h.NVML_CLOCK_MEM, app_clock)),
        "gpu_persistence_mode": lambda: bool(int(h.nvmlDeviceGetPersistenceMode(handle))),
        "gpu_ecc": lambda: _mode(h.nvmlDeviceGetEccMode(handle), 0),
        "gpu_ecc_pending": lambda: _mode(h.nvmlDeviceGetEccMode(handle), 1),
        "gpu_mig": lambda: _mode(h.nvmlDeviceGetMigMode(handle), 0),
        "gpu_mig_pending": lambda: _mode(h.nvmlDeviceGetMigMode(handle), 1),
    }
    settings = GpuSettings()
    for name, read in readings.items():
        try:
            settings.values[name] = read()
        except nvml.NVMLError as exc:  # NotSupported (no ECC on a GeForce, no MIG before Ampere), NoPermission
            settings.unavailable[name] = describe(exc)
        except (AttributeError, TypeError, IndexError, ValueError) as exc:  # bindings too old, or a shape we misread
            settings.unavailable[name] = f"{type(exc).__name__}: {exc}"
    if "gpu_mig" in settings.unavailable and settings.unavailable["gpu_mig"] == "NVMLError_NotSupported":
        # A GPU without MIG support runs whole: that is an answer, not a gap.
        settings.values["gpu_mig"] = settings.values["gpu_mig_pending"] = False
        del settings.unavailable["gpu_mig"]
        settings.unavailable.pop("gpu_mig_pending", None)
    return settings
