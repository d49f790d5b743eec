"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024, arXiv:2412.06464) and DeltaNet (Schlag et al. 2021; Yang et al.
2024, arXiv:2406.06484) in plain PyTorch, with fla's layer structure (``fla/layers/gated_deltanet.py``,
``delta_net.py``).

The cores work head-major, q and k (B, H, T, d_k), v (B, H, T, d_v), per-head gates (B, H, T), on the key-major state
H_t = S_tᵀ (B, H, d_k, d_v), fla's ``[N, H, K, V]``. In it the rule reads (α_t = exp(g_t), g_t ≤ 0; DeltaNet g = 0):

    H_t = α_t H_{t−1} + k_t δ_tᵀ,    δ_t = β_t (v_t − α_t H_{t−1}ᵀ k_t),    o_t = H_tᵀ (q_t / √d_k)

Two forms, which a test holds equal (values and gradients) to each other and to the paper's recurrence written per
token with its explicit d_k × d_k transition:

* ``recurrent``: the equations above, one token at a time, as a decoder runs them.
* ``chunked``: the WY/UT form (arXiv:2406.06484 §3; gated, arXiv:2412.06464 §3.3). Inside a chunk of c tokens with
  entering state H₀ and γ_t = ∏_{s≤t} α_s, the corrections Δ = [δ_t] solve one unit-lower-triangular system
      (I + A) Δ = βV − (βγK) H₀,    A[t, s] = β_t (γ_t/γ_s) k_t·k_s  (s < t)
  so Δ = U − W H₀ with U, W from one ``solve_triangular`` against [βV | βγK]; then
      O = (γQ) H₀ + (QKᵀ ⊙ L) Δ,    L[t, s] = γ_t/γ_s (s ≤ t),    H_c = γ_c H₀ + (K ⊙ γ_c/γ)ᵀ Δ.
  L is exp(G_t − G_s) of the in-chunk log-cumsum, masked before the exp, so nothing overflows for any g ≤ 0. The
  last chunk of T mod C tokens is computed at its own length, unpadded. Every product the FLOP formula counts is an
  ``@`` that torch's FlopCounterMode sees; everything else is element-wise.

The cores run in float32 for 16-bit models (the decays multiply along the sequence; fla accumulates in float32 too),
the projections in the model's dtype. ``kernel: fla`` runs the chunked core as flash-linear-attention's Triton kernel
(``chunk_gated_delta_rule``, ``chunk_delta_rule``; CUDA only), imported on first use so that importing this module
never needs it; the short conv and the norms stay in torch. Sequences packed end to end (a config's ``packing``) run
through it in one varlen call (``cu_seqlens``, ``Packing``), the short conv reading zero across each sequence's
start; the torch kernel runs them one after another. KDA and RWKV-7 share this (``DecodingLayer.packed``), linear
attention its ``Packing``.

The short conv is written as d_conv shifted multiply-adds (element-wise work, as the FLOP convention wants it, and
exact across a prefill's pieces and a step): fla's ``ShortConvolution`` with SiLU and no bias, which keeps d_conv
inputs in its cache where d_conv − 1 are needed.

Decoding (``attnbench.families.states``): the state is the conv's last d_conv − 1 inputs (B, d_conv − 1, conv_dim) in
the model's dtype and the memory (B, H, d_k, d_v) in the cores' dtype, both constant in n. A prefill runs the layer's
own form from the state it is given (so a long context may come in pieces); a step is one token of the recurrent
form, computed into buffers kept beside the state, which stays as it was until ``advance``.

Ported from the tested scratch reference of issue 39 (deltarules.py).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import itertools
import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.cases import Case
from attnbench.families.base import ExtraValue
from attnbench.families.blocks import ChunkedFormFamily, recurrent_network
from attnbench.families.deltanet.spec import FAMILY, FORMS, GATED, PLAIN
from attnbench.families.states import ConstantState, LayerStack, spans
from attnbench.families.torch_family import package_problem

KERNELS = ("torch", "fla")
_NORM_EPS = 1e-5  # fla's norm_eps
_L2_EPS = 1e-6  # fla's l2norm_fwd


def core_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


# ---------------------------------------------------------------------------------------------------- pieces
def chunk_blocks(length: int, chunk: int) -> list[tuple[int, int, int]]:
    """[0, T) as (start, chunks, size): the whole chunks in one block (their inside work batched) and the last
    T mod C tokens as one chunk of their own."""
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    whole, tail = divmod(length, chunk)
    blocks = [(0, whole, chunk)] if whole else []
    return blocks + ([(whole * chunk, 1, tail)] if tail else [])


def as_chunks(x: Tensor, start: int, count: int, size: int) -> Tensor:
    """(B, H, T, …) → (B, H, count, size, …) for the steps start … start + count·size − 1."""
    return x[:, :, start : start + count * size].reshape(*x.shape[:2], count, size, *x.shape[3:])


def solve_unit_lower(strict: Tensor, rhs: Tensor) -> Tensor:
    """X with (I + strict) X = rhs, ``strict`` strictly lower triangular: the UT transform (arXiv:2406.06484 §3),
    applied to the right-hand sides by forward substitution, never formed as an inverse."""
    eye = torch.eye(strict.shape[-1], dtype=strict.dtype, device=strict.device)
    return torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)


def outer(x: Tensor, y: Tensor) -> Tensor:
    """x yᵀ as a product with inner dimension 1: a rank-1 write is 2·m·n FLOPs, which FlopCounterMode charges it."""
    return x.unsqueeze(-1) @ y.unsqueeze(-2)


def vecmat(x: Tensor, m: Tensor) -> Tensor:
    """(…, K) · (…, K, V) → (…, V)."""
    return (x.unsqueeze(-2) @ m).squeeze(-2)


def zero_state(like: Tensor, d_k: int, d_v: int, initial: Tensor | None) -> Tensor:
    return like.new_zeros(*like.shape[:2], d_k, d_v) if initial is None else initial


def l2norm(x: Tensor) -> Tensor:
    """x / √(Σx² + ε): fla's ``l2norm_fwd`` (use_qk_l2norm_in_kernel)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + _L2_EPS)


def short_conv(
    x: Tensor, before: Tensor | None, weight: Tensor, positions: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """SiLU(causal depthwise conv) of x (B, T, C) with weight (C, K), ``before`` (B, K − 1, C) the inputs preceding
    this piece (zero at the start); and the last K − 1 inputs, for the next piece. ``positions`` (T,): each token's
    position in its own sequence, for sequences packed end to end (``Packing``): a tap that would read across a
    sequence's start reads zero there, as fla's ShortConvolution does with its ``cu_seqlens``."""
    length, taps = x.shape[1], weight.shape[1]
    if before is None:
        before = x.new_zeros(x.shape[0], taps - 1, x.shape[2])
    joined = torch.cat([before, x], dim=1)  # (B, K − 1 + T, C)

    def tap(j: int) -> Tensor:  # w_j x_{t−s}, s = K − 1 − j: another sequence's input where position < s
        term = joined[:, j : j + length] * weight[:, j]
        if positions is None or j == taps - 1:
            return term
        return term * (positions >= taps - 1 - j).to(term.dtype)[:, None]

    y = tap(0)
    for j in range(1, taps):  # y_t = Σ_j w_j x_{t−K+1+j}
        y = y + tap(j)
    return F.silu(y), joined[:, length:]


@dataclass(frozen=True)
class Packing:
    """Sequences packed end to end (a config's ``packing``), as fla's varlen kernels take them: ``cu_seqlens`` (int64
    on the device, fla's LongTensor) and the same on the host (``cu_seqlens_cpu``: fla sizes its chunk grid from it
    instead of copying the device's back, a synchronisation inside every timed call); ``positions`` (T,) each
    token's position in its own sequence, where a short conv or a token shift must read zero before it."""

    cu_seqlens: Tensor
    cu_seqlens_cpu: Tensor
    positions: Tensor

    def kernel_arguments(self, kernel: Any) -> dict[str, Tensor]:
        """The varlen arguments ``kernel`` takes: ``cu_seqlens``, and ``cu_seqlens_cpu`` where it names it."""
        named = inspect.signature(kernel).parameters
        return {"cu_seqlens": self.cu_seqlens} | (
            {"cu_seqlens_cpu": self.cu_seqlens_cpu} if "cu_seqlens_cpu" in named else {}
        )


def packing(lengths: tuple[int, ...], device: torch.device) -> Packing:
    """The ``Packing`` of ``lengths`` on ``device``, built by its first call (a warm-up's, untimed) and shared by
    every layer and call after it, as attention's cu_seqlens are: torch.tensor from a Python list is a pageable
    host-to-device copy. Kept per grad mode: a worker runs case after case, and tensors made under inference_mode
    cannot be saved for a later train case's backward (fla saves cu_seqlens)."""
    return _packing(lengths, device, torch.is_inference_mode_enabled())


@functools.lru_cache(maxsize=16)
def _packing(lengths: tuple[int, ...], device: torch.device, inference: bool) -> Packing:
    starts = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
    positions = torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths])
    return Packing(starts.to(device), starts, positions.to(device))


# ---------------------------------------------------------------------------------------------------- cores
def delta_rule_recurrent(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, initial: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The (gated) delta rule one token at a time; g None: DeltaNet. q, k (B, H, T, d_k), v (B, H, T, d_v), g and
    β (B, H, T), ``initial`` (B, H, d_k, d_v) or zero. Returns o (B, H, T, d_v) and the state after the last token.
    Per token and head three products of d_k·d_v (k_tᵀH, k_t δ_tᵀ, q_tᵀH): 6·d_k·d_v FLOPs."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    scale = d_k**-0.5
    state = zero_state(q, d_k, d_v, initial)
    out = []
    for t in range(length):
        if g is not None:
            state = state * g[:, :, t].exp()[..., None, None]  # α_t H_{t−1}, out of place for autograd
        delta = beta[:, :, t, None] * (v[:, :, t] - vecmat(k[:, :, t], state))  # (B, H, d_v)
        state = state + outer(k[:, :, t], delta)
        out.append(vecmat(q[:, :, t] * scale, state))
    y = torch.stack(out, dim=2) if out else v.new_zeros(batch, heads, 0, d_v)
    return y, state


def delta_rule_chunked(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, chunk: int, initial: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The (gated) delta rule in its chunked WY/UT form (module notes); shapes as ``delta_rule_recurrent``."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    q = q * d_k**-0.5
    state = zero_state(q, d_k, d_v, initial)
    out: list[Tensor] = []
    for start, count, size in chunk_blocks(length, chunk):
        qc, kc, vc = (as_chunks(x, start, count, size) for x in (q, k, v))  # (B, H, N, C, d)
        bc = as_chunks(beta, start, count, size)  # (B, H, N, C)
        causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
        if g is None:
            decays = causal.to(q.dtype)
            k_rhs, q_dec, k_dec, last = bc[..., None] * kc, qc, kc, None
        else:
            cum = as_chunks(g, start, count, size).cumsum(-1)  # G_t, (B, H, N, C)
            decays = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, -math.inf).exp()  # L
            k_rhs = (bc * cum.exp())[..., None] * kc  # βγK
            q_dec = qc * cum.exp()[..., None]  # γQ
            k_dec = kc * (cum[..., -1:] - cum).exp()[..., None]  # K γ_c/γ
            last = cum[..., -1].exp()  # γ_c, (B, H, N)
        strict = (bc[..., :, None] * (kc @ kc.transpose(-1, -2)) * decays).tril(-1)  # A, (B, H, N, C, C)
        u, w = solve_unit_lower(strict, torch.cat([bc[..., None] * vc, k_rhs], dim=-1)).split([d_v, d_k], dim=-1)
        scores = (qc @ kc.transpose(-1, -2)) * decays  # QKᵀ ⊙ L, (B, H, N, C, C)
        for i in range(count):  # across chunks: the state, one chunk after another
            delta = u[:, :, i] - w[:, :, i] @ state  # Δ, (B, H, C, d_v)
            out.append(q_dec[:, :, i] @ state + scores[:, :, i] @ delta)
            if last is not None:
                state = last[:, :, i, None, None] * state
            state = state + k_dec[:, :, i].transpose(-1, -2) @ delta
    y = torch.cat(out, dim=2) if out else v.new_zeros(batch, heads, 0, d_v)
    return y, state


def fla_function(module: str, name: str) -> Any:
    """One of flash-linear-attention's kernels (ImportError where the package is missing)."""
    return getattr(importlib.import_module(module), name)


# How an fla kernel refuses float32 in its body (fla 0.6's chunk_delta_rule; chunk_gated_delta_rule in some releases).
_REFUSES_FLOAT32 = re.compile(r"assert\s+q\.dtype\s*!=\s*torch\.float32")
# The distributions fla comes in: the kernels alone, or with its layers and models.
_FLA_DISTRIBUTIONS = ("fla-core", "flash-linear-attention")


def fla_refuses_float32(kernel: Any) -> bool:
    """Whether the installed ``kernel`` asserts that its inputs are not float32, read from its source (under fla's
    dispatch and torch.compiler.disable wrappers): refused up front, a float32 row is ``unsupported``, where the
    assert would make it an ``error``. Unreadable source counts as a refusal: an unsupported row, not a crash."""
    try:
        source = inspect.getsource(inspect.unwrap(kernel))
    except (OSError, TypeError):
        return True
    return _REFUSES_FLOAT32.search(source) is not None


def fla_layout(kernel: Any) -> dict[str, Any]:
    """``head_first=False`` where the installed ``kernel`` names the parameter (a release whose default is head-first
    would read our (B, T, H, D) as (B, H, T, D), silently); nothing where it does not (fla 0.6 raises on a
    head_first passed through its ``**kwargs``)."""
    return {"head_first": False} if "head_first" in inspect.signature(kernel).parameters else {}


def fla_version() -> str | None:
    """The installed flash-linear-attention's version (from its distribution's metadata, without importing it)."""
    for name in _FLA_DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def fla_extras(case: Case, kernel: str) -> dict[str, ExtraValue]:
    """What a ``kernel: fla`` row records of the fla that ran: its version."""
    if kernel != "fla":
        return {}
    version = fla_version()
    return {"fla_version": version} if version is not None else {}


# fla's chunked kernel for each model: module, function.
FLA_KERNELS = {
    GATED: ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    PLAIN: ("fla.ops.delta_rule", "chunk_delta_rule"),
}


# ---------------------------------------------------------------------------------------------------- state
class DeltaState(ConstantState):
    """One layer's decode state: the inputs the next token's mixing needs (the conv's last inputs, RWKV-7's previous
    token) and the matrix memory; and the buffers a step computes the next ones into (not part of ``tensors``)."""

    def __init__(self, inputs: Tensor, memory: Tensor) -> None:
        self.inputs, self.memory = inputs, memory
        self.next_inputs, self.next_memory = torch.empty_like(inputs), torch.empty_like(memory)
        self.stepped = False

    def tensors(self) -> Iterator[Tensor]:
        yield self.inputs
        yield self.memory

    def set_next(self, inputs: Tensor, memory: Tensor) -> None:
        self.next_inputs.copy_(inputs)
        self.next_memory.copy_(memory)
        self.stepped = True

    def advance(self) -> None:
        if not self.stepped:
            raise ValueError("advance() needs a step first")
        self.inputs.copy_(self.next_inputs)
        self.memory.copy_(self.next_memory)
        self.stepped = False

    def scratch(self) -> Iterator[Tensor]:
        yield self.next_inputs
        yield self.next_memory

    def drop_scratch(self) -> None:
        del self.next_inputs, self.next_memory  # a step after this has nowhere to write: the state is being measured


class DecodingLayer(nn.Module):
    """The decode protocol of a layer whose ``mix`` maps (input, inputs before, memory) to (output, inputs after,
    memory after) in a given form."""

    # A verify runs the drafts as decode steps, keeping the state after each (attnbench.families.serving).
    rollback_method = "checkpoint"

    form: str
    kernel: str

    def mix(
        self,
        x: Tensor,
        before: Tensor | None,
        memory: Tensor | None,
        form: str,
        *,
        output: bool = True,
        packed: Packing | None = None,
    ) -> tuple[Tensor | None, Tensor, Tensor]:
        """``packed``: ``x`` (1, T, …) holds sequences end to end, each from a zero state (``before`` and ``memory``
        None), in one call of fla's kernel with their cu_seqlens; the state returned is meaningless then."""
        raise NotImplementedError

    def state_shapes(self, batch: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shapes of the carried inputs and of the memory."""
        raise NotImplementedError

    def forward(self, x: Tensor) -> Tensor:
        y, _, _ = self.mix(x, None, None, self.form)
        assert y is not None
        return y

    def packed(self, x: Tensor, lengths: Sequence[int]) -> Tensor:
        """(1, T, d_model) of packed sequences, each from a zero state (``Packable``). ``kernel: fla`` (the chunked
        form): one call of fla's varlen kernel over all of them with their cu_seqlens, the short conv (a token shift)
        reading zero across each sequence's start, the projections, norms and gates on every token at once; else
        the layer over each sequence alone, one after another."""
        if self.kernel == "fla" and self.form == "chunked":
            y, _, _ = self.mix(x, None, None, self.form, packed=packing(tuple(lengths), x.device))
            assert y is not None
            return y
        return torch.cat([self(x[:, start:end]) for start, end in spans(lengths)], dim=1)

    def init_state(self, batch: int, capacity: int) -> DeltaState:
        """The carried inputs and the memory at zero; the same size after any number of tokens (``capacity`` does not
        matter)."""
        weight = next(self.parameters())
        inputs, memory = self.state_shapes(batch)
        return DeltaState(
            torch.zeros(inputs, device=weight.device, dtype=weight.dtype),
            torch.zeros(memory, device=weight.device, dtype=core_dtype(weight.dtype)),
        )

    def prefill(self, x: Tensor, state: DeltaState, *, output: bool = True) -> Tensor | None:
        """The layer's own form over the context, from the state it carries; the state after its last token."""
        y, inputs, memory = self.mix(x, state.inputs, state.memory, self.form, output=output)
        state.inputs.copy_(inputs)
        state.memory.copy_(memory)
        return y

    def step(self, x: Tensor, state: DeltaState) -> Tensor:
        """(B, 1, d_model) -> (B, 1, d_model): one step of the recurrence; the state stays as it was."""
        y, inputs, memory = self.mix(x, state.inputs, state.memory, "recurrent")
        state.set_next(inputs, memory)
        assert y is not None
        return y


# ---------------------------------------------------------------------------------------------------- the layer
class DeltaNet(DecodingLayer):
    """One (Gated) DeltaNet layer, (B, T, d_model) -> (B, T, d_model) (module notes)."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        *,
        gated: bool = True,
        head_dim: int = 0,
        expand_v: int = 2,
        heads_v: int = 0,
        d_conv: int = 4,
        output_gate: bool = True,
        chunk: int = 64,
        form: str = "chunked",
        kernel: str = "torch",
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("heads", heads), ("expand_v", expand_v), ("d_conv", d_conv), ("chunk", chunk)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        if head_dim == 0 and d_model % heads:
            raise ValueError(f"heads {heads} must divide d_model {d_model} where head_dim is 0")
        if form not in FORMS:
            raise ValueError(f"unknown form {form!r}; one of: {', '.join(FORMS)}")
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; one of: {', '.join(KERNELS)}")
        self.d_model, self.heads, self.gated, self.output_gate = d_model, heads, gated, output_gate
        self.d_k = head_dim or d_model // heads
        self.d_v = self.d_k * expand_v
        self.d_conv, self.chunk, self.form, self.kernel = d_conv, chunk, form, kernel
        # The rule runs per value head; key head j's q and k serve value heads j·G … j·G + G − 1 (G = H_v / H).
        self.key_heads, heads = heads, heads_v or heads
        if heads % self.key_heads:
            raise ValueError(f"heads_v {heads} is not a multiple of heads {self.key_heads}")
        self.heads = heads
        self.conv_dim = 2 * self.key_heads * self.d_k + heads * self.d_v
        self.widths = [self.conv_dim, heads, heads if gated else 0, heads * self.d_v if output_gate else 0]
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        # One projection to q, k, v, β, the decay's input and the output gate: one matmul, fla's weights side by side.
        self.in_proj = nn.Linear(d_model, sum(self.widths), bias=False, **kw)
        bound = 1 / math.sqrt(d_conv)  # nn.Conv1d's default, as fla's ShortConvolution (an nn.Conv1d)
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, d_conv, **kw).uniform_(-bound, bound))
        if gated:
            # fla's initialisation: A ~ U(0, 16); dt log-uniform in [1e-3, 0.1], stored as its inverse softplus.
            self.A_log = nn.Parameter(torch.empty(heads, **kw).uniform_(0, 16).log())
            dt = torch.exp(torch.rand(heads, device=device) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
            dt = dt.clamp(min=1e-4)
            self.dt_bias = nn.Parameter((dt + torch.log(-torch.expm1(-dt))).to(dtype or torch.get_default_dtype()))
        self.norm_weight = nn.Parameter(torch.ones(self.d_v, **kw))  # one (d_v,) weight shared by the heads, as fla's
        self.out_proj = nn.Linear(heads * self.d_v, d_model, bias=False, **kw)

    def state_shapes(self, batch: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (batch, self.d_conv - 1, self.conv_dim), (batch, self.heads, self.d_k, self.d_v)

    def mix(
        self,
        x: Tensor,
        before: Tensor | None,
        memory: Tensor | None,
        form: str,
        *,
        output: bool = True,
        packed: Packing | None = None,
    ) -> tuple[Tensor | None, Tensor, Tensor]:
        batch, length, _ = x.shape
        heads, d_k, d_v = self.heads, self.d_k, self.d_v
        qkv, b, a, gate = self.in_proj(x).split(self.widths, dim=-1)
        mixed, inputs = short_conv(qkv, before, self.conv_weight, None if packed is None else packed.positions)
        acc = core_dtype(x.dtype)
        key_heads = self.key_heads
        q, k, v = mixed.to(acc).split([key_heads * d_k, key_heads * d_k, heads * d_v], dim=-1)
        q = l2norm(q.view(batch, length, key_heads, d_k)).transpose(1, 2)  # (B, H_k, T, d_k)
        k = l2norm(k.view(batch, length, key_heads, d_k)).transpose(1, 2)  # (B, H_k, T, d_k)
        if heads != key_heads:  # each key head read by its G value heads, as fla repeats them
            q, k = q.repeat_interleave(heads // key_heads, dim=1), k.repeat_interleave(heads // key_heads, dim=1)
        v = v.view(batch, length, heads, d_v).transpose(1, 2)  # (B, H_v, T, d_v)
        beta = b.to(acc).sigmoid().transpose(1, 2)  # (B, H, T)
        g = None
        if self.gated:
            g = (-self.A_log.to(acc).exp() * F.softplus(a.to(acc) + self.dt_bias.to(acc))).transpose(1, 2)  # (B, H, T)
        if self.kernel == "fla" and form == "chunked":
            y, final = self._fla(q, k, v, g, beta, memory, x.dtype, final=memory is not None, packed=packed)
        elif form == "chunked":
            y, final = delta_rule_chunked(q, k, v, g, beta, self.chunk, memory)
        else:
            y, final = delta_rule_recurrent(q, k, v, g, beta, memory)
        if not output:
            return None, inputs, final
        y = y.transpose(1, 2)  # (B, T, H, d_v)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + _NORM_EPS) * self.norm_weight.to(acc)
        if self.output_gate:
            y = y * F.silu(gate.to(acc).view(batch, length, heads, d_v))  # fla's FusedRMSNormGated
        return self.out_proj(y.reshape(batch, length, heads * d_v).to(x.dtype)), inputs, final

    def _fla(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor | None,
        beta: Tensor,
        memory: Tensor | None,
        dtype: torch.dtype,
        *,
        final: bool,
        packed: Packing | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The chunked core as fla's kernel, in its layout: q, k, v (B, T, H, D) in the model's dtype, g (log decay)
        and β (B, T, H) after their activations, the state (B, H, d_k, d_v) in float32; scale 1/√d_k as ours.
        ``packed``: the sequences' cu_seqlens, each from a zero state."""
        q, k, v = (t.transpose(1, 2).to(dtype) for t in (q, k, v))
        kernel = fla_function(*FLA_KERNELS[GATED if self.gated else PLAIN])
        gates = (g.transpose(1, 2),) if g is not None else ()
        y, state = kernel(
            q,
            k,
            v,
            *gates,
            beta.transpose(1, 2).to(dtype),
            scale=self.d_k**-0.5,
            initial_state=memory,
            output_final_state=final,
            **fla_layout(kernel),
            **({} if packed is None else packed.kernel_arguments(kernel)),
        )
        if state is None:  # a forward keeps no state
            state = q.new_empty(0)
        return y.transpose(1, 2).to(core_dtype(dtype)), state

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, heads={self.heads}, d_k={self.d_k}, d_v={self.d_v}, gated={self.gated}, "
            f"output_gate={self.output_gate}, d_conv={self.d_conv}, chunk={self.chunk}, form={self.form}, "
            f"kernel={self.kernel}"
        )


class DeltaNetStack(LayerStack):
    """``layers`` layers applied in turn (scope core: the layers alone, as nn.LSTM(num_layers=…) stacks)."""

    def __init__(self, d_model: int, heads: int, layers: int, **options: Any) -> None:
        super().__init__([DeltaNet(d_model, heads, **options) for _ in range(layers)])


def _options(case: Case) -> dict[str, Any]:
    names = ("head_dim", "expand_v", "heads_v", "d_conv", "output_gate", "chunk", "form", "kernel")
    return {"gated": case.model == GATED} | {name: FAMILY.option(case, name) for name in names}


def kernel_problem(case: Case, device_type: str, kernel: tuple[str, str]) -> str | None:
    """Why ``kernel: fla`` cannot run ``case`` here (found before building), or None: no CUDA, no fla, or an installed
    ``kernel`` (module, function) that refuses the case's dtype (``fla_refuses_float32``)."""
    what = f"{case.model} kernel fla"
    if device_type != "cuda":
        return f"{what}: flash-linear-attention's kernels are Triton, CUDA only"
    problem = package_problem(what, kernel[0])
    if problem is not None:
        return problem
    if case.dtype in ("float32", "float64") and fla_refuses_float32(fla_function(*kernel)):
        version = fla_version() or "installed"
        return f"{what}: fla {version}'s {kernel[1]} takes float16 and bfloat16 only (it asserts q.dtype != float32)"
    return None


class DeltaNetTorch(ChunkedFormFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        options = {**_options(case), "device": device, "dtype": dtype}
        heads = case.heads or 1
        return recurrent_network(
            case,
            lambda: DeltaNetStack(case.d_model, heads, case.layers, **options),
            lambda _: DeltaNet(case.d_model, heads, **options),
            case.d_model,
            device,
            dtype,
        )

    def unavailable(self, case: Case, device_type: str) -> str | None:
        """Why the fused kernel (``kernel: fla``) cannot run here, found before building."""
        if FAMILY.option(case, "kernel") != "fla":
            return None
        return kernel_problem(case, device_type, FLA_KERNELS[case.model])

    def extras(self, case: Case, device: str) -> dict[str, ExtraValue]:
        return fla_extras(case, str(FAMILY.option(case, "kernel")))


TORCH = DeltaNetTorch()
