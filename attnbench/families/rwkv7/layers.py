"""RWKV-7 "Goose" (Peng et al. 2025, arXiv:2503.14456), its time-mix layer in plain PyTorch, with the structure of
fla's ``RWKV7Attention`` (``fla/layers/rwkv7.py``) at its first layer (no value residual).

The core works head-major, r, w, k̃, κ̂, a (B, H, T, N), v (B, H, T, N), on the key-major state H_t = S_tᵀ
(B, H, N, N), fla's ``[N, H, K, V]``. With u = −κ̂ and b = κ̂ ⊙ a (fla's ``chunk_rwkv7(a=-kk, b=kk*a)``) and
w ≤ 0 the log decay, the paper's recurrence is the diagonal-plus-low-rank update

    H_t = (diag(e^{w_t}) + b_t u_tᵀ) H_{t−1} + k̃_t v_tᵀ,    o_t = H_tᵀ r_t

Two forms, which a test holds equal (values and gradients) to each other and to the paper's recurrence written per
token with its explicit N × N transition:

* ``recurrent``: one token at a time: the removed row z_t = u_tᵀH_{t−1}, two rank-1 writes, the readout.
* ``chunked``: inside a chunk of c tokens (entering state H₀, G the per-channel in-chunk log-cumsum of w), the
  removed rows Z solve one unit-lower-triangular system, and the outputs and the next state follow by products:
      (I − A_ub) Z = Ũ H₀ + A_uk V    →  Z = W H₀ + U_v
      O = R̃ H₀ + A_rb Z + A_rk V,     H_c = e^{G_c} ⊙ H₀ + (B ⊙ e^{G_c−G})ᵀ Z + (K ⊙ e^{G_c−G})ᵀ V
  with Ũ = U ⊙ e^{G_{t−1}}, B̃ = B ⊙ e^{−G}, K̃ = K ⊙ e^{−G}, R̃ = R ⊙ e^{G}, A_ub = tril(ŨB̃ᵀ, −1),
  A_uk = tril(ŨK̃ᵀ, −1), A_rb = tril(R̃B̃ᵀ), A_rk = tril(R̃K̃ᵀ) (the structure of fla's dplr chunk kernels). The
  factors e^{±G} are relative to the chunk's start, so |Σ_chunk w| must stay within float32's exponent: RWKV-7's
  w ≥ −e^{−1/2} keeps it there for C ≤ 128, the option's maximum. (fla centres them on the chunk's middle instead.)

The core runs in float32 for 16-bit models, the projections in the model's dtype. ``kernel: fla`` runs the chunked
core as flash-linear-attention's ``chunk_rwkv7`` (CUDA only), called as fla's layer calls it; the token shift, the
LoRAs and the norm stay in torch.

Weights: the per-channel parameters (the mixes μ, ξ, α, ρ, the LoRAs' biases w₀ and a₀) start as fla's RWKV-LM
recipe sets them for a first layer, the norm at weight 1 and bias 0; the matrices as nn.Linear draws them (fla zeroes
the output projection and the LoRAs' first factors, which makes a fresh layer's output zero: nothing for a test to
compare, and no faster).

Decoding: the state is the previous token's input (B, 1, d) in the model's dtype and the memory (B, H, N, N) in the
core's dtype, constant in n (``attnbench.families.deltanet.layers.DeltaState``).
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.cases import Case
from attnbench.families.base import ExtraValue
from attnbench.families.blocks import ChunkedFormFamily, recurrent_network
from attnbench.families.deltanet.layers import (
    KERNELS,
    DecodingLayer,
    Packing,
    as_chunks,
    chunk_blocks,
    core_dtype,
    fla_extras,
    fla_function,
    kernel_problem,
    outer,
    solve_unit_lower,
    vecmat,
    zero_state,
)
from attnbench.families.deltanet.spec import FORMS
from attnbench.families.rwkv7.spec import FAMILY, default_ranks
from attnbench.families.states import LayerStack

# fla's decay bound: log w = −e^{−1/2}·σ(·) ∈ (−0.607, 0).
DECAY_SCALE = math.exp(-0.5)
FLA_KERNEL = ("fla.ops.rwkv7", "chunk_rwkv7")
_NORM_EPS = 1e-5  # fla's norm_eps; the GroupNorm's is head_dim times it, as RWKV-LM's


# ---------------------------------------------------------------------------------------------------- cores
def rwkv7_recurrent(
    r: Tensor, w: Tensor, k: Tensor, v: Tensor, kk: Tensor, a: Tensor, initial: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """RWKV-7's rule one token at a time. r, w (log decay), k (k̃), kk (κ̂), a (B, H, T, d_k); v (B, H, T, d_v);
    ``initial`` (B, H, d_k, d_v) or zero. Returns o (B, H, T, d_v) and the state after the last token. Per token
    and head four products of d_k·d_v: 8·d_k·d_v FLOPs; the diagonal decay is element-wise."""
    batch, heads, length, d_k = r.shape
    d_v = v.shape[-1]
    state = zero_state(r, d_k, d_v, initial)
    u, b = -kk, kk * a
    out = []
    for t in range(length):
        removed = vecmat(u[:, :, t], state)  # z_t = u_tᵀH_{t−1}, (B, H, d_v)
        state = w[:, :, t].exp()[..., None] * state + outer(b[:, :, t], removed) + outer(k[:, :, t], v[:, :, t])
        out.append(vecmat(r[:, :, t], state))
    y = torch.stack(out, dim=2) if out else v.new_zeros(batch, heads, 0, d_v)
    return y, state


def rwkv7_chunked(
    r: Tensor, w: Tensor, k: Tensor, v: Tensor, kk: Tensor, a: Tensor, chunk: int, initial: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """RWKV-7's rule in its chunked form (module notes); shapes as ``rwkv7_recurrent``."""
    batch, heads, length, d_k = r.shape
    d_v = v.shape[-1]
    state = zero_state(r, d_k, d_v, initial)
    u, b = -kk, kk * a
    out: list[Tensor] = []
    for start, count, size in chunk_blocks(length, chunk):
        rc, wc, kc, vc, uc, bc = (as_chunks(x, start, count, size) for x in (r, w, k, v, u, b))  # (B, H, N, C, d)
        cum = wc.cumsum(-2)  # G, inclusive, (B, H, N, C, d_k)
        r_t, u_t = rc * cum.exp(), uc * (cum - wc).exp()  # R̃; Ũ with the exclusive cumsum
        b_t, k_t = bc * (-cum).exp(), kc * (-cum).exp()  # B̃, K̃
        a_ub = (u_t @ b_t.transpose(-1, -2)).tril(-1)  # (B, H, N, C, C)
        a_uk = (u_t @ k_t.transpose(-1, -2)).tril(-1)
        a_rb = (r_t @ b_t.transpose(-1, -2)).tril()
        a_rk = (r_t @ k_t.transpose(-1, -2)).tril()
        w_h, u_v = solve_unit_lower(-a_ub, torch.cat([u_t, a_uk @ vc], dim=-1)).split([d_k, d_v], dim=-1)
        inside = a_rk @ vc  # the outputs' part that needs no state
        to_end = (cum[..., -1:, :] - cum).exp()  # e^{G_c − G_s} ≤ 1
        b_end = bc * to_end
        kv_end = (kc * to_end).transpose(-1, -2) @ vc  # (B, H, N, d_k, d_v)
        last = cum[..., -1, :].exp()  # e^{G_c}, (B, H, N, d_k)
        for i in range(count):  # across chunks: the state, one chunk after another
            removed = w_h[:, :, i] @ state + u_v[:, :, i]  # Z, (B, H, C, d_v)
            out.append(r_t[:, :, i] @ state + a_rb[:, :, i] @ removed + inside[:, :, i])
            state = last[:, :, i, :, None] * state + b_end[:, :, i].transpose(-1, -2) @ removed + kv_end[:, :, i]
    y = torch.cat(out, dim=2) if out else v.new_zeros(batch, heads, 0, d_v)
    return y, state


# ---------------------------------------------------------------------------------------------------- the layer
class LoRA(nn.Module):
    """x → act(x A) B (+ bias): RWKV's low-rank MLPs."""

    def __init__(self, d_model: int, rank: int, activation: str | None, bias: bool, **kw: Any) -> None:
        super().__init__()
        self.down = nn.Linear(d_model, rank, bias=False, **kw)
        self.up = nn.Linear(rank, d_model, bias=bias, **kw)
        self.activation = activation

    def forward(self, x: Tensor) -> Tensor:
        h = self.down(x)
        if self.activation == "tanh":
            h = torch.tanh(h)
        elif self.activation == "sigmoid":
            h = torch.sigmoid(h)
        return self.up(h)


class RWKV7(DecodingLayer):
    """One RWKV-7 time-mix layer, (B, T, d_model) -> (B, T, d_model) (module notes)."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        *,
        decay_rank: int = 0,
        a_rank: int = 0,
        gate_rank: int = 0,
        chunk: int = 64,
        form: str = "chunked",
        kernel: str = "torch",
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if heads < 1 or d_model % heads:
            raise ValueError(f"heads {heads} must divide d_model {d_model}")
        if chunk < 1:
            raise ValueError(f"chunk must be positive, got {chunk}")
        if form not in FORMS:
            raise ValueError(f"unknown form {form!r}; one of: {', '.join(FORMS)}")
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; one of: {', '.join(KERNELS)}")
        self.d_model, self.heads, self.head_dim = d_model, heads, d_model // heads
        ranks = default_ranks(d_model, self.head_dim)
        self.ranks = (decay_rank or ranks[0], a_rank or ranks[1], gate_rank or ranks[2])
        self.chunk, self.form, self.kernel = chunk, form, kernel
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.shift_mix = nn.Parameter(torch.empty(6, d_model, **kw))  # μ for r, w, k, v, a, g (fla's x_r … x_g)
        self.k_k = nn.Parameter(torch.empty(d_model, **kw))  # ξ: κ̂ = L2norm(k ⊙ ξ)
        self.k_a = nn.Parameter(torch.empty(d_model, **kw))  # α: k̃ = k ⊙ (1 + (a − 1) ⊙ α)
        self.r_k = nn.Parameter(torch.empty(heads, self.head_dim, **kw))  # ρ: the bonus term
        self.r_proj, self.k_proj, self.v_proj = (nn.Linear(d_model, d_model, bias=False, **kw) for _ in range(3))
        self.w_lora = LoRA(d_model, self.ranks[0], "tanh", True, **kw)
        self.a_lora = LoRA(d_model, self.ranks[1], None, True, **kw)
        self.g_lora = LoRA(d_model, self.ranks[2], "sigmoid", False, **kw)
        self.norm_weight = nn.Parameter(torch.empty(d_model, **kw))
        self.norm_bias = nn.Parameter(torch.zeros(d_model, **kw))
        self.o_proj = nn.Linear(d_model, d_model, bias=False, **kw)
        self._init_channels()

    @torch.no_grad()
    def _init_channels(self) -> None:
        """fla's RWKV-LM recipe (``RWKV7Attention._initialize_weights``) for the per-channel parameters of a first
        layer (layer_idx 0): ratio_0_to_1 = 0, ratio_1_to_almost0 = 1."""
        d, n = self.d_model, self.head_dim
        channel = torch.arange(d, dtype=torch.float32)
        ddd = channel / d
        linear = channel / max(d - 1, 1) - 0.5
        zigzag = ((channel % n) - (n - 1) / 2) / max((n - 1) / 2, 1e-9)
        zigzag = zigzag * zigzag.abs()
        www = -6 + 6 * (channel / max(d - 1, 1))
        for row, power in enumerate((0.2, 0.9, 0.7, 0.7, 0.9, 0.2)):
            self.shift_mix[row].copy_(1.0 - ddd.pow(power))
        self.k_k.copy_(0.71 - linear * 0.1)
        self.k_a.fill_(1.02)
        self.r_k.fill_(-0.04)
        assert self.w_lora.up.bias is not None and self.a_lora.up.bias is not None
        self.w_lora.up.bias.copy_(www + 0.5 + zigzag * 2.5)
        self.a_lora.up.bias.copy_(-0.19 + zigzag * 0.3 + linear * 0.4)
        self.norm_weight.fill_(1.0)

    def state_shapes(self, batch: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (batch, 1, self.d_model), (batch, self.heads, self.head_dim, self.head_dim)

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
        batch, length, d = x.shape
        if before is None:
            before = x.new_zeros(batch, 1, d)
        joined = torch.cat([before, x], dim=1)  # (B, 1 + T, d)
        previous = joined[:, :length]
        if packed is not None:  # a sequence's first token shifts in zero, not the one before it in the packing
            previous = previous * (packed.positions >= 1).to(x.dtype)[:, None]
        delta = previous - x  # x_{t−1} − x_t: the token shift
        xr, xw, xk, xv, xa, xg = (x + delta * mu for mu in self.shift_mix)
        acc = core_dtype(x.dtype)
        r, k, v = self.r_proj(xr).to(acc), self.k_proj(xk).to(acc), self.v_proj(xv).to(acc)
        w = -DECAY_SCALE * torch.sigmoid(self.w_lora(xw).to(acc))  # log decay in (−0.607, 0)
        a = torch.sigmoid(self.a_lora(xa).to(acc))  # the in-context learning rate

        def heads(t: Tensor) -> Tensor:
            return t.view(batch, length, self.heads, self.head_dim).transpose(1, 2)  # (B, H, T, N)

        kk = F.normalize(heads(k * self.k_k.to(acc)), dim=-1, p=2.0)  # κ̂
        k = k * (1 + (a - 1) * self.k_a.to(acc))  # k̃
        r_h, w_h, k_h, v_h, a_h = heads(r), heads(w), heads(k), heads(v), heads(a)
        if self.kernel == "fla" and form == "chunked":
            y, final = self._fla(r_h, w_h, k_h, v_h, kk, a_h, memory, x.dtype, final=memory is not None, packed=packed)
        elif form == "chunked":
            y, final = rwkv7_chunked(r_h, w_h, k_h, v_h, kk, a_h, self.chunk, memory)
        else:
            y, final = rwkv7_recurrent(r_h, w_h, k_h, v_h, kk, a_h, memory)
        inputs = joined[:, length:]
        if not output:
            return None, inputs, final
        normed = F.group_norm(
            y.transpose(1, 2).reshape(batch * length, d),
            self.heads,
            self.norm_weight.to(acc),
            self.norm_bias.to(acc),
            eps=self.head_dim * _NORM_EPS,
        ).view(batch, length, self.heads, self.head_dim)
        bonus = (r_h * k_h * self.r_k.to(acc)[:, None]).sum(-1, keepdim=True) * v_h  # (B, H, T, N)
        mixed = (normed + bonus.transpose(1, 2)).reshape(batch, length, d) * self.g_lora(xg).to(acc)
        return self.o_proj(mixed.to(x.dtype)), inputs, final

    def _fla(
        self,
        r: Tensor,
        w: Tensor,
        k: Tensor,
        v: Tensor,
        kk: Tensor,
        a: Tensor,
        memory: Tensor | None,
        dtype: torch.dtype,
        *,
        final: bool,
        packed: Packing | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The chunked core as fla's ``chunk_rwkv7``, called as fla's layer calls it: (B, T, H, N) in the model's
        dtype, a = −κ̂, b = κ̂ ⊙ a, scale 1, the decay's bound declared where the kernel takes it. ``packed``: the
        sequences' cu_seqlens, each from a zero state."""
        kernel = fla_function(*FLA_KERNEL)
        accepted = inspect.signature(kernel).parameters
        extra = {"safe_gate": True, "lower_bound": -DECAY_SCALE, "chunk_size": 64, "head_first": False}
        r, w, k, v, a_dplr, b_dplr = (t.transpose(1, 2).to(dtype) for t in (r, w, k, v, -kk, kk * a))
        y, state = kernel(
            r,
            w,
            k,
            v,
            a_dplr,
            b_dplr,
            scale=1.0,
            initial_state=memory,
            output_final_state=final,
            **{name: value for name, value in extra.items() if name in accepted},
            **({} if packed is None else packed.kernel_arguments(kernel)),
        )
        if state is None:  # a forward keeps no state
            state = r.new_empty(0)
        return y.transpose(1, 2).to(core_dtype(dtype)), state

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, heads={self.heads}, head_dim={self.head_dim}, ranks={self.ranks}, "
            f"chunk={self.chunk}, form={self.form}, kernel={self.kernel}"
        )


class RWKV7Stack(LayerStack):
    """``layers`` layers applied in turn (scope core)."""

    def __init__(self, d_model: int, heads: int, layers: int, **options: Any) -> None:
        super().__init__([RWKV7(d_model, heads, **options) for _ in range(layers)])


def _options(case: Case) -> dict[str, Any]:
    names = ("decay_rank", "a_rank", "gate_rank", "chunk", "form", "kernel")
    return {name: FAMILY.option(case, name) for name in names}


class RWKV7Torch(ChunkedFormFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        options = {**_options(case), "device": device, "dtype": dtype}
        heads = case.heads or 1
        return recurrent_network(
            case,
            lambda: RWKV7Stack(case.d_model, heads, case.layers, **options),
            lambda _: RWKV7(case.d_model, heads, **options),
            case.d_model,
            device,
            dtype,
        )

    def unavailable(self, case: Case, device_type: str) -> str | None:
        """Why the fused kernel (``kernel: fla``) cannot run here, found before building."""
        if FAMILY.option(case, "kernel") != "fla":
            return None
        return kernel_problem(case, device_type, FLA_KERNEL)

    def extras(self, case: Case, device: str) -> dict[str, ExtraValue]:
        return fla_extras(case, str(FAMILY.option(case, "kernel")))


TORCH = RWKV7Torch()
