"""The interface a model you bring is written against, torch-free: ``attnbench.plugin`` re-exports it for users.

Versioned (``API_VERSION``): a field is only ever added, with a default, and a change that could break a factory
written against an earlier version raises the version and is listed in CHANGELOG.md. A plugin says which version it
was written for (``ModelPlugin.api_version``; a plugin that does not say was written for 1, the version before the
field mattered): attnbench refuses a plugin written for a newer one, naming both, rather than run it half-understood.

- A **factory** (``module.path:function``) is called with one ``ModelRequest`` and returns a ``torch.nn.Module``
  that maps (batch, seq_len, d_model) to the same shape, on ``request.device`` in ``request.torch_dtype``. A module
  that is also ``Decodable`` (``init_state``, ``prefill``, ``step``) runs in ``mode: decode``; the tensors its
  ``DecodeState`` reports are measured as the row's ``state_mem_bytes``, after ``drop_scratch()`` where the state
  has one (``DropsScratch``: buffers only a step needs, which a decoder does not carry between tokens).
- A **plugin** is an installed distribution with an entry point in the group ``attnbench.models`` whose name is
  the model's name and whose object is a ``ModelPlugin``: ``my-rnn = "mypkg.spec:MY_RNN"``. Keep that module free
  of torch, so ``attnbench validate`` and ``attnbench models`` stay fast: the factory it names is imported only to
  build the model. Its options are ``Option``s (type, default, help, choices or bounds, checked as a built-in
  model's are) or, as in API 1, a mapping of names to defaults (the default's type is the option's type).

- The **serving questions** (issue 41) ask more of the same module, each through an optional method: ``mode:
  capacity`` and ``mode: prefill`` need ``Decodable`` (a prefill continues from the state it is given, so a prompt
  may come in chunks); ``mode: verify`` needs ``Verifiable`` (``verify``, ``rollback``); packed lengths need
  ``Packable`` (``packed``). A state may also be ``Resettable`` (a timed prefill empties it rather than allocating a
  new one per call) and ``Fillable`` (a capacity row pretends it holds n tokens rather than computing them). A model
  without the method a question needs is an ``unsupported`` row that says which.
- The **numerical check** holds a module's output to its ``reference`` method where it has one (``Referenced``).

History: 1 — ModelPlugin, ModelRequest, the decode protocol described in prose. 2 — ``api_version`` is checked,
options may be ``Option``s, and the decode protocol is typed here (``Decodable``, ``DecodeState``, ``DropsScratch``).
3 — the serving protocols, all optional: ``Verifiable``, ``Packable``, ``Resettable``, ``Fillable``; ``ModelRequest``
may carry the modes ``capacity``, ``prefill`` and ``verify`` and ``packing`` (the packed lengths). Added since, optional
(nothing a factory written for 3 did changes): ``Referenced`` (``reference``, the numerical check's reference).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from attnbench.core.cases import KINDS, Kind, OptionValue
from attnbench.families.base import OptionSpec

if TYPE_CHECKING:
    import torch

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
    "plugin_options",
    "plugin_problem",
]

API_VERSION = 3
ENTRY_POINT_GROUP = "attnbench.models"
# A plugin's options as the built-in models' are declared: name, type, default, help, choices or bounds.
Option = OptionSpec
# module.path:attribute — what importlib can import and getattr can reach, nothing else.
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
FACTORY = re.compile(f"{_DOTTED}:{_DOTTED}")
OPTION_HELP = "the model's own option, passed to its factory"
_OPTION_TYPES = (bool, int, float, str)


@dataclass(frozen=True)
class ModelPlugin:
    """One model an installed package registers: the factory that builds it, which side of the comparison it joins,
    a line for ``attnbench models``, its options (``Option``s, or a mapping of names to defaults) and the plugin API
    version it was written for."""

    factory: str
    kind: Kind
    summary: str = ""
    options: Mapping[str, OptionValue] | Sequence[OptionSpec] = field(default_factory=dict)
    api_version: int = 1


@dataclass(frozen=True)
class ModelRequest:
    """What a factory is called with: one case's sizes and options, and where to build.

    ``mode`` is forward, train, backward or decode (for decode, ``seq_len`` is the context length n, and the state
    must hold n + 1 positions), or a serving question: capacity, prefill, verify (``Verifiable``). ``options`` holds
    every option of the entry (a plugin's defaults filled in). ``torch_dtype`` is the ``torch.dtype`` named by
    ``dtype``. ``packing``: the lengths of the sequences a call runs packed end to end (``Packable``), or empty."""

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
    packing: tuple[int, ...] = ()


class DecodeState(Protocol):
    """What a decoder carries from one token to the next (a KV cache, a recurrent state)."""

    def tensors(self) -> Iterator[torch.Tensor]:
        """The tensors the state holds: their bytes are the row's ``state_mem_bytes``."""
        ...

    def advance(self) -> None:
        """Commit the last ``step``: the next step comes one position later."""
        ...


@runtime_checkable
class DropsScratch(Protocol):
    """A state that also holds what only a step needs (the buffers it computes into, a kernel's bookkeeping):
    ``drop_scratch`` frees that, so that what is measured is the state a decoder carries. Optional: without it,
    the scratch counts as state."""

    def drop_scratch(self) -> None: ...


@runtime_checkable
class Decodable(Protocol):
    """A module that produces one token at a time (``mode: decode``).

    ``init_state(batch, capacity)`` allocates the state for ``capacity`` positions, once, before anything is timed;
    ``prefill(x, state, output=...)`` runs the whole-sequence form over the n context tokens ``x`` (B, n, …) and
    leaves the state after them (``output=False``: skip what only the output needs); ``step(x, state)`` returns
    the output for one new token per sequence (B, 1, …) at position n and leaves the state describing n tokens,
    so every call is "the token after n" (``state.advance()`` commits it)."""

    def init_state(self, batch: int, capacity: int) -> Any: ...

    def prefill(self, x: torch.Tensor, state: Any, *, output: bool = True) -> torch.Tensor | None: ...

    def step(self, x: torch.Tensor, state: Any) -> torch.Tensor: ...


@runtime_checkable
class Verifiable(Protocol):
    """A decoder that checks k draft tokens in one call and keeps the accepted ones (``mode: verify``).

    ``verify(x, state)`` returns the output for the k draft tokens ``x`` (B, k, …) after the n tokens the state
    holds, each seeing the context and the drafts before it, and keeps what a rollback needs (the cache grows by k;
    a recurrence keeps its per-token states, or a copy to replay from). ``rollback(state, accepted)`` leaves the
    state after n + ``accepted`` tokens (0 ≤ accepted ≤ k), exactly as if those had been decoded one by one."""

    def verify(self, x: torch.Tensor, state: Any) -> torch.Tensor: ...

    def rollback(self, state: Any, accepted: int) -> None: ...


@runtime_checkable
class Packable(Protocol):
    """A module that runs sequences of different lengths packed end to end (a config's ``packing``).

    ``packed(x, lengths)`` takes ``x`` (1, T, …) holding the sequences one after another (``lengths`` sum to T) and
    returns (1, T, d_model): each sequence seeing only itself (attention block-diagonal, a recurrence starting again
    at each sequence's first token), so that each equals the sequence run alone."""

    def packed(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor: ...


@runtime_checkable
class Referenced(Protocol):
    """A module with a slow, plain form of its own function (optional): ``reference(x)`` takes what ``forward``
    takes and returns what it should. Before a case is timed, attnbench runs the module's own path once on a small
    input and holds its output to ``reference`` run on a float64 copy of the module; an output off it by more than the
    dtype's tolerance is an ``incorrect`` row, never timed. Without it the row's check says ``unchecked``."""

    def reference(self, x: torch.Tensor) -> torch.Tensor: ...


@runtime_checkable
class Resettable(Protocol):
    """A state that empties itself in place (``reset``: no tokens held). Optional: a timed prefill starts each call
    from it; without it a new state is allocated (``init_state``) before each call, outside the timing, which a
    large state makes slower to run but not to read."""

    def reset(self) -> None: ...


@runtime_checkable
class Fillable(Protocol):
    """A state that takes on the sizes of ``length`` tokens without computing them (``fill_to``). Optional: a
    capacity row times a decode step at batches whose real prefill could take hours, and a step's cost depends on
    the sizes it reads, not the values; without it the context is prefilled for real."""

    def fill_to(self, length: int) -> None: ...


def plugin_options(plugin: ModelPlugin) -> tuple[OptionSpec, ...]:
    """A plugin's options as ``OptionSpec``s (a mapping's defaults give each option its type; call
    ``plugin_problem`` first)."""
    if isinstance(plugin.options, Mapping):
        return tuple(OptionSpec(name, type(value), value, OPTION_HELP) for name, value in plugin.options.items())
    return tuple(plugin.options)


def plugin_problem(plugin: object) -> str | None:
    """Why a loaded entry point's object is not a plugin this attnbench can use, or None: its type, each field's,
    and its API version."""
    if not isinstance(plugin, ModelPlugin):
        return f"is {type(plugin).__name__}, not an attnbench.plugin.ModelPlugin"
    version = plugin.api_version
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return f"api_version {version!r} is not a plugin API version (1 … {API_VERSION})"
    if version > API_VERSION:
        return f"written for plugin API {version}; this attnbench speaks {API_VERSION}: upgrade attnbench"
    if not isinstance(plugin.factory, str) or not FACTORY.fullmatch(plugin.factory):
        return f"factory {plugin.factory!r} is not of the form module.path:function"
    if plugin.kind not in KINDS:
        return f"kind {plugin.kind!r} is not one of {', '.join(KINDS)}"
    if not isinstance(plugin.summary, str):
        return f"summary {plugin.summary!r} is not a string"
    return _options_problem(plugin.options)


def _options_problem(options: object) -> str | None:
    if isinstance(options, Mapping):
        for name, value in options.items():
            if not isinstance(name, str) or not isinstance(value, _OPTION_TYPES):
                return f"option {name!r}: a name and a default string, number or boolean, got {value!r}"
        return None
    if isinstance(options, Sequence) and not isinstance(options, str):
        for option in options:
            if not isinstance(option, OptionSpec) or not isinstance(option.default, option.type):
                return f"option {option!r} is not an attnbench.plugin.Option whose default has its type"
        return None
    return f"options {options!r} is neither a mapping of names to defaults nor a sequence of Options"
