"""Kimi Delta Attention (Kimi Linear, arXiv:2510.26692) in plain PyTorch, with the structure of fla's
``KimiDeltaAttention`` (``fla/layers/kda.py``).

The cores work head-major, q and k (B, H, T, d_k), v (B, H, T, d_v), the per-channel log decays g (B, H, T, d_k)
(g ≤ 0) and β (B, H, T), on the key-major state H_t = S_tᵀ (B, H, d_k, d_v), fla's ``[N, H, K, V]``. In it the rule
reads (fla's ``naive_recurrent_kda``):

    H̃_t = Diag(e^{g_t}) H_{t−1},    δ_t = β_t (v_t − H̃_tᵀ k_t),    H_t = H̃_t + k_t δ_tᵀ,    o_t = H_tᵀ q_t / √d_k

Two forms, which a test holds equal (values and gradients) to each other, to fla-core's own naive recurrence and to
the paper's recurrence written with its explicit d_k × d_k transition:

* ``recurrent``: the equations above, one token at a time, as a decoder runs them.
* ``chunked``: the WY/UT form with per-channel decays (as fla's ``naive_chunk_kda``). Inside a chunk of c tokens with
  entering state H₀ and G_t the in-chunk inclusive cumsum of g (per channel), the corrections Δ = [δ_t] solve
      (I + A) Δ = βV − (β e^{G} ⊙ K) H₀,    A[t, s] = β_t Σ_i k_{t,i} k_{s,i} e^{G_{t,i} − G_{s,i}}  (s < t)
  so Δ = U − W H₀; then
      O = (e^{G} ⊙ Q) H₀ + M Δ,    M[t, s] = Σ_i q_{t,i} k_{s,i} e^{G_{t,i} − G_{s,i}}  (s ≤ t),
      H_c = e^{G_c} ⊙ H₀ + (e^{G_c − G} ⊙ K)ᵀ Δ.
  The decay-weighted products are formed from the masked differences G_t − G_s (≤ 0 where kept) as one batched product
  of the (c, c, d_k) weighted keys with [k_t | q_t], so nothing overflows for any decay (KDA's log decay is unbounded
  below, unlike RWKV-7's: a factorisation e^{G_t}·e^{−G_s} would overflow float32). The chunks are taken one after
  another, so the in-chunk memory is (B, H, c, c, d_k), not the whole sequence's. The last chunk of T mod C tokens is
  computed at its own length.

The cores run in float32 for 16-bit models (fla keeps the state in float32 too), the projections in the model's
dtype. ``kernel: fla`` runs the chunked core as flash-linear-attention's ``chunk_kda`` (CUDA only, d_k ≤ 256),
imported on first use; the short conv, the gate and the norms stay in torch.

The decay's dt_bias starts as Mamba's dt (log-uniform in [1e-3, 0.1], stored as its inverse softplus) per key channel,
A as U(1, 16) per head as fla's: a fresh layer keeps a memory worth measuring (fla zero-initialises dt_bias).

Decoding: the state is the conv's last d_conv − 1 inputs and the memory (B, H, d_k, d_v), constant in n
(``attnbench.families.deltanet.layers.DeltaState``).
"""

from __future__ import annotations

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
    fla_layout,
    l2norm,
    outer,
    short_conv,
    solve_unit_lower,
    vecmat,
    zero_state,
)
from attnbench.families.deltanet.spec import FORMS
from attnbench.families.kda.spec import FAMILY
from attnbench.families.states import LayerStack
from attnbench.families.torch_family import package_problem

FLA_KERNEL = ("fla.ops.kda", "chunk_kda")
FLA_MAX_HEAD_DIM = 256  # chunk_kda asserts K <= 256
_NORM_EPS = 1e-5  # fla's norm_eps


# ---------------------------------------------------------------------------------------------------- cores
def kda_recurrent(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """KDA's rule one token at a time. q, k, g (B, H, T, d_k), v (B, H, T, d_v), β (B, H, T), ``initial``
    (B, H, d_k, d_v) or zero. Returns o (B, H, T, d_v) and the state after the last token. Per token and head three
    products of d_k·d_v (k_tᵀH̃, k_t δ_tᵀ, q_tᵀH): 6·d_k·d_v FLOPs; the decay is element-wise."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    scale = d_k**-0.5
    state = zero_state(q, d_k, d_v, initial)
    out = []
    for t in range(length):
        state = g[:, :, t].exp()[..., None] * state  # Diag(α_t) H_{t−1}, out of place for autograd
        delta = beta[:, :, t, None] * (v[:, :, t] - vecmat(k[:, :, t], state))  # (B, H, d_v)
        state = state + outer(k[:, :, t], delta)
        out.append(vecmat(q[:, :, t] * scale, state))
    y = torch.stack(out, dim=2) if out else v.new_zeros(batch, heads, 0, d_v)
    return y, state


def kda_chunked(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, chunk: int, initial: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """KDA's rule in its chunked WY/UT form (module notes); shapes as ``kda_recurrent``."""
    batch, heads, length, d_k = q.shape
    d_v = v.shape[-1]
    q = q * d_k**-0.5
    state = zero_state(q, d_k, d_v, initial)
    out: list[Tensor] = []
    for start, count, size in chunk_blocks(length, chunk):
        qs, ks, vs, gs = (as_chunks(x, start, count, size) for x in (q, k, v, g))  # (B, H, N, C, d)
        bs = as_chunks(beta, start, count, size)  # (B, H, N, C)
        causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()[..., None]  # (C, C, 1)
        strict = torch.ones(size, size, dtype=q.dtype, device=q.device).tril(-1)
        for i in range(count):  # one chunk after another: the in-chunk memory stays (B, H, C, C, d_k)
            qc, kc, vc, bc = qs[:, :, i], ks[:, :, i], vs[:, :, i], bs[:, :, i]
            cum = gs[:, :, i].cumsum(-2)  # G_t, (B, H, C, d_k)
            decays = (cum[..., :, None, :] - cum[..., None, :, :]).masked_fill(~causal, -math.inf).exp()
            weighted = decays * kc[..., None, :, :]  # [t, s, i] = k_{s,i} e^{G_{t,i} − G_{s,i}}, (B, H, C, C, d_k)
            both = (weighted @ torch.stack([kc, qc], dim=-1)).movedim(-1, 0)  # [t, s] · [k_t | q_t]: (2, B, H, C, C)
            a_kk, m_qk = both[0], both[1]
            left = bc[..., None] * a_kk * strict  # A
            rhs = torch.cat([bc[..., None] * vc, (bc[..., None] * cum.exp()) * kc], dim=-1)
            u, w = solve_unit_lower(left, rhs).split([d_v, d_k], dim=-1)
            delta = u - w @ state  # Δ, (B, H, C, d_v)
            out.append((qc * cum.exp()) @ state + m_qk @ delta)
            last = cum[..., -1, :]  # G_c, (B, H, d_k)
            state = last.exp()[..., None] * state + (kc * (last[..., None, :] - cum).exp()).transpose(-1, -2) @ delta
    y = torch.cat(out, dim=2) if out else v.new_zeros(batch, heads, 0, d_v)
    return y, state


# ---------------------------------------------------------------------------------------------------- the layer
class KDA(DecodingLayer):
    """One Kimi Delta Attention layer, (B, T, d_model) -> (B, T, d_model) (module notes)."""

    def __init__(
        self,
        d_model: int,
        heads: int,
        *,
        head_dim: int = 0,
        expand_v: int = 1,
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
        self.d_model, self.heads, self.output_gate = d_model, heads, output_gate
        self.d_k = head_dim or d_model // heads
        self.d_v = self.d_k * expand_v
        self.d_conv, self.chunk, self.form, self.kernel = d_conv, chunk, form, kernel
        self.conv_dim = heads * (2 * self.d_k + self.d_v)
        self.widths = [self.conv_dim, heads]
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        # q, k, v and β in one matmul (fla's q_proj, k_proj, v_proj, b_proj side by side).
        self.in_proj = nn.Linear(d_model, sum(self.widths), bias=False, **kw)
        bound = 1 / math.sqrt(d_conv)  # nn.Conv1d's default, as fla's ShortConvolution
        self.conv_weight = nn.Parameter(torch.empty(self.conv_dim, d_conv, **kw).uniform_(-bound, bound))
        # The decay's low-rank projection d → d_v → H·d_k (fla's f_proj), its per-channel bias and per-head A.
        self.f_down = nn.Linear(d_model, self.d_v, bias=False, **kw)
        self.f_up = nn.Linear(self.d_v, heads * self.d_k, bias=False, **kw)
        self.A_log = nn.Parameter(torch.empty(heads, **kw).uniform_(1, 16).log())
        dt = torch.exp(torch.rand(heads * self.d_k, device=device) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter((dt + torch.log(-torch.expm1(-dt))).to(dtype or torch.get_default_dtype()))
        if output_gate:  # fla's g_proj: d → d_v → H·d_v, the second with a bias
            self.g_down = nn.Linear(d_model, self.d_v, bias=False, **kw)
            self.g_up = nn.Linear(self.d_v, heads * self.d_v, bias=True, **kw)
        self.norm_weight = nn.Parameter(torch.ones(self.d_v, **kw))  # one (d_v,) weight shared by the heads
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
        qkv, b = self.in_proj(x).split(self.widths, dim=-1)
        mixed, inputs = short_conv(qkv, before, self.conv_weight, None if packed is None else packed.positions)
        acc = core_dtype(x.dtype)
        q, k, v = mixed.to(acc).split([heads * d_k, heads * d_k, heads * d_v], dim=-1)
        q = l2norm(q.view(batch, length, heads, d_k)).transpose(1, 2)  # (B, H, T, d_k)
        k = l2norm(k.view(batch, length, heads, d_k)).transpose(1, 2)
        v = v.view(batch, length, heads, d_v).transpose(1, 2)  # (B, H, T, d_v)
        beta = b.to(acc).sigmoid().transpose(1, 2)  # (B, H, T)
        f = (self.f_up(self.f_down(x)).to(acc) + self.dt_bias.to(acc)).view(batch, length, heads, d_k)
        g = (-self.A_log.to(acc).exp()[:, None] * F.softplus(f)).transpose(1, 2)  # fla's fused_kda_gate, (B, H, T, d_k)
        if self.kernel == "fla" and form == "chunked":
            y, final = self._fla(q, k, v, g, beta, memory, x.dtype, final=memory is not None, packed=packed)
        elif form == "chunked":
            y, final = kda_chunked(q, k, v, g, beta, self.chunk, memory)
        else:
            y, final = kda_recurrent(q, k, v, g, beta, memory)
        if not output:
            return None, inputs, final
        y = y.transpose(1, 2)  # (B, T, H, d_v)
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + _NORM_EPS) * self.norm_weight.to(acc)
        if self.output_gate:  # fla's FusedRMSNormGated(activation='sigmoid')
            y = y * torch.sigmoid(self.g_up(self.g_down(x)).to(acc).view(batch, length, heads, d_v))
        return self.out_proj(y.reshape(batch, length, heads * d_v).to(x.dtype)), inputs, final

    def _fla(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        g: Tensor,
        beta: Tensor,
        memory: Tensor | None,
        dtype: torch.dtype,
        *,
        final: bool,
        packed: Packing | None = None,
    ) -> tuple[Tensor, Tensor]:
        """The chunked core as fla's ``chunk_kda``, in its layout: q, k, v (B, T, H, D) in the model's dtype, g (the
        log decay, after the gate) in the core's dtype (B, T, H, d_k), β (B, T, H), the state in the core's dtype;
        scale 1/√d_k as ours. ``packed``: the sequences' cu_seqlens, each from a zero state."""
        q, k, v = (t.transpose(1, 2).to(dtype) for t in (q, k, v))
        kernel = fla_function(*FLA_KERNEL)
        y, state = kernel(
            q,
            k,
            v,
            g.transpose(1, 2).to(core_dtype(dtype)),
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
            f"d_model={self.d_model}, heads={self.heads}, d_k={self.d_k}, d_v={self.d_v}, "
            f"output_gate={self.output_gate}, d_conv={self.d_conv}, chunk={self.chunk}, form={self.form}, "
            f"kernel={self.kernel}"
        )


class KDAStack(LayerStack):
    """``layers`` layers applied in turn (scope core)."""

    def __init__(self, d_model: int, heads: int, layers: int, **options: Any) -> None:
        super().__init__([KDA(d_model, heads, **options) for _ in range(layers)])


def _options(case: Case) -> dict[str, Any]:
    names = ("head_dim", "expand_v", "d_conv", "output_gate", "chunk", "form", "kernel")
    return {name: FAMILY.option(case, name) for name in names}


def kernel_problem(case: Case, device_type: str) -> str | None:
    """Why ``kernel: fla`` cannot run ``case`` here (found before building), or None."""
    what = "kda kernel fla"
    if device_type != "cuda":
        return f"{what}: flash-linear-attention's kernels are Triton, CUDA only"
    d_k = FAMILY.head_dims(case)[0]
    if d_k > FLA_MAX_HEAD_DIM:
        return f"{what}: chunk_kda takes key head dims up to {FLA_MAX_HEAD_DIM}, this case has {d_k}"
    return None


class KDATorch(ChunkedFormFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        options = {**_options(case), "device": device, "dtype": dtype}
        heads = case.heads or 1
        return recurrent_network(
            case,
            lambda: KDAStack(case.d_model, heads, case.layers, **options),
            lambda _: KDA(case.d_model, heads, **options),
            case.d_model,
            device,
            dtype,
        )

    def extras(self, case: Case, device: str) -> dict[str, ExtraValue]:
        return fla_extras(case, str(FAMILY.option(case, "kernel")))

    def unavailable(self, case: Case, device_type: str) -> str | None:
        """Why the fused kernel (``kernel: fla``) cannot run here, found before building."""
        if FAMILY.option(case, "kernel") != "fla":
            return None
        return kernel_problem(case, device_type) or package_problem("kda kernel fla", FLA_KERNEL[0])


TORCH = KDATorch()
