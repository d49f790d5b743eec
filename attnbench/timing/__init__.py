"""Timing one case: the ``Executor`` protocol (``executor``), the in-process executor that builds, sets up, times
and measures a case (``torch_executor``), the adaptive timing loop (``adaptive``), device clocks and GPU aids, peak
memory, torch.compile around a call, a decode case's set-up (``decode_setup``), the process warm-up and traces for
external profilers. Never prints or exits. Imports ``core``, ``families``, ``results`` and ``host``."""
