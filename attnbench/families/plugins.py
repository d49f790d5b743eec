"""The interface a model you bring is written against, torch-free: ``attnbench.plugin`` re-exports it for users.

Versioned (``API_VERSION``): a field is only ever added, with a default, and a change that could break a factory
written against an earlier version raises the version and is listed in CHANGELOG.md.

- A **factory** (``module.path:function``) is called with one ``ModelRequest`` and returns a ``torch.nn.Module``
  that maps (batch, seq_len, d_model) to the same shape, on ``request.device`` in ``request.torch_dtype``. A module
  that also has ``init_state(batch, capacity)``, ``prefill(x, state, *, output=True)`` and ``step(x, state)`` (the
  decode protocol of ``attnbench.families.states``) runs in ``mode: decode``; its state's ``tensors()``
  are measured as the row's ``state_mem_bytes``.
- A **plugin** is an installed distribution with an entry point in the group ``attnbench.models`` whose name is
  the model's name and whose object is a ``ModelPlugin``: ``my-rnn = "mypkg.spec:MY_RNN"``. Keep that module free
  of torch, so ``attnbench validate`` and ``attnbench models`` stay fast: the factory it names is imported only to
  build the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attnbench.core.cases import Kind, OptionValue

API_VERSION = 1
ENTRY_POINT_GROUP = "attnbench.models"


@dataclass(frozen=True)
class ModelPlugin:
    """One model an installed package registers: the factory that builds it, which side of the comparison it joins,
    a line for ``attnbench models`` and its options with their defaults (a config's ``model_options`` may set them;
    the type of each default is the type the option takes)."""

    factory: str
    kind: Kind
    summary: str = ""
    options: Mapping[str, OptionValue] = field(default_factory=dict)
    api_version: int = API_VERSION


@dataclass(frozen=True)
class ModelRequest:
    """What a factory is called with: one case's sizes and options, and where to build.

    ``mode`` is forward, train, backward or decode (for decode, ``seq_len`` is the context length n, and the state
    must hold n + 1 positions). ``options`` holds every option of the entry (a plugin's defaults filled in).
    ``torch_dtype`` is the ``torch.dtype`` named by ``dtype``."""

    name: str
    mode: str
    device: str
    dtype: str
    torch_dtype: Any
    batch: int
    seq_len: int
    d_model: int
    heads: int
    layers: int
    causal: bool
    options: Mapping[str, OptionValue]
    api_version: int = API_VERSION
