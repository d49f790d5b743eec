"""Where torch lives: models, devices and clocks, the timing loop, memory and hardware telemetry, the executors
(in-process, isolated, replicated), the sweep that turns cases into rows on disk, and the ceilings and selfcheck
measurements. Never prints, exits or handles signals: progress goes out through ``events``. Imports ``core``,
``config`` and ``results``."""
