"""Two layers of one's own, each a factory attnbench calls with an ``attnbench.plugin.ModelRequest``.

Both map (batch, seq_len, d_model) to the same shape and implement attnbench's decode protocol (``init_state``,
``prefill``, ``step``), so they run in ``mode: decode`` too. A step leaves the state as it was and keeps the new
one aside (``advance`` commits it): attnbench times "the token after n" again and again at the same n.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import nn

from attnbench.plugin import ModelRequest


class RecurrenceState:
    """h (batch, width), constant in the context length."""

    def __init__(self, h: torch.Tensor) -> None:
        self.h = h
        self.next: torch.Tensor | None = None

    def tensors(self) -> Iterator[torch.Tensor]:
        yield self.h

    def advance(self) -> None:
        assert self.next is not None, "advance() needs a step first"
        self.h.copy_(self.next)
        self.next = None


class GatedRecurrence(nn.Module):
    """h_t = a_t ⊙ h_{t−1} + (1 − a_t) ⊙ v_t, a_t = σ(W_a x_t), v_t = W_v x_t, y_t = W_o h_t: a recurrence whose gates
    depend on x_t alone, computed here one step at a time (the RNN way)."""

    def __init__(self, d_model: int, width: int, *, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.width = width
        self.gates = nn.Linear(d_model, 2 * width, device=device, dtype=dtype)
        self.out = nn.Linear(width, d_model, device=device, dtype=dtype)

    def _scan(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a, v = self.gates(x).chunk(2, dim=-1)  # (B, T, width) each
        a = torch.sigmoid(a)
        hs = []
        for t in range(x.shape[1]):
            h = a[:, t] * h + (1 - a[:, t]) * v[:, t]
            hs.append(h)
        return torch.stack(hs, dim=1), h  # (B, T, width), (B, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hs, _ = self._scan(x, x.new_zeros(x.shape[0], self.width))
        return self.out(hs)

    def init_state(self, batch: int, capacity: int) -> RecurrenceState:
        weight = self.gates.weight
        return RecurrenceState(torch.zeros(batch, self.width, device=weight.device, dtype=weight.dtype))

    def prefill(self, x: torch.Tensor, state: RecurrenceState, *, output: bool = True) -> torch.Tensor | None:
        hs, h = self._scan(x, state.h)
        state.h.copy_(h)
        return self.out(hs) if output else None

    def step(self, x: torch.Tensor, state: RecurrenceState) -> torch.Tensor:
        a, v = self.gates(x[:, 0]).chunk(2, dim=-1)
        a = torch.sigmoid(a)
        state.next = a * state.h + (1 - a) * v
        return self.out(state.next).unsqueeze(1)


class KVState:
    """K and V of every position so far, preallocated for ``capacity`` positions: (2, batch, heads, capacity, D)."""

    def __init__(self, storage: torch.Tensor) -> None:
        self.storage = storage
        self.length = 0

    def tensors(self) -> Iterator[torch.Tensor]:
        yield self.storage

    def advance(self) -> None:
        self.length += 1


class AlibiAttention(nn.Module):
    """Causal multi-head attention with ALiBi (Press et al. 2022, arXiv:2108.12409): a head-specific slope times
    the query–key distance is subtracted from the scores, so no positions are added to the input."""

    def __init__(self, d_model: int, heads: int, *, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"heads {heads} must divide d_model {d_model}")
        self.heads, self.head_dim = heads, d_model // heads
        self.qkv = nn.Linear(d_model, 3 * d_model, device=device, dtype=dtype)
        self.out = nn.Linear(d_model, d_model, device=device, dtype=dtype)
        # ALiBi's slopes: a geometric sequence 2^(−8/H), 2^(−16/H), … (paper §3).
        slopes = torch.tensor([2 ** (-8 * (i + 1) / heads) for i in range(heads)], device=device, dtype=dtype)
        self.register_buffer("slopes", slopes, persistent=False)

    def _split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return q, k, v  # (B, H, T, D) each

    def _bias(self, queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        distance = (queries[:, None] - keys[None, :]).to(self.slopes.dtype)  # (Tq, Tk)
        bias = -self.slopes[:, None, None] * distance  # (H, Tq, Tk)
        return bias.masked_fill(distance < 0, -math.inf)  # causal: no key after its query

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(x)
        positions = torch.arange(x.shape[1], device=x.device)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self._bias(positions, positions))
        return self.out(y.transpose(1, 2).flatten(2))

    def init_state(self, batch: int, capacity: int) -> KVState:
        weight = self.qkv.weight
        shape = (2, batch, self.heads, capacity, self.head_dim)
        return KVState(torch.zeros(shape, device=weight.device, dtype=weight.dtype))

    def prefill(self, x: torch.Tensor, state: KVState, *, output: bool = True) -> torch.Tensor | None:
        q, k, v = self._split(x)
        n = x.shape[1]
        state.storage[0, :, :, :n], state.storage[1, :, :, :n] = k, v
        state.length = n
        if not output:
            return None
        positions = torch.arange(n, device=x.device)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self._bias(positions, positions))
        return self.out(y.transpose(1, 2).flatten(2))

    def step(self, x: torch.Tensor, state: KVState) -> torch.Tensor:
        q, k, v = self._split(x)  # (B, H, 1, D)
        n = state.length
        state.storage[0, :, :, n : n + 1], state.storage[1, :, :, n : n + 1] = k, v  # slot n; length stays n
        keys, values = state.storage[0, :, :, : n + 1], state.storage[1, :, :, : n + 1]
        positions = torch.arange(n + 1, device=x.device)
        bias = self._bias(positions[-1:], positions)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias)
        return self.out(y.transpose(1, 2).flatten(2))


def gated_recurrence(request: ModelRequest) -> nn.Module:
    """The factory of example-gru: ``expand`` widens the state to expand × d_model."""
    width = int(request.options.get("expand", 1)) * request.d_model
    return GatedRecurrence(request.d_model, width, device=request.device, dtype=request.torch_dtype)


def alibi_attention(request: ModelRequest) -> nn.Module:
    """The factory of example-alibi."""
    return AlibiAttention(request.d_model, request.heads, device=request.device, dtype=request.torch_dtype)
