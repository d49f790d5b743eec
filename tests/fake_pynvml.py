"""A fake ``pynvml`` (nvidia-ml-py) for a scriptable machine: a true seam, faithful to the real bindings.

Same function and constant names, the same NVMLError hierarchy (``NVMLError(3)`` is an ``NVMLError_NotSupported``
with ``.value == 3``), the same units: power mW, energy mJ, clocks MHz, memory bytes, sample timestamps µs of host
wall-clock time. ``test_fake_matches_real_pynvml`` holds every name and value here to the installed bindings.

A ``FakeGpu`` is scripted with functions of ``t`` (seconds since the fake was created) for utilisation, power, SM
clock, temperature and throttle reasons; its energy counter integrates the power trace, and NVML's own buffered
samples (``nvmlDeviceGetSamples``) are taken every ``util_period_s`` (utilisation) or ``sample_period_s`` (power,
clocks), with ``history_s`` of samples from before the fake existed, stamped in µs on ``sample_clock`` ("wall":
the Unix epoch, or "boottime", as drivers differ). Knobs: ``FakeGpu.not_supported`` (function names that raise
NVMLError_NotSupported), ``FakeGpu.unbuffered`` (sampling types nvmlDeviceGetSamples refuses, as MIG refuses
utilisation), ``FakeNvml.fail_after`` (every call after the N-th raises ``fail_code``, e.g. the driver going
away), ``FakeNvml.init_error``.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

NVML_SUCCESS = 0
# code -> (class suffix, NVML_ERROR_* constant suffix, message), as pynvml builds them from nvml.h
_ERRORS: dict[int, tuple[str, str, str]] = {
    1: ("Uninitialized", "UNINITIALIZED", "Uninitialized"),
    2: ("InvalidArgument", "INVALID_ARGUMENT", "Invalid Argument"),
    3: ("NotSupported", "NOT_SUPPORTED", "Not Supported"),
    4: ("NoPermission", "NO_PERMISSION", "Insufficient Permissions"),
    5: ("AlreadyInitialized", "ALREADY_INITIALIZED", "Already Initialized"),
    6: ("NotFound", "NOT_FOUND", "Not Found"),
    9: ("DriverNotLoaded", "DRIVER_NOT_LOADED", "Driver Not Loaded"),
    10: ("Timeout", "TIMEOUT", "Timeout"),
    12: ("LibraryNotFound", "LIBRARY_NOT_FOUND", "NVML Shared Library Not Found"),
    13: ("FunctionNotFound", "FUNCTION_NOT_FOUND", "Function Not Found"),
    15: ("GpuIsLost", "GPU_IS_LOST", "GPU is lost"),
    16: ("ResetRequired", "RESET_REQUIRED", "GPU requires restart"),
    18: ("LibRmVersionMismatch", "LIB_RM_VERSION_MISMATCH", "RM has detected an NVML/RM version mismatch."),
    19: ("InUse", "IN_USE", "In use by another client"),
    999: ("Unknown", "UNKNOWN", "Unknown Error"),
}
ERROR_CODES = {f"NVML_ERROR_{const}": code for code, (_, const, _) in _ERRORS.items()}


class NVMLError(Exception):
    """As in pynvml: ``NVMLError(code)`` returns the subclass for ``code``; ``.value`` is the code."""

    _valClassMapping: dict[int, type[NVMLError]] = {}  # noqa: RUF012 - the real attribute's name and shape
    value: int

    def __new__(cls, value: int = 999) -> NVMLError:  # the default only serves subclasses, which set their own
        if cls is NVMLError:
            cls = NVMLError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __str__(self) -> str:
        entry = _ERRORS.get(self.value)
        return entry[2] if entry else f"NVML Error with code {self.value}"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = None  # type: ignore[assignment]  # pynvml defines __eq__ only, so its errors are unhashable too


def _error_class(code: int, suffix: str) -> type[NVMLError]:
    def new(cls: type[NVMLError], *args: object) -> NVMLError:
        return NVMLError.__new__(cls, code)

    cls = type(f"NVMLError_{suffix}", (NVMLError,), {"__new__": new})
    NVMLError._valClassMapping[code] = cls
    return cls


ERROR_CLASSES: dict[str, type[NVMLError]] = {
    f"NVMLError_{suffix}": _error_class(code, suffix) for code, (suffix, _, _) in _ERRORS.items()
}
globals().update(ERROR_CLASSES)
NVMLError_NotSupported = ERROR_CLASSES["NVMLError_NotSupported"]
NVMLError_NotFound = ERROR_CLASSES["NVMLError_NotFound"]
NVMLError_DriverNotLoaded = ERROR_CLASSES["NVMLError_DriverNotLoaded"]
NVMLError_GpuIsLost = ERROR_CLASSES["NVMLError_GpuIsLost"]

CONSTANTS: dict[str, int] = {
    "NVML_SUCCESS": NVML_SUCCESS,
    **ERROR_CODES,
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_GRAPHICS": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_CLOCK_ID_CURRENT": 0,
    "NVML_CLOCK_ID_APP_CLOCK_TARGET": 1,
    "NVML_FEATURE_DISABLED": 0,
    "NVML_FEATURE_ENABLED": 1,
    "NVML_DEVICE_MIG_DISABLE": 0,
    "NVML_DEVICE_MIG_ENABLE": 1,
    "NVML_TOTAL_POWER_SAMPLES": 0,
    "NVML_GPU_UTILIZATION_SAMPLES": 1,
    "NVML_MEMORY_UTILIZATION_SAMPLES": 2,
    "NVML_PROCESSOR_CLK_SAMPLES": 5,
    "NVML_MEMORY_CLK_SAMPLES": 6,
    "NVML_VALUE_TYPE_DOUBLE": 0,
    "NVML_VALUE_TYPE_UNSIGNED_INT": 1,
    "NVML_VALUE_TYPE_UNSIGNED_LONG": 2,
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": 3,
    "NVML_GPM_METRIC_SM_UTIL": 2,
    "NVML_GPM_METRIC_SM_OCCUPANCY": 3,
    "NVML_GPM_METRIC_ANY_TENSOR_UTIL": 5,
    "NVML_GPM_METRIC_DRAM_BW_UTIL": 10,
    "NVML_GPM_METRIC_MAX": 477,
    "NVML_GPM_METRICS_GET_VERSION": 1,
    "NVML_GPM_SUPPORT_VERSION": 1,
    "nvmlClocksEventReasonGpuIdle": 0x001,
    "nvmlClocksEventReasonApplicationsClocksSetting": 0x002,
    "nvmlClocksEventReasonSwPowerCap": 0x004,
    "nvmlClocksEventReasonHwSlowdown": 0x008,
    "nvmlClocksEventReasonSyncBoost": 0x010,
    "nvmlClocksEventReasonSwThermalSlowdown": 0x020,
    "nvmlClocksEventReasonHwThermalSlowdown": 0x040,
    "nvmlClocksEventReasonHwPowerBrakeSlowdown": 0x080,
    "nvmlClocksEventReasonDisplayClockSetting": 0x100,
}
GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_TENSOR, GPM_DRAM_BW = 2, 3, 5, 10


@dataclass
class Struct:
    """Stands in for a ctypes structure: named fields, nothing else."""

    fields: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            return self.fields[name]
        except KeyError:
            raise AttributeError(name) from None


class c_nvmlGpmMetric_t:  # pynvml's name
    def __init__(self) -> None:
        self.metricId = 0
        self.nvmlReturn = NVML_SUCCESS
        self.value = 0.0
        self.metricInfo = Struct({"shortName": None, "longName": None, "unit": None})


class c_nvmlGpmMetricsGet_t:  # pynvml's name
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: FakeGpmSample | None = None
        self.sample2: FakeGpmSample | None = None
        self.metrics = [c_nvmlGpmMetric_t() for _ in range(CONSTANTS["NVML_GPM_METRIC_MAX"])]


_MetricsGet = c_nvmlGpmMetricsGet_t


@dataclass
class FakeGpmSample:
    gpu: FakeGpu | None = None
    t: float | None = None
    freed: bool = False


Trace = float | Callable[[float], float]  # a constant, or a function of t (seconds since the fake was created)


def at(trace: Trace, t: float) -> float:
    return trace(t) if callable(trace) else trace


@dataclass
class FakeGpu:
    uuid: str = "GPU-5e1f2c3d-0a1b-4c2d-8e3f-000000000001"
    pci_bus_id: str = "00000000:3B:00.0"
    name: str = "NVIDIA H100 80GB HBM3"
    compute_capability: tuple[int, int] = (9, 0)
    util_pct: Trace = 80.0
    mem_util_pct: Trace = 40.0
    power_w: Trace = 300.0
    sm_clock_mhz: Trace = 1755.0
    max_sm_clock_mhz: int = 1980
    mem_clock_mhz: int = 2619
    temp_c: Trace = 55.0
    throttle_mask: Trace = 0  # nvmlClocksEventReason* bits
    mem_used_bytes: Trace = 10 * 2**30
    mem_total_bytes: int = 80 * 2**30
    energy_start_mj: int = 123_456_789
    util_period_s: float = 1 / 6
    sample_period_s: float = 0.02  # power and clock samples
    sample_clock: str = "wall"  # the host clock nvmlDeviceGetSamples stamps with: "wall" or "boottime"
    unbuffered: set[int] = field(default_factory=set)  # sampling types nvmlDeviceGetSamples answers NotSupported
    history_s: float = 2.0  # NVML samples that exist from before the fake was created
    sample_buffer: int = 120  # NVML keeps only the most recent samples
    gpm: dict[int, float] = field(
        default_factory=lambda: {GPM_SM_UTIL: 61.5, GPM_SM_OCCUPANCY: 30.25, GPM_TENSOR: 45.0, GPM_DRAM_BW: 22.5}
    )
    gpm_errors: dict[int, int] = field(default_factory=dict)  # metric id -> NVML error code (counters busy, ...)
    not_supported: set[str] = field(default_factory=set)  # API function names raising NVMLError_NotSupported
    # Settings (nvmlDeviceGet*PowerLimit*, clocks, modes): mW, MHz, NVML_FEATURE_* / NVML_DEVICE_MIG_* values.
    power_limit_mw: int = 700_000
    power_default_limit_mw: int = 700_000
    power_limit_range_mw: tuple[int, int] = (200_000, 700_000)
    app_sm_clock_mhz: int = 1980
    app_mem_clock_mhz: int = 2619
    persistence_mode: int = 1
    ecc_mode: tuple[int, int] = (1, 1)  # (current, pending)
    mig_mode: tuple[int, int] = (0, 0)  # (current, pending)
    # The pids holding a compute context on the GPU (nvmlDeviceGetComputeRunningProcesses), host pid namespace.
    processes: list[int] = field(default_factory=list)


class FakeHandle:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu


def _parse_bus_id(text: str) -> tuple[int, int, int, int]:
    """domain:bus:device.function (hex, domain optional), as nvmlDeviceGetHandleByPciBusId accepts it."""
    parts = text.split(":")
    if len(parts) == 2:
        parts.insert(0, "0")
    if len(parts) != 3:
        raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
    dev, _, fn = parts[2].partition(".")
    try:
        return int(parts[0], 16), int(parts[1], 16), int(dev, 16), int(fn or "0", 16)
    except ValueError:
        raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"]) from None


class FakeNvml:
    """The fake module: put an instance in ``sys.modules["pynvml"]`` or hand it to ``open_telemetry(nvml=...)``."""

    NVMLError = NVMLError
    c_nvmlGpmMetricsGet_t = c_nvmlGpmMetricsGet_t

    if TYPE_CHECKING:  # constants and error classes are set per instance, from CONSTANTS and ERROR_CLASSES

        def __getattr__(self, name: str) -> Any: ...

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        *,
        clock: Callable[[], float] = time.time,
        fail_after: int | None = None,
        fail_code: int = 15,  # NVML_ERROR_GPU_IS_LOST
        init_error: int | None = None,
        driver_version: str = "550.54.15",
    ) -> None:
        for name, cls in ERROR_CLASSES.items():
            setattr(self, name, cls)
        for name, value in CONSTANTS.items():
            setattr(self, name, value)
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.clock = clock
        self.t0 = clock()
        # Where t = 0 falls on each clock a driver may stamp its samples with.
        self.origins = {"wall": self.t0, "boottime": time.clock_gettime(time.CLOCK_BOOTTIME) - (time.time() - self.t0)}
        self.fail_after = fail_after
        self.fail_code = fail_code
        self.init_error = init_error
        self.driver_version = driver_version
        self.calls: Counter[str] = Counter()
        self.total_calls = 0
        self.init_count = 0
        self.gpm_live: list[FakeGpmSample] = []
        self._energy: dict[int, tuple[float, float]] = {}  # id(gpu) -> (t, mJ)

    # ---- scripting helpers (not in pynvml) ----
    def now(self) -> float:
        """Seconds since the fake was created: the ``t`` the traces are functions of."""
        return self.clock() - self.t0

    def lose_gpu(self, code: int = 15) -> None:
        """From the next call on, every call raises NVMLError(code) — the driver or the GPU went away."""
        self.fail_after, self.fail_code = self.total_calls, code

    # ---- plumbing ----
    def _call(self, name: str, handle: FakeHandle | None = None, *, needs_init: bool = True) -> FakeGpu | None:
        self.calls[name] += 1
        self.total_calls += 1
        if self.fail_after is not None and self.total_calls > self.fail_after:
            raise NVMLError(self.fail_code)
        if needs_init and self.init_count <= 0:
            raise NVMLError(CONSTANTS["NVML_ERROR_UNINITIALIZED"])
        if handle is None:
            return None
        if not isinstance(handle, FakeHandle):
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
        if name in handle.gpu.not_supported:
            raise NVMLError_NotSupported()
        return handle.gpu

    def _gpu(self, name: str, handle: FakeHandle) -> FakeGpu:
        gpu = self._call(name, handle)
        assert gpu is not None
        return gpu

    # ---- init ----
    def nvmlInit(self) -> None:
        self._call("nvmlInit", needs_init=False)
        if self.init_error is not None:
            raise NVMLError(self.init_error)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver_version

    # ---- devices ----
    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
        return FakeHandle(self.gpus[index])

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeHandle:
        self._call("nvmlDeviceGetHandleByUUID")
        text = uuid.decode() if isinstance(uuid, bytes) else uuid
        for gpu in self.gpus:
            if gpu.uuid == text:
                return FakeHandle(gpu)
        raise NVMLError_NotFound()

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes) -> FakeHandle:
        self._call("nvmlDeviceGetHandleByPciBusId")
        wanted = _parse_bus_id(bus_id.decode() if isinstance(bus_id, bytes) else bus_id)
        for gpu in self.gpus:
            if _parse_bus_id(gpu.pci_bus_id) == wanted:
                return FakeHandle(gpu)
        raise NVMLError_NotFound()

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        return self._gpu("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeHandle) -> tuple[int, int]:
        return self._gpu("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    # ---- readings ----
    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Struct:
        gpu, t = self._gpu("nvmlDeviceGetUtilizationRates", handle), self.now()
        return Struct({"gpu": round(at(gpu.util_pct, t)), "memory": round(at(gpu.mem_util_pct, t))})

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> Struct:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", handle)
        used = int(at(gpu.mem_used_bytes, self.now()))
        return Struct({"total": gpu.mem_total_bytes, "free": gpu.mem_total_bytes - used, "used": used})

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetPowerUsage", handle)
        return round(at(gpu.power_w, self.now()) * 1000)  # mW

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle)
        now = self.now()
        last_t, mj = self._energy.get(id(gpu), (0.0, float(gpu.energy_start_mj)))
        steps = max(1, int((now - last_t) / 0.001))
        dt = (now - last_t) / steps
        for i in range(steps):  # midpoint rule over the power trace: the counter advances with time
            mj += at(gpu.power_w, last_t + (i + 0.5) * dt) * dt * 1000
        self._energy[id(gpu)] = (now, mj)
        return int(mj) % 2**64

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        if clock_type == CONSTANTS["NVML_CLOCK_SM"] or clock_type == CONSTANTS["NVML_CLOCK_GRAPHICS"]:
            return round(at(gpu.sm_clock_mhz, self.now()))
        if clock_type == CONSTANTS["NVML_CLOCK_MEM"]:
            return gpu.mem_clock_mhz
        raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetMaxClockInfo", handle)
        if clock_type == CONSTANTS["NVML_CLOCK_MEM"]:
            return gpu.mem_clock_mhz
        return gpu.max_sm_clock_mhz

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        gpu = self._gpu("nvmlDeviceGetTemperature", handle)
        if sensor != CONSTANTS["NVML_TEMPERATURE_GPU"]:
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
        return round(at(gpu.temp_c, self.now()))

    def nvmlDeviceGetClock(self, handle: FakeHandle, clock_type: int, clock_id: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClock", handle)
        if clock_id == CONSTANTS["NVML_CLOCK_ID_CURRENT"]:
            return self.nvmlDeviceGetClockInfo(handle, clock_type)
        if clock_id != CONSTANTS["NVML_CLOCK_ID_APP_CLOCK_TARGET"]:
            raise NVMLError(CONSTANTS["NVML_ERROR_NOT_SUPPORTED"])
        return gpu.app_mem_clock_mhz if clock_type == CONSTANTS["NVML_CLOCK_MEM"] else gpu.app_sm_clock_mhz

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[Struct]:
        gpu = self._gpu("nvmlDeviceGetComputeRunningProcesses", handle)
        return [Struct({"pid": pid, "usedGpuMemory": 2**30}) for pid in gpu.processes]

    # ---- settings ----
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPowerManagementDefaultLimit", handle).power_default_limit_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeHandle) -> list[int]:
        return list(self._gpu("nvmlDeviceGetPowerManagementLimitConstraints", handle).power_limit_range_mw)

    def nvmlDeviceGetPersistenceMode(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPersistenceMode", handle).persistence_mode

    def nvmlDeviceGetEccMode(self, handle: FakeHandle) -> list[int]:
        return list(self._gpu("nvmlDeviceGetEccMode", handle).ecc_mode)

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        return list(self._gpu("nvmlDeviceGetMigMode", handle).mig_mode)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return int(at(self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle).throttle_mask, self.now()))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return int(at(self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle).throttle_mask, self.now()))

    def nvmlDeviceGetSamples(self, handle: FakeHandle, sampling_type: int, last_seen_us: int) -> tuple[int, list[Any]]:
        """(value type, [c_nvmlSample_t]) of the buffered samples newer than ``last_seen_us``; NotFound if none."""
        gpu = self._gpu("nvmlDeviceGetSamples", handle)
        traces: dict[int, tuple[Trace, float, float]] = {  # type -> (trace, unit factor, period)
            CONSTANTS["NVML_GPU_UTILIZATION_SAMPLES"]: (gpu.util_pct, 1.0, gpu.util_period_s),
            CONSTANTS["NVML_MEMORY_UTILIZATION_SAMPLES"]: (gpu.mem_util_pct, 1.0, gpu.util_period_s),
            CONSTANTS["NVML_TOTAL_POWER_SAMPLES"]: (gpu.power_w, 1000.0, gpu.sample_period_s),  # mW
            CONSTANTS["NVML_PROCESSOR_CLK_SAMPLES"]: (gpu.sm_clock_mhz, 1.0, gpu.sample_period_s),
            CONSTANTS["NVML_MEMORY_CLK_SAMPLES"]: (gpu.mem_clock_mhz, 1.0, gpu.sample_period_s),
        }
        if sampling_type not in traces:
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
        if sampling_type in gpu.unbuffered:
            raise NVMLError_NotSupported()
        trace, factor, period = traces[sampling_type]
        now, first = self.now(), -gpu.history_s
        count = int((now - first) / period)
        times = [first + k * period for k in range(max(0, count - gpu.sample_buffer) + 1, count + 1)]
        origin = self.origins[gpu.sample_clock]
        samples = [
            Struct({"timeStamp": ts, "sampleValue": Struct({"uiVal": round(at(trace, t) * factor)})})
            for t in times
            if (ts := int((origin + t) * 1e6)) > last_seen_us
        ]
        if not samples:
            raise NVMLError_NotFound()
        return CONSTANTS["NVML_VALUE_TYPE_UNSIGNED_INT"], samples

    # ---- GPM ----
    def nvmlGpmQueryDeviceSupport(self, handle: FakeHandle) -> Struct:
        gpu = self._gpu("nvmlGpmQueryDeviceSupport", handle)
        supported = int(gpu.compute_capability >= (9, 0))
        return Struct({"version": CONSTANTS["NVML_GPM_SUPPORT_VERSION"], "isSupportedDevice": supported})

    def nvmlGpmSampleAlloc(self) -> FakeGpmSample:
        self._call("nvmlGpmSampleAlloc")
        sample = FakeGpmSample()
        self.gpm_live.append(sample)
        return sample

    def nvmlGpmSampleFree(self, sample: FakeGpmSample) -> None:
        self._call("nvmlGpmSampleFree")
        if sample.freed or sample not in self.gpm_live:
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
        sample.freed = True
        self.gpm_live.remove(sample)

    def nvmlGpmSampleGet(self, handle: FakeHandle, sample: FakeGpmSample) -> FakeGpmSample:
        gpu = self._gpu("nvmlGpmSampleGet", handle)
        if gpu.compute_capability < (9, 0):
            raise NVMLError_NotSupported()
        sample.gpu, sample.t = gpu, self.now()
        return sample

    def nvmlGpmMetricsGet(self, request: _MetricsGet) -> _MetricsGet:
        self._call("nvmlGpmMetricsGet")
        s1, s2 = request.sample1, request.sample2
        if request.version != CONSTANTS["NVML_GPM_METRICS_GET_VERSION"] or s1 is None or s2 is None:
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])
        gpu = s1.gpu
        if gpu is None or gpu is not s2.gpu or s1.t is None or s2.t is None or s2.t <= s1.t:
            raise NVMLError(CONSTANTS["NVML_ERROR_INVALID_ARGUMENT"])  # two samples of one GPU, in time order
        for metric in request.metrics[: request.numMetrics]:
            code = gpu.gpm_errors.get(metric.metricId)
            if code is not None:
                metric.nvmlReturn, metric.value = code, 0.0
            elif metric.metricId in gpu.gpm:
                metric.nvmlReturn, metric.value = NVML_SUCCESS, gpu.gpm[metric.metricId]
            else:
                metric.nvmlReturn = CONSTANTS["NVML_ERROR_NOT_SUPPORTED"]
        return request
