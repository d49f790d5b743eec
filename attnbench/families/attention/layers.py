"""Multi-head self-attention with interchangeable cores.

A layer is: fused QKV projection → split heads → *core* → merge heads → output projection. The core is the
only thing that differs between the attention models, and it owns no parameters, so two models built from the
same seed with different cores hold identical weights and must compute the same function (a test holds them
equal).
Every core takes q as ``(B, H, T, D)`` and k, v as ``(B, H_kv, T, D)`` and returns ``(B, H, T, D)``: with
grouped-query attention (Ainslie et al. 2023, arXiv:2305.13245) H_kv divides H and key/value head j serves query
heads j·G…j·G+G−1 (G = H / H_kv; multi-query attention, Shazeer 2019, is H_kv = 1), as SDPA's ``enable_gqa`` and
flash-attn order them. A core with ``window`` W > 0 is local attention: query i sees keys j with i − W < j ≤ i
(causal), or |i − j| < W (not causal), the band of Longformer (Beltagy et al. 2020) and Mistral's sliding window.
SDPA takes the band as a mask and a mask skips no tile, so an SDPA core over a long sequence attends block by block
(``band_blocks``), each block's queries against the keys its band reaches: the band's work, not n².

Decoding (``attnbench.families.states``): ``step(q, k, v, cache)`` takes the new token's (B, H, 1, D)
query, key and value, writes the key and value into the cache's slot n and attends to slots 0…n. The prefill that
fills slots 0…n−1 is the layer's, the same for every core: K and V are projections of the layer's input, and the
context's own attention runs through SDPA's causal kernel (the same function as every core's, in O(n) memory,
so vanilla's n×n scores never limit the context a decode step is timed at; a window needs its band as an explicit
mask there). A windowed core's cache is a ring of W slots (``KVCache``), so its step reads min(n + 1, W) keys.

The serving questions (``attnbench.families.serving``) append to the cache: a prompt's next chunk, or a verify's k
draft tokens, is written after the n positions it holds, and its T queries attend to all n + T, causal within the
chunk (query i sees keys up to n + i: the causal mask aligned bottom-right). That attention is the core's own
(``chunk``) when the call is timed (``own_core``, which the family's call context sets), so a prefill row times the
model's kernel; the decode set-up's untimed prefill stays on SDPA, so an explicit core's n² scores never limit a
decode context. flex has no chunk (it compiles per exact shape: the family refuses its serving questions). A verify
rolls back by truncating the cache to n + r (``rollback_method`` truncate). Packed lengths run the projections on
the packed tokens and the core over each sequence alone (flash-attn's varlen kernel does them in one call).

Sinks (option ``sinks``, gpt-oss's; Xiao et al. 2023, arXiv:2309.17453, learned): one logit s_h per query head in
every softmax's denominator, o_i = Σ_j e^{l_ij} v_j / (e^{s_h} + Σ_j e^{l_ij}), with or without a window. The explicit
core writes it out (the sink a column of the scores). An SDPA core runs it on its own backend as one extra key: q, k
and v padded to D + E (E ≥ 1, the total a multiple of 8), q's first extra channel 1, a sink key at position 0 whose
first extra channel is s_h·√D and a zero value, ``scale`` 1/√D, so the sink's score is s_h exactly and its value adds
nothing; the causal mask aligned bottom-right over the S + 1 keys (``causal_lower_right``) keeps the sink visible to
every query, a window's band gets a visible first column. K and V are repeated per query head there (one sink key per
query head). A decode step with sinks is one query's scores over the cache, written out for every core (no copy of
the cache, as the extra key would need). flash-attn and flex take no sinks: the family refuses them.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import replace
from functools import partial
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

from attnbench.core.cases import Case
from attnbench.families.attention.spec import FAMILY, band_blocks
from attnbench.families.base import ExtraValue
from attnbench.families.blocks import NetworkFamily, Stack, TransformerBlock, front, network
from attnbench.families.catalogue import family_of
from attnbench.families.positional import Rotary
from attnbench.families.shared import flag, head_dim, kv_heads
from attnbench.families.states import KVCache, LayerStack, Layout, kv_cache, spans
from attnbench.families.torch_family import LaunchLimit, torch_dtype

# SDPA's enable_gqa (torch 2.5+): K/V with fewer heads than Q, read in place. Older torch repeats them.
SDPA_GQA = tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (2, 5)


def repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, H_kv, T, D) -> (B, H, T, D), each key/value head repeated for the H / H_kv query heads it serves."""
    groups = heads // t.shape[1]
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def band_mask(length: int, *, causal: bool, window: int, device: torch.device) -> torch.Tensor | None:
    """(T, T) bool, True where query i may see key j: causal j ≤ i, within a window i − j < W (and j − i < W when
    not causal). None when every pair is visible. Bool throughout (T² bytes): an int64 distance matrix on the way
    would cost 8·T² (8 GiB at 32k) in time and peak memory. Cores take it from their model's ``MaskCache``."""
    if not causal and not window:
        return None
    keep = torch.ones(length, length, dtype=torch.bool, device=device)
    below = keep.tril(window - 1) if window else keep  # j − i < W (or every key after i, without a window)
    above = keep.triu(-(window - 1)) if window else keep  # i − j < W
    return (below.tril(0) if causal else below) & above


Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def banded(
    attend: Attend,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    spans: Sequence[tuple[int, int, int, int]],
    *,
    causal: bool,
    window: int,
    masks: MaskCache,
    sinks: int = 0,
) -> torch.Tensor:
    """A windowed core's call block by block (``band_blocks``, spec.py): ``attend(q, k, v, mask)`` of each block's
    queries against the keys its band reaches, after the first ``sinks`` keys, which every query sees. Slices are
    views; only a sink key is copied in front of each block's."""
    out = []
    for span in spans:
        start, end, first, last = span
        keys, values = k[..., sinks + first : sinks + last, :], v[..., sinks + first : sinks + last, :]
        if sinks:
            keys = torch.cat([k[..., :sinks, :], keys], dim=-2)
            values = torch.cat([v[..., :sinks, :], values], dim=-2)
        mask = masks.band(span, causal=causal, window=window, sinks=sinks, like=q)
        out.append(attend(q[..., start:end, :], keys, values, mask))
    return torch.cat(out, dim=-2)


class MaskCache:
    """One model's band masks, made once per (length, causal, window, device, grad mode) and shared by its layers:
    built per call they were time and memory in every timed call of a windowed or vanilla causal row. A mask made
    under inference_mode cannot be saved for a backward, hence the grad mode in the key. Freed with the model."""

    def __init__(self) -> None:
        self._masks: dict[tuple[int, bool, int, str, bool], torch.Tensor | None] = {}
        self._additive: dict[tuple[int, bool, int, str, bool, torch.dtype], torch.Tensor | None] = {}
        self._blocks: dict[tuple[int, bool, int, str], Any] = {}
        self._bands: dict[tuple[int, int, int, bool, int, int, str, bool, torch.dtype], torch.Tensor] = {}
        self._mods: dict[tuple[bool, int], Any] = {}

    def get(self, length: int, *, causal: bool, window: int, device: torch.device) -> torch.Tensor | None:
        key = (length, causal, window, str(device), torch.is_inference_mode_enabled())
        if key not in self._masks:
            self._masks[key] = band_mask(length, causal=causal, window=window, device=device)
        return self._masks[key]

    def additive(
        self, length: int, *, causal: bool, window: int, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor | None:
        """The band as SDPA adds it to the scores: 0 where a key is visible, −inf elsewhere, in ``dtype`` (the
        queries'). Given a bool mask, SDPA converts it to this form inside every call (2·T² bytes written per layer
        and call in 16-bit, then read by the kernel), so it is made here once."""
        key = (length, causal, window, str(device), torch.is_inference_mode_enabled(), dtype)
        if key not in self._additive:
            keep = band_mask(length, causal=causal, window=window, device=device)
            made = None
            if keep is not None:
                made = torch.zeros(length, length, dtype=dtype, device=device).masked_fill_(~keep, float("-inf"))
            self._additive[key] = made
        return self._additive[key]

    def band(
        self, span: tuple[int, int, int, int], *, causal: bool, window: int, sinks: int, like: torch.Tensor
    ) -> torch.Tensor:
        """The additive mask of one ``band_blocks`` block: its queries against its keys, after ``sinks`` keys every
        query sees. Made once per shape and offset, which every block but the first and last share."""
        start, end, first, last = span
        key = (end - start, last - first, start - first, causal, window, sinks, str(like.device),
               torch.is_inference_mode_enabled(), like.dtype)  # fmt: skip
        if key not in self._bands:
            distance = torch.arange(start, end, device=like.device)[:, None] - torch.arange(
                first, last, device=like.device
            )
            keep = (distance < window) & (distance >= 0 if causal else distance > -window)
            made = torch.zeros(keep.shape, dtype=like.dtype, device=like.device).masked_fill_(~keep, float("-inf"))
            self._bands[key] = F.pad(made, (sinks, 0))
        return self._bands[key]

    def block(self, length: int, *, causal: bool, window: int, device: torch.device) -> Any:
        """FlexAttention's ``BlockMask`` of the band, once per (length, causal, window, device) for every layer.
        ``create_block_mask`` runs compiled (``compiled_block_mask``): eager, it materialises the whole (T, T) mask
        on the way, 8 GiB of int64 distances at 32k, an ``oom`` row where the kernel itself fits. One ``mask_mod`` per
        (causal, window), the same function for every layer, so dynamo compiles it once rather than per layer (and
        past its cache limit would silently fall back to eager)."""
        key = (length, causal, window, str(device))
        if key not in self._blocks:
            mod = self._mask_mod(causal, window)
            self._blocks[key] = compiled_block_mask()(mod, None, None, length, length, device=device)
        return self._blocks[key]

    def _mask_mod(self, causal: bool, window: int) -> Any:
        if (causal, window) not in self._mods:

            def keep(b: Any, h: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
                distance = q_idx - kv_idx
                visible = distance >= 0 if causal else distance > -window
                return visible & (distance < window) if window else visible

            self._mods[causal, window] = keep
        return self._mods[causal, window]


def gqa_path(model: str, heads: int, heads_kv: int) -> str | None:
    """How ``model``'s core reads fewer key/value heads than query heads: ``enable_gqa`` (SDPA reads them in place),
    ``native`` (flash-attn, flex), ``repeat`` (copied per query head first), or None under multi-head attention."""
    if heads_kv == heads:
        return None
    if model.startswith("sdpa"):
        return "enable_gqa" if SDPA_GQA else "repeat"
    return "native" if model in ("flash-attn", "flex") else "repeat"


class DecodingCore(Protocol):
    """What a core needs to decode: one query's attention over a KV cache, the new key and value written in; and a
    chunk's queries attending to the cache they were appended to (the serving questions)."""

    cache_layout: Layout

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache) -> torch.Tensor: ...

    def chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...


class VanillaCore(nn.Module):
    """The textbook formula, written out: ``softmax(QKᵀ/√D + mask) · V`` (Vaswani et al. 2017, eq. 1).

    It materialises the (T, T) score matrix for every batch × head — that memory and traffic is what the
    fused kernels avoid, and what this benchmark sets out to show. The softmax runs in the input dtype, as a
    naive implementation would.
    """

    cache_layout: Layout = "bhnd"

    def __init__(self, causal: bool, window: int = 0) -> None:
        super().__init__()
        self.causal = causal
        self.window = window
        self.masks = MaskCache()  # attention_network hands every layer of a model one cache

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One query against the cache, written out: scores over the n + 1 slots (the last W in a window's ring;
        no mask: all are in the past). GQA's keys and values are repeated per query head, as in the forward."""
        n, heads = cache.length, q.shape[1]
        cache.check_room()
        cache.write(k, v, n)
        keys, values = repeat_kv(cache.keys(n + 1), heads), repeat_kv(cache.values(n + 1), heads)
        scores = (q @ keys.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, 1, min(n + 1, W))
        return scores.softmax(dim=-1) @ values  # (B, H, 1, D)

    def chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """T queries, the last T of the S keys' positions, written out: query i sees keys j ≤ S − T + i."""
        length, keys = q.shape[-2], k.shape[-2]
        if length == keys:
            return self(q, k, v)
        heads = q.shape[1]
        k, v = repeat_kv(k, heads), repeat_kv(v, heads)
        scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, T, S)
        keep = torch.ones(length, keys, dtype=torch.bool, device=q.device).tril(keys - length)
        return scores.masked_fill(~keep, float("-inf")).softmax(dim=-1) @ v  # (B, H, T, D)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        heads, seq_len, head_dim = q.shape[1], q.shape[-2], q.shape[-1]
        k, v = repeat_kv(k, heads), repeat_kv(v, heads)  # (B, H, T, D): the textbook form has a K/V per head
        scores = (q @ k.transpose(-2, -1)) * head_dim**-0.5  # (B, H, T, T)
        keep = self.masks.get(seq_len, causal=self.causal, window=self.window, device=q.device)
        if keep is not None:
            scores = scores.masked_fill(~keep, float("-inf"))
        return scores.softmax(dim=-1) @ v  # (B, H, T, D)


# The backends ``pinned_backend`` has set torch's (process-wide) SDPA flags to, innermost last; empty outside it.
_PINNED: list[SDPBackend] = []
# Whether a prefill attends with the core's own kernel (a timed call: the family's call context sets it) rather than
# SDPA's dispatch (the decode set-up's untimed prefill, whose context an explicit core's n² scores could not hold).
OWN_CORE: ContextVar[bool] = ContextVar("own_core", default=False)


@contextlib.contextmanager
def own_core() -> Iterator[None]:
    """Prefills inside attend with the model's own core (module notes)."""
    token = OWN_CORE.set(True)
    try:
        yield
    finally:
        OWN_CORE.reset(token)


class SdpaCore(nn.Module):
    """``F.scaled_dot_product_attention``, optionally forced to one backend.

    ``backend=None`` leaves the choice to PyTorch's dispatcher (model ``sdpa``). A forced backend that cannot
    run these inputs raises RuntimeError rather than falling back, which is what the probe relies on.

    Forcing a backend is ``sdpa_kernel``, a pure-Python context manager that reads and sets five global flags
    on entry and again on exit (~20 µs on a CPU host). Entered in every ``forward`` it would charge each layer
    of a forced model a host cost the dispatched ``sdpa`` row never pays, and at launch-bound sizes a forced
    backend would look slower for Python reasons. So whoever times the model enters it once, around all its
    calls (``pinned_backend``); ``forward`` enters it only when called outside that scope, which keeps the
    module self-contained. Backward needs no context: each fused kernel records its own backward.
    """

    cache_layout: Layout = "bhnd"

    def __init__(self, causal: bool, backend: SDPBackend | None = None, window: int = 0) -> None:
        super().__init__()
        self.causal = causal
        self.backend = backend
        self.window = window
        self.masks = MaskCache()  # attention_network hands every layer of a model one cache

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not self.window:
            return self._attend(q, k, v, is_causal=self.causal)
        # A window is an explicit additive mask: SDPA has no band of its own. A backend that takes no mask
        # (CUDA's flash) raises, and the probe turns that into an unsupported row. A long sequence goes block by block.
        spans = band_blocks(q.shape[-2], self.window, causal=self.causal) if q.shape[-2] == k.shape[-2] else ()
        if spans:

            def attend(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
                return self._attend(qb, kb, vb, is_causal=False, mask=mask)

            return banded(attend, q, k, v, spans, causal=self.causal, window=self.window, masks=self.masks)
        band = self.masks.additive(q.shape[-2], causal=self.causal, window=self.window, device=q.device, dtype=q.dtype)
        return self._attend(q, k, v, is_causal=False, mask=band)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """A query of length 1 against the n + 1 cached keys (a window's ring: the last W). ``is_causal=False``:
        SDPA aligns its causal mask top-left, so with one query it would let the new token see key 0 alone (every
        key here is in the past)."""
        n = cache.length
        cache.check_room()
        cache.write(k, v, n)
        return self._attend(q, cache.keys(n + 1), cache.values(n + 1), is_causal=False)

    def chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """T queries, the last T of the S keys' positions: SDPA's causal mask aligned bottom-right (``CausalBias``,
        which flash and the efficient kernel take as such), on the core's backend."""
        if q.shape[-2] == k.shape[-2]:
            return self(q, k, v)
        heads = q.shape[1]
        k, v = repeat_kv(k, heads), repeat_kv(v, heads)  # CausalBias's kernels take no enable_gqa
        bias = causal_lower_right(q.shape[-2], k.shape[-2])
        if self.backend is None or (_PINNED and _PINNED[-1] == self.backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        with sdpa_kernel(self.backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    def explicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, mask: Any, scale: float) -> torch.Tensor:
        """SDPA on the core's backend with a mask and a scale of the caller's (K and V with Q's heads)."""
        if self.backend is None or (_PINNED and _PINNED[-1] == self.backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        with sdpa_kernel(self.backend):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        if self.backend is None or (_PINNED and _PINNED[-1] == self.backend):
            return sdpa(q, k, v, is_causal=is_causal, mask=mask)
        with sdpa_kernel(self.backend):
            return sdpa(q, k, v, is_causal=is_causal, mask=mask)

    def extra_repr(self) -> str:
        name = "dispatch" if self.backend is None else self.backend.name
        return f"backend={name}, causal={self.causal}, window={self.window}"


def sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with K/V of fewer heads than Q read in place (``enable_gqa``), or repeated
    where this torch has no such flag."""
    if k.shape[1] == q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
    if SDPA_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, enable_gqa=True)
    heads = q.shape[1]
    return F.scaled_dot_product_attention(
        q, repeat_kv(k, heads), repeat_kv(v, heads), attn_mask=mask, is_causal=is_causal
    )


def forced_backend(model: nn.Module) -> SDPBackend | None:
    """The one SDPA backend ``model``'s cores are forced to, or None when none is (dispatch, other cores)."""
    backends = {m.backend for m in model.modules() if isinstance(m, SdpaCore) and m.backend is not None}
    if len(backends) > 1:
        raise ValueError(f"one model forces several SDPA backends: {sorted(b.name for b in backends)}")
    return next(iter(backends), None)


@contextlib.contextmanager
def pinned_backend(model: nn.Module) -> Iterator[None]:
    """Set torch's SDPA flags to ``model``'s forced backend once, for every call made inside (see ``SdpaCore``).

    A no-op for a model that forces no backend. The flags are process-wide, as ``sdpa_kernel``'s are.
    """
    backend = forced_backend(model)
    if backend is None:
        yield
        return
    with sdpa_kernel(backend):
        _PINNED.append(backend)
        try:
            yield
        finally:
            _PINNED.pop()


@contextlib.contextmanager
def timed_call(model: nn.Module) -> Iterator[None]:
    """What every timed call of an attention model runs inside: its forced SDPA backend, set once rather than per
    layer (``pinned_backend``), and a prefill on the core's own kernel (``own_core``)."""
    with pinned_backend(model), own_core():
        yield


def reduced_precision_math(*, apply: bool = True) -> bool | None:
    """Let SDPA's math backend compute fp16/bf16 inputs in their own dtype (``apply``); True, or None where this
    torch has no such switch.

    Since torch 2.5 the math backend upcasts fp16/bf16 q, k and v to float32 unless
    ``allow_fp16_bf16_reduction_math_sdp(True)`` (ATen ``_scaled_dot_product_attention_math``; on CPU too), so an
    ``sdpa-math`` row labelled bf16 would do float32 work and be held against the bf16 tensor-core peak. attnbench
    sets the switch, so every bf16 row computes in bf16 — the like-for-like comparison with ``vanilla`` (whose
    softmax runs in the input dtype) and with the fused kernels. The flag is process-wide; run.json and each
    attention row record it.
    """
    allow = getattr(torch.backends.cuda, "allow_fp16_bf16_reduction_math_sdp", None)
    if allow is None:
        return None
    if apply:
        allow(True)
    return True


def math_precision_flag() -> bool | None:
    """Whether SDPA's math backend keeps fp16/bf16 in their own dtype now (None: this torch has no switch)."""
    allowed = getattr(torch.backends.cuda, "fp16_bf16_reduction_math_sdp_allowed", None)
    return None if allowed is None else bool(allowed())


class FlashAttnCore(nn.Module):
    """``flash_attn.flash_attn_func`` from the Dao-AILab package (CUDA, fp16/bf16 only).

    The package wants (B, T, H, D). Transposing our (B, H, T, D) view back gives exactly the strides the QKV
    split produced, so no copy is made on the way in. Its decode kernel, ``flash_attn_with_kvcache``, keeps the
    cache in that layout too, and writes the new key and value into it itself.
    """

    cache_layout: Layout = "bnhd"

    def __init__(self, causal: bool, window: int = 0) -> None:
        super().__init__()
        self.causal = causal
        self.window = window
        # flash-attn's band: (left, right) keys beside the query's own, -1 = unbounded.
        self._window_size = (-1, -1) if not window else (window - 1, 0 if causal else window - 1)
        # Imported here, not at module import: the package is optional and its import needs CUDA libraries.
        package = importlib.import_module("flash_attn")
        self._func: Any = package.flash_attn_func
        self._kvcache: Any = getattr(package, "flash_attn_with_kvcache", None)  # older releases lack it
        self._varlen: Any = getattr(package, "flash_attn_varlen_func", None)
        # Each packing's cu_seqlens, made by its first call (a warm-up's, untimed) and reused: torch.tensor from a
        # Python list is a pageable host-to-device copy, a synchronisation inside every timed call.
        self._cu_seqlens: dict[tuple[tuple[int, ...], torch.device], torch.Tensor] = {}

    def chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """T queries, the last T of the S keys' positions: flash-attn aligns its causal mask bottom-right (2.1+)."""
        if q.shape[-2] == k.shape[-2]:
            return self(q, k, v)
        out = self._func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True)
        return out.transpose(1, 2)

    def varlen(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """Packed sequences in one call of ``flash_attn_varlen_func``: q (1, H, T, D), k and v (1, H_kv, T, D), each
        sequence attending to itself alone (its ``cu_seqlens``)."""
        if self._varlen is None:
            raise NotImplementedError("this flash_attn release has no flash_attn_varlen_func")
        cu = self.cu_seqlens(lengths, q.device)
        out = self._varlen(
            q[0].transpose(0, 1),  # (T, H, D)
            k[0].transpose(0, 1),
            v[0].transpose(0, 1),
            cu,
            cu,
            max(lengths),
            max(lengths),
            causal=self.causal,
            window_size=self._window_size,
        )
        return out.transpose(0, 1)[None]  # (T, H, D) -> (1, H, T, D)

    def cu_seqlens(self, lengths: Sequence[int], device: torch.device) -> torch.Tensor:
        """The packing's sequence starts and end (int32, on ``device``), built once per packing."""
        key = (tuple(lengths), device)
        if key not in self._cu_seqlens:
            starts = [0, *itertools.accumulate(lengths)]
            self._cu_seqlens[key] = torch.tensor(starts, dtype=torch.int32, device=device)
        return self._cu_seqlens[key]

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # GQA is native: k and v keep their H_kv heads (nheads_k in the package's words).
        out = self._func(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=self.causal, window_size=self._window_size
        )
        return out.transpose(1, 2)  # (B, T, H, D) -> (B, H, T, D)

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """``flash_attn_with_kvcache``: writes k and v into slot ``cache_seqlens`` (= n) of the cache in place and
        attends to slots 0…n. Its causal mask is aligned bottom-right, so one query sees every slot either way."""
        if self._kvcache is None:
            raise NotImplementedError("this flash_attn release has no flash_attn_with_kvcache (added in 2.2)")
        if cache.storage.dtype != q.dtype:
            raise NotImplementedError("flash_attn_with_kvcache reads the cache in the model's dtype: no kv_dtype")
        cache.check_room()
        if cache.visible is not None:
            # A window's ring: the kernel would write at slot cache_seqlens, but the token's slot is n mod W. So
            # the token is written here and the kernel reads the min(n + 1, W) filled slots, every one visible.
            cache.write(k, v, cache.length)
            out = self._kvcache(q.transpose(1, 2), cache.k, cache.v, cache_seqlens=cache.visible, causal=True)
            return out.transpose(1, 2)
        out = self._kvcache(
            q.transpose(1, 2),  # (B, 1, H, D)
            cache.k,  # (B, capacity, H, D)
            cache.v,
            k=k.transpose(1, 2),
            v=v.transpose(1, 2),
            cache_seqlens=cache.seqlens,
            causal=True,
        )
        return out.transpose(1, 2)  # (B, 1, H, D) -> (B, H, 1, D)


_COMPILED_FLEX: list[Any] = []  # torch.compile(flex_attention), made once per process on first use
_COMPILED_BLOCK_MASK: list[Any] = []  # torch.compile(create_block_mask), the same


def compiled_block_mask() -> Any:
    """``create_block_mask`` compiled, as torch now asks (its ``_compile=True`` flag is deprecated and compiles a new
    wrapper per call)."""
    if not _COMPILED_BLOCK_MASK:
        module = importlib.import_module("torch.nn.attention.flex_attention")
        _COMPILED_BLOCK_MASK.append(torch.compile(module.create_block_mask))
    return _COMPILED_BLOCK_MASK[0]


def compiled_flex() -> Any:
    """``flex_attention`` compiled, as its docs require for the fused kernel (eager materialises the scores)."""
    if not _COMPILED_FLEX:
        module = importlib.import_module("torch.nn.attention.flex_attention")  # torch 2.5+
        _COMPILED_FLEX.append(torch.compile(module.flex_attention, dynamic=False))
    return _COMPILED_FLEX[0]


class FlexCore(nn.Module):
    """FlexAttention (``torch.nn.attention.flex_attention``), compiled, with causal and window as a block mask.

    The mask is a ``mask_mod`` turned into a ``BlockMask`` once per sequence length for the whole model
    (``MaskCache.block``: compiled, with B = H = None, on the inputs' device: the mask does not depend on batch or
    head, and its default device is the accelerator whatever the inputs): tiles wholly outside the band are
    skipped, which is what makes flex fast for a window. GQA goes in as ``enable_gqa``. Compilation happens on
    the first call, which the executor makes and times apart (``compile_s``) and which is the case's probe too
    (a tiny probe would compile shapes the case never runs, ``dynamic=False``); on a CPU flex has no backward, so
    train and backward rows are ``unsupported`` with torch's reason. A decode step attends over the cache's
    visible slots with no mask: every one is in the past (a window's ring holds only its band).
    """

    cache_layout: Layout = "bhnd"

    def __init__(self, causal: bool, window: int = 0) -> None:
        super().__init__()
        self.causal = causal
        self.window = window
        self._flex = compiled_flex()
        self.masks = MaskCache()  # attention_network hands every layer of a model one cache

    def _block_mask(self, length: int, device: torch.device) -> Any:
        if not self.causal and not self.window:
            return None
        return self.masks.block(length, causal=self.causal, window=self.window, device=device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = self._block_mask(q.shape[-2], q.device)
        return self._flex(q, k, v, block_mask=mask, enable_gqa=k.shape[1] != q.shape[1])

    def step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache) -> torch.Tensor:
        n = cache.length
        cache.check_room()
        cache.write(k, v, n)
        keys, values = cache.keys(n + 1), cache.values(n + 1)
        return self._flex(q, keys, values, enable_gqa=keys.shape[1] != q.shape[1])

    def chunk(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if q.shape[-2] == k.shape[-2]:
            return self(q, k, v)
        raise NotImplementedError("flex compiles per exact shape: a chunk attending to a cache is not implemented")


# ---------------------------------------------------------------------------------------------------- sinks
def visible(
    length: int, keys: int, *, causal: bool, window: int, masks: MaskCache, device: torch.device
) -> torch.Tensor | None:
    """(T, S) bool of the keys T queries (the last T of S positions) see, None where every key is seen: the band for
    a whole sequence, the causal mask aligned bottom-right for a chunk (a chunk with a window is refused)."""
    if length == keys:
        return masks.get(length, causal=causal, window=window, device=device)
    return torch.ones(length, keys, dtype=torch.bool, device=device).tril(keys - length)


def explicit_sinks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, keep: torch.Tensor | None
) -> torch.Tensor:
    """softmax([s_h, QKᵀ/√D]) · [0; V], written out: the sink a column of the scores (module notes)."""
    heads = q.shape[1]
    k, v = repeat_kv(k, heads), repeat_kv(v, heads)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, T, S)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    sink = sinks.to(scores.dtype).view(1, heads, 1, 1).expand(*scores.shape[:-1], 1)
    weights = torch.cat([sink, scores], dim=-1).softmax(dim=-1)
    return weights[..., 1:] @ v  # (B, H, T, D)


def sink_padding(head_dim: int) -> int:
    """E: the channels added to a head (at least one, the total a multiple of 8, as fused kernels want)."""
    return 8 - head_dim % 8


def with_sink_key(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v padded to D + E with the sink as key 0 (module notes): k, v (B, H, S + 1, D + E)."""
    batch, heads, _, d = q.shape
    extra = sink_padding(d)
    k, v = repeat_kv(k, heads), repeat_kv(v, heads)
    one = F.pad(q.new_ones(1), (0, extra - 1))  # (E,): [1, 0, …]
    q = torch.cat([q, one.expand(*q.shape[:-1], extra)], dim=-1)
    key = F.pad((sinks.to(q.dtype) * d**0.5).view(heads, 1, 1), (d, extra - 1))  # (H, 1, D + E): s_h·√D at D
    k = torch.cat([key.expand(batch, heads, 1, d + extra), F.pad(k, (0, extra))], dim=2)
    v = F.pad(v, (0, extra, 1, 0))  # a zero value for the sink, and the padding
    return q, k, v


def sink_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: KVCache, sinks: torch.Tensor) -> torch.Tensor:
    """One query (B, H, 1, D) against the cache's n + 1 slots and the sink, written out: K/V grouped per key/value
    head (no repeat, no copy of the cache)."""
    n = cache.length
    cache.check_room()
    cache.write(k, v, n)
    keys, values = cache.keys(n + 1), cache.values(n + 1)  # (B, H_kv, S, D)
    batch, heads, _, d = q.shape
    heads_kv = keys.shape[1]
    grouped = q.reshape(batch, heads_kv, heads // heads_kv, d)  # query heads j·G … j·G + G − 1 on key head j
    scores = (grouped @ keys.transpose(-2, -1)) * d**-0.5  # (B, H_kv, G, S)
    sink = sinks.to(scores.dtype).view(1, heads_kv, heads // heads_kv, 1).expand(batch, -1, -1, 1)
    weights = torch.cat([sink, scores], dim=-1).softmax(dim=-1)
    return (weights[..., 1:] @ values).reshape(batch, heads, 1, d)


class SelfAttention(nn.Module):
    """One multi-head self-attention layer around a parameter-free core; the FFN and norms are the block's
    (``attnbench.families.blocks``). ``rotary`` (RoPE, parameter-free too) rotates queries and keys per head."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        core: nn.Module,
        *,
        device: str,
        dtype: torch.dtype,
        rotary: nn.Module | None = None,
        heads_kv: int | None = None,
        head_dim: int = 0,
        bias: bool = True,
        output_gate: bool = False,
        qk_norm: bool = False,
    ) -> None:
        super().__init__()
        heads_kv = heads_kv or heads
        if d_model % heads and not head_dim:
            raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
        if heads % heads_kv:
            raise ValueError(f"heads_kv {heads_kv} does not divide heads {heads}")
        self.heads, self.heads_kv = heads, heads_kv
        self.head_dim = head_dim or d_model // heads
        self.rotary = rotary
        # Created in this order for every core, so a given seed yields the same weights whatever the core. Q takes
        # H·D rows (d_model unless head_dim is set), K and V H_kv·D each: GQA shrinks the projection (and the KV
        # cache) by H / H_kv. A gated layer's gate is H·D more rows of the same projection (Qwen3-Next's q_proj).
        q_width = heads * self.head_dim
        width = q_width + 2 * heads_kv * self.head_dim
        self.qkv = nn.Linear(d_model, width, bias=bias, device=device, dtype=dtype)
        self.core = core
        self.out = nn.Linear(q_width, d_model, bias=bias, device=device, dtype=dtype)
        # A gated layer's gate: H·D more rows of the input projection (Qwen3-Next's q_proj), applied at the merge.
        self.gate = nn.Linear(d_model, q_width, bias=bias, device=device, dtype=dtype) if output_gate else None
        # Per-head RMSNorm of queries and keys, one weight of D each (Qwen3's q_norm and k_norm).
        self.q_norm = nn.RMSNorm(self.head_dim, device=device, dtype=dtype) if qk_norm else None
        self.k_norm = nn.RMSNorm(self.head_dim, device=device, dtype=dtype) if qk_norm else None
        self.sinks: nn.Parameter | None = None

    def add_sinks(self) -> None:
        """A learned sink logit per query head (module notes), drawn after every other weight of the model, so a
        seed gives the same projections with sinks or without."""
        weight = self.qkv.weight
        self.sinks = nn.Parameter(torch.randn(self.heads, device=weight.device, dtype=weight.dtype))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The core over T queries and S ≥ T keys (a chunk's queries the last T), with the sinks where on."""
        if self.sinks is None:
            core: DecodingCore = self.core  # type: ignore[assignment]  # every core here has a chunk
            return core.chunk(q, k, v) if q.shape[-2] != k.shape[-2] else self.core(q, k, v)
        causal, window = bool(getattr(self.core, "causal", True)), int(getattr(self.core, "window", 0))
        masks = getattr(self.core, "masks", None)
        made = masks if isinstance(masks, MaskCache) else MaskCache()
        length, keys = q.shape[-2], k.shape[-2]
        if not isinstance(self.core, SdpaCore):
            keep = visible(length, keys, causal=causal, window=window, masks=made, device=q.device)
            return explicit_sinks(q, k, v, self.sinks, keep)
        qs, ks, vs = with_sink_key(q, k, v, self.sinks)
        scale, width = q.shape[-1] ** -0.5, q.shape[-1]
        spans = band_blocks(length, window, causal=causal) if length == keys else ()
        if spans:
            core = self.core

            def attend(qb: torch.Tensor, kb: torch.Tensor, vb: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
                return core.explicit(qb, kb, vb, mask=mask, scale=scale)

            out = banded(attend, qs, ks, vs, spans, causal=causal, window=window, masks=made, sinks=1)
            return out[..., :width]
        mask: Any = None
        if window:
            band = made.additive(length, causal=causal, window=window, device=q.device, dtype=q.dtype)
            mask = F.pad(band, (1, 0)) if band is not None else None  # the sink's column, always visible
        elif causal or length != keys:
            mask = causal_lower_right(length, keys + 1)
        return self.core.explicit(qs, ks, vs, mask=mask, scale=scale)[..., :width]

    def _heads(self, x: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q (B, H, T, D), k and v (B, H_kv, T, D): views of one fused projection, rotated for positions position…"""
        return self._split(self.qkv(x), position)

    def _split(self, qkv: torch.Tensor, position: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``_heads`` of the projection ``qkv`` (B, T, (H + 2·H_kv)·D)."""
        batch, seq_len, _ = qkv.shape
        d, kv = self.head_dim, self.heads_kv * self.head_dim
        q, k, v = qkv.split([self.heads * d, kv, kv], dim=-1)  # views, no copy
        q = q.view(batch, seq_len, self.heads, d).transpose(1, 2)  # (B, H, T, D)
        k = k.view(batch, seq_len, self.heads_kv, d).transpose(1, 2)  # (B, H_kv, T, D)
        v = v.view(batch, seq_len, self.heads_kv, d).transpose(1, 2)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:
            q, k = self.rotary(q, position), self.rotary(k, position)  # (B, H, T, D), rotated by position
        return q, k, v

    def _merge(self, y: torch.Tensor, x: torch.Tensor | None = None) -> torch.Tensor:
        """The core's (B, H, T, D) back to (B, T, d_model); a gated layer's times sigmoid of its gate, projected
        from the same input ``x``."""
        merged = y.transpose(1, 2).flatten(2)  # (B, H, T, D) -> (B, T, H, D) -> (B, T, H·D)
        if self.gate is not None:
            if x is None:
                raise ValueError("a gated layer's merge needs the layer's input")
            merged = merged * torch.sigmoid(self.gate(x))
        return self.out(merged)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._heads(x, 0)
        return self._merge(self.core(q, k, v) if self.sinks is None else self._attend(q, k, v), x)

    def init_state(self, batch: int, capacity: int) -> KVCache:
        """H_kv heads of K and V for ``capacity`` positions, or a ring of the core's window."""
        weight = self.qkv.weight
        layout: Layout = getattr(self.core, "cache_layout", "bhnd")
        window = int(getattr(self.core, "window", 0))
        return kv_cache(
            batch, self.heads_kv, self.head_dim, capacity, layout=layout, device=weight.device, dtype=weight.dtype,
            window=window,
        )  # fmt: skip

    def prefill(self, x: torch.Tensor, state: KVCache, *, output: bool = True) -> torch.Tensor | None:
        """K and V of the T tokens ``x`` into the cache after the n it holds; their causal attention to all n + T
        only if ``output``: the core's own (``chunk``) in a timed call or after a first chunk, else SDPA's."""
        start = state.length
        q, k, v = self._heads(x, start)
        state.append(k, v)
        if not output:
            return None
        if start or OWN_CORE.get() or self.sinks is not None:
            end = start + x.shape[1]
            keys, values = (k, v) if not start else (state.keys(end), state.values(end))
            return self._merge(self._attend(q, keys, values), x)
        window = int(getattr(self.core, "window", 0))
        if not window:
            return self._merge(sdpa(q, k, v, is_causal=True), x)
        masks = getattr(self.core, "masks", None)
        made = masks if isinstance(masks, MaskCache) else MaskCache()
        keep = made.get(q.shape[-2], causal=True, window=window, device=q.device)
        return self._merge(sdpa(q, k, v, is_causal=False, mask=keep), x)

    def step(self, x: torch.Tensor, state: KVCache) -> torch.Tensor:
        """(B, 1, d_model) at position n = the cache's length -> (B, 1, d_model)."""
        q, k, v = self._heads(x, state.length)
        if self.sinks is not None:
            return self._merge(sink_step(q, k, v, state, self.sinks), x)
        if callable(attend := getattr(state, "attend", None)):  # a kept cache read as an engine's kernel reads it
            return self._merge(attend(q, k, v), x)
        core: DecodingCore = self.core  # type: ignore[assignment]  # every core here has a step
        return self._merge(core.step(q, k, v, state), x)

    rollback_method = "truncate"

    def verify(self, x: torch.Tensor, state: KVCache) -> torch.Tensor:
        """k draft tokens appended to the cache in one call, each attending to the context and the drafts before
        it (the chunk path); the cache remembers where they start."""
        state.saved = state.length
        out = self.prefill(x, state, output=True)
        assert out is not None  # output=True
        return out

    def rollback(self, state: KVCache, accepted: int) -> None:
        """The cache truncated to the context and the first ``accepted`` drafts."""
        if state.saved is None:
            raise ValueError("rollback() needs a verify first")
        state.truncate(state.saved + accepted)

    def packed(self, x: torch.Tensor, lengths: Sequence[int]) -> torch.Tensor:
        """(1, T, d_model) of packed sequences: the projections on every token at once, each sequence's attention
        to itself alone (positions from 0): flash-attn's varlen kernel in one call, else the core per sequence."""
        qkv = self.qkv(x)  # (1, T, (H + 2·H_kv)·D)
        pieces = [self._split(qkv[:, start:end], 0) for start, end in spans(lengths)]  # each rotated from 0
        varlen = getattr(self.core, "varlen", None)
        if self.sinks is not None:
            return self._merge(torch.cat([self._attend(q, k, v) for q, k, v in pieces], dim=2), x)
        if varlen is not None:
            q, k, v = (torch.cat(parts, dim=2) for parts in zip(*pieces, strict=True))
            return self._merge(varlen(q, k, v, lengths), x)
        return self._merge(torch.cat([self.core(q, k, v) for q, k, v in pieces], dim=2), x)  # (1, H, T, D)


class AttentionStack(LayerStack):
    """``layers`` self-attention layers applied in turn: (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, layers: list[SelfAttention]) -> None:
        super().__init__(list(layers))


# ---------------------------------------------------------------------------------------------------- the family
# The SDPA backend each forced model pins, by SDPBackend member name (CUDNN_ATTENTION is new in torch 2.5).
FORCED_BACKENDS = {
    "sdpa-math": "MATH",
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
}
# Why a model is missing on a device the catalogue leaves out, for the cheap check before any probing.
_DEVICE_NOTES = {
    "sdpa-efficient": "EFFICIENT_ATTENTION has no CPU kernel",
    "sdpa-cudnn": "CUDNN_ATTENTION runs on cuDNN, which is GPU-only",
    "flash-attn": "the flash_attn package ships CUDA kernels only",
}
# dtypes a model supports at all, where narrower than catalogue.DTYPES (flash_attn_func: fp16/bf16 only).
_DTYPE_LIMITS = {"flash-attn": ("float16", "bfloat16")}
# CUDA caps a grid's y and z axes at 65,535 blocks, and these kernels put the batch (times the heads, in flash-attn's
# split-KV decode) on one: SDPA's flash, efficient and cuDNN kernels (pytorch#146704, #142228, #181235), which plain
# `sdpa` dispatches to, and flash_attn_with_kvcache. Past it a launch fails ("invalid configuration argument"), not
# an allocation, so a capacity search must stop there. Bounded on batch × heads, the tightest of those layouts.
GRID_AXIS_MAX = 65_535
_GRID_BOUND = frozenset({"sdpa", *FORCED_BACKENDS.keys() - {"sdpa-math"}, "flash-attn"})


def _forced_core(model: str, causal: bool, window: int) -> nn.Module:
    backend = getattr(SDPBackend, FORCED_BACKENDS[model], None)
    if backend is None:
        raise NotImplementedError(f"torch {torch.__version__} has no SDPBackend.{FORCED_BACKENDS[model]}")
    return SdpaCore(causal, backend, window)


# Each builds a parameter-free core from (causal, window).
CORES: dict[str, Callable[[bool, int], nn.Module]] = {
    "vanilla": VanillaCore,
    "sdpa": lambda causal, window: SdpaCore(causal, None, window),
    "flash-attn": FlashAttnCore,
    "flex": FlexCore,
    **{model: partial(_forced_core, model) for model in FORCED_BACKENDS},
}


def attention_network(
    case: Case,
    layer_type: type[SelfAttention],
    make_core: Callable[[], nn.Module],
    device: str,
    dtype: torch.dtype,
) -> nn.Module:
    """Attention-like layers (``layer_type`` around ``make_core()``), or pre-norm blocks of them, at the case's
    scope; linear attention is the same network with its own layer and core."""
    if case.heads is None or case.head_dim is None:
        raise ValueError(f"{case.model} needs heads")
    made = front(case, device, dtype)
    opt = family_of(case).values(case)
    rotary = None
    if family_of(case).option(case, "positional") == "rope":
        # One table shared by every layer: it holds no parameters, only cos/sin of the positions.
        rotary = Rotary(head_dim(case, opt), case.span, device=device, dtype=dtype)
    # The attention family's head options (linear attention, which shares the layer, has none: their defaults).
    width, bias = head_dim(case, opt), flag(opt, "bias", default=True)
    gated, normed = flag(opt, "output_gate"), flag(opt, "qk_norm")

    def attention() -> SelfAttention:
        heads = case.heads or 0
        return layer_type(
            case.d_model,
            heads,
            make_core(),
            device=device,
            dtype=dtype,
            rotary=rotary,
            heads_kv=kv_heads(case, opt),
            head_dim=width,
            bias=bias,
            output_gate=gated,
            qk_norm=normed,
        )

    if family_of(case).option(case, "scope") == "core":
        built = network(case, AttentionStack([attention() for _ in range(case.layers)]), made, device, dtype)
    else:
        ffn_mult = int(family_of(case).option(case, "ffn_mult"))
        blocks = [
            TransformerBlock(attention(), case.d_model, ffn_mult, device=device, dtype=dtype)
            for _ in range(case.layers)
        ]
        built = network(case, Stack(*blocks), made, device, dtype)
    shared = MaskCache()  # one band per length for every layer, not one per layer
    for module in built.modules():
        if isinstance(getattr(module, "masks", None), MaskCache):
            module.masks = shared  # type: ignore[assignment]
    return built


class AttentionTorch(NetworkFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        core = CORES[case.model]
        built = attention_network(case, SelfAttention, lambda: core(case.causal, FAMILY.window(case)), device, dtype)
        if FAMILY.option(case, "sinks"):
            for module in built.modules():
                if isinstance(module, SelfAttention):
                    module.add_sinks()
        return built

    def probes(self, case: Case) -> bool:
        # flex compiles for its exact shapes (dynamic=False): a tiny copy's compile would be thrown away, so the
        # case's first, compiling call is its probe (the executor turns a missing kernel there into unsupported).
        return case.model != "flex"

    def device_note(self, model: str) -> str | None:
        return _DEVICE_NOTES.get(model)

    def unavailable(self, case: Case, device_type: str) -> str | None:
        allowed = _DTYPE_LIMITS.get(case.model)
        if allowed is not None and case.dtype not in allowed:
            return f"{case.model}: supports only {' and '.join(allowed)}, not {case.dtype}"
        return None

    def label(self, model: str) -> str:
        return FORCED_BACKENDS.get(model, model)

    def extras(self, case: Case, device: str) -> dict[str, ExtraValue]:
        extra: dict[str, ExtraValue] = {}
        if case.heads is not None and FAMILY.kv_heads(case) != case.heads:
            extra["gqa_path"] = gqa_path(case.model, case.heads, FAMILY.kv_heads(case) or case.heads)
        if case.model == "sdpa" and not FAMILY.option(case, "sinks"):
            # With sinks SDPA sees padded heads, one more key and a mask: the case's own shapes would not say which
            # kernel ran, so the row claims none.
            extra["sdpa_kernel"] = sdpa_kernel_chosen(case, device)
        if case.model.startswith("sdpa") and case.dtype in ("float16", "bfloat16"):
            # Whether SDPA's math path (forced, or dispatch's fallback) computed in the row's dtype or in float32.
            extra["math_sdp_reduced_precision"] = math_precision_flag()
        return extra

    def compiled(self, case: Case) -> bool:
        return case.model == "flex"  # flex is compiled by construction

    def launch_limit(self, case: Case, device_type: str) -> LaunchLimit | None:
        if device_type != "cuda" or case.model not in _GRID_BOUND:
            return None
        heads = case.heads or 1
        return LaunchLimit(
            max(1, GRID_AXIS_MAX // heads),
            f"{self.label(case.model)} puts batch × heads ({heads}) on a CUDA grid axis of at most {GRID_AXIS_MAX}",
        )

    def prepare_process(self) -> None:
        reduced_precision_math()  # a bf16 row computes in bf16, sdpa-math included (README: "Precision")

    def process_settings(self) -> dict[str, bool | str | None]:
        return {"sdpa_math_reduced_precision": reduced_precision_math(apply=False)}

    def call_context(self, case: Case, model: nn.Module) -> contextlib.AbstractContextManager[object]:
        return timed_call(model)

    def reference_case(self, case: Case) -> Case:
        """The explicit formula (QKᵀ/√d, softmax, ·V), eager: what every fused core (SDPA's backends, flash-attn,
        flex) computes faster, with the same weights (the cores have none of their own)."""
        return super().reference_case(replace(case, model="vanilla"))


# SDPBackend is a pybind11 enum: SDPBackend(99) does not raise, so map the int back through its members.
_BACKEND_NAMES: dict[int, str] = {member.value: name for name, member in SDPBackend.__members__.items()}


def sdpa_kernel_chosen(case: Case, device: str) -> str | None:
    """Which SDPA backend PyTorch's own dispatch picks for ``case`` (e.g. ``"FLASH_ATTENTION"``), or None.

    Asks ``torch._fused_sdp_choice`` (private, hence the guards) with q, k, v shaped and strided exactly as
    ``SelfAttention`` hands them to the core, with grads on for ``train``: the dispatcher looks at strides,
    head dim, dtype, device and whether a backward is needed. ``torch.empty`` does no work and is freed at
    once; meta tensors would not do, since dispatch on ``meta`` answers MATH whatever the real device would.
    A decode step asks with its own shapes: one query against the n + 1 keys of a (B, H, n + 1, D) cache.
    """
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None or case.heads is None or case.head_dim is None:
        return None
    d = head_dim(case, FAMILY.values(case))
    train = case.mode in ("train", "backward")  # backward mode dispatches as train does: a graph is kept
    dtype = torch_dtype(case.dtype)
    try:
        with torch.set_grad_enabled(train):
            kv_heads = FAMILY.kv_heads(case) or case.heads
            gqa = kv_heads != case.heads
            mask = None
            if case.mode == "decode":
                keys = min(case.span, FAMILY.window(case)) if FAMILY.window(case) else case.span
                q = torch.empty(case.batch, case.heads, 1, d, device=device, dtype=dtype)
                k = v = torch.empty(case.batch, kv_heads, keys, d, device=device, dtype=dtype)
                causal = False
            else:
                width = (case.heads + 2 * kv_heads) * d
                qkv = torch.empty(
                    case.batch, case.seq_len, width, device=device, dtype=dtype, requires_grad=train
                )  # (B, T, (H + 2·H_kv)·D), split as SelfAttention splits it
                q_, k_, v_ = qkv.split([case.heads * d, kv_heads * d, kv_heads * d], dim=-1)
                q = q_.view(case.batch, case.seq_len, case.heads, d).transpose(1, 2)
                k = k_.view(case.batch, case.seq_len, kv_heads, d).transpose(1, 2)
                v = v_.view(case.batch, case.seq_len, kv_heads, d).transpose(1, 2)
                causal = case.causal and not FAMILY.window(case)
                if FAMILY.window(case):  # the band goes in as an explicit mask, as SdpaCore passes it
                    mask = torch.ones(case.seq_len, case.seq_len, dtype=torch.bool, device=device)
            index = int(
                choose(q, k, v, mask, 0.0, causal, enable_gqa=gqa) if gqa else choose(q, k, v, mask, 0.0, causal)
            )
    except (RuntimeError, NotImplementedError, TypeError):
        return None  # includes OOM for a case too big to hold even its inputs: that case will say so itself
    name = _BACKEND_NAMES.get(index)
    return None if name in (None, "ERROR") else name


TORCH = AttentionTorch()
