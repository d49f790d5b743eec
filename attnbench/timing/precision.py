"""States kept narrower than they compute (issue 52), and what that costs in accuracy.

``keeping`` sets how every state allocated inside is stored (``families.states.KEPT``): a KV cache in ``kv_dtype``
(the cache converts on write and read), a recurrent layer's state in ``state_dtype`` (``KeptState``), as an engine
stores them. A case with ``kv_dtype`` or ``state_dtype`` decodes
``DECODE_TOKENS`` tokens twice at a small size, once keeping its state as computed and once as the case keeps it,
and the row carries the largest and the mean absolute difference of their outputs (``kept_error_max``,
``kept_error_mean``) beside its time.

The small size: the case's model (its d_model, heads, layers and options) at batch 1 after ``CONTEXT`` tokens of
prompt, the same weights and inputs both times, each token's own input fed (teacher forcing), so the difference is
the stored precision's alone, compounded as a decode compounds it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnbench.core.cases import Case
from attnbench.families.catalogue import family_of
from attnbench.families.registry import build_model, call_context
from attnbench.families.states import KEPT, KVCache, decodable, kept_as_made, opened, prefill, scratch_tensors
from attnbench.families.torch_family import make_input, torch_dtype
from attnbench.timing.paging import kept_cache

__all__ = ["CONTEXT", "DECODE_TOKENS", "TILE_BYTES", "Keeping", "KeptState", "keeping", "kept_error"]

DECODE_TOKENS = 256  # tokens decoded after the prompt: long enough for a state's rounding to compound
CONTEXT = 16  # the prompt's tokens, prefilled
# Bytes of a layer's state (and scratch), in the dtype it computes in, that a kept state's step converts at once:
# large enough that a tile's calls cost little beside its work, small beside a 1 GiB budget's states, and well under
# glibc's 32 MiB mmap threshold's reach: with 16 MiB tiles a CPU capacity moved by 15 % with the heap's history (a
# cold cache's flush buffer beside it or not), with 4 MiB (a KV chunk's size, ``paging.CHUNK_BYTES``) by 1 %.
TILE_BYTES = 4 * 2**20


class KeptState:
    """A recurrent layer's state stored in ``state_dtype`` between calls (vLLM's ``mamba_ssm_cache_dtype``), or in
    its own dtype (``dtype`` None) and stepped as an engine steps it: a capacity row's states (``keeping``'s
    ``in_place``).

    A decode step (``step_with``) runs ``TILE_BYTES`` of rows at a time: it lends the layer those rows converted up
    (each tensor's ``.data`` swapped, so the layer's own state object is the one it gets) with fresh scratch of their
    size, commits their next state at once and writes it back down (in place where the dtype is the state's own), as
    an engine's kernel reads a tile of its cache, computes wide and writes the next state into the cache. So only a
    tile is ever held wide, and no layer keeps next-state buffers between calls: held for every layer of a stack, as
    the plain state's are (so that a step can be timed again and again at the same n), they would weigh as much as
    the state, and a narrower state would save nothing. ``advance`` then has nothing left to do. The other calls
    (``opened``: a prefill, a verify, a rollback) lend every row."""

    def __init__(self, inner: Any, dtype: torch.dtype | None, batch: int) -> None:
        """``inner``: the layer's state, of ``batch`` sequences or of the rows of one tile (the most its step is lent
        at once: ``Keeping.keep``), whose values every tile starts from (the state before the first token)."""
        self.inner, self.batch, self.saved, self.ahead = inner, batch, None, False
        self.held, self.spare = list(inner.tensors()), list(scratch_tensors(inner))
        self.shapes = [t.shape for t in self.spare]
        self.dim: int | None = getattr(inner, "batch_dim", None)  # which dim of every tensor holds the sequences
        self.rows = batch if self.dim is None else self.held[0].shape[self.dim]
        self.stored = [_stored(t, dtype, self.dim, batch) for t in self.held]
        self._drop()

    def _drop(self) -> None:
        for t in (*self.held, *self.spare):
            t.data = t.data.new_empty(0)  # keeps its dtype: what ``_lend`` converts back to

    def _lend(self, start: int, end: int) -> None:
        """The rows start…end of every tensor, in the dtype the layer computes in, and scratch of their size."""
        dim = self.dim
        for t, kept in zip(self.held, self.stored, strict=True):
            t.data = _part(kept, dim, start, end).to(t.dtype)  # its own dtype: the stored rows themselves
        for t, shape in zip(self.spare, self.shapes, strict=True):
            t.data = t.data.new_empty(shape if dim is None else (*shape[:dim], end - start, *shape[dim + 1 :]))

    def _store(self, start: int, end: int) -> None:
        for t, kept in zip(self.held, self.stored, strict=True):
            part = _part(kept, self.dim, start, end)
            if part.data_ptr() != t.data_ptr() or part.dtype != t.dtype:  # written in place already otherwise
                part.copy_(t)

    @contextmanager
    def opened(self, *, commit: bool) -> Iterator[Any]:
        self._lend(0, self.batch)
        try:
            yield self.inner
            if commit:
                self._store(0, self.batch)
        finally:
            self._drop()

    def step_with(self, step: Callable[[torch.Tensor, Any], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``step(x, layer state)`` a tile of rows at a time, each tile's next state committed as it is computed."""
        out: torch.Tensor | None = None
        for start in range(0, self.batch, self.rows):
            end = min(self.batch, start + self.rows)
            self._lend(start, end)
            try:
                y = step(x[start:end], self.inner)
                self.inner.advance()
                self._store(start, end)
            finally:
                self._drop()
            if end - start == self.batch:
                out = y
            else:  # written into one output as it comes: never every tile's beside their join
                out = y.new_empty((self.batch, *y.shape[1:])) if out is None else out
                out[start:end] = y
        self.ahead = True
        assert out is not None  # a batch of at least one row
        return out

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.stored

    def advance(self) -> None:
        """Nothing left to do: the step committed its next state (``step_with``)."""
        if not self.ahead:
            raise ValueError("advance() needs a step first")
        self.ahead = False

    def reset(self) -> None:
        for kept in self.stored:
            kept.zero_()
        self.ahead = False

    def fill_to(self, length: int) -> None:
        """Nothing to do: a recurrent state has one size after any number of tokens."""

    def drop_scratch(self) -> None:
        """Nothing held: scratch is made for a call, of its rows (``_lend``)."""

    def scratch(self) -> Iterator[torch.Tensor]:
        return iter(())


def _stored(held: torch.Tensor, dtype: torch.dtype | None, dim: int | None, batch: int) -> torch.Tensor:
    """What keeps ``held``'s values for ``batch`` sequences in ``dtype``: ``held`` repeated along ``dim`` (it holds
    a tile's rows), made in that dtype, never wide. Another tensor object either way: the held ones are emptied
    between calls; in its own dtype and of every row, the same storage (stepped in place)."""
    dtype = dtype or held.dtype
    if dim is None or held.shape[dim] == batch:
        return held.detach() if dtype == held.dtype else held.to(dtype)
    stored = held.new_empty((*held.shape[:dim], batch, *held.shape[dim + 1 :]), dtype=dtype)
    for start in range(0, batch, held.shape[dim]):
        part = stored.narrow(dim, start, min(held.shape[dim], batch - start))
        part.copy_(held.narrow(dim, 0, part.shape[dim]))
    return stored


def _part(kept: torch.Tensor, dim: int | None, start: int, end: int) -> torch.Tensor:
    return kept if dim is None else kept.narrow(dim, start, end - start)


class PaddedState:
    """A recurrent state in a slot of ``page`` bytes (vLLM's ``mamba_page_size_padded``): itself, and the bytes its
    slot holds beyond it, allocated and never read (``padding``)."""

    def __init__(self, inner: Any, page: int) -> None:
        self.inner = inner
        held = sum(t.numel() * t.element_size() for t in inner.tensors())
        first = next(iter(inner.tensors()))
        self.padding = torch.zeros(max(0, page - held), dtype=torch.uint8, device=first.device)

    def __getattr__(self, name: str) -> Any:  # advance, reset, fill_to, scratch, drop_scratch, saved: the state's
        return getattr(self.__dict__["inner"], name)

    @contextmanager
    def opened(self, *, commit: bool) -> Iterator[Any]:
        with opened(self.inner, commit=commit) as held:
            yield held

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.inner.tensors()
        yield self.padding


@dataclass(frozen=True)
class Keeping:
    """What ``families.states.KEPT`` holds while a case runs: the KV cache's dtype, and the recurrent states'."""

    kv: torch.dtype | None
    state: torch.dtype | None
    page_tokens: int = 0  # a KV cache's page (``timing.paging``): 0 contiguous
    state_page: int = 0  # bytes per sequence a recurrent state's slot takes (``PaddedState``): 0 its own
    in_place: bool = False  # every recurrent state stepped as an engine steps it (``KeptState``), in its dtype too

    def cache(self, *args: Any, **kwargs: Any) -> KVCache:
        """A layer's KV cache (``KVCache``'s arguments) kept in ``kv`` and ``page_tokens``: ``paging.kept_cache``."""
        return kept_cache(*args, **kwargs, kept=self.kv, page_tokens=self.page_tokens)

    def keep(self, make: Callable[[int], Any], batch: int) -> Any:
        """The state of ``batch`` sequences ``make`` makes, kept: made for one sequence first, which says what it
        holds per sequence, so that a kept state is made a tile of rows big (``KeptState``) and never wide at every
        row. That one is dropped before a bigger one is made: a capacity try would count it."""
        one = make(1)
        if kept_as_made(one) or isinstance(one, KeptState | PaddedState):  # or a module that kept its own (an RNN)
            del one
            return make(batch)
        plain = self.state is None and not self.in_place
        rows = batch  # as it computes, or a user's state (no batch_dim): lent whole
        if not plain and getattr(one, "batch_dim", None) is not None:
            per_row = sum(t.numel() * t.element_size() for t in (*one.tensors(), *scratch_tensors(one)))
            rows = min(batch, max(1, TILE_BYTES // max(1, per_row)))
        if rows > 1:
            del one
        made = make(rows) if rows > 1 else one
        kept = made if plain else KeptState(made, self.state, batch)
        return PaddedState(kept, batch * self.state_page) if self.state_page else kept


@contextmanager
def keeping(
    kv: str | None, state: str | None, page_tokens: int = 0, state_page: int = 0, *, in_place: bool = False
) -> Iterator[None]:
    """Every state allocated inside stored in ``kv`` (a KV cache) and ``state`` (a recurrent one): torch's names;
    None, as it computes; a KV cache in pages of ``page_tokens`` positions (0: contiguous), a recurrent state in a
    slot of ``state_page`` bytes per sequence (0: its own size); with ``in_place``, every recurrent state stepped as
    a kept one is, whatever its dtype (a capacity row: ``KeptState``)."""
    kv_kept, state_kept = getattr(torch, kv) if kv else None, getattr(torch, state) if state else None
    kept = Keeping(kv_kept, state_kept, page_tokens, state_page, in_place)
    token = KEPT.set(None if kept == Keeping(None, None) else kept)
    try:
        yield
    finally:
        KEPT.reset(token)


def kept_error(case: Case, device: torch.device, seed: int) -> dict[str, float]:
    """``kept_error_max`` and ``kept_error_mean``: |kept − full| over the outputs of a decode of ``DECODE_TOKENS``
    tokens, the model's outputs as it computes them (the case's dtype)."""
    small = replace(case, mode="decode", batch=1, seq_len=CONTEXT, serving=(), packing=())
    dtype = torch_dtype(case.dtype)
    torch.manual_seed(seed)
    model = build_model(small, str(device), dtype)
    tokens = make_input(replace(small, seq_len=CONTEXT + DECODE_TOKENS), str(device), dtype)
    full = _decode(small, model, tokens, None, None)
    layout = family_of(small).page_layout(small)
    kept = _decode(small, model, tokens, case.kept_dtype("kv_dtype"), case.kept_dtype("state_dtype"), *layout)
    error = (kept.double() - full.double()).abs()
    return {"kept_error_max": float(error.max()), "kept_error_mean": float(error.mean())}


def _decode(
    case: Case,
    model: torch.nn.Module,
    tokens: torch.Tensor,
    kv: str | None,
    state: str | None,
    pages: int = 0,
    state_page: int = 0,
) -> torch.Tensor:
    """The outputs of the decode steps after ``CONTEXT`` tokens, the state kept in ``kv``/``state``."""
    decoder = decodable(model)
    with torch.inference_mode(), call_context(case, model), keeping(kv, state, pages, state_page):
        held = prefill(model, tokens[:, :CONTEXT], CONTEXT + DECODE_TOKENS)
        outputs = []
        for t in range(CONTEXT, CONTEXT + DECODE_TOKENS):
            outputs.append(decoder.step(tokens[:, t : t + 1], held))
            held.advance()
    return torch.cat(outputs, dim=1)
