"""One side of ``attnbench ab``: the isolated worker, run by another Python environment's interpreter.

``PYTHON -m attnbench.cli.side_worker FD`` (the runner that gives ``main``'s code to the process) — FD is one end
of a socket pair the parent made and handed down; over it the worker speaks ``isolated_executor``'s pipe protocol
after a short prelude:

1. the parent sends the settings as plain values (``settings_to_dict``), so that two versions of attnbench read
   them alike (a pickled ``ExecutorSettings`` of one version need not unpickle in the other);
2. the worker answers ``("environment", environment, code)``: what this side's run.json records, collected here,
   in the environment under test (its torch, its packages, the checkout its attnbench was installed from), or
   ``("failed", why)``;
3. then ``isolated_executor._worker`` itself: ``("ready", threads)``, and a row for each case it is sent.

``ATTNBENCH_INJECT_SLOWDOWN`` (a fraction, CPU only) in this process's environment slows every timed call of this
side by that fraction — what ``sweep``'s hidden ``--inject-slowdown`` does (``timing.adaptive``: a busy-wait of that
fraction of the warm-up's fastest call inside every timed call, recorded as the row's ``injected_delay_s``). A
wrapper script given as ``--head-python`` that sets it makes a known regression (tests, ``scripts/ab_power.py``).
"""

from __future__ import annotations

import math
import multiprocessing.connection
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnbench.core.cases import TimingPolicy
from attnbench.timing.executor import ExecutorSettings

INJECT_ENV = "ATTNBENCH_INJECT_SLOWDOWN"
MAX_INJECTED = 10.0  # as sweep's --inject-slowdown


def settings_to_dict(settings: ExecutorSettings) -> dict[str, Any]:
    """What a side worker needs of the settings, as plain values (profiling options stay in ``sweep``)."""
    return {
        "device": settings.device,
        "timing": settings.timing.to_dict(),
        "seed": settings.seed,
        "threads": settings.threads,
        "timeout_s": settings.timeout_s,
        "telemetry": settings.telemetry,
        "telemetry_interval_s": settings.telemetry_interval_s,
    }


def settings_from_dict(data: dict[str, Any]) -> ExecutorSettings:
    timing = data["timing"]
    return ExecutorSettings(
        device=data["device"],
        timing=TimingPolicy.from_dict(timing) if isinstance(timing, dict) else TimingPolicy(),
        seed=data["seed"],
        threads=data["threads"],
        timeout_s=data["timeout_s"],
        telemetry=data["telemetry"],
        telemetry_interval_s=data["telemetry_interval_s"],
    )


def injected_slowdown(device: str, environ: dict[str, str] | None = None) -> float:
    """The fraction ``ATTNBENCH_INJECT_SLOWDOWN`` asks for (0 when unset). Raises ValueError saying what is allowed."""
    text = (os.environ if environ is None else environ).get(INJECT_ENV, "").strip()
    if not text:
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0.0 <= value <= MAX_INJECTED:
        raise ValueError(f"{INJECT_ENV}={text!r}: not a fraction from 0 to {MAX_INJECTED:g} (0.25 slows by 25 %)")
    if value and not device.startswith("cpu"):
        raise ValueError(f"{INJECT_ENV} busy-waits on the host, which does not slow work queued on {device}")
    return value


def _prelude(conn: multiprocessing.connection.Connection) -> ExecutorSettings | None:
    """Steps 1 and 2 of the module notes: the settings in, this side's environment out (None: it failed, and the
    parent was told why)."""
    try:
        settings = settings_from_dict(conn.recv())
        settings = replace(settings, inject_slowdown=injected_slowdown(settings.device))
        from attnbench.host.devices import use_threads
        from attnbench.host.inventory import code_identity, collect_environment

        use_threads(settings.threads)  # before the environment records the count
        environment = collect_environment(settings.device).to_dict()
        code = code_identity(Path(__file__).resolve().parent.parent)  # the checkout attnbench was installed from
    except Exception as exc:  # whatever this environment cannot do is the parent's to report, as one line
        lines = str(exc).strip().splitlines()
        conn.send(("failed", f"{type(exc).__name__}: {lines[0] if lines else ''}".strip()))
        return None
    conn.send(("environment", environment, None if code is None else code.to_dict()))
    return settings


def main(argv: list[str]) -> int:
    """Serve the socket whose descriptor is ``argv[0]``; returns 0, or 1 when this side could not start (the parent
    has been told why)."""
    from attnbench.sweeps.isolated_executor import _worker

    conn = multiprocessing.connection.Connection(int(argv[0]))
    settings = _prelude(conn)
    if settings is None:
        return 1
    _worker(conn, settings)
    return 0
