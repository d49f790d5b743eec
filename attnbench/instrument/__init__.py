"""Checks of the instrument itself: the machine's ceilings (``ceilings``) and between-process noise (``noise``)
for ``attnbench calibrate``, and the timing half of ``attnbench selfcheck`` (``agreement``). Imports ``core``,
``families``, ``results``, ``host``, ``timing`` and ``sweeps``."""
