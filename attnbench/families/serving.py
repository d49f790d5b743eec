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
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from attnbench.core.cases import Case
from attnbench.families.states import decodable, packed, rollback, verify


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
