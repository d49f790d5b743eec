"""How a process that times cases on a CPU has its thread pool wait for work, set before torch loads.

oneDNN's RNNs and many of torch's CPU kernels synchronise their OpenMP threads at every step or op. With libgomp's
default (``OMP_WAIT_POLICY`` unset: spin a while, then sleep), a thread that goes to sleep between two parallel
regions pays a futex wake-up at the next, and whether it sleeps depends on how long the serial work between regions
takes against the spin count: on a 2-vCPU VM some fresh processes timed a two-thread LSTM 2.5–3× slower than
others, each consistent within itself (results/README.md, issue 30). Spinning (``ACTIVE``) keeps every process on
the fast path. It is set in the processes that time cases — isolated workers, calibrate's noise processes, and the
sweep's own process when it times in-process — and in no process that idles beside them: a spinning thread in a
parent waiting on its workers would take a core from them (exporting it to a whole command did exactly that:
±103 % between processes, every timing marked busy). A user's own thread-pool variable wins: none is set then.

What a run's timing processes ran with is recorded (``Environment.thread_env``).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["THREAD_ENV_PREFIXES", "TIMING_THREAD_ENV", "timing_env", "user_thread_env"]

# Prefixes of the variables that steer the CPU thread pools torch uses (OpenMP, Intel's and LLVM's runtimes, MKL,
# oneDNN): ``Environment.thread_env``.
THREAD_ENV_PREFIXES = ("OMP_", "GOMP_", "KMP_", "MKL_", "DNNL_", "ONEDNN_")
# What a CPU timing process gets by default. Not OMP_WAIT_POLICY=ACTIVE: on a machine with any other load a spinning
# thread holds its core while the thread it waits for is descheduled, and a two-thread LSTM step went from 0.15 ms
# to 300 ms (results/stability-cpu.md). libgomp's own default (spin about 3 ms, then sleep) stays.
TIMING_THREAD_ENV: Mapping[str, str] = {}


def user_thread_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The thread-pool variables the user set (this process's environment by default)."""
    found = os.environ if environ is None else environ
    return {k: v for k, v in found.items() if k.startswith(THREAD_ENV_PREFIXES)}


def timing_env(device: str, threads: int | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """What a process that times cases on ``device`` with ``threads`` torch threads (None: torch's default, one per
    core) starts with, before torch loads: ``TIMING_THREAD_ENV`` on a CPU with more than one thread, unless the
    user set a thread-pool variable of their own (then nothing: theirs is what the process runs with)."""
    if not device.startswith("cpu") or threads == 1 or user_thread_env(environ):
        return {}
    return dict(TIMING_THREAD_ENV)
