"""Each case in a worker process, so a segfault, a hang or an OOM kill costs one row, not the sweep.

The worker is a spawned Python (fork after torch or CUDA initialised is unsafe) that imports torch once and
then runs cases sent over a pipe until it dies; the next case gets a fresh one. The parent only sees a result,
an end-of-file (the worker died: ``crashed``, or ``oom`` when the kernel's OOM killer fired) or silence past
the case's timeout (``timeout``; the worker is killed). A result that says the CUDA context is broken retires
the worker too, so one illegal memory access does not turn every later case into an error.

The pipe, per case: the parent sends the case; the worker answers ``("timed", row)`` as soon as a row has its
timing and memory, then ``("result", row, retire)`` once the profiled call has added its kernel counts (a
failed case sends only the latter). The profile gets ``PROFILE_BUDGET_S`` of its own: a profile that hangs or
kills the worker costs the row its kernel counts, never the timing it already has. ``retire`` is the worker's
own word that its CUDA context is unusable.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import multiprocessing as mp
import multiprocessing.connection
import os
import signal
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

from attnbench.core.cases import Case
from attnbench.results.records import Result
from attnbench.timing.executor import ExecutorSettings, detach_cupti_after_profiling

WorkerMain = Callable[[multiprocessing.connection.Connection, ExecutorSettings, Mapping[str, str] | None], None]


class WorkerProcess(Protocol):
    """What the executor needs of a worker process: a multiprocessing ``Process``, or ``ab``'s subprocess."""

    @property
    def pid(self) -> int | None: ...

    @property
    def exitcode(self) -> int | None: ...

    def is_alive(self) -> bool: ...

    def kill(self) -> None: ...

    def join(self, timeout: float | None = None) -> None: ...


_PR_SET_PDEATHSIG = 1  # from <sys/prctl.h>
PROFILE_BUDGET_S = 60.0  # after the timed row, at most this long (or the case timeout) for the profiled call
_START_TIMEOUT_S = 300.0  # importing torch on a cold, busy machine can take a minute
_CGROUP_EVENTS = (Path("/sys/fs/cgroup/memory.events"), Path("/sys/fs/cgroup/memory/memory.oom_control"))
# Failures after which every later kernel in the same process fails too.
_CONTEXT_POISON_MARKERS = ("CUDA error", "device-side assert", "illegal memory access")


class WorkerStartError(Exception):
    """The worker process could not be started; the case it was for becomes a ``crashed`` row. ``device``: it
    started but could not use its device (a pool retires that device at once)."""

    def __init__(self, message: str, *, device: bool = False) -> None:
        super().__init__(message)
        self.device = device


def poisons_context(result: Result) -> bool:
    return result.status == "error" and any(marker in result.reason for marker in _CONTEXT_POISON_MARKERS)


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass  # not Linux: the parent's close() still kills us on every path it controls


def _worker(
    conn: multiprocessing.connection.Connection, settings: ExecutorSettings, env: Mapping[str, str] | None = None
) -> None:
    # Ctrl-C, and a SIGTERM sent to the whole process group (a CI runner, Slurm), reach us too; what they mean
    # is the parent's decision. If the parent dies without killing us, the kernel does (Linux).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    # Before torch is imported: CUDA reads CUDA_VISIBLE_DEVICES once, when it initialises (a pinned worker), and
    # kineto reads TEARDOWN_CUPTI when a profile starts and stops.
    os.environ.update(env or {})
    detach_cupti_after_profiling()
    try:
        import torch

        from attnbench.timing.torch_executor import TorchExecutor

        executor = TorchExecutor(settings)  # sets torch's threads from the settings before anything runs
        if settings.device.startswith("cuda"):
            # Touch the device now: one that has fallen off the bus, or is not there, fails here, not as a case.
            torch.zeros(1, device=settings.device).add_(1).item()
    except Exception as exc:  # the worker cannot use its device: the parent decides what that means
        lines = str(exc).strip().splitlines()
        conn.send(("failed", f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()))
        return
    conn.send(("ready", torch.get_num_threads()))

    def timed(result: Result) -> None:
        conn.send(("timed", result.to_dict(include_raw=True)))

    while True:
        message = conn.recv()
        if message is None:
            return
        result = executor.run(Case.from_dict(message), on_timed=timed)
        conn.send(("result", result.to_dict(include_raw=True), bool(executor.broken)))


def oom_kills() -> int | None:
    """The cgroup's count of OOM kills so far, or None where the kernel does not say."""
    for path in _CGROUP_EVENTS:
        try:
            for line in path.read_text().splitlines():
                name, _, value = line.partition(" ")
                if name == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class IsolatedExecutor:
    """Same contract as ``TorchExecutor.run``, one worker process at a time."""

    def __init__(
        self, settings: ExecutorSettings, env: Mapping[str, str] | None = None, *, worker_main: WorkerMain = _worker
    ) -> None:
        """``worker_main`` is what the spawned process runs: ``_worker``, or a stand-in speaking the same pipe
        protocol (the process boundary is the seam tests use)."""
        self.settings = settings
        self.env = dict(env or {})  # set in each worker before torch is imported (CUDA_VISIBLE_DEVICES)
        self.timeout_s = settings.timeout_s
        self._worker_main = worker_main
        self._context = mp.get_context("spawn")
        self._process: WorkerProcess | None = None
        self._conn: multiprocessing.connection.Connection | None = None
        self.workers_started = 0
        self.start_failures = 0  # workers that could not start: what a pool counts against a device
        self.device_failures = 0  # of those, workers that started but could not use the device

    @property
    def worker_pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def _spawn(self) -> tuple[WorkerProcess, multiprocessing.connection.Connection]:
        """A new worker process and our end of its pipe; the worker answers ``ready`` or ``failed`` first. The
        seam ``ab``'s side executor replaces, to start the worker in another Python environment."""
        parent, child = self._context.Pipe()
        process = self._context.Process(
            target=self._worker_main,
            args=(child, self.settings, self.env),
            name="attnbench-worker",
            daemon=True,
        )
        process.start()
        child.close()
        return process, parent

    def start(self) -> None:
        """Start a worker now (``run`` starts one when there is none). Raises WorkerStartError."""
        process, parent = self._spawn()
        self._process, self._conn = process, parent
        self.workers_started += 1
        if not parent.poll(_START_TIMEOUT_S):
            self._kill()
            raise WorkerStartError(f"the worker process did not start within {_START_TIMEOUT_S:.0f} s")
        try:
            status, detail = parent.recv()
        except EOFError:
            process.join(5)
            code = process.exitcode
            self._kill()
            raise WorkerStartError(
                f"the worker process died while starting (exit code {code}); --no-isolate shows why"
            ) from None
        if status == "failed":
            self._kill()
            pinned = "".join(f" ({k}={v})" for k, v in self.env.items() if k == "CUDA_VISIBLE_DEVICES")
            raise WorkerStartError(f"the worker could not use {self.settings.device}{pinned}: {detail}", device=True)

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
        if self._process is not None:
            self._process.join(5)
        if self._conn is not None:
            self._conn.close()
        self._process, self._conn = None, None

    def run(self, case: Case) -> Result:
        if self._process is None or not self._process.is_alive():
            self._kill()
            try:
                self.start()
            except WorkerStartError as exc:
                self.start_failures += 1
                self.device_failures += exc.device
                return Result(case, "crashed", str(exc))
        assert self._conn is not None and self._process is not None
        kills_before = oom_kills()
        t0 = time.perf_counter()
        try:
            self._conn.send(case.to_dict())
            if not self._conn.poll(self.timeout_s):
                self._kill()
                return Result(
                    case,
                    "timeout",
                    f"still running after {self.timeout_s:g} s (case_timeout_s); the worker was killed",
                    duration_s=time.perf_counter() - t0,
                )
            message = self._conn.recv()
        except (EOFError, BrokenPipeError, ConnectionResetError):
            return self._died(case, kills_before, time.perf_counter() - t0)
        if message[0] == "timed":
            timed = self._read(case, message[1])
            if not timed.ok:  # a row that does not read back: nothing worth waiting for
                self._kill()
                return timed
            message = self._after_timing(timed)
            if isinstance(message, Result):
                return message
        result = self._read(case, message[1])
        if (len(message) > 2 and message[2]) or poisons_context(result):
            self._kill()
        return result

    @staticmethod
    def _read(case: Case, payload: Any) -> Result:
        try:
            return Result.from_dict(payload)
        except (ValueError, KeyError, TypeError) as exc:  # a bug of ours: one row, not the sweep
            return Result(case, "error", f"the worker sent a result that does not read back: {exc}")

    def _after_timing(self, timed: Result) -> tuple[Any, ...] | Result:
        """The worker's final message, or the timed row itself when the profile outran its budget or killed
        the worker (said in ``profile_error``; the worker is retired)."""
        assert self._conn is not None and self._process is not None
        budget = min(PROFILE_BUDGET_S, self.timeout_s)
        try:
            if self._conn.poll(budget):
                message: tuple[Any, ...] = self._conn.recv()
                return message
            why = f"the profiled call had not finished {budget:g} s after the timing; the worker was retired"
        except (EOFError, BrokenPipeError, ConnectionResetError):
            self._process.join(5)
            why = f"the worker died during the profiled call (exit code {self._process.exitcode})"
        self._kill()
        return replace(timed, extra={**timed.extra, "profile_error": why})

    def _died(self, case: Case, kills_before: int | None, elapsed: float) -> Result:
        assert self._process is not None
        self._process.join(5)
        code = self._process.exitcode
        self._kill()
        kills_after = oom_kills()
        if kills_before is not None and kills_after is not None and kills_after > kills_before:
            reason = (
                f"the worker was killed by the kernel's OOM killer (cgroup oom_kill {kills_before} → {kills_after})"
            )
            return Result(case, "oom", reason, duration_s=elapsed)
        if code is not None and code < 0:
            name = _signal_name(code)
            hint = " (possibly the kernel's OOM killer)" if name == "SIGKILL" else ""
            return Result(case, "crashed", f"the worker was killed by {name}{hint}", duration_s=elapsed)
        return Result(case, "crashed", f"the worker exited with code {code}", duration_s=elapsed)

    def kill_worker(self) -> None:
        """SIGKILL the worker process now, from any thread or a signal handler, and nothing else: the thread
        running its case sees the worker die and does the bookkeeping (a pool stopping its workers)."""
        process = self._process
        if process is not None and process.pid is not None and process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):  # it died on its own meanwhile
                os.kill(process.pid, signal.SIGKILL)

    def close(self, *, now: bool = False) -> None:
        """Stop the worker: politely between cases, at once (``now``) when a case may still be running."""
        if not now and self._conn is not None and self._process is not None and self._process.is_alive():
            try:
                self._conn.send(None)
                self._process.join(10)
            except (BrokenPipeError, OSError):
                pass
        self._kill()
