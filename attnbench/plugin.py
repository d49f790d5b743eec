"""The interface for models you bring, versioned (``API_VERSION``); README "Benchmark your own model" shows it.

- ``ModelRequest``: what a factory is called with (the case's device, dtype, sizes and options).
- ``ModelPlugin``: what an entry point of the ``attnbench.models`` group names, for an installed package; its
  ``api_version`` says which version of this interface it was written for, and its options are ``Option``s.
- The decode protocol a module may also implement, to run in ``mode: decode``: ``Decodable`` (``init_state``,
  ``prefill``, ``step``) and its ``DecodeState`` (``tensors``, ``advance``; ``drop_scratch`` too where the state
  holds buffers only a step needs: ``DropsScratch``).

Torch-free: a plugin's spec module imports this and stays light.
"""

from __future__ import annotations

from attnbench.families.plugins import (
    API_VERSION,
    ENTRY_POINT_GROUP,
    Decodable,
    DecodeState,
    DropsScratch,
    ModelPlugin,
    ModelRequest,
    Option,
)

__all__ = [
    "API_VERSION",
    "ENTRY_POINT_GROUP",
    "Decodable",
    "DecodeState",
    "DropsScratch",
    "ModelPlugin",
    "ModelRequest",
    "Option",
]
