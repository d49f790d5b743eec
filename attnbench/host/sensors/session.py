"""The telemetry context around one case's measured window: which sources, the thread, the summary.

``open_telemetry`` never raises for a hardware or driver problem: a source that cannot be used turns into reasons
in ``TelemetrySummary.unavailable``, and the CPU metrics still come.

A source (``cpu.HostProcess``, ``nvml.NvmlDevice``) gives the sampler its polled ``channels()`` and reads its
counters when the window opens and closes; ``assemble`` turns what it read into metrics. A new source (the
processes sharing the GPU, system-wide CPU load) follows the same shape: channels for what must be polled,
readings at the edges for what the system counts itself, a record of its own in ``assemble``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol

from attnbench.core.cases import LEVELS, Level
from attnbench.host.sensors import reduce
from attnbench.host.sensors.assemble import CpuWindow, HostCounters, cpu_metrics, gpu_metrics
from attnbench.host.sensors.cpu import HostProcess
from attnbench.host.sensors.faults import TelemetryUnavailable
from attnbench.host.sensors.identity import GpuIdentity, cuda_identity
from attnbench.host.sensors.nvml import NvmlDevice, load_nvml, nvml_status
from attnbench.host.sensors.sampler import Channel, Sampler
from attnbench.results.telemetry import CPU_METRICS, NVML_METRICS, MetricValue, TelemetrySummary

DEFAULT_INTERVAL_S = 0.1
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")

NvmlLoader = Callable[[], Any]
IdentityLookup = Callable[[str], GpuIdentity]


class Telemetry(Protocol):
    """A single-use context around one measured window; ``summary`` after it has exited."""

    def __enter__(self) -> Telemetry: ...

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    def mark_sampling(self) -> None:
        """The timing loop has finished warming up: what is measured over the sampling phase only (GPM) starts."""
        ...

    def summary(self, *, calls: int, tokens_per_call: int) -> TelemetrySummary: ...


class _Off:
    """Level "off": measures nothing, costs nothing."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s

    def __enter__(self) -> _Off:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def mark_sampling(self) -> None:
        return None

    def summary(self, *, calls: int, tokens_per_call: int) -> TelemetrySummary:
        return TelemetrySummary("off", "off", self.interval_s, 0.0, 0, True, "telemetry off", {}, {})


class _Session:
    """psutil for this process, and NVML for the GPU on CUDA runs, polled by one ``Sampler`` thread."""

    def __init__(
        self,
        level: Level,
        interval_s: float,
        *,
        host: HostProcess | None,
        host_failure: str,
        gpu: NvmlDevice | None,
        gpu_failure: str,
    ) -> None:
        self.level, self.interval_s = level, interval_s
        self._host, self._host_failure = host, host_failure
        self._gpu, self._gpu_failure = gpu, gpu_failure
        channels: list[Channel] = []
        for source in (host, gpu):
            if source is not None:
                channels += source.channels()
        self._sampler = Sampler(channels, interval_s)
        self._host_counters: list[HostCounters | None] = []
        self._state = "new"

    @property
    def running(self) -> bool:
        return self._sampler.running

    def __enter__(self) -> _Session:
        if self._state != "new":
            raise RuntimeError("a telemetry session is single-use: open_telemetry() again for the next window")
        self._state = "running"
        if self._gpu is not None:
            self._gpu.start()
        if self._host is not None:
            self._host_counters.append(self._host.read_counters())
        self._sampler.start()  # last: the window starts here
        return self

    def mark_sampling(self) -> None:
        if self._gpu is not None and self._state == "running":
            self._gpu.mark_sampling()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._state = "done"
        try:
            self._sampler.stop()  # first: the window ends here
        except Exception:
            # A bug in a reading (not a hardware failure, those are data). Do not mask the workload's own error.
            if exc_type is None:
                raise
        finally:
            if self._host is not None:
                self._host_counters.append(self._host.read_counters())
            if self._gpu is not None:
                try:
                    self._gpu.stop(self._sampler)
                finally:
                    self._gpu.close()  # nvmlShutdown and freeing GPM samples happen whatever stop() did

    def summary(self, *, calls: int, tokens_per_call: int) -> TelemetrySummary:
        if self._state != "done":
            raise RuntimeError("summary() is available once the telemetry context has exited")
        window_s, samples = self._sampler.window_s, self._sampler.samples
        metrics: dict[str, MetricValue] = {}
        unavailable: dict[str, str] = {}
        notes: list[str] = []
        period: float | None = None
        if self._gpu is None:
            unavailable.update(dict.fromkeys(NVML_METRICS, self._gpu_failure))
        else:
            gpu, missing, gpu_notes, util_period = gpu_metrics(
                self._gpu.window(self._sampler), max(0, calls) * max(0, tokens_per_call)
            )
            metrics.update(gpu)
            unavailable.update(missing)
            notes += gpu_notes
            period = util_period if "gpu_util_pct" in gpu else None
        if self._host is None:
            unavailable.update(dict.fromkeys(CPU_METRICS, self._host_failure))
        else:
            start, end = [*self._host_counters, None, None][:2]
            cpu = CpuWindow(
                window_s,
                samples,
                self._sampler.failures,
                self._host.logical_cores,
                start,
                end,
                self._host.counter_failure,
            )
            cpu_values, cpu_missing = cpu_metrics(cpu)
            metrics.update(cpu_values)
            unavailable.update(cpu_missing)
        reliable, why = reduce.reliability(window_s, len(samples), period)
        raw = [dict(s) for s in samples] + (self._gpu.raw_rows() if self._gpu is not None else [])
        return TelemetrySummary(
            source="nvml+psutil" if self._gpu is not None and not getattr(self._gpu, "fatal", False) else "psutil",
            level=self.level,
            interval_s=self.interval_s,
            window_s=window_s,
            samples=len(samples),
            reliable=reliable,
            note="; ".join(why + notes),
            metrics=metrics,
            unavailable=unavailable,
            raw=tuple(raw),
        )


def _check(device: str, level: str, interval_s: float) -> None:
    if not _DEVICE.fullmatch(device):
        raise ValueError(f"telemetry device must be cpu, cuda or cuda:N, got {device!r}")
    if level not in LEVELS:
        raise ValueError(f"telemetry level must be one of {', '.join(LEVELS)}, got {level!r}")
    if not (isinstance(interval_s, int | float) and math.isfinite(interval_s) and interval_s > 0):
        raise ValueError(f"telemetry interval_s must be a positive number of seconds, got {interval_s!r}")


def open_telemetry(
    device: str,
    level: Level = "basic",
    interval_s: float = DEFAULT_INTERVAL_S,
    *,
    nvml: NvmlLoader = load_nvml,
    identity: IdentityLookup = cuda_identity,
) -> Telemetry:
    """A telemetry context for one window on ``device`` ("cpu", "cuda", "cuda:N"), polling every ``interval_s``.

    NVML is initialised and the device found here, outside the window. ``nvml`` (returns the pynvml module) and
    ``identity`` (torch device -> UUID/PCI bus id) are seams for tests. Raises ValueError only for bad arguments.
    """
    _check(device, level, interval_s)
    if level == "off":
        return _Off(interval_s)
    host: HostProcess | None = None
    host_failure = ""
    try:
        host = HostProcess()
    except TelemetryUnavailable as exc:
        host_failure = str(exc)
    gpu: NvmlDevice | None = None
    gpu_failure = "CPU run"
    if device != "cpu":
        try:
            gpu = NvmlDevice.open(nvml(), identity(device), gpm=level == "full")
        except TelemetryUnavailable as exc:
            gpu_failure = str(exc)
    return _Session(level, interval_s, host=host, host_failure=host_failure, gpu=gpu, gpu_failure=gpu_failure)


def telemetry_status(
    device: str, *, nvml: NvmlLoader = load_nvml, identity: IdentityLookup = cuda_identity
) -> dict[str, str]:
    """Whether NVML, GPM and psutil can be used for ``device``, each "available" or the reason: for `attnbench env`."""
    _check(device, "basic", DEFAULT_INTERVAL_S)
    status: dict[str, str]
    if device == "cpu":
        status = nvml_status(nvml, None)
    else:
        try:
            status = nvml_status(nvml, identity(device))
        except TelemetryUnavailable as exc:
            status = {"nvml": f"unavailable: {exc}", "gpm": "unsupported: device unknown"}
    try:
        HostProcess()
        status["psutil"] = "available"
    except TelemetryUnavailable as exc:
        status["psutil"] = f"unavailable: {exc}"
    return status
