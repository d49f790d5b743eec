"""GPU telemetry through NVML (the nvidia-ml-py distribution, module ``pynvml``).

The only module that touches pynvml, and only through a module object handed in (``load_nvml`` imports it lazily),
so tests pass a fake. Nothing here raises for an NVML problem: an error becomes the reason a metric is missing.
Units as NVML gives them: power mW, energy mJ, clocks MHz, memory bytes, sample timestamps µs.
"""

from __future__ import annotations

import contextlib
import math
import time
from typing import Any

from attnbench.measure.telemetry.assemble import GpuWindow
from attnbench.measure.telemetry.errors import TelemetryUnavailable
from attnbench.measure.telemetry.identity import GpuIdentity
from attnbench.measure.telemetry.sampler import Channel, Failure, Sampler
from attnbench.results.telemetry import GPM_METRICS

GROUP = "nvml"
_UTIL_SAMPLES = "_nvml_util_samples"  # a channel that collects nvmlDeviceGetSamples output, records nothing itself
# Errors after which no NVML call on the device can succeed: the driver or the GPU went away.
FATAL_ERRORS = frozenset(
    {
        "NVMLError_Uninitialized",
        "NVMLError_DriverNotLoaded",
        "NVMLError_GpuIsLost",
        "NVMLError_ResetRequired",
        "NVMLError_LibRmVersionMismatch",
        "NVMLError_LibraryNotFound",
    }
)
GPM_IDS: tuple[tuple[str, str], ...] = (
    ("gpm_sm_util_pct", "NVML_GPM_METRIC_SM_UTIL"),
    ("gpm_sm_occupancy_pct", "NVML_GPM_METRIC_SM_OCCUPANCY"),
    ("gpm_tensor_util_pct", "NVML_GPM_METRIC_ANY_TENSOR_UTIL"),
    ("gpm_dram_bw_util_pct", "NVML_GPM_METRIC_DRAM_BW_UTIL"),
)
GPM_NEEDS = "GPM needs Hopper or newer (compute capability 9.0+)"
# nvmlValueType_t -> the c_nvmlValue_t union member holding a sample's value.
_VALUE_FIELDS = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}


def load_nvml() -> Any:
    """The pynvml module; ``TelemetryUnavailable`` when the package is missing."""
    try:
        import pynvml
    except ImportError as exc:
        raise TelemetryUnavailable(f"pynvml (the nvidia-ml-py package) is not importable: {exc}") from None
    return pynvml


def describe(exc: BaseException) -> str:
    """An NVML error's class name, the form reasons use ("NVMLError_NotSupported")."""
    return type(exc).__name__


def nvml_handle_for(uuid: str | None, pci_bus_id: str | None, nvml: Any) -> Any:
    """The NVML handle of the GPU with this UUID, else this PCI bus id. Never by index (see ``identity``)."""
    tried: list[str] = []
    for how, key, lookup in (
        ("UUID", uuid, "nvmlDeviceGetHandleByUUID"),
        ("PCI bus id", pci_bus_id, "nvmlDeviceGetHandleByPciBusId"),
    ):
        if not key:
            continue
        try:
            return getattr(nvml, lookup)(key)
        except nvml.NVMLError as exc:
            tried.append(f"{how} {key}: {describe(exc)}")
    if not tried:
        raise TelemetryUnavailable("torch reported neither a UUID nor a PCI bus id for the device")
    raise TelemetryUnavailable("no NVML device matches (" + "; ".join(tried) + ")")


def gpm_support(nvml: Any, handle: Any) -> str:
    """The reason GPM metrics cannot be read on this device, or "" when they can."""
    try:
        supported = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except nvml.NVMLError as exc:
        return f"GPM support query failed: {describe(exc)}"
    except AttributeError:
        return "these NVML bindings have no GPM functions (nvidia-ml-py ≥ 12 needed)"
    if supported:
        return ""
    try:
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(handle)
        return f"{GPM_NEEDS}; this GPU is {major}.{minor}"
    except nvml.NVMLError:
        return GPM_NEEDS


class NvmlDevice:
    """One GPU for the duration of one window: polled readings, counters at both ends, GPM at level "full"."""

    def __init__(self, nvml: Any, handle: Any, *, gpm: bool) -> None:
        self.nvml, self.handle = nvml, handle
        self.fatal = ""
        self.max_sm_clock_mhz: float | None = None
        self.max_sm_clock_failure = ""
        try:
            self.max_sm_clock_mhz = float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        except nvml.NVMLError as exc:
            self.max_sm_clock_failure = describe(exc)
        self.gpm_failure = gpm_support(nvml, handle) if gpm else "telemetry level basic (GPM needs level full)"
        self._gpm_samples: list[Any] = []
        self._gpm: dict[str, float] = {}
        self._gpm_unavailable: dict[str, str] = {}
        self._util: dict[int, float] = {}  # NVML timestamp µs -> %, every sample drained (for the period too)
        self._util_failure = ""
        self._after_us = 0
        self._wall_start_us = 0
        self._energy: list[int] = []
        self._energy_failure = ""
        self._old_reasons_api = False

    @classmethod
    def open(cls, nvml: Any, identity: GpuIdentity, *, gpm: bool) -> NvmlDevice:
        """nvmlInit and find the device; ``TelemetryUnavailable`` with the reason otherwise (NVML shut down)."""
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise TelemetryUnavailable(f"nvmlInit failed: {describe(exc)} ({exc})") from None
        try:
            return cls(nvml, nvml_handle_for(identity.uuid, identity.pci_bus_id, nvml), gpm=gpm)
        except (TelemetryUnavailable, nvml.NVMLError) as exc:
            cls._shutdown(nvml)
            raise TelemetryUnavailable(str(exc) if isinstance(exc, TelemetryUnavailable) else describe(exc)) from None

    def classify(self, exc: Exception) -> Failure | None:
        if not isinstance(exc, self.nvml.NVMLError):
            return None
        name = describe(exc)
        if name in FATAL_ERRORS:
            return Failure(f"{name} ({_safe_str(exc)})", fatal=True)
        return Failure(name)

    def channels(self) -> list[Channel]:
        nvml, h = self.nvml, self.handle
        readings: dict[str, Any] = {
            "gpu_util_pct": lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_util_pct": lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).memory),
            "gpu_mem_used_bytes": lambda: int(nvml.nvmlDeviceGetMemoryInfo(h).used),
            # On Ampere (but GA100) and newer this is a 1 s average, on older boards instantaneous (nvml.h).
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
            "temp_c": lambda: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU)),
            "throttle_mask": self._throttle_mask,
        }
        readings[_UTIL_SAMPLES] = self._drain_util
        return [Channel(name, read, self.classify, GROUP) for name, read in readings.items()]

    def _throttle_mask(self) -> int:
        # "Clocks event reasons" is the current name (driver 535+); older drivers only know the "throttle" one.
        if not self._old_reasons_api:
            try:
                return int(self.nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle))
            except (AttributeError, self.nvml.NVMLError_FunctionNotFound):
                self._old_reasons_api = True
        return int(self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle))

    def _drain_util(self) -> None:
        """Collect the utilisation samples NVML took since the last call (its buffer is finite, so keep up)."""
        last = max(self._util, default=self._after_us)
        try:
            kind, samples = self.nvml.nvmlDeviceGetSamples(self.handle, self.nvml.NVML_GPU_UTILIZATION_SAMPLES, last)
        except self.nvml.NVMLError_NotFound:  # no sample newer than `last` yet
            return None
        field = _VALUE_FIELDS.get(int(kind), "uiVal")
        for sample in samples:
            value = float(getattr(sample.sampleValue, field))
            if math.isfinite(value):
                self._util[int(sample.timeStamp)] = value
        return None

    def start(self) -> None:
        """Counters at window start: the utilisation-sample cursor, the energy counter, the first GPM sample."""
        self._wall_start_us = time.time_ns() // 1000
        try:
            self._drain_util()
            # Samples NVML took before the window mark where the window starts on NVML's clock; with none yet,
            # assume its timestamps are host wall-clock µs (they are CPU timestamps per nvml.h).
            self._after_us = max(self._util, default=self._wall_start_us)
        except self.nvml.NVMLError as exc:
            self._util_failure = f"nvmlDeviceGetSamples: {describe(exc)}"
            self._note_fatal(exc)
        self._read_energy()
        if not self.gpm_failure:
            self._gpm_sample()

    def stop(self, sampler: Sampler) -> None:
        """Counters at window end (skipped once the driver has gone)."""
        self.fatal = self.fatal or sampler.fatal.get(GROUP, "")
        if self.fatal:
            return
        if not self._util_failure and _UTIL_SAMPLES not in sampler.failures:
            try:
                self._drain_util()
            except self.nvml.NVMLError as exc:
                self._note_fatal(exc)
        self._read_energy()
        if not self.gpm_failure and self._gpm_sample():
            self._gpm_metrics()

    def window(self, sampler: Sampler) -> GpuWindow:
        util_failure = self._util_failure or sampler.failures.get(_UTIL_SAMPLES, "")
        if util_failure and not util_failure.startswith("nvmlDeviceGetSamples"):
            util_failure = f"nvmlDeviceGetSamples: {util_failure}"
        failures = {k: v for k, v in sampler.failures.items() if k != _UTIL_SAMPLES}
        gpm_unavailable = dict.fromkeys(GPM_METRICS, self.gpm_failure) if self.gpm_failure else self._gpm_unavailable
        return GpuWindow(
            window_s=sampler.window_s,
            samples=sampler.samples,
            failures=failures,
            fatal=self.fatal,
            util_samples=tuple(sorted(self._util.items())),
            util_bounds_us=(self._after_us, max(self._util, default=self._after_us)),
            util_samples_failure=util_failure,
            energy_mj=(self._energy[0], self._energy[1]) if len(self._energy) == 2 else None,
            energy_failure=self._energy_failure,
            max_sm_clock_mhz=self.max_sm_clock_mhz,
            max_sm_clock_failure=self.max_sm_clock_failure,
            gpm=dict(self._gpm),
            gpm_unavailable=gpm_unavailable,
        )

    def util_rows(self) -> list[dict[str, float | int | None]]:
        """NVML's own utilisation samples inside the window, for the raw sidecar; t_s assumes host wall-clock µs."""
        return [
            {"t_s": (ts - self._wall_start_us) / 1e6, "nvml_sample_ts_us": ts, "nvml_sample_gpu_util_pct": v}
            for ts, v in sorted(self._util.items())
            if ts > self._after_us
        ]

    def close(self) -> None:
        for sample in self._gpm_samples:
            with contextlib.suppress(self.nvml.NVMLError):  # the driver may be gone; nothing left to free
                self.nvml.nvmlGpmSampleFree(sample)
        self._gpm_samples.clear()
        self._shutdown(self.nvml)

    @staticmethod
    def _shutdown(nvml: Any) -> None:
        # Reference-counted by NVML: pairs with this session's nvmlInit only. Nothing to release if the driver went.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()

    def _note_fatal(self, exc: Exception) -> None:
        failure = self.classify(exc)
        if failure is not None and failure.fatal:
            self.fatal = self.fatal or failure.reason

    def _read_energy(self) -> None:
        if self._energy_failure or self.fatal:
            return
        try:
            self._energy.append(int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)))
        except self.nvml.NVMLError as exc:  # NotSupported before Volta
            self._energy_failure = describe(exc)
            self._energy.clear()
            self._note_fatal(exc)

    def _gpm_sample(self) -> bool:
        try:
            sample = self.nvml.nvmlGpmSampleAlloc()
            self._gpm_samples.append(sample)
            self.nvml.nvmlGpmSampleGet(self.handle, sample)
            return True
        except self.nvml.NVMLError as exc:
            self.gpm_failure = f"GPM sample failed: {describe(exc)}"
            self._note_fatal(exc)
            return False

    def _gpm_metrics(self) -> None:
        """The four GPM metrics between the window's two samples (nvmlGpmMetricsGet, one request)."""
        nvml = self.nvml
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(GPM_IDS)
        request.sample1, request.sample2 = self._gpm_samples[0], self._gpm_samples[1]
        for i, (_, constant) in enumerate(GPM_IDS):
            request.metrics[i].metricId = getattr(nvml, constant)
        try:
            nvml.nvmlGpmMetricsGet(request)
        except nvml.NVMLError as exc:
            self.gpm_failure = f"nvmlGpmMetricsGet: {describe(exc)}"
            self._note_fatal(exc)
            return
        for i, (name, _) in enumerate(GPM_IDS):
            metric = request.metrics[i]
            if metric.nvmlReturn != nvml.NVML_SUCCESS:  # e.g. counters held by a profiler
                self._gpm_unavailable[name] = describe(nvml.NVMLError(metric.nvmlReturn))
            elif not math.isfinite(metric.value):
                self._gpm_unavailable[name] = f"non-finite value {metric.value}"
            else:
                self._gpm[name] = float(metric.value)


def _safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except Exception:  # pynvml's __str__ may call back into a library that is gone
        return "no message"


def nvml_status(nvml_loader: Any, identity: GpuIdentity | None) -> dict[str, str]:
    """{"nvml": ..., "gpm": ...} for ``telemetry_status``; ``identity`` None = a CPU run."""
    try:
        nvml = nvml_loader()
    except TelemetryUnavailable as exc:
        return {"nvml": f"unavailable: {exc}", "gpm": "unsupported: NVML unavailable"}
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        return {"nvml": f"unavailable: nvmlInit failed: {describe(exc)}", "gpm": "unsupported: NVML unavailable"}
    try:
        if identity is None:
            return {"nvml": f"available ({nvml.nvmlDeviceGetCount()} device(s))", "gpm": "unsupported: CPU run"}
        try:
            handle = nvml_handle_for(identity.uuid, identity.pci_bus_id, nvml)
        except TelemetryUnavailable as exc:
            return {"nvml": f"unavailable: {exc}", "gpm": "unsupported: no NVML device"}
        why = gpm_support(nvml, handle)
        return {"nvml": "available", "gpm": f"unsupported: {why}" if why else "available"}
    except nvml.NVMLError as exc:
        return {"nvml": f"unavailable: {describe(exc)}", "gpm": "unsupported: NVML unavailable"}
    finally:
        NvmlDevice._shutdown(nvml)
