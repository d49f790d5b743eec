"""Was the machine busy with other work while a case was timed? Counters read at a window's ends, judged by rules.

A timing taken while other processes compete for the cores (a shared CI runner, a laptop compiling, a
neighbour's job) is slower by an unknown amount, and two such runs compared read as a regression. So every case's
timed window (warm-up and samples) is watched, and the row says whether it was contended and why:

* **other processes' CPU use**: the machine's busy CPU time over the window (``/proc/stat`` through psutil) minus
  this process's own, in cores. Contended when others used more than the cores this case leaves free
  (``logical_cores − threads``) by ``OTHERS_SLACK_CORES``: a one-core hog beside a two-thread case on two cores is
  contention, the same hog beside a one-thread case on eight cores is not;
* **run-queue wait**: the time this process's threads were runnable but waiting for a CPU (Linux
  ``/proc/self/task/*/schedstat``), as a share of the window; at least ``RUN_WAIT_PCT`` is contention. It is the
  most direct evidence: time the case wanted to run and could not;
* **steal**: CPU time the hypervisor gave to other guests, ``STEAL_PCT`` of the window's CPU time or more;
* on a GPU, **other compute processes** on the device (NVML's running compute processes), and an **SM clock
  below the application clock** by more than ``CLOCK_SLACK`` at the window's end *for a reason NVML gives other
  than idling or the software power cap* (thermal or hardware slowdown, a power brake, sync boost, the display):
  an H200 idles at 345 MHz and boosts to ~1980, so a launch-bound case (the GPU idle between kernels) or a
  power-capped one reads well below the application clock with nobody else on the GPU, which is the case's own
  nature, not contention. Without the reasons (an old driver) the clock is recorded, not judged;
* the **load average** at both ends is recorded as evidence only: it is a one-minute average, lagging any window
  shorter than that, and it counts this case's own threads.

The pre-sweep check (``busy_now``) applies the same rules to a short idle window (≤ 1 s) before the first case,
with the threads the sweep will use, and ``wait_for_idle`` repeats it until the machine is quiet or time is up.

No torch at import time; psutil and NVML are optional, and a counter that cannot be read is None, never an error.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attnbench.results.contention import Contention

OTHERS_SLACK_CORES = 0.5  # others may use this much more than the free cores before a case counts as contended
RUN_WAIT_PCT = 10.0  # % of the window this process's threads spent waiting for a CPU
STEAL_PCT = 5.0  # % of the window's CPU time stolen by the hypervisor
CLOCK_SLACK = 0.10  # an SM clock this far below the application clock
# NVML's clock-event reason bits (nvmlClocksEventReason*), by the names rows record. The first three say the GPU is
# idle, held to its application clocks, or at its software power cap: what the case does itself, not contention.
CLOCK_EVENTS: tuple[tuple[int, str], ...] = (
    (0x001, "gpu_idle"),
    (0x002, "applications_clocks_setting"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal_slowdown"),
    (0x040, "hw_thermal_slowdown"),
    (0x080, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)
OWN_CLOCK_EVENTS = frozenset({"gpu_idle", "applications_clocks_setting", "sw_power_cap"})
IDLE_CHECK_S = 0.5  # the pre-sweep check's window (the bound: ≤ 1 s)

NvmlLoader = Callable[[], Any]


@dataclass(frozen=True)
class CpuCounters:
    """The host's counters at one end of a window (None where the platform has no such counter)."""

    at_s: float  # time.perf_counter()
    process_cpu_s: float  # this process's user + system time, all threads
    busy_s: float | None  # the machine's busy CPU time, every core this process may use, summed
    total_s: float | None  # the same cores' total CPU time (busy + idle + steal …)
    steal_s: float | None
    run_wait_s: float | None  # summed over this process's threads (schedstat)
    load: float | None  # 1-minute load average


def _run_wait_s() -> float | None:
    """Seconds this process's threads have spent runnable but not running, summed (Linux schedstat, ns)."""
    total = 0
    try:
        tasks = list(Path("/proc/self/task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue  # a thread that ended between the listing and the read
        if len(fields) >= 2:
            total += int(fields[1])
    return total / 1e9 if tasks else None


def read_cpu() -> CpuCounters:
    """The counters now; psutil's failures (or absence) leave the machine-wide figures None."""
    at = time.perf_counter()
    times = os.times()
    busy = total = steal = None
    try:
        import psutil

        per_core = psutil.cpu_times(percpu=True)
        with contextlib.suppress(AttributeError, OSError):
            cores = sorted(os.sched_getaffinity(0))
            if all(i < len(per_core) for i in cores):
                per_core = [per_core[i] for i in cores]
        total = sum(sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0) for t in per_core)
        idle = sum(t.idle + getattr(t, "iowait", 0.0) for t in per_core)
        steal = sum(getattr(t, "steal", 0.0) for t in per_core)
        busy = total - idle - steal
    except (ImportError, OSError):
        pass
    load = None
    with contextlib.suppress(OSError, AttributeError):
        load = os.getloadavg()[0]
    return CpuCounters(at, times.user + times.system, busy, total, steal, _run_wait_s(), load)


def logical_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class GpuReading:
    """What NVML says about the device at one moment: other compute processes and the SM clocks."""

    others: int | None = None
    sm_clock_mhz: float | None = None
    app_clock_mhz: float | None = None
    events: tuple[str, ...] | None = None  # NVML's clock-event reasons (CLOCK_EVENTS names); None: unknown


def clock_events(mask: int) -> tuple[str, ...]:
    """The names of the reason bits set in an NVML clock-event mask."""
    return tuple(name for bit, name in CLOCK_EVENTS if mask & bit)


def read_gpu(nvml: Any, handle: Any) -> GpuReading:
    """Other compute processes on the device and its SM clocks; what NVML refuses stays None.

    NVML lists processes by their pid in the host's namespace: inside a container our own pid is not among them,
    and then one of the listed processes is taken to be ours."""
    others: int | None = None
    with contextlib.suppress(nvml.NVMLError):
        pids = {int(p.pid) for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
        ours = {os.getpid(), os.getppid()} & pids
        others = len(pids - ours) if ours else max(0, len(pids) - 1)
    sm = app = None
    with contextlib.suppress(nvml.NVMLError):
        sm = float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
    with contextlib.suppress(nvml.NVMLError):
        app = float(nvml.nvmlDeviceGetClock(handle, nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_ID_APP_CLOCK_TARGET)) or None
    events = None
    # "Clocks event reasons" is the current name (driver 535+); older drivers only know the "throttle" one.
    for name in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
        reader = getattr(nvml, name, None)
        if reader is not None:
            with contextlib.suppress(nvml.NVMLError):
                events = clock_events(int(reader(handle)))
                break
    return GpuReading(others, sm, app, events)


def judge(
    start: CpuCounters,
    end: CpuCounters,
    threads: int,
    cores: int,
    gpu: GpuReading | None = None,
    *,
    own_busy: bool = True,
) -> Contention:
    """The rules of the module docstring applied to one window. ``own_busy`` False (the pre-sweep check, where
    this process sleeps) counts every busy core as someone else's and skips the run-queue rule."""
    window = max(end.at_s - start.at_s, 1e-9)
    own_s = max(0.0, end.process_cpu_s - start.process_cpu_s)
    reasons: list[str] = []
    others = steal_pct = wait_pct = None
    if None not in (start.busy_s, end.busy_s):
        busy = end.busy_s - start.busy_s  # type: ignore[operator]
        others = max(0.0, busy - own_s) / window
        free = max(0, cores - threads)
        if others > free + OTHERS_SLACK_CORES:
            reasons.append(
                f"other processes kept {others:.1f} of {cores} cores busy while this case's {threads} threads "
                f"needed {min(threads, cores)}"
            )
    if None not in (start.steal_s, end.steal_s, start.total_s, end.total_s):
        total = end.total_s - start.total_s  # type: ignore[operator]
        steal_pct = 100 * (end.steal_s - start.steal_s) / total if total > 0 else 0.0  # type: ignore[operator]
        if steal_pct >= STEAL_PCT:
            reasons.append(f"the hypervisor stole {steal_pct:.0f} % of the CPU time")
    if own_busy and start.run_wait_s is not None and end.run_wait_s is not None:
        wait_pct = 100 * max(0.0, end.run_wait_s - start.run_wait_s) / window
        if wait_pct >= RUN_WAIT_PCT:
            # Summed over the case's threads, so two threads that both wait the whole window read 200 %.
            reasons.append(f"this case's threads waited for a CPU for {wait_pct:.0f} % of the window (summed)")
    if gpu is not None:
        if gpu.others:
            reasons.append(f"{gpu.others} other process{'es' if gpu.others > 1 else ''} computed on the GPU")
        sm, app = gpu.sm_clock_mhz, gpu.app_clock_mhz
        blamed = [e for e in gpu.events or () if e not in OWN_CLOCK_EVENTS]
        if sm is not None and app and sm < app * (1 - CLOCK_SLACK) and blamed:
            reasons.append(
                f"the SM clock ran at {sm:.0f} MHz, below the application clock {app:.0f} MHz "
                f"(NVML: {', '.join(blamed)})"
            )
    return Contention(
        contended=bool(reasons),
        reasons=tuple(reasons),
        window_s=window,
        threads=threads,
        logical_cores=cores,
        cpu_share=own_s / window if own_busy else None,
        others_cores=others,
        load_start=start.load,
        load_end=end.load,
        steal_pct=steal_pct,
        run_wait_pct=wait_pct,
        gpu_processes=None if gpu is None else gpu.others,
        sm_clock_mhz=None if gpu is None else gpu.sm_clock_mhz,
        app_clock_mhz=None if gpu is None else gpu.app_clock_mhz,
        clock_events=None if gpu is None else gpu.events,
    )


class _Nvml:
    """NVML opened for one device, or nothing (a CPU run, no driver, no pynvml): readings are then None."""

    def __init__(self, device: str, nvml: NvmlLoader | None) -> None:
        self.nvml: Any = None
        self.handle: Any = None
        if device == "cpu" or nvml is None:
            return
        from attnbench.host.sensors.faults import TelemetryUnavailable
        from attnbench.host.sensors.identity import cuda_identity
        from attnbench.host.sensors.nvml import nvml_handle_for

        try:
            module = nvml()
            module.nvmlInit()
        except Exception:  # no pynvml, no driver: the GPU rules are skipped, the CPU ones still apply
            return
        try:
            identity = cuda_identity(device)
            self.handle = nvml_handle_for(identity.uuid, identity.pci_bus_id, module)
            self.nvml = module
        except (TelemetryUnavailable, module.NVMLError):
            with contextlib.suppress(Exception):
                module.nvmlShutdown()

    def read(self) -> GpuReading | None:
        return None if self.nvml is None else read_gpu(self.nvml, self.handle)

    def close(self) -> None:
        if self.nvml is not None:
            with contextlib.suppress(Exception):
                self.nvml.nvmlShutdown()
            self.nvml = None


def _default_nvml() -> Any:
    from attnbench.host.sensors.nvml import load_nvml

    return load_nvml()


class ContentionWatch:
    """Reads the counters when a case's timed window opens and closes; ``result`` judges it.

    NVML is opened (and the device found) in ``__init__``, outside the window."""

    def __init__(self, device: str, threads: int, *, nvml: NvmlLoader | None = _default_nvml) -> None:
        self.threads = threads
        self.cores = logical_cores()
        self._gpu = _Nvml(device, nvml)
        self._start: CpuCounters | None = None
        self._end: CpuCounters | None = None
        self._gpu_reading: GpuReading | None = None

    def __enter__(self) -> ContentionWatch:
        self._start = read_cpu()
        return self

    def __exit__(self, *exc: object) -> None:
        self._end = read_cpu()
        try:
            # At the end, while the GPU is still warm from the samples: an idle GPU drops its clocks.
            self._gpu_reading = self._gpu.read()
        finally:
            self._gpu.close()

    @property
    def done(self) -> bool:
        return self._end is not None

    def result(self) -> Contention:
        if self._start is None or self._end is None:
            raise RuntimeError("result() is available once the watch has exited")
        return judge(self._start, self._end, self.threads, self.cores, self._gpu_reading)


def busy_now(
    device: str, threads: int, *, seconds: float = IDLE_CHECK_S, nvml: NvmlLoader | None = _default_nvml
) -> Contention:
    """Is the machine already busy? This process sleeps ``seconds`` while the counters run; every busy core in
    that time is another process's. The sweep's own threads are what ``threads`` says it will ask for."""
    gpu = _Nvml(device, nvml)
    try:
        start = read_cpu()
        time.sleep(seconds)
        end = read_cpu()
        reading = gpu.read()
    finally:
        gpu.close()
    return judge(start, end, threads, logical_cores(), reading, own_busy=False)


def wait_for_idle(
    device: str,
    threads: int,
    wait_s: float,
    *,
    on_busy: Callable[[Contention, float], None] | None = None,
    nvml: NvmlLoader | None = _default_nvml,
    clock: Callable[[], float] = time.monotonic,
) -> Contention:
    """``busy_now`` until the machine is quiet or ``wait_s`` has passed; the last reading. ``on_busy`` hears each
    busy reading with the seconds left (the CLI's "waiting for quiet" line)."""
    deadline = clock() + wait_s
    while True:
        reading = busy_now(device, threads, nvml=nvml)
        left = deadline - clock()
        if not reading.contended or left <= 0:
            return reading
        if on_busy is not None:
            on_busy(reading, left)
        time.sleep(min(1.0, left))
