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

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch

from attnbench.core.cases import Case
from attnbench.families.catalogue import family_of
from attnbench.families.registry import build_model, call_context
from attnbench.families.states import KEPT, KVCache, decodable, drop_scratch, opened, prefill, scratch_tensors
from attnbench.families.torch_family import make_input, torch_dtype
from attnbench.timing.paging import kept_cache

__all__ = ["CONTEXT", "DECODE_TOKENS", "Keeping", "KeptState", "keeping", "kept_error"]

DECODE_TOKENS = 256  # tokens decoded after the prompt: long enough for a state's rounding to compound
CONTEXT = 16  # the prompt's tokens, prefilled


class KeptState:
    """A recurrent layer's state stored in ``state_dtype`` between calls (vLLM's ``mamba_ssm_cache_dtype``), so only
    the layer computing holds its state in the compute dtype. ``opened`` lends the layer its state converted up (each
    tensor's ``.data`` swapped, so the layer's own state object is the one it gets) and, for a call that commits (a
    prefill, ``advance``, a rollback), converts it back down; a decode step commits only the next state it computes
    aside (a family's scratch buffers, kept narrow as well, as an engine writes the next state into its cache)."""

    def __init__(self, inner: Any, dtype: torch.dtype) -> None:
        self.inner, self.held, self.saved = inner, list(inner.tensors()), None
        self.spare = list(scratch_tensors(inner))
        # Copies even in their own dtype: the held tensors are emptied between calls.
        self.stored = [t.to(dtype, copy=True) for t in self.held]
        self.spare_stored = [t.to(dtype, copy=True) for t in self.spare]
        self._drop()

    def _drop(self) -> None:
        for t in (*self.held, *self.spare):
            t.data = t.data.new_empty(0)  # keeps its dtype: what ``opened`` converts back to

    @contextmanager
    def opened(self, *, commit: bool) -> Iterator[Any]:
        pairs = list(zip((*self.held, *self.spare), (*self.stored, *self.spare_stored), strict=True))
        for t, kept in pairs:
            t.data = kept.to(t.dtype)
        try:
            yield self.inner
            for t, kept in pairs if commit else pairs[len(self.held) :]:
                kept.copy_(t)
        finally:
            self._drop()

    def tensors(self) -> Iterator[torch.Tensor]:
        yield from self.stored

    def advance(self) -> None:
        with self.opened(commit=True) as inner:
            inner.advance()

    def reset(self) -> None:
        for kept in self.stored:
            kept.zero_()

    def fill_to(self, length: int) -> None:
        """Nothing to do: a recurrent state has one size after any number of tokens."""

    def drop_scratch(self) -> None:
        drop_scratch(self.inner)
        self.spare, self.spare_stored = [], []

    def scratch(self) -> Iterator[torch.Tensor]:
        yield from self.spare_stored


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

    def cache(self, *args: Any, **kwargs: Any) -> KVCache:
        """A layer's KV cache (``KVCache``'s arguments) kept in ``kv`` and ``page_tokens``: ``paging.kept_cache``."""
        return kept_cache(*args, **kwargs, kept=self.kv, page_tokens=self.page_tokens)

    def keep(self, state: Any, batch: int) -> Any:
        if isinstance(state, KeptState | PaddedState):
            return state
        kept = state if self.state is None else KeptState(state, self.state)
        return PaddedState(kept, batch * self.state_page) if self.state_page else kept


@contextmanager
def keeping(kv: str | None, state: str | None, page_tokens: int = 0, state_page: int = 0) -> Iterator[None]:
    """Every state allocated inside stored in ``kv`` (a KV cache) and ``state`` (a recurrent one): torch's names;
    None, as it computes; a KV cache in pages of ``page_tokens`` positions (0: contiguous), a recurrent state in a
    slot of ``state_page`` bytes per sequence (0: its own size)."""
    kv_kept, state_kept = getattr(torch, kv) if kv else None, getattr(torch, state) if state else None
    kept = Keeping(kv_kept, state_kept, page_tokens, state_page)
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
