"""Multi-head latent attention (DeepSeek-V2, arXiv:2405.04434 §2.1) in plain PyTorch, with the structure of
DeepSeek's ``MLA`` (DeepSeek-V3's ``inference/model.py``) and its two forms (``attnbench.families.mla.spec``).

Per token: the query from x (or from RMSNorm(W_DQ x) with ``q_lora_rank``), split per head into d_n channels and d_R
rotated ones; W_DKV x split into the latent (RMSNorm'd, d_c) and the shared key (rotated, d_R). The cache keeps
[c_t ; k^R_t] per token (``LatentCache``), written before attention. Over T queries, the last T of S cached positions:

* ``naive``: kv_b(c) → per-head K^C and V (B, H, S, ·); K = [K^C ; k^R], Q = [q^C ; q^R]; SDPA (its fused kernel:
  V zero-padded to K's width) with scale 1/√(d_n + d_R), the causal mask aligned bottom-right.
* ``absorbed``: q̃ = q^C W_UK,h (B, H, T, d_c); SDPA of [q̃ ; q^R] against the one head [c ; k^R], read in place as
  keys and values (multi-query, ``enable_gqa``), scale 1/√(d_n + d_R); o = õ[:d_c] W_UV,hᵀ. kv_b's weight is read as
  W_UK and W_UV, never applied to the cache.

RoPE is the rotate-half layout (``attnbench.families.positional.Rotary``), at each token's position. The norms are
RMSNorm with ε = 1e-6 as DeepSeek's. Decoding: ``step`` writes the token's latent into slot n and attends to slots
0…n in the decode form (absorbed when ``form`` is deployed); a prefill appends to the cache and attends in the
whole-sequence form, so a prompt may come in chunks; a verify appends its drafts and a rollback truncates.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.bias import causal_lower_right

from attnbench.core.cases import Case
from attnbench.families.attention.layers import SDPA_GQA
from attnbench.families.blocks import NetworkFamily, Stack, TransformerBlock, front, network
from attnbench.families.mla.spec import FAMILY
from attnbench.families.positional import Rotary
from attnbench.families.states import LayerStack, SharedPrefix, spans
from attnbench.families.torch_family import with_options

_NORM_EPS = 1e-6  # DeepSeek's RMSNorm eps


def rms_norm(x: Tensor, weight: Tensor) -> Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + _NORM_EPS) * weight


class LatentCache:
    """One MLA layer's cache: [c_t ; k^R_t] (B, capacity, d_c + d_R) per token, preallocated and zeroed; ``length``
    positions hold the context, a step writes slot ``length`` (the protocol of ``attnbench.families.states``)."""

    holds_positions = True  # never kept as a recurrent state (``states.keep``)

    def __init__(self, batch: int, capacity: int, width: int, *, device: torch.device, dtype: torch.dtype) -> None:
        if capacity < 1:
            raise ValueError(f"a latent cache needs at least one position, got capacity {capacity}")
        self.storage = torch.zeros(batch, capacity, width, device=device, dtype=dtype)
        self.capacity, self.length = capacity, 0
        self.saved: int | None = None  # where a verify's drafts start: its rollback truncates to there + accepted

    def latent(self, end: int) -> Tensor:
        """The entries of positions [0, end), (B, end, d_c + d_R)."""
        return self.storage[:, :end]

    def write(self, entries: Tensor, start: int) -> None:
        end = start + entries.shape[1]
        if end > self.capacity:
            raise ValueError(f"positions {start}…{end - 1} do not fit a latent cache of {self.capacity}")
        self.storage[:, start:end].copy_(entries)

    def append(self, entries: Tensor) -> None:
        self.write(entries, self.length)
        self.length += entries.shape[1]

    def truncate(self, length: int) -> None:
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate a latent cache of {self.length} positions to {length}")
        self.length = length

    def reset(self) -> None:
        self.length = 0

    def fill_to(self, length: int) -> None:
        """``length`` positions of made-up entries: a step's cost reads the slots, not what is in them."""
        if length > self.capacity:
            raise ValueError(f"{length} positions do not fit a latent cache of {self.capacity}")
        self.storage.normal_()
        self.length = length

    def check_room(self) -> None:
        if self.length >= self.capacity:
            raise ValueError(f"the latent cache is full ({self.capacity} positions); allocate it with more capacity")

    def advance(self) -> None:
        self.check_room()
        self.length += 1

    def tensors(self) -> Iterator[Tensor]:
        yield self.storage

    def shared_by(self, own: LatentCache) -> SharedLatent:
        """This cache (one sequence's prefix) read by reference by ``own``'s sequences (mode prefix)."""
        return SharedLatent(self, own)

    def drop_scratch(self) -> None:
        pass  # a step writes its token into the cache itself

    def scratch(self) -> Iterator[Tensor]:
        return iter(())


class SharedLatent(SharedPrefix):
    """A shared prefix of latent entries (``states.SharedPrefix``), read as ``LatentCache.latent`` reads."""

    def latent(self, end: int) -> Tensor:
        return self.joined("latent", end, 1)


class MLA(nn.Module):
    """One multi-head latent attention layer, (B, T, d_model) -> (B, T, d_model) (module notes)."""

    rollback_method = "truncate"

    def __init__(
        self,
        d_model: int,
        heads: int,
        *,
        kv_lora_rank: int,
        q_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        form: str = "deployed",
        causal: bool = True,
        max_len: int = 2048,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if form not in ("deployed", "naive", "absorbed"):
            raise ValueError(f"unknown form {form!r}; one of: deployed, naive, absorbed")
        if qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim {qk_rope_head_dim} must be even (RoPE rotates pairs)")
        self.d_model, self.heads, self.form, self.causal = d_model, heads, form, causal
        self.d_c, self.d_q, self.d_n = kv_lora_rank, q_lora_rank, qk_nope_head_dim
        self.d_r, self.d_v = qk_rope_head_dim, v_head_dim
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        query = heads * (self.d_n + self.d_r)
        if q_lora_rank:
            self.q_down = nn.Linear(d_model, q_lora_rank, bias=False, **kw)
            self.q_norm = nn.Parameter(torch.ones(q_lora_rank, **kw))
            self.q_up = nn.Linear(q_lora_rank, query, bias=False, **kw)
        else:
            self.q_proj = nn.Linear(d_model, query, bias=False, **kw)
        self.kv_down = nn.Linear(d_model, self.d_c + self.d_r, bias=False, **kw)  # W_DKV and W_KR side by side
        self.kv_norm = nn.Parameter(torch.ones(self.d_c, **kw))
        self.kv_up = nn.Linear(self.d_c, heads * (self.d_n + self.d_v), bias=False, **kw)  # W_UK and W_UV: kv_b
        self.out = nn.Linear(heads * self.d_v, d_model, bias=False, **kw)
        self.rotary = Rotary(self.d_r, max_len, device=str(device or "cpu"), dtype=dtype or torch.get_default_dtype())
        self.scale = (self.d_n + self.d_r) ** -0.5

    def whole_form(self) -> str:
        return "naive" if self.form == "deployed" else self.form

    def decode_form(self) -> str:
        return "absorbed" if self.form == "deployed" else self.form

    # ------------------------------------------------------------------------------------------------ pieces
    def _project(self, x: Tensor, position: int) -> tuple[Tensor, Tensor, Tensor]:
        """q^C (B, H, T, d_n), q^R (B, H, T, d_R) rotated, and the cache entries [c ; k^R] (B, T, d_c + d_R)."""
        batch, length, _ = x.shape
        q = self.q_up(rms_norm(self.q_down(x), self.q_norm)) if self.d_q else self.q_proj(x)
        q = q.view(batch, length, self.heads, self.d_n + self.d_r).transpose(1, 2)
        q_nope, q_rope = q.split([self.d_n, self.d_r], dim=-1)
        latent, k_rope = self.kv_down(x).split([self.d_c, self.d_r], dim=-1)
        k_rope = self.rotary(k_rope.unsqueeze(1), position).squeeze(1)  # (B, T, d_R), shared by the heads
        entries = torch.cat([rms_norm(latent, self.kv_norm), k_rope], dim=-1)
        return q_nope, self.rotary(q_rope, position), entries

    def _mask(self, length: int, keys: int) -> tuple[Any, bool]:
        """(attn_mask, is_causal) for T queries that are the last T of S positions."""
        if not self.causal or length == 1:
            return None, False
        if length == keys:
            return None, True
        return causal_lower_right(length, keys), False

    def _attend(self, q_nope: Tensor, q_rope: Tensor, entries: Tensor, form: str) -> Tensor:
        """The T queries against the S cached entries (B, S, d_c + d_R) in ``form``: (B, T, H·d_v)."""
        batch, heads, length, _ = q_nope.shape
        keys = entries.shape[1]
        latent, k_rope = entries.split([self.d_c, self.d_r], dim=-1)  # (B, S, d_c), (B, S, d_R)
        mask, causal = self._mask(length, keys)
        if form == "naive":
            kv = self.kv_up(latent).view(batch, keys, heads, self.d_n + self.d_v).transpose(1, 2)
            k_nope, v = kv.split([self.d_n, self.d_v], dim=-1)  # (B, H, S, ·)
            k = torch.cat([k_nope, k_rope.unsqueeze(1).expand(batch, heads, keys, self.d_r)], dim=-1)
            q = torch.cat([q_nope, q_rope], dim=-1)
        else:
            weight = self.kv_up.weight.view(heads, self.d_n + self.d_v, self.d_c)
            w_uk, w_uv = weight.split([self.d_n, self.d_v], dim=1)  # (H, d_n, d_c), (H, d_v, d_c)
            q = torch.cat([q_nope @ w_uk, q_rope], dim=-1)  # (B, H, T, d_c + d_R): W_UK folded into the query
            k = v = entries.unsqueeze(1)  # one head (B, 1, S, d_c + d_R), read in place; values c: õ's first d_c
            if not SDPA_GQA:
                k = v = k.expand(batch, heads, keys, -1)
        # SDPA's fused CPU kernel takes one width for q, k and v (else its math fallback holds every (B, H, T, S) score
        # and per-head copies of K and V): the narrower zero-padded, products the FLOP formulas leave out.
        width, wide = self.d_v if form == "naive" else self.d_c, max(q.shape[-1], v.shape[-1])
        q, k, v = (t if t.shape[-1] == wide else F.pad(t, (0, wide - t.shape[-1])) for t in (q, k, v))
        gqa = {"enable_gqa": True} if k.shape[1] < heads else {}
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=self.scale, **gqa)
        o = o[..., :width]
        if form != "naive":
            o = o @ w_uv.transpose(-1, -2)  # (B, H, T, d_v): W_UV folded into the output
        return o.transpose(1, 2).reshape(batch, length, heads * self.d_v)

    # ------------------------------------------------------------------------------------------------ forms
    def forward(self, x: Tensor) -> Tensor:
        q_nope, q_rope, entries = self._project(x, 0)
        return self.out(self._attend(q_nope, q_rope, entries, self.whole_form()))

    def init_state(self, batch: int, capacity: int) -> LatentCache:
        weight = self.kv_down.weight
        return LatentCache(batch, capacity, self.d_c + self.d_r, device=weight.device, dtype=weight.dtype)

    def prefill(self, x: Tensor, state: LatentCache, *, output: bool = True) -> Tensor | None:
        """The T tokens' entries appended after the n the cache holds; their attention to all n + T only if
        ``output``, in the whole-sequence form."""
        start = state.length
        q_nope, q_rope, entries = self._project(x, start)
        state.append(entries)
        if not output:
            return None
        return self.out(self._attend(q_nope, q_rope, state.latent(state.length), self.whole_form()))

    def step(self, x: Tensor, state: LatentCache) -> Tensor:
        """(B, 1, d_model) at position n = the cache's length: its entry written into slot n, attention to 0…n in the
        decode form; the cache still says n."""
        n = state.length
        state.check_room()
        q_nope, q_rope, entries = self._project(x, n)
        state.write(entries, n)
        return self.out(self._attend(q_nope, q_rope, state.latent(n + 1), self.decode_form()))

    def verify(self, x: Tensor, state: LatentCache) -> Tensor:
        state.saved = state.length
        out = self.prefill(x, state, output=True)
        assert out is not None
        return out

    def rollback(self, state: LatentCache, accepted: int) -> None:
        if state.saved is None:
            raise ValueError("rollback() needs a verify first")
        state.truncate(state.saved + accepted)

    def packed(self, x: Tensor, lengths: Sequence[int]) -> Tensor:
        """Each packed sequence's attention to itself alone, positions from 0."""
        return torch.cat([self(x[:, start:end]) for start, end in spans(lengths)], dim=1)

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, heads={self.heads}, kv_lora_rank={self.d_c}, q_lora_rank={self.d_q}, "
            f"qk_nope_head_dim={self.d_n}, qk_rope_head_dim={self.d_r}, v_head_dim={self.d_v}, form={self.form}"
        )


class MLAStack(LayerStack):
    """``layers`` MLA layers applied in turn (scope core)."""


def _layer(case: Case, device: str, dtype: torch.dtype) -> MLA:
    d_c, d_q, d_n, d_r, d_v = FAMILY.dims(case)
    return MLA(
        case.d_model,
        case.heads or 1,
        kv_lora_rank=d_c,
        q_lora_rank=d_q,
        qk_nope_head_dim=d_n,
        qk_rope_head_dim=d_r,
        v_head_dim=d_v,
        form=str(FAMILY.option(case, "form")),
        causal=case.causal,
        max_len=case.span,
        device=device,
        dtype=dtype,
    )


class MLATorch(NetworkFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        made = front(case, device, dtype)
        if FAMILY.option(case, "scope") == "core":
            return network(
                case, MLAStack([_layer(case, device, dtype) for _ in range(case.layers)]), made, device, dtype
            )
        ffn_mult = int(FAMILY.option(case, "ffn_mult"))
        blocks = [
            TransformerBlock(_layer(case, device, dtype), case.d_model, ffn_mult, device=device, dtype=dtype)
            for _ in range(case.layers)
        ]
        return network(case, Stack(*blocks), made, device, dtype)

    def reference_case(self, case: Case) -> Case:
        """The naive form (every head's keys and values up-projected from the latent, then attention written
        out): what the absorbed decode computes faster, with the same weights."""
        return with_options(super().reference_case(case), {"form": "naive"})


TORCH = MLATorch()
