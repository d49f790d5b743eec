"""Positional encodings: sinusoidal and learned tables added to the input, and rotary on queries and keys.

Self-attention is permutation-equivariant, so order has to be put in: Vaswani et al. 2017 (§3.5) add a fixed
sinusoid table, BERT (Devlin et al. 2019) a learned one, RoFormer (Su et al. 2021, arXiv:2104.09864) rotates
each query and key by an angle proportional to its position, so that a query·key product sees only their
distance. The tables are built once, in float64, at the size the case runs, then cast to the model's dtype;
the sinusoid and rotary tables are buffers (no parameters), the learned table is a parameter.
"""

from __future__ import annotations

import torch
from torch import nn

# The wavelength base of both the sinusoid table and RoPE (Vaswani et al. 2017 §3.5; Su et al. 2021 eq. 15).
BASE = 10_000.0


def sinusoid_table(length: int, d_model: int, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), as (length, d) float64.

    An odd d_model keeps the last sine column without its cosine partner.
    """
    position = torch.arange(length, dtype=torch.float64, device=device)[:, None]  # (T, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64, device=device)  # 2i = 0, 2, 4, …
    angle = position / BASE ** (two_i / d_model)  # (T, ⌈d/2⌉)
    table = torch.empty(length, d_model, dtype=torch.float64, device=device)
    table[:, 0::2] = angle.sin()
    table[:, 1::2] = angle.cos()[:, : d_model // 2]
    return table


class Sinusoidal(nn.Module):
    """Adds the fixed sinusoid table to (B, T, d); a longer input than built for gets a fresh table."""

    table: torch.Tensor  # a buffer: (max_len, d)

    def __init__(self, d_model: int, max_len: int, *, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.d_model = d_model
        self.register_buffer("table", sinusoid_table(max_len, d_model, device=device).to(dtype), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x (B, T, d) at positions offset…offset+T−1 (a decode step: one token at position n)."""
        end = offset + x.shape[1]
        table = self.table
        if end > table.shape[0]:
            table = sinusoid_table(end, self.d_model, device=x.device).to(x.dtype)
        return x + table[offset:end]  # (T, d) broadcasts over the batch

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, max_len={self.table.shape[0]}"


class Learned(nn.Module):
    """Adds a learned (max_len, d) table, BERT's absolute position embeddings (initialised N(0, 0.02²), as
    BERT's initializer_range). Indexing an embedding with arange(T) and slicing the table are the same
    operation; slicing skips the index tensor."""

    def __init__(self, d_model: int, max_len: int, *, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(max_len, d_model, device=device, dtype=dtype))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        end, max_len = offset + x.shape[1], self.weight.shape[0]
        if end > max_len:
            raise ValueError(f"learned positions cover {max_len} tokens; the input reaches position {end - 1}")
        return x + self.weight[offset:end]

    def extra_repr(self) -> str:
        return f"max_len={self.weight.shape[0]}, d_model={self.weight.shape[1]}"


def rotary_angles(length: int, head_dim: int, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """θ-angles m·θ_i with θ_i = 10000^(−2i/D), as (length, D/2) float64 (Su et al. 2021 eq. 15)."""
    if head_dim % 2:
        raise ValueError(f"rotary embeddings rotate pairs of features: head_dim must be even, got {head_dim}")
    theta = BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)  # (D/2,)
    return torch.arange(length, dtype=torch.float64, device=device)[:, None] * theta[None, :]


class Rotary(nn.Module):
    """RoPE on (B, H, T, D): feature pair (x_i, x_{i+D/2}) at position m is rotated by the angle m·θ_i.

    The pairing is the "rotate half" layout of GPT-NeoX and Llama rather than RoFormer's adjacent pairs
    (x_{2i}, x_{2i+1}): the same rotation up to a fixed permutation of the head's features, and two contiguous
    halves instead of strided ones. ⟨R_m q, R_n k⟩ then depends on m − n alone (a test holds it).
    """

    cos: torch.Tensor  # buffers: (max_len, D/2)
    sin: torch.Tensor

    def __init__(self, head_dim: int, max_len: int, *, device: str, dtype: torch.dtype) -> None:
        super().__init__()
        self.head_dim = head_dim
        angles = rotary_angles(max_len, head_dim, device=device)
        self.register_buffer("cos", angles.cos().to(dtype), persistent=False)  # (T, D/2)
        self.register_buffer("sin", angles.sin().to(dtype), persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x (B, H, T, D) at positions offset…offset+T−1."""
        end = offset + x.shape[-2]
        cos, sin = self.cos, self.sin
        if end > cos.shape[0]:
            angles = rotary_angles(end, self.head_dim, device=x.device)
            cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        cos, sin = cos[offset:end], sin[offset:end]
        first, second = x.chunk(2, dim=-1)  # 2 × (B, H, T, D/2)
        return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)  # (B, H, T, D)

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, max_len={self.cos.shape[0]}"


def input_encoding(kind: str, d_model: int, max_len: int, *, device: str, dtype: torch.dtype) -> nn.Module | None:
    """The module that adds positions to the input for ``kind``; None for none and for rope (which acts
    inside attention, not on the input)."""
    if kind == "sinusoidal":
        return Sinusoidal(d_model, max_len, device=device, dtype=dtype)
    if kind == "learned":
        return Learned(d_model, max_len, device=device, dtype=dtype)
    if kind in ("none", "rope"):
        return None
    raise ValueError(f"unknown positional encoding {kind!r}; one of: none, sinusoidal, learned, rope")
