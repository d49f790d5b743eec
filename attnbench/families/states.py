"""Decoding one token at a time: the state a model carries between tokens, and the protocol every module keeps.

Every module a model is built from (a layer, a block, a stack, the whole network) decodes with the weights of its
whole-sequence form, through three methods (``Decodable``):

- ``init_state(batch, capacity)``: allocate the state for ``capacity`` positions, once, before anything is timed
  (a KV cache of ``capacity`` slots per attention layer, zeroed; h/c per recurrent layer). A context too long to
  hold fails here, as an out-of-memory row, before any work is spent on it.
- ``prefill(x, state, output=...)``: run the whole-sequence form over the n context tokens ``x`` and leave the
  state after them (K and V written into slots 0…n−1; the recurrent state after step n). ``output=False`` skips
  what only the output needs (the last layer's attention over the context). A recurrent prefill continues from
  the state it is given, so a long context may come in chunks; an attention prefill is one pass.
- ``step(x, state)``: the output for one new token per sequence, ``x`` of shape (B, 1, …), at position n = the
  state's length. It writes the token's own K and V into slot n and attends to slots 0…n; a recurrent step reads
  h/c and keeps the new state aside. Either way the state still describes n tokens afterwards, so every call is
  "the token after n" and can be timed again and again at the same n.
- ``state.advance()`` commits the last step (length n + 1), for generating several tokens in a row.

The serving questions (``attnbench.families.serving``) ask three things more of a built-in state: ``reset()`` (no
tokens held: a timed prefill starts every call from it), ``fill_to(n)`` (the sizes of n tokens without computing
them: a capacity row's step at a batch no real prefill could reach in time) and, for a verify's rollback, a KV
cache's ``truncate(n)``; a recurrent state keeps what its rollback needs in ``saved``.

The state values live here; the modules implement the methods (``attention``, ``blocks``, ``rnn``, ``minrnn``).
A new kind of attention adds a cache (fewer KV heads; a ring buffer of W slots for a sliding window) and a core
whose ``step`` reads it; a new recurrence adds a state (a d×d matrix for linear attention) with ``tensors`` and
``advance``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import cache, partial
from typing import Any, ClassVar, Literal, Protocol, cast

import torch
from torch import nn

from attnbench.families.plugins import (
    Decodable,
    DecodeState,
    DropsScratch,
    Fillable,
    Packable,
    Resettable,
    Verifiable,
)

# How a KV cache lays out each of K and V: (batch, heads, positions, head_dim) as SDPA takes them, or (batch,
# positions, heads, head_dim) as flash-attn's kernels do.
Layout = Literal["bhnd", "bnhd"]


class State(DecodeState, DropsScratch, Protocol):
    """A built-in state: the plugin interface's ``DecodeState`` that also drops its scratch (``DropsScratch``), which
    the executor does before it measures the state's memory."""

    def scratch(self) -> Iterator[torch.Tensor]:
        """The buffers a step writes in place beside ``tensors`` (the next state, computed aside): allocated once
        and never moved, so a compiled step may take them as static (CUDA graphs skip a graph whose inputs it sees
        mutated unless they are)."""
        ...


def drop_scratch(state: Any) -> None:
    """``state.drop_scratch()`` where the state has one (a user model's may not: ``DropsScratch`` is optional)."""
    if isinstance(state, DropsScratch):
        state.drop_scratch()


def scratch_tensors(state: Any) -> Iterator[torch.Tensor]:
    """``state.scratch()`` where the state has one (a user model's may not), else nothing: see ``State``."""
    scratch = getattr(state, "scratch", None)
    if callable(scratch):
        yield from scratch()


def decodable(module: nn.Module) -> Decodable:
    """``module`` as a ``Decodable``; NotImplementedError (an ``unsupported`` row) if it cannot decode."""
    if not isinstance(module, Decodable):
        raise NotImplementedError(f"{type(module).__name__} has no decode step")
    return module


def parameter_of(module: nn.Module) -> torch.Tensor:
    """Any parameter of ``module``: where its state must live (device) and in what dtype."""
    return next(module.parameters())


# How the states allocated now are stored (issue 52), set around a case by the executor (``timing.precision``),
# so the decode protocol keeps its signature: None as they compute, else its ``kv`` dtype for a KV cache and its
# ``keep`` for a recurrent layer's state (``keep`` below).
KEPT: ContextVar[Any] = ContextVar("kept", default=None)


def kv_cache(*args: Any, **kwargs: Any) -> KVCache:
    """A layer's KV cache (``KVCache``'s arguments) as the executor keeps it (``KEPT``'s ``cache``: narrower than it
    computes, in pages, read as an engine's kernel reads it), else as it computes."""
    keeping = KEPT.get()
    return KVCache(*args, **kwargs) if keeping is None else keeping.cache(*args, **kwargs)


def _converted(held: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``held`` (contiguous) in ``dtype``. A float8 tensor on a CPU through a table of its 256 values, each torch's
    own conversion (bit for bit the same), as an int32 index: torch's CPU cast from float8 is scalar, six times
    slower."""
    if held.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) or held.device.type != "cpu":
        return held.to(dtype)
    return float8_table(held.dtype, dtype).index_select(0, held.view(torch.uint8).flatten().int()).view(held.shape)


@cache  # read for every chunk of every step
def float8_table(kept: torch.dtype, dtype: torch.dtype) -> torch.Tensor:
    """Every value of the float8 dtype ``kept``, by its byte, in ``dtype``."""
    return torch.arange(256, dtype=torch.uint8).view(kept).to(dtype)


class KVCache:
    """K and V of one attention layer for ``capacity`` positions, preallocated as one zeroed tensor.

    ``length`` positions hold the context; a step writes the new token into slot ``length``. The views
    ``keys(end)``/``values(end)`` are (B, H_kv, slots, D) whatever the layout: the slots that hold positions
    0…end−1 (H_kv: the key/value heads, fewer than the query heads under GQA/MQA). flash-attn's layout also keeps the
    int32 ``seqlens`` its kernel reads (one per sequence, preallocated: an int would cost an allocation per call).

    ``window`` > 0 makes it a ring buffer of ``min(window, capacity)`` slots: position p lives in slot p mod W, so
    the cache holds the last W positions and a step at any n ≥ W reads W slots, in memory that stops growing at
    n = W. The slots are out of position order then, which softmax attention does not see (a query attends to a
    set of keys; RoPE is applied before a key is cached). ``visible`` holds min(n + 1, W) per sequence for
    flash-attn's kernel, which reads that many slots.
    """

    def __init__(
        self,
        batch: int,
        heads: int,
        head_dim: int,
        capacity: int,
        *,
        layout: Layout,
        device: torch.device,
        dtype: torch.dtype,
        window: int = 0,
        kept: torch.dtype | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"a KV cache needs at least one position, got capacity {capacity}")
        self.slots = min(capacity, window) if window else capacity
        shape = (2, batch, heads, self.slots, head_dim) if layout == "bhnd" else (2, batch, self.slots, heads, head_dim)
        # Stored in ``kept`` (kv_dtype) where given, converted to ``compute`` as it is read. int8: a float32 scale per
        # key/value and head (vLLM's k/v scales), set by the first write's largest magnitude and kept (±127 clamps).
        self.compute = dtype
        self.storage = self.allocate(shape, device, kept or dtype)
        self.scales = torch.zeros(2, heads, device=device, dtype=torch.float32) if kept == torch.int8 else None
        self.layout: Layout = layout
        self.capacity = capacity
        self.window = window
        self.length = 0
        self.seqlens = torch.zeros(batch, dtype=torch.int32, device=device) if layout == "bnhd" else None
        self.visible = torch.ones(batch, dtype=torch.int32, device=device) if layout == "bnhd" and window else None
        self.saved: int | None = None  # where a verify's drafts start: its rollback truncates to there + accepted

    def allocate(self, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """K and V's storage, zeroed (a paged cache's is a pool of pages instead: ``timing.paging``)."""
        return torch.zeros(shape, device=device, dtype=dtype)

    @property
    def ring(self) -> bool:
        """Whether positions wrap around (a sliding window shorter than the capacity)."""
        return self.slots < self.capacity

    @property
    def k(self) -> torch.Tensor:
        """K in the cache's own layout, every slot."""
        return self.storage[0]

    @property
    def v(self) -> torch.Tensor:
        return self.storage[1]

    def _bhnd(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.layout == "bhnd" else t.transpose(1, 2)

    def keys(self, end: int) -> torch.Tensor:
        """K of the slots holding positions [0, end) (the last ``window`` of them in a ring), (B, H_kv, ·, D)."""
        return self._loaded(self._bhnd(self.k)[:, :, : min(end, self.slots)], 0)

    def values(self, end: int) -> torch.Tensor:
        return self._loaded(self._bhnd(self.v)[:, :, : min(end, self.slots)], 1)

    def _loaded(self, held: torch.Tensor, which: int) -> torch.Tensor:
        """Stored (B, H_kv, S, D) slots in the compute dtype (the same tensor where nothing is converted)."""
        if held.dtype == self.compute:
            return held
        # Made contiguous as it converts: a paged chunk is a transposed gather, and a scale broadcast over a strided
        # tensor is several times slower than the conversion itself on a CPU.
        loaded = _converted(held.contiguous(), self.compute)
        return loaded if self.scales is None else loaded.mul_(self.scales[which].to(self.compute)[None, :, None, None])

    def _stored(self, src: torch.Tensor, which: int) -> torch.Tensor:
        if self.scales is None:
            return src.to(self.storage.dtype)
        scale = self.scales[which]
        first = src.detach().abs().amax(dim=(0, 2, 3)).float().clamp_min(1e-8) / 127
        scale.copy_(torch.where(scale == 0, first, scale))  # a head's first write sets its scale
        return (src.float() / scale[None, :, None, None]).round_().clamp_(-127, 127).to(torch.int8)

    def write(self, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        """Store (B, H_kv, T, D) keys and values of positions start…start+T−1, in place (a ring keeps the last
        ``slots`` of them, position p in slot p mod slots)."""
        end = start + k.shape[-2]
        if end > self.capacity:
            raise ValueError(f"positions {start}…{end - 1} do not fit a KV cache of {self.capacity}")
        if end - start > self.slots:  # only the last positions survive in a ring
            k, v, start = k[:, :, -self.slots :], v[:, :, -self.slots :], end - self.slots
        first = start % self.slots
        head = min(end - start, self.slots - first)  # up to the ring's end, then from slot 0
        k, v = self._stored(k, 0), self._stored(v, 1)
        for src, dst in ((k, self._bhnd(self.k)), (v, self._bhnd(self.v))):
            dst[:, :, first : first + head].copy_(src[:, :, :head])
            if head < end - start:
                dst[:, :, : end - start - head].copy_(src[:, :, head:])

    def fill(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Hold (B, H_kv, n, D) keys and values as the whole context (the decode set-up's prefill: one pass)."""
        if self.length:
            raise ValueError("an attention prefill fills an empty cache in one pass; this one holds a context")
        self.append(k, v)

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        """Add (B, H_kv, T, D) keys and values of the next T positions (a prompt's chunk, a verify's drafts)."""
        start = self.length
        self.write(k, v, start)
        self._set_length(start + k.shape[-2])

    def truncate(self, length: int) -> None:
        """Keep the first ``length`` positions (a verify's rollback): the slots after them are written again. A ring
        that has wrapped has overwritten what this would restore: refused."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a KV cache of {self.length} positions to {length}")
        if self.ring and self.length > self.slots:
            raise ValueError("a ring cache that has wrapped no longer holds the positions a truncation restores")
        self._set_length(length)

    def reset(self) -> None:
        """No positions held; the slots are left as they are (every one is written before it is read)."""
        self._set_length(0)

    def fill_to(self, length: int) -> None:
        """Hold ``length`` positions of made-up keys and values (normal noise, not the model's; one sequence's drawn
        and copied into every sequence's slots, which is what a batch of many costs): a step's cost reads the slots,
        not what is in them."""
        if length > self.capacity:
            raise ValueError(f"{length} positions do not fit a KV cache of {self.capacity}")
        self.storage.copy_(self.noise(self.storage[:, :1].shape))  # broadcast along the batch
        if self.scales is not None:
            self.scales.fill_(4 / 127)
        self._set_length(length)

    def noise(self, shape: tuple[int, ...] | torch.Size) -> torch.Tensor:
        """Normal noise of ``shape`` in the compute dtype, as int8 stores it at the scale ``fill_to`` sets."""
        noise = torch.randn(shape, device=self.storage.device, dtype=self.compute)
        return noise.mul_(127 / 4).round_().clamp_(-127, 127) if self.scales is not None else noise

    def check_room(self) -> None:
        """A step writes slot ``length``: it must exist."""
        if self.length >= self.capacity:
            raise ValueError(f"the KV cache is full ({self.capacity} positions); allocate it with more capacity")

    def _set_length(self, length: int) -> None:
        self.length = length
        if self.seqlens is not None:
            self.seqlens.fill_(length)
        if self.visible is not None:
            self.visible.fill_(min(length + 1, self.slots))  # what a step at this length reads

    def advance(self) -> None:
        self.check_room()
        self._set_length(self.length + 1)

    def tensors(self) -> Iterator[torch.Tensor]:
        yield self.storage
        if self.scales is not None:
            yield self.scales

    def shared_by(self, own: KVCache) -> SharedKV:
        """This cache (one sequence's prefix) read by reference by ``own``'s sequences (mode prefix)."""
        return SharedKV(self, own)

    def drop_scratch(self) -> None:
        self.seqlens = self.visible = None  # flash-attn's per-sequence lengths: bookkeeping, not K and V

    def scratch(self) -> Iterator[torch.Tensor]:
        return iter(())  # a step writes its token into the cache itself (``tensors``)


class SharedPrefix:
    """A cache of positions for M sequences whose first R positions are one sequence's (a shared prefix, mode
    prefix): that sequence's cache (``prefix``, batch 1, R positions) is read by reference, expanded to the M
    sequences without a copy held, and each sequence's own positions after it go to ``own`` (batch M, allocated for
    the n − R positions after the prefix), as an engine's block table points every request at the prefix's pages and
    gives each its own for the rest. A cache's own ``shared_by`` makes one (``families.serving.share``)."""

    holds_positions = True  # never kept as a recurrent state (``keep``)

    def __init__(self, prefix: Any, own: Any) -> None:
        self.prefix, self.own = prefix, own
        self.saved: int | None = None

    @property
    def start(self) -> int:
        """Where the requests' own positions begin: after the prefix the shared cache holds now."""
        return int(self.prefix.length)

    @property
    def length(self) -> int:
        return self.start + self.own.length

    def joined(self, read: str, end: int, dim: int) -> torch.Tensor:
        """What the cache's ``read`` (keys, values, latent) gives for positions [0, end): the prefix's, expanded over
        the batch, then each sequence's own (the one copy a read makes, as a paged cache's gather does)."""
        mine = getattr(self.own, read)(end - self.start)
        shared = getattr(self.prefix, read)(self.start)
        return torch.cat([shared.expand(mine.shape[0], *shared.shape[1:]), mine], dim=dim)

    def append(self, *parts: torch.Tensor) -> None:
        self.own.append(*parts)

    def reset(self) -> None:
        """The requests' own positions emptied; the prefix is its owner's to reset."""
        self.own.reset()

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.prefix.tensors()
        yield from self.own.tensors()

    def drop_scratch(self) -> None:
        drop_scratch(self.own)

    def scratch(self) -> Iterator[torch.Tensor]:
        return iter(())


class SharedKV(SharedPrefix):
    """A shared prefix of K and V (``SharedPrefix``), read as ``KVCache.keys`` and ``values`` read."""

    def keys(self, end: int) -> torch.Tensor:
        return self.joined("keys", end, 2)

    def values(self, end: int) -> torch.Tensor:
        return self.joined("values", end, 2)


def keep(make: Callable[[int], Any], batch: int) -> Any:
    """A layer's state of ``batch`` sequences (``make(batch)``) as the executor keeps it (``KEPT``'s ``keep``, which
    makes one sequence's first to see what it holds per sequence)."""
    keeping = KEPT.get()
    return make(batch) if keeping is None else keeping.keep(make, batch)


def kept_as_made(state: Any) -> bool:
    """Whether ``state`` is kept as it is made: a cache of positions, or states of layers each kept on its own."""
    return getattr(state, "holds_positions", False) or isinstance(state, KVCache | StackState | NetworkState)


def step_with(state: Any, step: Callable[[torch.Tensor, Any], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``step(x, state)``, one decode step of a layer: through the state's own ``step_with`` where it has one (a
    kept state steps in place, rows at a time: ``timing.precision.KeptState``), else against the state as it is."""
    own = getattr(state, "step_with", None)
    if callable(own):
        return cast(torch.Tensor, own(step, x))
    with opened(state, commit=False) as held:
        return step(x, held)


@contextmanager
def opened(state: Any, *, commit: bool) -> Iterator[Any]:
    """The state a layer computes with: a kept one's converted (its ``opened``), any other itself."""
    lend = getattr(state, "opened", None)
    with lend(commit=commit) if callable(lend) else nullcontext(state) as held:
        yield held


@dataclass
class RecurrentState:
    """h (and c for an LSTM) of a recurrent layer or stack, (layers, B, hidden). A step leaves them as they are
    and keeps its new state, layer by layer, in ``pending``, which ``advance`` copies in."""

    batch_dim: ClassVar[int] = 1  # which of each tensor's dims holds the sequences (``KeptState`` steps rows of it)
    h: torch.Tensor
    c: torch.Tensor | None = None
    pending: tuple[list[torch.Tensor], list[torch.Tensor] | None] | None = field(default=None, repr=False)
    saved: Any = field(default=None, repr=False)  # what a verify keeps for its rollback (families.serving)

    def tensors(self) -> Iterator[torch.Tensor]:
        yield self.h
        if self.c is not None:
            yield self.c

    def reset(self) -> None:
        for t in self.tensors():
            t.zero_()

    def fill_to(self, length: int) -> None:
        """Nothing to do: the state has one size after any number of tokens."""

    def drop_scratch(self) -> None:
        self.pending = None

    def scratch(self) -> Iterator[torch.Tensor]:
        return iter(())  # a step's new h and c are new tensors each time, kept in ``pending``

    def advance(self) -> None:
        if self.pending is None:
            raise ValueError("advance() needs a step first")
        hs, cs = self.pending
        for layer, h in enumerate(hs):
            self.h[layer].copy_(h)
        if self.c is not None and cs is not None:
            for layer, c in enumerate(cs):
                self.c[layer].copy_(c)
        self.pending = None


class ConstantState:
    """What a state of one size after any number of tokens (a layer's conv window and scan state) adds for the
    serving questions: ``reset`` zeroes it, ``fill_to`` has nothing to do, ``saved`` holds a verify's record."""

    batch_dim: ClassVar[int] = 0  # every tensor, its scratch's too, holds the sequences first
    saved: Any = None

    def tensors(self) -> Iterator[torch.Tensor]:
        raise NotImplementedError

    def reset(self) -> None:
        for t in self.tensors():
            t.zero_()

    def fill_to(self, length: int) -> None:
        """Nothing to do: the state has one size after any number of tokens."""


@dataclass
class StackState:
    """One state per layer (or block) of a stack."""

    layers: list[Any]

    def tensors(self) -> Iterator[torch.Tensor]:
        for layer in self.layers:
            yield from cast(State, layer).tensors()

    def advance(self) -> None:
        for layer in self.layers:
            cast(State, layer).advance()

    def drop_scratch(self) -> None:
        for layer in self.layers:
            drop_scratch(layer)

    def scratch(self) -> Iterator[torch.Tensor]:
        for layer in self.layers:
            yield from scratch_tensors(layer)

    def reset(self) -> None:
        for layer in self.layers:
            reset_state(layer)

    def fill_to(self, length: int) -> None:
        for layer in self.layers:
            fill_state(layer, length)


@dataclass
class NetworkState:
    """A network's body state and the position of the next token (for the positional encodings)."""

    body: Any
    position: int = 0
    verified_from: int = 0  # the position a verify started at: its rollback's origin

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from cast(State, self.body).tensors()

    def advance(self) -> None:
        cast(State, self.body).advance()
        self.position += 1

    def drop_scratch(self) -> None:
        drop_scratch(self.body)

    def scratch(self) -> Iterator[torch.Tensor]:
        yield from scratch_tensors(self.body)

    def reset(self) -> None:
        reset_state(self.body)
        self.position = 0

    def fill_to(self, length: int) -> None:
        fill_state(self.body, length)
        self.position = length


def reset_state(state: Any) -> bool:
    """``state.reset()`` where the state has one (``Resettable``); False where it has none (a user's may not)."""
    if not isinstance(state, Resettable):
        return False
    state.reset()
    return True


def fill_state(state: Any, length: int) -> bool:
    """``state.fill_to(length)`` where the state has one (``Fillable``); False where it has none."""
    if not isinstance(state, Fillable):
        return False
    state.fill_to(length)
    return True


def tensor_bytes(state: State) -> int:
    """Bytes of the tensors a state holds."""
    return sum(t.numel() * t.element_size() for t in state.tensors())


def stack_init(layers: nn.Module, batch: int, capacity: int) -> StackState:
    makers = [partial(decodable(layer).init_state, capacity=capacity) for layer in layers.children()]
    return StackState([keep(make, batch) for make in makers])


def stack_prefill(layers: nn.Module, x: torch.Tensor, state: StackState, *, output: bool) -> torch.Tensor | None:
    """Each layer's prefill in turn; the last computes its output only when asked for it."""
    children = list(layers.children())
    y: torch.Tensor | None = x
    for i, (layer, layer_state) in enumerate(zip(children, state.layers, strict=True)):
        assert y is not None
        with opened(layer_state, commit=True) as held:
            y = decodable(layer).prefill(y, held, output=output or i < len(children) - 1)
    return y


def stack_step(layers: nn.Module, x: torch.Tensor, state: StackState) -> torch.Tensor:
    for layer, layer_state in zip(layers.children(), state.layers, strict=True):
        x = step_with(layer_state, decodable(layer).step, x)
    return x


class LayerStack(nn.Module):
    """Layers applied in turn (``self.layers``), decoding layer by layer: (B, T, d) -> (B, T, d)."""

    def __init__(self, layers: list[nn.Module]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def init_state(self, batch: int, capacity: int) -> StackState:
        return stack_init(self.layers, batch, capacity)

    def prefill(self, x: torch.Tensor, state: StackState, *, output: bool = True) -> torch.Tensor | None:
        return stack_prefill(self.layers, x, state, output=output)

    def step(self, x: torch.Tensor, state: StackState) -> torch.Tensor:
        return stack_step(self.layers, x, state)

    def verify(self, x: torch.Tensor, state: StackState) -> torch.Tensor:
        return stack_verify(self.layers, x, state)

    def rollback(self, state: StackState, accepted: int) -> None:
        stack_rollback(self.layers, state, accepted)

    def packed(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        return stack_packed(self.layers, x, lengths)


# ---------------------------------------------------------------------------------------------------- serving
# Packed lengths and a verify with its rollback, layer by layer (``attnbench.families.serving`` says how and why).
RollbackMethod = Literal["truncate", "checkpoint", "replay"]
ROLLBACK_METHODS: tuple[RollbackMethod, ...] = ("truncate", "checkpoint", "replay")


def spans(lengths: Sequence[int]) -> Iterator[tuple[int, int]]:
    """(start, end) of each packed sequence, in order."""
    start = 0
    for length in lengths:
        yield start, start + length
        start += length


def packed(module: nn.Module, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    """``module`` over the packed sequences of ``x`` (1, T, …), each on its own: the module's ``packed`` where it
    has one, else the module over each sequence alone, the outputs joined again (1, T, …)."""
    if isinstance(module, Packable):
        return module.packed(x, lengths)
    return torch.cat([module(x[:, start:end]) for start, end in spans(lengths)], dim=1)


def rollback_method(module: nn.Module) -> RollbackMethod:
    """How ``module`` rolls a verify back (module notes): its ``rollback_method``, ``replay`` where it says none
    (a copy of the state and a prefill again are all any decoder needs)."""
    method = getattr(module, "rollback_method", "replay")
    return method if method in ROLLBACK_METHODS else "replay"


def verify(module: nn.Module, x: torch.Tensor, state: Any) -> torch.Tensor:
    """The output for the draft tokens ``x`` (B, k, …) after the state's tokens, keeping what ``rollback`` needs."""
    if isinstance(module, Verifiable):
        return module.verify(x, state)
    if rollback_method(module) == "checkpoint":
        return checkpoint_verify(module, x, state)
    return replay_verify(module, x, state)


def rollback(module: nn.Module, state: Any, accepted: int) -> None:
    """The state after the first ``accepted`` draft tokens of the last verify."""
    if isinstance(module, Verifiable):
        module.rollback(state, accepted)
    elif rollback_method(module) == "checkpoint":
        checkpoint_rollback(state, accepted)
    else:
        replay_rollback(module, state, accepted)


def _copy(state: Any) -> list[torch.Tensor]:
    return [t.clone() for t in state.tensors()]


def _restore(state: Any, saved: list[torch.Tensor]) -> None:
    for held, copy in zip(state.tensors(), saved, strict=True):
        held.copy_(copy)


def checkpoint_verify(layer: nn.Module, x: torch.Tensor, state: Any) -> torch.Tensor:
    """The k drafts as k decode steps, the state after each (and before the first) kept in ``state.saved``."""
    decoder = decodable(layer)
    saved = [_copy(state)]
    outputs = []
    for t in range(x.shape[1]):
        outputs.append(decoder.step(x[:, t : t + 1], state))
        state.advance()
        saved.append(_copy(state))
    state.saved = saved
    return torch.cat(outputs, dim=1)


def checkpoint_rollback(state: Any, accepted: int) -> None:
    _restore(state, _saved(state)[accepted])


def replay_verify(layer: nn.Module, x: torch.Tensor, state: Any) -> torch.Tensor:
    """The k drafts as one prefill from the state, a copy of which is kept in ``state.saved`` with the drafts."""
    saved = _copy(state)
    out = decodable(layer).prefill(x, state, output=True)
    assert out is not None  # output=True
    state.saved = (saved, x)
    return out


def replay_rollback(layer: nn.Module, state: Any, accepted: int) -> None:
    saved, drafts = _saved(state)
    _restore(state, saved)
    if accepted:
        decodable(layer).prefill(drafts[:, :accepted], state, output=False)


def _saved(state: Any) -> Any:
    saved = getattr(state, "saved", None)
    if saved is None:
        raise ValueError("rollback() needs a verify first")
    return saved


def stack_verify(layers: nn.Module, x: torch.Tensor, state: Any) -> torch.Tensor:
    """Each layer's verify in turn (a ``StackState``: one state per layer)."""
    for layer, layer_state in zip(layers.children(), state.layers, strict=True):
        with opened(layer_state, commit=True) as held:
            x = verify(layer, x, held)
    return x


def stack_rollback(layers: nn.Module, state: Any, accepted: int) -> None:
    for layer, layer_state in zip(layers.children(), state.layers, strict=True):
        with opened(layer_state, commit=True) as held:
            rollback(layer, held, accepted)


def stack_packed(layers: nn.Module, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
    for layer in layers.children():
        x = packed(layer, x, lengths)
    return x


def prefill(model: nn.Module, context: torch.Tensor, capacity: int) -> Any:
    """The state of ``model`` after the n context tokens (B, n, …), with room for ``capacity`` positions."""
    decoder = decodable(model)
    state = decoder.init_state(context.shape[0], capacity)
    decoder.prefill(context, state, output=False)
    return state
