"""One isolated worker per device on one machine (``sweep --devices cuda:0,cuda:1`` or ``--devices all``).

Each device gets one ``IsolatedExecutor`` (wrapped in a ``ReplicatedExecutor`` for ``timing.processes`` > 1),
pinned to it with ``CUDA_VISIBLE_DEVICES`` so that the worker sees its GPU as ``cuda:0`` and nothing else. A
thread per device feeds its worker one case at a time; the calling thread deals the cases from one queue, in
the config's order, to whichever device is free, and is the single writer: every ``on_result`` (the row appended
to the run folder, the listener told) happens there, the moment a case ends.

The comparability rule (ARCHITECTURE.md, "Beyond one machine"):

* a case — with all its ``timing.processes`` replicates — runs on exactly one device, so a row's spread is never
  a mix of devices; the row records that device (``case.device``, in the machine's own numbering: ``cuda:3``);
* the devices of one sweep must be the same hardware (GPU name, memory, compute capability): a curve whose
  lengths ran on two devices is then one curve. A mix is refused unless ``--allow-mixed-devices``, and the rows
  still say where each case ran.

A device is **retired** when its worker starts but cannot use it (a GPU that fell off the bus, or is not there),
or when it fails twice in a row — a worker that cannot start, a case that breaks the CUDA context — so that one
OOM-killed start-up or one faulty kernel does not cost a healthy GPU. The case it held becomes a ``crashed`` row
naming the device, and the other devices take the remaining cases. When every
device is retired the pool stops and says so (``DevicesFailedError``); the cases left are not run and a resume
finishes them.

Stopping (Ctrl-C, SIGTERM, a full disk): the workers are killed, the cases in flight are abandoned, and rows that
finished before the stop are still handed to ``on_result``. ``abort`` is safe from a signal handler.

The worker processes are started by the device threads, so their parent-death signal (``PR_SET_PDEATHSIG``) is
tied to those threads: they are killed when the pool's threads end, and with the process on ``os._exit``.
"""

from __future__ import annotations

import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from attnbench.core.cases import DEVICE_REQUEST, Case
from attnbench.core.errors import EXIT_CASE_FAILED, DeviceError
from attnbench.host.devices import resolve_device
from attnbench.results.records import Result
from attnbench.sweeps.isolated_executor import IsolatedExecutor, poisons_context
from attnbench.sweeps.loop import OomSkipper
from attnbench.sweeps.replicated_executor import ReplicatedExecutor
from attnbench.timing.executor import Executor, ExecutorSettings

FAILURE_LIMIT = 2  # failures in a row (start-ups, broken CUDA contexts) after which the device is retired
_POLL_S = 0.2  # how often the dealing thread wakes while it waits (a signal lands between waits)
_JOIN_S = 15.0  # how long stopping waits for a device thread after its worker was killed


class DevicesFailedError(DeviceError):
    """Every device of a pool was retired while cases were left."""

    exit_code = EXIT_CASE_FAILED


# ------------------------------------------------------------------------------------------- which devices


@dataclass(frozen=True)
class DeviceSet:
    """The devices a pooled sweep runs on, as the machine numbers them, and what is worth a warning."""

    devices: tuple[str, ...]
    warnings: tuple[str, ...] = ()


def _visible_ids() -> list[str] | None:
    """The parent's CUDA_VISIBLE_DEVICES entries (indices, UUIDs or MIG ids), or None when it is unset."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if value is None else [part.strip() for part in value.split(",") if part.strip()]


def _hardware(device: str) -> str:
    import torch

    p = torch.cuda.get_device_properties(int(device.split(":")[1]))
    return f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm {p.major}.{p.minor}"


def resolve_devices(text: str, *, allow_mixed: bool = False) -> DeviceSet:
    """``--devices all`` or ``cuda:0,cuda:1`` (or ``cpu,cpu``) → the devices, each checked to exist here.
    Raises ``DeviceError`` naming the device and what is allowed."""
    if text.strip() == "all":
        import torch

        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            raise DeviceError(
                f"--devices all: no CUDA device here (torch {torch.__version__}, built for CUDA "
                f"{torch.version.cuda or 'none'})",
                hint="on a machine without GPUs, --devices cpu,cpu runs two CPU workers (for tests; they share cores)",
            )
        devices = tuple(f"cuda:{i}" for i in range(torch.cuda.device_count()))
    else:
        names = [part.strip() for part in text.split(",")]
        if not names or any(not name for name in names):
            raise DeviceError(f"--devices {text!r}: an empty device name", hint="e.g. --devices cuda:0,cuda:1 or all")
        for name in names:
            if not DEVICE_REQUEST.fullmatch(name) or name in ("auto", "cuda"):
                raise DeviceError(
                    f"--devices: {name!r} is not a device a worker can be pinned to",
                    hint="name each one: cpu or cuda:N (e.g. --devices cuda:0,cuda:1), or --devices all",
                )
        devices = tuple(resolve_device(name) for name in names)
    kinds = sorted({d.split(":")[0] for d in devices})
    if len(kinds) > 1:
        raise DeviceError(
            f"--devices {text}: mixes {' and '.join(kinds)}; one run measures one kind of device",
            hint="sweep the CPU and the GPUs as two runs",
        )
    repeated = sorted({d for d in devices if devices.count(d) > 1 and d != "cpu"})
    if repeated:
        raise DeviceError(
            f"--devices {text}: {', '.join(repeated)} named twice; two workers on one GPU disturb each other's timings",
            hint="name each GPU once",
        )
    warnings: list[str] = []
    if devices.count("cpu") > 1:
        warnings.append(
            f"{devices.count('cpu')} CPU workers share this machine's cores and memory bandwidth: their timings "
            "disturb each other (use it to test the machinery, or set threads so the workers fit the cores)"
        )
    if kinds == ["cuda"]:
        hardware = {d: _hardware(d) for d in devices}
        if len(set(hardware.values())) > 1:
            listing = "; ".join(f"{d}: {h}" for d, h in hardware.items())
            if not allow_mixed:
                raise DeviceError(
                    f"--devices {text}: the GPUs differ ({listing}); rows of one run must be comparable",
                    hint="name GPUs of one model, or pass --allow-mixed-devices (each row records its device)",
                )
            warnings.append(f"--allow-mixed-devices: the GPUs differ ({listing}); each row records its device")
    return DeviceSet(devices, tuple(warnings))


def worker_placement(device: str) -> tuple[str, dict[str, str]]:
    """The device a worker for ``device`` uses inside its process, and the environment that pins it there:
    ``cuda:3`` → ``cuda:0`` with CUDA_VISIBLE_DEVICES naming the machine's (or the visible list's) fourth GPU."""
    if not device.startswith("cuda"):
        return device, {}
    index = int(device.split(":")[1])
    visible = _visible_ids()
    if visible is not None and index >= len(visible):
        raise DeviceError(f"{device}: CUDA_VISIBLE_DEVICES lists only {len(visible)} device(s)")
    return "cuda:0", {"CUDA_VISIBLE_DEVICES": visible[index] if visible is not None else str(index)}


# ------------------------------------------------------------------------------------------------ the pool


@dataclass(eq=False)
class _Worker:
    device: str  # as the machine numbers it: what the rows record
    isolated: IsolatedExecutor
    executor: Executor  # the isolated one, or replicates of it
    inbox: queue.Queue[tuple[int, Case] | None] = field(default_factory=queue.Queue)
    thread: threading.Thread | None = None
    retired: str = ""  # why, once the device is retired
    failures: int = 0  # start-ups that failed and cases that broke the CUDA context, in a row


class WorkerPool:
    """One isolated worker per device; ``run`` deals cases to them and hands each result over as it ends. The
    caller ``close``s it, as any executor."""

    def __init__(self, settings: ExecutorSettings, devices: Sequence[str]) -> None:
        if not devices:
            raise ValueError("a pool needs at least one device")
        self.workers: list[_Worker] = []
        for device in devices:
            inside, env = worker_placement(device)
            isolated = IsolatedExecutor(replace(settings, device=inside), env)
            processes = settings.timing.processes
            executor: Executor = ReplicatedExecutor(isolated, processes) if processes > 1 else isolated
            self.workers.append(_Worker(device, isolated, executor))
        # (worker, case index, row, how the case went for the device: "", "start" or "device")
        self._done: queue.Queue[tuple[_Worker, int, Result, str]] = queue.Queue()
        self._stopping = threading.Event()

    @property
    def retired(self) -> dict[str, str]:
        return {w.device: w.retired for w in self.workers if w.retired}

    def _serve(self, worker: _Worker) -> None:
        """A device thread: run the cases its inbox receives until told to stop (None)."""
        while True:
            item = worker.inbox.get()
            if item is None or self._stopping.is_set():
                return
            index, case = item
            isolated = worker.isolated
            before = (isolated.start_failures, isolated.device_failures)
            try:
                result = worker.executor.run(case)
            except Exception as exc:  # a bug of ours, or the worker killed under us while stopping: one row
                result = Result(case, "crashed", f"{worker.device}: the worker's thread failed: {exc!r}")
            if self._stopping.is_set():
                return  # the case in flight when the pool stopped is abandoned, as a single worker's is
            trouble = "device" if isolated.device_failures > before[1] else ""
            trouble = trouble or ("start" if isolated.start_failures > before[0] else "")
            self._done.put((worker, index, result, trouble))

    def run(
        self,
        cases: Sequence[Case],
        on_result: Callable[[int, Result], None],
        on_start: Callable[[int, Case], None] | None = None,
        skipper: OomSkipper | None = None,
        on_warning: Callable[[str], None] | None = None,
    ) -> list[Result]:
        """Run every case on some device; ``on_result(index, row)`` is called in this thread as each ends (in the
        order they end). Raises ``DevicesFailedError`` when every device is retired with cases left."""
        pending = deque(enumerate(cases))
        idle = list(self.workers)
        busy: dict[_Worker, tuple[int, Case]] = {}
        results: list[Result] = []

        def finish(index: int, result: Result) -> None:
            if skipper is not None:
                skipper.record(result)
            results.append(result)
            on_result(index, result)

        for worker in self.workers:
            worker.thread = threading.Thread(target=self._serve, args=(worker,), name=f"attnbench-{worker.device}")
            worker.thread.start()
        try:
            while pending or busy:
                while pending and idle:
                    index, case = pending.popleft()
                    if on_start is not None:
                        on_start(index, case)
                    skipped = skipper.skip(case) if skipper is not None else None
                    if skipped is not None:
                        finish(index, skipped)
                        continue
                    worker = idle.pop(0)
                    busy[worker] = (index, case)
                    worker.inbox.put((index, case))
                if not busy:
                    if pending:
                        raise self._all_failed(len(pending))
                    break
                try:
                    worker, index, result, trouble = self._done.get(timeout=_POLL_S)
                except queue.Empty:
                    continue
                del busy[worker]
                result = self._settle(worker, result, trouble, on_warning)
                if not worker.retired:
                    idle.append(worker)
                finish(index, result)
        except BaseException:
            # Ctrl-C, a full disk, a bug: stop every worker, then keep the rows that had already finished.
            self._stop()
            while True:
                try:
                    worker, index, result, trouble = self._done.get_nowait()
                except queue.Empty:
                    break
                finish(index, self._settle(worker, result, trouble, None))
            raise
        return results

    def _settle(
        self, worker: _Worker, result: Result, trouble: str, on_warning: Callable[[str], None] | None
    ) -> Result:
        """The row as stored (it records the device the case ran on), retiring the device if it failed."""
        result = replace(result, case=replace(result.case, device=worker.device))
        failed = trouble != "" or poisons_context(result)
        worker.failures = worker.failures + 1 if failed else 0
        why = ""
        if trouble == "device":
            why = result.reason
        elif worker.failures >= FAILURE_LIMIT:
            why = f"it failed {FAILURE_LIMIT} times in a row (last: {result.reason})"
        if why:
            worker.retired = why
            worker.inbox.put(None)
            if on_warning is not None:
                left = sum(1 for w in self.workers if not w.retired)
                on_warning(f"{worker.device} retired: {why}; {left} device(s) go on")
            result = replace(result, reason=f"{worker.device} retired: {result.reason}")
        return result

    def _all_failed(self, left: int) -> DevicesFailedError:
        listing = "; ".join(f"{device}: {why}" for device, why in self.retired.items())
        return DevicesFailedError(
            f"every device was retired with {left} case(s) left ({listing})",
            hint="check the devices (nvidia-smi), then finish the run with attnbench sweep --resume RUN",
        )

    def _stop(self) -> None:
        """Stop dealing, kill every worker, and wait for the device threads (their cases are abandoned)."""
        self._stopping.set()
        for worker in self.workers:
            worker.inbox.put(None)
        for worker in self.workers:
            thread = worker.thread
            waited = 0.0
            while thread is not None and thread.is_alive() and waited < _JOIN_S:
                worker.isolated.kill_worker()  # again each round: a replicate may have started a fresh one
                thread.join(_POLL_S)
                waited += _POLL_S

    def abort(self) -> None:
        """Kill every worker now (a second Ctrl-C). Safe from a signal handler: it only sends signals."""
        self._stopping.set()
        for worker in self.workers:
            worker.isolated.kill_worker()

    def close(self, *, now: bool = False) -> None:
        """Release the workers: between cases politely, else at once. Their threads end first."""
        if any(w.thread is not None and w.thread.is_alive() for w in self.workers):
            if now:
                self._stop()
            else:
                for worker in self.workers:
                    worker.inbox.put(None)
                for worker in self.workers:
                    if worker.thread is not None:
                        worker.thread.join()
        for worker in self.workers:
            worker.executor.close(now=now)
