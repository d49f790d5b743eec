"""The interface for models you bring, versioned (``API_VERSION``); README "Benchmark your own model" shows it.

- ``ModelRequest``: what a factory is called with (the case's device, dtype, sizes and options).
- ``ModelPlugin``: what an entry point of the ``attnbench.models`` group names, for an installed package.
- The decode protocol a module may also implement, to run in ``mode: decode``: ``init_state(batch, capacity)``,
  ``prefill(x, state, *, output=True)`` and ``step(x, state)``; the state has ``tensors()`` and ``advance()``.

Torch-free: a plugin's spec module imports this and stays light.
"""

from __future__ import annotations

from attnbench.families.plugins import API_VERSION, ENTRY_POINT_GROUP, ModelPlugin, ModelRequest

__all__ = ["API_VERSION", "ENTRY_POINT_GROUP", "ModelPlugin", "ModelRequest"]
