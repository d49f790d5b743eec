"""A decode case, set up outside the timed region: its state allocated, filled by a real prefill, and measured.

In this order, so that each figure means one thing:

1. The new token (one per sequence) is made.
2. The state is allocated for n + 1 positions (a KV cache, zeroed; or h/c). A context whose cache cannot be held
   fails here, before any work is spent on it, as an ``oom`` row saying how large the cache was.
3. The context (n tokens per sequence) is made and run through the model's whole-sequence form into the state
   (``prefill``; a recurrent model's in chunks of ``PREFILL_CHUNK`` tokens, its state carrying over), then
   dropped. The cache holds what the model computes, not random numbers: a dense kernel's cost
   does not depend on the values, but the timed step is then exactly the path the equality tests hold to the
   whole-sequence forward. The prefill is affordable at any n a step is: scope core with one layer needs only the
   K/V projections, and deeper stacks use SDPA's fused causal kernel for the context's own attention.
4. The timed call is ``step()``: the token's K and V written into slot n, slots 0…n read, and the state left at n
   (a recurrent step keeps its new state aside), so every call is the token after n tokens. A recurrent state kept
   in a ``state_dtype`` is stepped as an engine steps it, in place (``timing.precision.KeptState``): each call moves
   it one token on, at the same cost.
5. After the timing, ``release()`` measures what the state holds and frees it (``state_mem_bytes``): on a GPU the
   caching allocator's bytes that freeing it gives back; on a CPU the resident pages backing its tensors
   (``resident-pages``, mincore: a state smaller than a page reads that page). ``state_bytes`` is the same
   computed from shapes and dtype.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from attnbench.core.cases import Case
from attnbench.core.units import format_bytes
from attnbench.families.catalogue import family_of
from attnbench.families.registry import make_input
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import decodable, drop_scratch, scratch_tensors, tensor_bytes
from attnbench.host.memory import ResidentPages
from attnbench.timing.compiled import mark_static, uses_cudagraphs, wrap
from attnbench.timing.failures import describe, is_oom

Extra = dict[str, str | int | float | bool | None]
# A recurrent context is fed in chunks of this many tokens, the state carrying over: the prefill's memory (the
# context and the scan's intermediates) stays bounded whatever n. Attention's context lives in its cache anyway,
# and its prefill (the context attending to itself) is one pass.
PREFILL_CHUNK = 4096


class DecodeSetup:
    """A filled state and the token to decode against it; ``extra`` gathers what the row records of both."""

    def __init__(
        self, model: nn.Module, case: Case, device: torch.device, dtype: torch.dtype, *, compile_mode: str | None = None
    ):
        """Steps 1–3 of the module notes, under ``inference_mode`` as the step is timed. ``compile_mode``: the step
        (not the prefill) goes through ``torch.compile`` with it (``attnbench.timing.compiled``)."""
        self._decoder = decodable(model)
        self._step: Any = self._decoder.step if compile_mode is None else wrap(self._decoder.step, compile_mode)
        self._device = device
        model.eval()
        with torch.inference_mode():
            self._token = make_input(replace(case, seq_len=1), str(device), dtype)  # (B, 1, d) or (B, 1) ids
            self._state: Any = _allocate(model, case)
            started = time.perf_counter()
            chunk = PREFILL_CHUNK if family_of(case).prefill_carries(case) else case.seq_len
            for start in range(0, case.seq_len, chunk):
                context = make_input(replace(case, seq_len=min(chunk, case.seq_len - start)), str(device), dtype)
                self._decoder.prefill(context, self._state, output=False)
                del context
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            prefill_s = time.perf_counter() - started
        if compile_mode is not None and uses_cudagraphs(compile_mode) and device.type == "cuda":
            # Written in place at every step and never moved: static, so CUDA graphs need not skip the step.
            mark_static(static_tensors(self._state))
        allocated, computed = tensor_bytes(self._state), state_bytes(case)
        if computed is not None and allocated != computed:  # the formula and the modules disagree: our bug
            raise RuntimeError(f"decode state: {allocated} bytes allocated, {computed} computed for {case.key}")
        # A model without a formula (a user's) reports the bytes of the tensors its state says it holds.
        self.extra: Extra = {"state_bytes": allocated, "prefill_s": prefill_s}

    @property
    def device(self) -> torch.device:
        return self._device

    def step(self) -> object:
        """The timed call: one new token per sequence at context n."""
        return self._step(self._token, self._state)

    def eager_step(self) -> object:
        """The same call, never compiled (the peak-memory call: a CUDA graph's replay would read about 0 bytes)."""
        return self._decoder.step(self._token, self._state)

    def release(self) -> None:
        """Measure the state, then free it (the step cannot run after this)."""
        held: int | None = None
        # What only a step needs (its output buffers, a kernel's bookkeeping) goes first: a recurrent state's
        # next-state buffers would otherwise double its measured size.
        drop_scratch(self._state)
        if self._device.type == "cuda":
            torch.cuda.synchronize(self._device)
            before = torch.cuda.memory_allocated(self._device)
            self._state = None
            torch.cuda.synchronize(self._device)
            held, method = int(before - torch.cuda.memory_allocated(self._device)), "cuda-allocator"
        else:
            pages = ResidentPages()
            method = pages.method if pages.available else "unavailable"
            if pages.available:
                storages = [t.untyped_storage() for t in self._state.tensors()]
                held = pages.bytes_of((s.data_ptr(), s.nbytes()) for s in storages)
            self._state = None
        self.extra["state_mem_bytes"], self.extra["state_mem_method"] = held, method


def static_tensors(state: Any) -> list[torch.Tensor]:
    """What a step writes in place and never moves: the state, and the buffers it computes the next state into
    (linear attention's and Mamba-2's ``scratch``), which left unmarked made inductor skip CUDA graphs for the step."""
    return [*state.tensors(), *scratch_tensors(state)]


def _allocate(model: nn.Module, case: Case) -> Any:
    """The state for n + 1 positions, or a MemoryError that says which state did not fit."""
    try:
        return decodable(model).init_state(case.batch, case.span)
    except Exception as exc:
        if not is_oom(exc):
            raise
        what = family_of(case).state_noun
        computed = state_bytes(case)
        size = "" if computed is None else f"{format_bytes(computed)}, "
        raise MemoryError(
            f"the {what} for a context of n={case.seq_len} ({size}batch {case.batch}, "
            f"{case.layers} layer{'s' * (case.layers != 1)}) cannot be allocated: {describe(exc)}"
        ) from exc
