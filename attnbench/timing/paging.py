"""KV caches as serving engines keep them (issue 52): narrower than they compute, in pages, read chunk by chunk.

An engine's attention kernel reads a kept cache where it lies: vLLM's paged attention converts an fp8 or int8 page
in registers as it reads it, through the sequence's block table, and never holds a converted copy of a layer's
cache. So does a step here (``EngineCache.attend``): the query attends to the cache ``CHUNK_BYTES`` at a time
(whole pages), each chunk gathered through the page table and converted to the compute dtype on its own: as many
whole sequences as a chunk holds, or a long sequence's slots in pieces whose softmaxes are merged by their maxima and
sums (split-K, as flash-decoding merges its splits). A step's working
memory is then one chunk whatever n and the batch, and a capacity search counts what an engine would hold: the
cache in its kept dtype and pages, not a converted copy.

``page_tokens`` P > 0 (vLLM's ``block_size``, 16 by default) keeps K and V in pages of P positions drawn from one
pool (vLLM's layout, ``(2, pages, P, heads, head_dim)``): a sequence of n positions holds ⌈n / P⌉ pages, so up to
P − 1 slots of its last page are allocated and empty, and each reads through a page table (B, ⌈capacity / P⌉) of
page ids. The ids are a permutation of the pool, as an engine's free list hands out pages after its requests came
and went: the gather is a real indirection, never a contiguous slice in disguise.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from attnbench.families.states import KVCache, Layout

__all__ = ["CHUNK_BYTES", "EngineCache", "PagedCache", "kept_cache"]

# What one chunk of a step's read may hold converted (K and V, the batch's, and its float32 scores): bounded, so a
# step's working memory is a constant beside a cache of any length, as a fused kernel's is.
CHUNK_BYTES = 4 * 2**20
# The page pool's ids: a fixed draw, so a run's page tables are the same on every try.
_SEED = 52


def kept_cache(
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
    page_tokens: int = 0,
) -> KVCache:
    """The cache a layer keeps: plain where it is stored as it computes, contiguous; an engine's otherwise."""
    if page_tokens:
        return PagedCache(
            batch, heads, head_dim, capacity, layout=layout, device=device, dtype=dtype, window=window, kept=kept,
            page_tokens=page_tokens,
        )  # fmt: skip
    if kept is None or kept == dtype:
        return KVCache(batch, heads, head_dim, capacity, layout=layout, device=device, dtype=dtype, window=window)
    return EngineCache(
        batch, heads, head_dim, capacity, layout=layout, device=device, dtype=dtype, window=window, kept=kept
    )


class EngineCache(KVCache):
    """A KV cache a step reads chunk by chunk (module notes), converted a chunk at a time."""

    def chunk(self, which: int, start: int, stop: int, rows: slice = slice(None)) -> torch.Tensor:
        """(B, H_kv, stop − start, D) of K (0) or V (1), slots [start, stop) of the sequences ``rows``, in the
        compute dtype."""
        return self._loaded(self._bhnd(self.storage[which])[rows, :, start:stop], which)

    @property
    def heads_kv(self) -> int:
        """K and V's heads (the int8 scales are per head; else the storage's layout says)."""
        return int(
            self.storage.shape[3] if self.storage.dim() == 5 and self.layout == "bnhd" else self.storage.shape[2]
        )

    def chunk_slots(self, batch: int, heads: int, head_dim: int) -> int:
        """Slots per chunk: ``CHUNK_BYTES`` over what a slot costs ``batch`` sequences converted (K and V, and a
        float32 score and weight per query head), at least one."""
        width = torch.empty((), dtype=self.compute).element_size()
        return max(1, CHUNK_BYTES // (batch * (2 * self.heads_kv * head_dim * width + 2 * heads * 4)))

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The step's query (B, H, 1, D) after writing its key and value into slot n, over slots 0…n (a ring's
        filled ones), chunk by chunk: as many whole sequences as ``CHUNK_BYTES`` holds at a time (a batch of short
        ones reads in few large calls), a long one's slots split (split-K)."""
        n = self.length
        self.check_room()
        self.write(k, v, n)
        batch, heads, _, d = q.shape
        filled = min(n + 1, self.slots)
        grouped = q.reshape(batch, self.heads_kv, heads // self.heads_kv, d) * d**-0.5  # query heads on their key head
        rows = self.chunk_slots(1, heads, d) // filled  # whole sequences per chunk, where two or more fit
        rows = rows if rows > 1 else batch  # else every sequence at once, its slots in pieces (split-K)
        parts = [self._attend(grouped[r : r + rows], slice(r, r + rows), filled) for r in range(0, batch, rows)]
        out = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out.to(q.dtype).reshape(batch, heads, 1, d)

    def _attend(self, grouped: torch.Tensor, rows: slice, filled: int) -> torch.Tensor:
        """softmax(qKᵀ)·V over slots 0…filled − 1 of the sequences ``rows``, chunk by chunk, the chunks merged by
        their maxima and sums in float32: (rows, H_kv, G, D)."""
        step = self.chunk_slots(grouped.shape[0], grouped.shape[1] * grouped.shape[2], grouped.shape[3])
        top = total = out = None
        for start in range(0, filled, step):
            stop = min(filled, start + step)
            scores = (grouped @ self.chunk(0, start, stop, rows).transpose(-2, -1)).float()  # (b, H_kv, G, S)
            high = scores.amax(dim=-1, keepdim=True)
            new_top = high if top is None else torch.maximum(top, high)
            weights = (scores - new_top).exp_()
            part = weights.to(grouped.dtype) @ self.chunk(1, start, stop, rows)  # (b, H_kv, G, D)
            if top is None or total is None or out is None:
                total, out = weights.sum(dim=-1, keepdim=True), part.float()
            else:
                decay = (top - new_top).exp_()
                total = total.mul_(decay).add_(weights.sum(dim=-1, keepdim=True))
                out = out.mul_(decay).add_(part.float())
            top = new_top
        assert out is not None and total is not None  # at least the token itself
        return out / total


class PagedCache(EngineCache):
    """K and V in pages of ``page_tokens`` slots from one pool, each sequence's through its page table (module
    notes). Slot s of sequence b lies at offset s mod P of page ``table[b, s // P]``."""

    def __init__(self, *args: Any, page_tokens: int, **kwargs: Any) -> None:
        self.page_tokens, self.layout = page_tokens, kwargs["layout"]  # what ``allocate`` reads
        super().__init__(*args, **kwargs)

    def allocate(self, shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """A pool of whole pages for ``shape``'s sequences and slots (never a contiguous cache beside it), and the
        table of each sequence's pages."""
        bnhd = self.layout == "bnhd"
        batch, heads, slots, dim = shape[1], shape[3 if bnhd else 2], shape[2 if bnhd else 3], shape[4]
        per_sequence = math.ceil(slots / self.page_tokens)
        draw = torch.randperm(batch * per_sequence, generator=torch.Generator().manual_seed(_SEED))
        self.table = draw.view(batch, per_sequence).to(device)
        self.batch = batch
        return torch.zeros((2, batch * per_sequence, self.page_tokens, heads, dim), device=device, dtype=dtype)

    @property
    def heads_kv(self) -> int:
        return int(self.storage.shape[3])

    def chunk_slots(self, batch: int, heads: int, head_dim: int) -> int:
        """Whole pages (at least one): a chunk that began or ended inside a page would gather all of it."""
        return max(1, super().chunk_slots(batch, heads, head_dim) // self.page_tokens) * self.page_tokens

    def chunk(self, which: int, start: int, stop: int, rows: slice = slice(None)) -> torch.Tensor:
        """Whole pages gathered through the table (the indirection an engine's kernel pays), the slots of
        [start, stop) of the sequences ``rows`` kept, converted: (B, H_kv, stop − start, D)."""
        first, last = start // self.page_tokens, math.ceil(stop / self.page_tokens)
        ids, pool = self.table[rows, first:last], self.storage[which]
        # Gathered as bytes where they are bytes: torch's CPU index_select has no float8 kernel of its own.
        raw = pool.view(torch.uint8) if pool.element_size() == 1 else pool
        pages = raw.index_select(0, ids.flatten()).view(pool.dtype).unflatten(0, ids.shape)  # (B, pages, P, H_kv, D)
        held = pages.flatten(1, 2)[:, start - first * self.page_tokens : stop - first * self.page_tokens]
        return self._loaded(held.transpose(1, 2), which)

    def keys(self, end: int) -> torch.Tensor:
        return self.chunk(0, 0, min(end, self.slots))

    def values(self, end: int) -> torch.Tensor:
        return self.chunk(1, 0, min(end, self.slots))

    def write(self, k: torch.Tensor, v: torch.Tensor, start: int) -> None:
        end = start + k.shape[-2]
        if end > self.capacity:
            raise ValueError(f"positions {start}…{end - 1} do not fit a KV cache of {self.capacity}")
        if end - start > self.slots:  # only the last positions survive in a ring
            k, v, start = k[:, :, -self.slots :], v[:, :, -self.slots :], end - self.slots
        slots = torch.arange(start, end, device=self.table.device) % self.slots
        pages, offsets = self.table[:, slots // self.page_tokens], (slots % self.page_tokens).expand(self.batch, -1)
        for which, src in enumerate((k, v)):
            self.storage[which].index_put_((pages, offsets), self._stored(src, which).transpose(1, 2))

    def fill_to(self, length: int) -> None:
        """Made-up keys and values (``KVCache.fill_to``): one sequence's pages drawn, copied into every one's."""
        if length > self.capacity:
            raise ValueError(f"{length} positions do not fit a KV cache of {self.capacity}")
        per_sequence = self.table.shape[1]
        pool = self.storage.unflatten(1, (self.batch, per_sequence))  # (2, B, pages, P, H_kv, D)
        pool.copy_(self.noise(pool[:, :1].shape))
        if self.scales is not None:
            self.scales.fill_(4 / 127)
        self._set_length(length)

    def tensors(self) -> Any:
        yield from super().tensors()
        yield self.table  # the page table: an engine holds one per sequence too
