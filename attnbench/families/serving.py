"""The serving questions' torch machinery that every family shares: packed lengths, and a verify with its rollback.

Both work module by module, as decoding does (``attnbench.families.states``): the containers (a stack, a block, a
network) implement ``packed``, ``verify`` and ``rollback`` by asking their children, and a layer answers with its
own methods where it has them (``Packable``, ``Verifiable``), else with what this module does for it:

- **Packed lengths** (``packed``): the layer over each sequence alone, one after another, so a recurrence starts
  again from zero at each sequence's first token whatever its form (the chunked forms included); the work around
  the layers (the embedding, norms, projections and FFNs of the blocks) runs on the packed tokens, with no padding.
  Attention has its own (a block-diagonal layout: flash-attn's varlen kernel where it runs, else each sequence's
  causal attention), and so does the LSTM (torch's ``PackedSequence``, the varlen path of cuDNN and oneDNN), and
  ``kernel: fla``'s delta rules, KDA, RWKV-7 and linear attention (one varlen call with ``cu_seqlens`` a layer).
- **Verify** (``verify``, then ``rollback``): the k draft tokens after the n the state holds, then back to n + r.
  A layer says how by its ``rollback_method``:
  ``truncate`` (attention: the k tokens appended to the cache in one call, each attending to the cache and the
  drafts before it; the rollback truncates the cache to n + r), ``checkpoint`` (a recurrence run as k steps of its
  decode form, the state after each kept; the rollback copies the r-th back: Mamba-2, the min-RNNs, linear attention,
  the delta rules, RWKV-7) or ``replay`` (the state copied, the k drafts as one call of the layer's whole-sequence
  form; the rollback copies the state back and prefills the r accepted tokens again: the LSTM and GRU, whose fused
  kernels keep no state per token).
  A rollback may be repeated with as many accepted tokens or fewer, until the next verify: a timed verify goes back
  to n (r = 0) before its next call, untimed.
- **Shared prefixes** (``SharedPrefill``, mode prefix): M prompts of n tokens whose first P are the same. The shared
  strategy prefills the first R ≤ P of them once, for one sequence (R: the largest multiple of the family's
  ``prefix_step``, 0 where nothing can be reused), then the M requests' n − R tokens each from there: a cache of
  positions reads the prefix by reference (its ``shared_by``: ``states.SharedPrefix``), every other state is restored
  by a copy (``restore``), and a recurrent state is checkpointed every ``checkpoint_every`` tokens of the prefix on
  the way (a copy each, held: what an engine keeps to serve later prefixes). The independent strategy prefills the M
  prompts whole. The first token's output (the last position's) is the same either way, within rounding.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import torch
from torch import nn

from attnbench.core.cases import Case
from attnbench.families.catalogue import family_of
from attnbench.families.states import (
    NetworkState,
    SharedPrefix,
    StackState,
    decodable,
    packed,
    reset_state,
    rollback,
    tensor_bytes,
    verify,
)


# ---------------------------------------------------------------------------------------------------- the probe
def tiny_serving(case: Case) -> Case:
    """A probe's case for a serving question: two short sequences where lengths are packed, a chunk that splits the
    probe's prompt, as many drafts as the case (at most 4)."""
    if case.packing:
        short = (max(1, case.seq_len // 2), case.seq_len)
        return replace(case, batch=len(short), packing=short)
    serving = dict(case.serving)
    if case.mode == "prefill" and serving.get("prefill_chunk"):
        serving["prefill_chunk"] = max(1, case.seq_len // 2)
    if case.mode == "verify":
        serving["draft"] = min(serving.get("draft", 1), 4)
        serving["accept"] = min(serving.get("accept", 0), serving["draft"])
    if case.mode == "prefix":  # half the probe's prompt shared by two requests, checkpointed half way where asked
        serving["prefix_tokens"] = max(1, case.seq_len // 2)
        serving["requests"] = min(serving.get("requests", 1), 2)
        serving["checkpoint_every"] = min(serving.get("checkpoint_every", 0), max(1, case.seq_len // 4))
    return replace(case, serving=tuple(sorted(serving.items())))


def chunks(length: int, chunk: int) -> list[tuple[int, int]]:
    """A prompt of ``length`` tokens in pieces of ``chunk`` (0: one piece), as (start, end)."""
    step = chunk if 0 < chunk < length else max(length, 1)
    return [(start, min(start + step, length)) for start in range(0, length, step)]


def run_tiny(case: Case, model: nn.Module, x: torch.Tensor) -> torch.Tensor | None:
    """One call of the serving question ``case`` asks of ``model`` on ``x`` (the case's input), for the probe: the
    packed call (its output returned, for a train case's backward), the chunked prefill, or a prefill, the verify
    and its rollback, or a decode step."""
    if case.packing:
        return packed(model, x, case.packing)
    decoder = decodable(model)
    if case.mode == "prefix":
        requests = case.param("requests")
        run = SharedPrefill(model, case, x[:1, : case.param("prefix_tokens")], x[:1].expand(requests, *x.shape[1:]))
        run.shared()
        return None
    if case.mode == "prefill":
        state = decoder.init_state(case.batch, case.span)
        for start, end in chunks(case.seq_len, case.param("prefill_chunk")):
            decoder.prefill(x[:, start:end], state, output=True)
        return None
    draft = case.param("draft") if case.mode == "verify" else 1
    state = decoder.init_state(case.batch, case.span)
    context, drafts = x[:, : case.seq_len - draft], x[:, case.seq_len - draft :]
    decoder.prefill(context, state, output=False)
    if case.mode == "verify":
        verify(model, drafts, state)
        rollback(model, state, case.param("accept"))
    else:
        decoder.step(drafts[:, :1], state)
    return None


# ---------------------------------------------------------------------------------------------------- shared prefixes
def prefix_reused(case: Case) -> int:
    """R: the prefix positions a request reuses rather than computes, the largest multiple of the family's
    ``prefix_step`` within the prefix (0 where nothing can be reused)."""
    step = family_of(case).prefix_step(case)
    return case.param("prefix_tokens") // step * step if step else 0


def share(prefix: Any, own: Any) -> Any:
    """``own`` (M sequences, allocated for the positions after the prefix) made to read ``prefix``'s caches of
    positions (one sequence's) by reference; its other states are filled from the prefix's by ``restore``."""
    shared_by = getattr(prefix, "shared_by", None)
    if callable(shared_by):
        return shared_by(own)
    if isinstance(prefix, NetworkState) and isinstance(own, NetworkState):
        own.body = share(prefix.body, own.body)
    elif isinstance(prefix, StackState) and isinstance(own, StackState):
        own.layers = [share(p, o) for p, o in zip(prefix.layers, own.layers, strict=True)]
    return own


def held_states(state: Any, *, slots: bool = False) -> Iterator[torch.Tensor]:
    """The tensors of every state but a cache of positions: what a restore fills (a state padded to a page, its own
    tensors, not the padding) and, with ``slots``, what a checkpoint holds (the padding too: a checkpoint of an
    aligned layout takes a page, as every state there does)."""
    if isinstance(state, SharedPrefix) or callable(getattr(state, "shared_by", None)):
        return
    if isinstance(state, NetworkState):
        yield from held_states(state.body, slots=slots)
    elif isinstance(state, StackState):
        for layer in state.layers:
            yield from held_states(layer, slots=slots)
    else:
        yield from (state if slots or getattr(state, "padding", None) is None else state.inner).tensors()


def restore(prefix: Any, state: Any) -> None:
    """``state``'s M sequences continue from ``prefix``'s one: every state but a cache of positions copied from it
    (broadcast over the batch), and the network's position set after the prefix."""
    for src, dst in zip(held_states(prefix), held_states(state), strict=True):
        dst.copy_(src.expand_as(dst))
    if isinstance(prefix, NetworkState) and isinstance(state, NetworkState):
        state.position = prefix.position


class SharedPrefill:
    """M prompts of n tokens sharing their first P (``prefix``: (1, P[, d]); ``prompts``: (M, n[, d]), each beginning
    with it), prefilled to their first token both ways (module notes): ``shared`` and ``independent``."""

    def __init__(self, model: nn.Module, case: Case, prefix: torch.Tensor, prompts: torch.Tensor) -> None:
        self.decoder = decodable(model)
        requests, n = prompts.shape[0], prompts.shape[1]
        self.reused = prefix_reused(case)
        self.head, self.prompts = prefix[:, : self.reused].contiguous(), prompts.contiguous()
        self.rest = prompts[:, self.reused :].contiguous()
        self.independent_state = self.decoder.init_state(requests, n)
        self.prefix_state: Any = None
        self.state: Any = self.independent_state  # nothing reused: the shared strategy is the independent one
        self.pieces: list[tuple[int, int]] = []
        self.checkpoints: list[list[torch.Tensor]] = []
        if self.reused:
            self.prefix_state = self.decoder.init_state(1, self.reused)
            self.state = share(self.prefix_state, self.decoder.init_state(requests, n - self.reused))
            every, held = case.param("checkpoint_every"), list(held_states(self.prefix_state, slots=True))
            self.pieces = chunks(self.reused, every if held else 0)
            if every and held:  # a copy of the recurrent states at each multiple of checkpoint_every, kept
                self.checkpoints = [[t.clone() for t in held] for _ in self.pieces]

    def reset(self) -> None:
        """Every state emptied, as before a call (the checkpoints are written over)."""
        for state in (self.prefix_state, self.state, self.independent_state):
            if state is not None:
                reset_state(state)

    def shared(self) -> torch.Tensor:
        """The prefix once (checkpointed on the way), the M requests from it: (M, n − R, d), the last their first
        token's."""
        for i, (start, end) in enumerate(self.pieces):
            self.decoder.prefill(self.head[:, start:end], self.prefix_state, output=False)
            if self.checkpoints:
                for copy, t in zip(self.checkpoints[i], held_states(self.prefix_state, slots=True), strict=True):
                    copy.copy_(t)
        if self.reused:
            restore(self.prefix_state, self.state)
        out = self.decoder.prefill(self.rest, self.state, output=True)
        assert out is not None  # output=True
        return out

    def independent(self) -> torch.Tensor:
        """The M prompts whole, each from nothing: (M, n, d)."""
        out = self.decoder.prefill(self.prompts, self.independent_state, output=True)
        assert out is not None
        return out

    def unshared(self) -> torch.Tensor:
        """The shared strategy's pieces with nothing shared: every request prefills the prefix itself, in the same
        pieces, then its own tokens: (M, n − R, d). What ``shared`` must equal (a recurrence whose chunked and
        one-pass forms round apart, Mamba-3's at a size that grows its activations to 1e17, is held to its own
        chunking)."""
        prompts = self.prompts
        for start, end in self.pieces:
            self.decoder.prefill(prompts[:, start:end], self.independent_state, output=False)
        out = self.decoder.prefill(self.rest, self.independent_state, output=True)
        assert out is not None
        return out

    def held_bytes(self) -> tuple[int, int]:
        """Bytes the shared strategy holds (the prefix's state, its checkpoints and the requests' own states, each
        tensor once however many read it) and the independent one's (the M requests' states)."""
        shared: dict[int, int] = {}
        for state in (self.prefix_state, self.state):
            if state is not None:
                shared.update((t.data_ptr(), t.numel() * t.element_size()) for t in state.tensors())
        shared.update((t.data_ptr(), t.numel() * t.element_size()) for saved in self.checkpoints for t in saved)
        return sum(shared.values()), tensor_bytes(self.independent_state)
