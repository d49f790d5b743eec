"""The interface for models you bring, versioned (``API_VERSION``); README "Benchmark your own model" shows it.

- ``ModelRequest``: what a factory is called with (the case's device, dtype, sizes and options).
- ``ModelPlugin``: what an entry point of the ``attnbench.models`` group names, for an installed package; its
  ``api_version`` says which version of this interface it was written for, and its options are ``Option``s.
- The decode protocol a module may also implement, to run in ``mode: decode``: ``Decodable`` (``init_state``,
  ``prefill``, ``step``) and its ``DecodeState`` (``tensors``, ``advance``; ``drop_scratch`` too where the state
  holds buffers only a step needs: ``DropsScratch``).
- The serving protocols (API 3), each optional: ``Verifiable`` (``verify``, ``rollback``) for ``mode: verify``,
  ``Packable`` (``packed``) for packed lengths, and a state that is ``Resettable`` (emptied before a timed prefill)
  or ``Fillable`` (made to stand in for n tokens in ``mode: capacity``).
- ``Referenced`` (``reference``, optional): a slow form of the module's function that the numerical check holds its
  output to, in float64, before the case is timed (without it the row's check is ``unchecked``).

Torch-free: a plugin's spec module imports this and stays light.
"""

from __future__ import annotations

from attnbench.families.plugins import (
    API_VERSION,
    ENTRY_POINT_GROUP,
    Decodable,
    DecodeState,
    DropsScratch,
    Fillable,
    ModelPlugin,
    ModelRequest,
    Option,
    Packable,
    Referenced,
    Resettable,
    Verifiable,
)

__all__ = [
    "API_VERSION",
    "ENTRY_POINT_GROUP",
    "Decodable",
    "DecodeState",
    "DropsScratch",
    "Fillable",
    "ModelPlugin",
    "ModelRequest",
    "Option",
    "Packable",
    "Referenced",
    "Resettable",
    "Verifiable",
]
