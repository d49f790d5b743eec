"""Multi-head self-attention with interchangeable cores.

A layer is: fused QKV projection → split heads → *core* → merge heads → output projection. The core is the
only thing that differs between the attention models, and it owns no parameters, so two models built from the
same seed with different cores hold identical weights and must compute the same function (a test holds them
equal).
Every core takes and returns ``(B, H, T, D)``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel


class VanillaCore(nn.Module):
    """The textbook formula, written out: ``softmax(QKᵀ/√D + mask) · V`` (Vaswani et al. 2017, eq. 1).

    It materialises the (T, T) score matrix for every batch × head — that memory and traffic is what the
    fused kernels avoid, and what this benchmark sets out to show. The softmax runs in the input dtype, as a
    naive implementation would.
    """

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        seq_len, head_dim = q.shape[-2], q.shape[-1]
        scores = (q @ k.transpose(-2, -1)) * head_dim**-0.5  # (B, H, T, T)
        if self.causal:
            # Built per call rather than cached: a mask made under inference_mode could not be saved for a
            # later backward, and T² bytes are small beside the B·H·T² scores.
            mask = torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device).triu(1)
            scores = scores.masked_fill(mask, float("-inf"))
        return scores.softmax(dim=-1) @ v  # (B, H, T, D)


# The backends ``pinned_backend`` has set torch's (process-wide) SDPA flags to, innermost last; empty outside it.
_PINNED: list[SDPBackend] = []


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

    def __init__(self, causal: bool, backend: SDPBackend | None = None) -> None:
        super().__init__()
        self.causal = causal
        self.backend = backend

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.backend is None or (_PINNED and _PINNED[-1] == self.backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        with sdpa_kernel(self.backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)

    def extra_repr(self) -> str:
        name = "dispatch" if self.backend is None else self.backend.name
        return f"backend={name}, causal={self.causal}"


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
    split produced, so no copy is made on the way in.
    """

    def __init__(self, causal: bool) -> None:
        super().__init__()
        self.causal = causal
        # Imported here, not at module import: the package is optional and its import needs CUDA libraries.
        self._func: Any = importlib.import_module("flash_attn").flash_attn_func

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = self._func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=self.causal)
        return out.transpose(1, 2)  # (B, T, H, D) -> (B, H, T, D)


class SelfAttention(nn.Module):
    """One multi-head self-attention layer around a parameter-free core; the FFN and norms are the block's
    (``attnbench.measure.models.blocks``). ``rotary`` (RoPE, parameter-free too) rotates queries and keys per head."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        core: nn.Module,
        *,
        device: str,
        dtype: torch.dtype,
        rotary: nn.Module | None = None,
    ) -> None:
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
        self.heads = heads
        self.rotary = rotary
        # Created in this order for every core, so a given seed yields the same weights whatever the core.
        self.qkv = nn.Linear(d_model, 3 * d_model, device=device, dtype=dtype)
        self.core = core
        self.out = nn.Linear(d_model, d_model, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq_len, d_model = x.shape
        head_dim = d_model // self.heads
        qkv = self.qkv(x).view(batch, seq_len, 3, self.heads, head_dim)  # (B, T, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # 3 × (B, H, T, D), views, no copy
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)  # (B, H, T, D), rotated by position
        y = self.core(q, k, v)  # (B, H, T, D)
        y = y.transpose(1, 2).reshape(batch, seq_len, d_model)  # (B, T, H, D) -> (B, T, H·D)
        return self.out(y)


class AttentionStack(nn.Module):
    """``layers`` self-attention layers applied in turn: (B, T, d_model) -> (B, T, d_model)."""

    def __init__(self, layers: list[SelfAttention]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x
