"""Where torch lives: models, devices and clocks, the timing loop, memory and hardware telemetry, the executors
(in-process, isolated, replicated), the sweep that turns cases into rows on disk, and the ceilings and selfcheck
measurements. Never prints, exits or handles signals: progress goes out through ``events``. Imports ``core``,
``config`` and ``results``."""

import os

# Kineto (torch.profiler: the probes' operator names, the kernel counts) writes a "USDT: profiler_start" and a
# "profiler_stop" line to stderr around every profile from torch 2.13 on: noise between a sweep's progress lines.
# 6 is above every level it logs at; read once, when torch loads, so it is set here, before any module of this
# room imports torch. A user's own setting wins.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")
