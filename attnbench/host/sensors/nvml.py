"""GPU telemetry through NVML (the nvidia-ml-py distribution, module ``pynvml``): one GPU for one window.

pynvml is reached only through a module object handed in (``load_nvml`` imports it lazily), so tests pass a fake;
``buffers``, ``gpm`` and ``settings`` use the same object. Nothing here raises for an NVML problem: an error becomes
the reason a metric is missing. Units as NVML gives them: power mW, energy mJ, clocks MHz, memory bytes.

What is read how, so that the thread beside the timed calls makes as few calls as possible (issue 12, item 8):

* buffered by the driver, read at the window's ends and drained twice a second (``buffers``): utilisation (GPU
  and memory), power, SM and memory clocks. A type the driver will not buffer (MIG has no utilisation samples) is
  polled instead; one with no sample inside the window (a window shorter than the driver's period) gets one
  reading at the window's end;
* counters, read at the ends: the total-energy counter, GPM (from the start of sampling, ``gpm``);
* polled every interval, as nothing buffers them: device memory in use, temperature, clock-event reasons.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from attnbench.host.sensors.assemble import GpuWindow
from attnbench.host.sensors.buffers import Buffers
from attnbench.host.sensors.faults import TelemetryUnavailable
from attnbench.host.sensors.gpm import Gpm, gpm_support
from attnbench.host.sensors.identity import GpuIdentity
from attnbench.host.sensors.sampler import Channel, Failure, Reading, Sampler

GROUP = "nvml"
_DRAIN = "_nvml_buffers"  # the channel that drains the sample buffers; records nothing itself
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


class NvmlDevice:
    """One GPU for the duration of one window: its buffers, counters at both ends, polled readings, GPM."""

    def __init__(self, nvml: Any, handle: Any, *, gpm: bool) -> None:
        self.nvml, self.handle = nvml, handle
        self.fatal = ""
        self.max_sm_clock_mhz: float | None = None
        self.max_sm_clock_failure = ""
        try:
            self.max_sm_clock_mhz = float(nvml.nvmlDeviceGetMaxClockInfo(handle, nvml.NVML_CLOCK_SM))
        except nvml.NVMLError as exc:
            self.max_sm_clock_failure = describe(exc)
        self.buffers = Buffers(nvml, handle, self._is_fatal)
        failure = gpm_support(nvml, handle) if gpm else "telemetry level basic (GPM needs level full)"
        self.gpm = Gpm(nvml, handle, failure, self._note_fatal)
        self._energy: list[int] = []
        self._energy_failure = ""
        self._old_reasons_api = False
        self._polled: set[str] = set()  # buffered types the driver would not buffer, polled instead
        self._at_end: dict[str, float] = {}
        self._at_end_failures: dict[str, str] = {}

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
        """What is polled: the readings no buffer holds, and the buffers' drain."""
        nvml, h = self.nvml, self.handle
        polled: list[tuple[str, Callable[[], Reading]]] = [
            ("gpu_mem_used_bytes", lambda: int(nvml.nvmlDeviceGetMemoryInfo(h).used)),
            ("temp_c", lambda: float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))),
            ("throttle_mask", self._throttle_mask),
        ]
        unbuffered = set(self.buffers.failures)
        self._polled = unbuffered
        getters = self._getters()
        polled += [(n, getters[n]) for n in ("power_w", "sm_clock_mhz", "mem_clock_mhz") if n in unbuffered]
        channels = [Channel(name, read, self.classify, GROUP) for name, read in polled]
        utilisation = tuple(n for n in ("gpu_util_pct", "mem_util_pct") if n in unbuffered)
        if utilisation:  # one call answers both: never two per poll
            channels.append(Channel("utilization", self._utilisation, self.classify, GROUP, utilisation))
        if self.buffers.buffers:
            channels.append(Channel(_DRAIN, self._drain, self.classify, GROUP))
        return channels

    def _getters(self) -> dict[str, Callable[[], float]]:
        """One reading each, for polling a type the driver does not buffer or reading one at the window's end."""
        nvml, h = self.nvml, self.handle
        return {
            # On Ampere (but GA100) and newer this is a 1 s average, on older boards instantaneous (nvml.h).
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
            "mem_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM)),
            "gpu_util_pct": lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            "mem_util_pct": lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).memory),
        }

    def _utilisation(self) -> dict[str, Reading]:
        rates = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
        return {"gpu_util_pct": float(rates.gpu), "mem_util_pct": float(rates.memory)}

    def _drain(self) -> None:
        self.buffers.drain_if_due()

    def _throttle_mask(self) -> int:
        # "Clocks event reasons" is the current name (driver 535+); older drivers only know the "throttle" one.
        if not self._old_reasons_api:
            try:
                return int(self.nvml.nvmlDeviceGetCurrentClocksEventReasons(self.handle))
            except (AttributeError, self.nvml.NVMLError_FunctionNotFound):
                self._old_reasons_api = True
        return int(self.nvml.nvmlDeviceGetCurrentClocksThrottleReasons(self.handle))

    def start(self) -> None:
        """Counters at window start: the buffers' cursors, the energy counter, the first GPM sample."""
        try:
            self.buffers.start()
        except self.nvml.NVMLError as exc:  # only fatal errors leave Buffers
            self._note_fatal(exc)
        self._read_energy()
        self.gpm.start()

    def mark_sampling(self) -> None:
        """The timing loop's sampling phase starts: GPM is measured from here."""
        if not self.fatal:
            self.gpm.mark()

    def stop(self, sampler: Sampler) -> None:
        """Counters at window end (skipped once the driver has gone)."""
        self.fatal = self.fatal or sampler.fatal.get(GROUP, "")
        if self.fatal:
            return
        try:
            self.buffers.stop()
        except self.nvml.NVMLError as exc:
            self._note_fatal(exc)
            return
        self._read_energy()
        self.gpm.stop()
        self._read_at_end(sampler)

    def _read_at_end(self, sampler: Sampler) -> None:
        """One reading at the window's end of each buffered type that had no sample inside the window."""
        series, getters = self.buffers.series(), self._getters()
        for name in [name for name in getters if not series.get(name) and name not in self._polled]:
            try:
                self._at_end[name] = getters[name]()
            except self.nvml.NVMLError as exc:
                self._at_end_failures[name] = describe(exc)
                self._note_fatal(exc)
                if self.fatal:
                    return

    def window(self, sampler: Sampler) -> GpuWindow:
        reading = self.gpm.reading
        return GpuWindow(
            window_s=sampler.window_s,
            samples=sampler.samples,
            failures={k: v for k, v in sampler.failures.items() if k != _DRAIN},
            fatal=self.fatal,
            buffered=self.buffers.series(),
            buffer_failures=dict(self.buffers.failures),
            buffer_clock=self.buffers.domain,
            util_timestamps_us=tuple(self.buffers.timestamps("gpu_util_pct")),
            at_end=dict(self._at_end),
            at_end_failures=dict(self._at_end_failures),
            energy_mj=(self._energy[0], self._energy[1]) if len(self._energy) == 2 else None,
            energy_failure=self._energy_failure,
            max_sm_clock_mhz=self.max_sm_clock_mhz,
            max_sm_clock_failure=self.max_sm_clock_failure,
            gpm=dict(reading.values),
            gpm_unavailable=self.gpm.unavailable(),
            gpm_window_s=reading.window_s,
            gpm_marked=reading.marked,
        )

    def raw_rows(self) -> list[dict[str, float | int | None]]:
        """NVML's own buffered samples inside the window, for the raw sidecar (t_s None on an unknown clock)."""
        rows: list[dict[str, float | int | None]] = []
        for name, points in self.buffers.series().items():
            rows += [{"t_s": t, f"nvml_sample_{name}": v} for t, v in points]
        return rows

    def close(self) -> None:
        self.gpm.close()
        self._shutdown(self.nvml)

    @staticmethod
    def _shutdown(nvml: Any) -> None:
        # Reference-counted by NVML: pairs with this session's nvmlInit only. Nothing to release if the driver went.
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()

    def _is_fatal(self, exc: Exception) -> bool:
        failure = self.classify(exc)
        return failure is not None and failure.fatal

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
