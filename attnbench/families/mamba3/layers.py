"""Mamba-3 (Lahoti et al. 2026, arXiv:2603.15569) in plain PyTorch, with the structure of mamba_ssm's ``Mamba3``
(``mamba_ssm/modules/mamba3.py``; the recurrence of its reference ``mamba3_siso_step_ref`` and
``mamba3_MIMO_step_ref``). See ``attnbench.families.mamba3.spec`` for the equations.

The cores work head-major on q, k (B, H, T, R, N) — B and C after their norm, bias and rotation —, x (B, H, T, R, P)
after the MIMO lift, and per-head log α = Δ·A, Δ and λ (B, H, T); the state h (B, H, N, P) is key-major. Two forms,
which a test holds equal (values and gradients) to each other and to the recurrence written per token as mamba_ssm's
reference writes it:

* ``recurrent``: h_t = α_t h_{t−1} + β_t k_{t−1}ᵀx_{t−1} + γ_t k_tᵀx_t (rank R: k_t is R × N, x_t R × P), then
  y_{t,r} = h_tᵀ q_{t,r}, one token at a time.
* ``chunked``: unrolled, token s enters h_t (s ≤ t) with weight e^{G_t − G_s}·(γ_s + σ_s·[s < t]), where
  σ_s = (1 − λ_{s+1})Δ_{s+1} is the next token's β over its α (0 after the call's last token). Inside a chunk of c
  tokens with entering state h₀ (G the in-chunk cumsum of log α) the c·R rows take
      Y = (e^{G} ⊙ Q) h₀ + (QKᵀ ⊙ M) X,    M[t, s] = e^{G_t − G_s}(γ_s + σ_s·[s < t])  (s ≤ t),
      h_c = e^{G_c} h₀ + (K ⊙ e^{G_c − G}(γ + σ))ᵀ X,
  so the state carried into the next chunk already holds its first token's β term; a call that starts from a state
  first adds (1 − λ_0)Δ_0 k_prevᵀx_prev (the last token of the call before, which the state keeps).

The angles accumulate θ_t = θ_{t−1} + π·tanh(φ_t)·Δ_t (mod 2π), the rotation acts on adjacent pairs (2i, 2i+1) of
the first 2S channels (mamba_ssm's SISO convention). The cores run in float32 for 16-bit models. ``kernel:
mamba_ssm`` runs the chunked SISO form as mamba_ssm's ``mamba3_siso_combined`` (CUDA), called with the layout its
module uses; the projections, norms and the gate stay in torch (its kernel fuses the gate and D itself).

Decoding: the state is the angles, h, the last rotated k and lifted x (``Mamba3State``), constant in n.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnbench.core.cases import Case
from attnbench.families.blocks import ChunkedFormFamily, recurrent_network
from attnbench.families.deltanet.layers import chunk_blocks, core_dtype
from attnbench.families.mamba3.spec import FAMILY, FORMS, KERNELS
from attnbench.families.states import ConstantState, LayerStack
from attnbench.families.torch_family import package_problem

_NORM_EPS = 1e-5  # mamba_ssm's B_norm, C_norm
A_FLOOR = 1e-4  # mamba_ssm's A_floor: A ≤ −1e-4
TWO_PI = 2 * math.pi
MAMBA_SSM_KERNEL = ("mamba_ssm.ops.triton.mamba3.mamba3_siso_combined", "mamba3_siso_combined")

Carry = tuple[Tensor, Tensor, Tensor]  # h (B, H, N, P), the last k (B, H, R, N) and x (B, H, R, P)


# ---------------------------------------------------------------------------------------------------- cores
def mamba3_recurrent(
    q: Tensor, k: Tensor, x: Tensor, log_alpha: Tensor, dt: Tensor, lam: Tensor, carry: Carry | None = None
) -> tuple[Tensor, Carry]:
    """The trapezoidal recurrence one token at a time. q, k (B, H, T, R, N); x (B, H, T, R, P); log α, Δ, λ
    (B, H, T); ``carry`` (h, k_prev, x_prev) or zero. Returns y (B, H, T, R, P) = h_tᵀ q_{t,r} and the carry after the
    last token. Per token and head 6·R·N·P FLOPs (two rank-R writes and the readout)."""
    batch, heads, length, rank, n = q.shape
    p = x.shape[-1]
    if carry is None:
        carry = (
            q.new_zeros(batch, heads, n, p),
            q.new_zeros(batch, heads, rank, n),
            q.new_zeros(batch, heads, rank, p),
        )
    h, k_prev, x_prev = carry
    out = []
    for t in range(length):
        alpha = log_alpha[:, :, t].exp()
        beta = ((1 - lam[:, :, t]) * dt[:, :, t] * alpha)[..., None, None]
        gamma = (lam[:, :, t] * dt[:, :, t])[..., None, None]
        h = alpha[..., None, None] * h + beta * (k_prev.transpose(-1, -2) @ x_prev)
        h = h + gamma * (k[:, :, t].transpose(-1, -2) @ x[:, :, t])
        out.append(q[:, :, t] @ h)  # (B, H, R, P)
        k_prev, x_prev = k[:, :, t], x[:, :, t]
    y = torch.stack(out, dim=2) if out else x.new_zeros(batch, heads, 0, rank, p)
    return y, (h, k_prev, x_prev)


def mamba3_chunked(
    q: Tensor,
    k: Tensor,
    x: Tensor,
    log_alpha: Tensor,
    dt: Tensor,
    lam: Tensor,
    chunk: int,
    carry: Carry | None = None,
) -> tuple[Tensor, Carry]:
    """The trapezoidal recurrence in its chunked form (module notes); shapes as ``mamba3_recurrent``."""
    batch, heads, length, rank, n = q.shape
    p = x.shape[-1]
    if carry is None:
        h = q.new_zeros(batch, heads, n, p)
        k_last, x_last = q.new_zeros(batch, heads, rank, n), q.new_zeros(batch, heads, rank, p)
    else:
        h, k_last, x_last = carry
        if length:  # the first token's β term, from the last token of the call before
            h = h + ((1 - lam[:, :, 0]) * dt[:, :, 0])[..., None, None] * (k_last.transpose(-1, -2) @ x_last)
    gamma = lam * dt
    sigma = F.pad(((1 - lam) * dt)[:, :, 1:], (0, 1))  # σ_s: the next token's β/α; 0 after the last
    out: list[Tensor] = []
    for start, count, size in chunk_blocks(length, chunk):
        for i in range(count):
            span = slice(start + i * size, start + (i + 1) * size)
            cum = log_alpha[:, :, span].cumsum(-1)  # G, (B, H, c)
            causal = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
            decay = (cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, -math.inf).exp()  # (B, H, c, c)
            strict = torch.ones(size, size, dtype=q.dtype, device=q.device).tril(-1)
            weights = decay * (gamma[:, :, None, span] + sigma[:, :, None, span] * strict)  # M
            rows = size * rank
            qc = q[:, :, span].reshape(batch, heads, rows, n)
            kc = k[:, :, span].reshape(batch, heads, rows, n)
            xc = x[:, :, span].reshape(batch, heads, rows, p)
            mask = weights.repeat_interleave(rank, dim=-1).repeat_interleave(rank, dim=-2)  # (B, H, cR, cR)
            into = cum.exp().repeat_interleave(rank, dim=-1)[..., None]  # e^{G_t} per row
            out.append((qc * into) @ h + ((qc @ kc.transpose(-1, -2)) * mask) @ xc)
            to_end = ((cum[..., -1:] - cum).exp() * (gamma[:, :, span] + sigma[:, :, span])).repeat_interleave(
                rank, dim=-1
            )
            h = cum[..., -1].exp()[..., None, None] * h + (kc * to_end[..., None]).transpose(-1, -2) @ xc
    y = torch.cat(out, dim=2).view(batch, heads, length, rank, p) if out else x.new_zeros(batch, heads, 0, rank, p)
    if length:
        k_last, x_last = k[:, :, -1], x[:, :, -1]
    return y, (h, k_last, x_last)


def rotate(t: Tensor, angles: Tensor) -> Tensor:
    """Pairs (2i, 2i+1) of the first 2S channels of t (…, N) rotated by ``angles`` (…, S); the rest as they are."""
    pairs = angles.shape[-1]
    head, rest = t[..., : 2 * pairs], t[..., 2 * pairs :]
    even, odd = head[..., 0::2], head[..., 1::2]
    cos, sin = angles.cos(), angles.sin()
    rotated = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1)


def rms_norm(t: Tensor, weight: Tensor) -> Tensor:
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + _NORM_EPS) * weight


def mamba_ssm_function() -> Any:
    """mamba_ssm's fused SISO Mamba-3 (ImportError where the package or its Mamba-3 kernels are missing)."""
    module, name = MAMBA_SSM_KERNEL
    return getattr(importlib.import_module(module), name)


# ---------------------------------------------------------------------------------------------------- state
class Mamba3State(ConstantState):
    """One layer's decode state: the angles (B, H, S), h (B, H, N, P), the last rotated k (B, H, R, N) and lifted x
    (B, H, R, P); and the buffers a step computes the next ones into."""

    def __init__(self, angles: Tensor, h: Tensor, k: Tensor, x: Tensor) -> None:
        self.held = [angles, h, k, x]
        self.next = [torch.empty_like(t) for t in self.held]
        self.stepped = False

    def tensors(self) -> Iterator[Tensor]:
        yield from self.held

    def scratch(self) -> Iterator[Tensor]:
        yield from self.next

    def set_next(self, values: list[Tensor]) -> None:
        for buffer, value in zip(self.next, values, strict=True):
            buffer.copy_(value)
        self.stepped = True

    def advance(self) -> None:
        if not self.stepped:
            raise ValueError("advance() needs a step first")
        for held, value in zip(self.held, self.next, strict=True):
            held.copy_(value)
        self.stepped = False

    def drop_scratch(self) -> None:
        self.next = []


# ---------------------------------------------------------------------------------------------------- the layer
class Mamba3(nn.Module):
    """One Mamba-3 layer, (B, T, d_model) -> (B, T, d_model) (module notes)."""

    rollback_method = "checkpoint"

    def __init__(
        self,
        d_model: int,
        *,
        d_state: int = 128,
        head_dim: int = 64,
        expand: int = 2,
        mimo_rank: int = 1,
        rope_fraction: float = 0.5,
        chunk: int = 64,
        form: str = "chunked",
        kernel: str = "torch",
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        inner = expand * d_model
        if inner % head_dim:
            raise ValueError(f"head_dim {head_dim} must divide d_inner {inner}")
        if form not in FORMS:
            raise ValueError(f"unknown form {form!r}; one of: {', '.join(FORMS)}")
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; one of: {', '.join(KERNELS)}")
        self.d_model, self.inner, self.head_dim, self.d_state, self.rank = d_model, inner, head_dim, d_state, mimo_rank
        self.heads = inner // head_dim
        self.angles = int(d_state * rope_fraction) // 2
        if self.angles < 1:
            raise ValueError(f"d_state {d_state} leaves no pair of channels to rotate")
        self.chunk, self.form, self.kernel = chunk, form, kernel
        h, n, r, p = self.heads, d_state, mimo_rank, head_dim
        self.widths = [inner, inner, r * n, r * n, h, h, h, self.angles]  # z, x, B, C, dd_dt, dd_A, trap, φ
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.in_proj = nn.Linear(d_model, sum(self.widths), bias=False, **kw)
        # mamba_ssm's initialisation: dt log-uniform in [1e-3, 0.1] stored as its inverse softplus; biases at 1.
        dt = torch.exp(torch.rand(h, device=device) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
        self.dt_bias = nn.Parameter((dt + torch.log(-torch.expm1(-dt))).to(dtype or torch.get_default_dtype()))
        self.B_bias = nn.Parameter(torch.ones(h, r, n, **kw))
        self.C_bias = nn.Parameter(torch.ones(h, r, n, **kw))
        self.B_norm = nn.Parameter(torch.ones(n, **kw))
        self.C_norm = nn.Parameter(torch.ones(n, **kw))
        if r > 1:
            self.mimo_x = nn.Parameter(torch.full((h, r, p), 1 / r, **kw))
            self.mimo_z = nn.Parameter(torch.ones(h, r, p, **kw))
            self.mimo_o = nn.Parameter(torch.full((h, r, p), 1 / r, **kw))
        self.D = nn.Parameter(torch.ones(h, **kw))
        self.out_proj = nn.Linear(inner, d_model, bias=False, **kw)

    # ------------------------------------------------------------------------------------------------ pieces
    def _inputs(self, u: Tensor, theta: Tensor | None) -> tuple[Tensor, ...]:
        """From the input (B, T, d): z (B, T, H, P); q, k (B, H, T, R, N) rotated; the lifted x (B, H, T, R, P);
        log α, Δ, λ (B, H, T); the angles after the last token (B, H, S)."""
        batch, length, _ = u.shape
        acc = core_dtype(u.dtype)
        h, n, r, p = self.heads, self.d_state, self.rank, self.head_dim
        z, x, b, c, dd_dt, dd_a, trap, phi = self.in_proj(u).to(acc).split(self.widths, dim=-1)
        z, x = z.view(batch, length, h, p), x.view(batch, length, h, p)
        dt = F.softplus(dd_dt + self.dt_bias.to(acc)).transpose(1, 2)  # Δ (B, H, T)
        a = (-F.softplus(dd_a)).clamp(max=-A_FLOOR).transpose(1, 2)
        log_alpha, lam = a * dt, trap.sigmoid().transpose(1, 2)
        steps = torch.tanh(phi)[:, None] * math.pi * dt[..., None]  # (B, H, T, S)
        cum = steps.cumsum(2) + (0 if theta is None else theta[:, :, None])
        cum = torch.remainder(cum, TWO_PI)  # the angles mod 2π, as mamba_ssm keeps them
        b = rms_norm(b.view(batch, length, r, n), self.B_norm.to(acc))  # (B, T, R, N), one group
        c = rms_norm(c.view(batch, length, r, n), self.C_norm.to(acc))
        k = rotate(b[:, None] + self.B_bias.to(acc)[:, None], cum[..., None, :])  # (B, H, T, R, N)
        q = rotate(c[:, None] + self.C_bias.to(acc)[:, None], cum[..., None, :])
        xh = x.transpose(1, 2)[:, :, :, None]  # (B, H, T, 1, P)
        lifted = xh * self.mimo_x.to(acc)[:, None] if self.rank > 1 else xh  # (B, H, T, R, P)
        last = cum[:, :, -1] if length else (torch.zeros_like(cum[:, :, 0]) if theta is None else theta)
        return z, q, k, lifted, log_alpha, dt, lam, last

    def mix(
        self, u: Tensor, state: list[Tensor] | None, form: str, *, output: bool = True
    ) -> tuple[Tensor | None, list[Tensor]]:
        """The layer over u (B, T, d) from ``state`` [θ, h, k, x] (None: zero); the output and the state after."""
        theta = None if state is None else state[0]
        carry = None if state is None else (state[1], state[2], state[3])
        if self.kernel == "mamba_ssm" and form == "chunked" and self.rank == 1:
            fused, fused_after = self._mamba_ssm(u, carry, theta)
            return self.out_proj(fused.reshape(*u.shape[:2], self.inner).to(u.dtype)) if output else None, fused_after
        z, q, k, lifted, log_alpha, dt, lam, last = self._inputs(u, theta)
        if form == "chunked":
            y, carry = mamba3_chunked(q, k, lifted, log_alpha, dt, lam, self.chunk, carry)
        else:
            y, carry = mamba3_recurrent(q, k, lifted, log_alpha, dt, lam, carry)
        after = [last, *carry]
        if not output:
            return None, after
        acc = core_dtype(u.dtype)
        y = y + self.D.to(acc)[:, None, None, None] * lifted  # (B, H, T, R, P)
        gate = z.transpose(1, 2)[:, :, :, None]
        if self.rank > 1:
            gate = gate * self.mimo_z.to(acc)[:, None]
        y = y * F.silu(gate)
        y = (y * self.mimo_o.to(acc)[:, None]).sum(3) if self.rank > 1 else y[:, :, :, 0]
        out = y.transpose(1, 2)  # (B, T, H, P)
        return self.out_proj(out.reshape(*u.shape[:2], self.inner).to(u.dtype)), after

    def _mamba_ssm(self, u: Tensor, carry: Carry | None, theta: Tensor | None) -> tuple[Tensor, list[Tensor]]:
        """The chunked SISO layer core as mamba_ssm's ``mamba3_siso_combined``, called as its module calls it (gate and
        skip fused): the output (B, T, H, P) and the state after [θ, h, k, x] (empty where none was given)."""
        batch, length, _ = u.shape
        h, n, p = self.heads, self.d_state, self.head_dim
        z, x, b, c, dd_dt, dd_a, trap, phi = self.in_proj(u).split(self.widths, dim=-1)
        acc = core_dtype(u.dtype)
        a = (-F.softplus(dd_a.to(acc))).clamp(max=-A_FLOOR)
        dt = F.softplus(dd_dt + self.dt_bias)
        states = None
        if carry is not None and theta is not None:  # mamba_ssm's (angle, h as (H, P, N), k, x)
            states = (theta, carry[0].transpose(-1, -2), carry[1][:, :, 0], carry[2][:, :, 0])
        result = mamba_ssm_function()(
            Q=rms_norm(c.view(batch, length, 1, n), self.C_norm),
            K=rms_norm(b.view(batch, length, 1, n), self.B_norm),
            V=x.reshape(batch, length, h, p),
            ADT=(a * dt).transpose(1, 2),
            DT=dt.transpose(1, 2),
            Trap=trap.transpose(1, 2),
            Q_bias=self.C_bias[:, 0],
            K_bias=self.B_bias[:, 0],
            Angles=phi[:, :, None].expand(-1, -1, h, -1).to(acc),
            D=self.D,
            Z=z.reshape(batch, length, h, p),
            chunk_size=64,
            Input_States=states,
            return_final_states=states is not None,
        )
        if states is None:
            empty = u.new_empty(0)
            return (result[0] if isinstance(result, tuple) else result), [empty] * 4
        y, angle, final_h, final_k, final_x = result[:5]
        after = [angle, final_h.transpose(-1, -2), final_k[:, :, None], final_x[:, :, None]]
        return y, [t.to(acc) for t in after]

    def forward(self, u: Tensor) -> Tensor:
        y, _ = self.mix(u, None, self.form)
        assert y is not None
        return y

    def init_state(self, batch: int, capacity: int) -> Mamba3State:
        """Zero angles, state and last k, x; the same size after any number of tokens."""
        weight = self.in_proj.weight
        kw: dict[str, Any] = {"device": weight.device, "dtype": core_dtype(weight.dtype)}
        h, n, r, p = self.heads, self.d_state, self.rank, self.head_dim
        return Mamba3State(
            torch.zeros(batch, h, self.angles, **kw),
            torch.zeros(batch, h, n, p, **kw),
            torch.zeros(batch, h, r, n, **kw),
            torch.zeros(batch, h, r, p, **kw),
        )

    def prefill(self, u: Tensor, state: Mamba3State, *, output: bool = True) -> Tensor | None:
        y, after = self.mix(u, list(state.tensors()), self.form, output=output)
        for held, value in zip(state.tensors(), after, strict=True):
            held.copy_(value)
        return y

    def step(self, u: Tensor, state: Mamba3State) -> Tensor:
        y, after = self.mix(u, list(state.tensors()), "recurrent")
        state.set_next(after)
        assert y is not None
        return y

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_inner={self.inner}, heads={self.heads}, head_dim={self.head_dim}, "
            f"d_state={self.d_state}, mimo_rank={self.rank}, angles={self.angles}, chunk={self.chunk}, "
            f"form={self.form}, kernel={self.kernel}"
        )


class Mamba3Stack(LayerStack):
    """``layers`` layers applied in turn (scope core)."""

    def __init__(self, d_model: int, layers: int, **options: Any) -> None:
        super().__init__([Mamba3(d_model, **options) for _ in range(layers)])


def _options(case: Case) -> dict[str, Any]:
    names = ("d_state", "head_dim", "expand", "mimo_rank", "rope_fraction", "chunk", "form", "kernel")
    return {name: FAMILY.option(case, name) for name in names}


def kernel_problem(case: Case, device_type: str) -> str | None:
    what = "mamba3 kernel mamba_ssm"
    if device_type != "cuda":
        return f"{what}: the mamba-ssm package's kernels are Triton, CUDA only"
    if int(FAMILY.option(case, "mimo_rank")) > 1:
        return f"{what}: the MIMO kernel is TileLang's (mamba3_mimo); only the SISO kernel is wired here"
    return None


class Mamba3Torch(ChunkedFormFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        options = {**_options(case), "device": device, "dtype": dtype}
        return recurrent_network(
            case,
            lambda: Mamba3Stack(case.d_model, case.layers, **options),
            lambda _: Mamba3(case.d_model, **options),
            case.d_model,
            device,
            dtype,
        )

    def unavailable(self, case: Case, device_type: str) -> str | None:
        if FAMILY.option(case, "kernel") != "mamba_ssm":
            return None
        return kernel_problem(case, device_type) or package_problem("mamba3 kernel mamba_ssm", MAMBA_SSM_KERNEL[0])


TORCH = Mamba3Torch()
