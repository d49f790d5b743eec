"""Mamba-2 (Dao & Gu 2024, "Transformers are SSMs", arXiv:2405.21060) in plain PyTorch, with mamba_ssm's layout.

One layer (``Mamba2``), per token t and SSM head h of P channels, with a state of N per channel:

    z, xBC, dt = in_proj(u)                      xBC = SiLU(causal depthwise conv(xBC)), split into x, B, C
    Δ = softplus(dt + dt_bias),  A = −exp(A_log)
    h_t = exp(Δ_t·A)·h_{t−1} + (Δ_t·x_t) ⊗ B_t   (P × N per head; B and C shared by the heads of a group)
    y_t = C_t·h_t + D·x_t
    out = out_proj(RMSNorm(y ⊙ SiLU(z)))

The scan has two forms a test holds equal (values and gradients) to each other and to a per-token reference:

* ``chunked``: the SSD form, the paper's Listing 1 (``ssd_minimal_discrete``) with its four steps — the diagonal
  blocks (attention-like: (C·Bᵀ ⊙ L)·X inside chunks of C tokens, L the decays), each chunk's final state, the
  recurrence across chunk boundaries, the states' contribution to the output — written as explicit matrix
  products so that torch's FlopCounterMode counts exactly what ``attnbench.families.mamba2.spec`` states. A
  sequence shorter than C is one chunk of its own length; a longer one whose length C does not divide is padded
  with zero steps (x = 0, Δ·A = 0: they add nothing and decay nothing), which the count includes.
* ``recurrent``: the recurrence one token at a time, as a decoder runs it.

The scan runs in float32 for 16-bit models (the decays multiply along the sequence), the projections in the model's
dtype. ``kernel: mamba_ssm`` runs the chunked scan as the mamba-ssm package's fused Triton kernel
(``mamba_chunk_scan_combined``, CUDA only), imported on first use so that importing this module never needs it.

Decoding (``attnbench.families.states``): the state is the conv's last d_conv inputs (B, conv_dim, d_conv)
in the model's dtype and the SSM state (B, H, P, N) in the scan's dtype, both constant in n. A prefill runs the
layer's own form over the context from the state it is given (so a long context may come in chunks); a step is
mamba_ssm's ``Mamba2.step``: the conv window shifted by the new input, the single recurrence step, the gate, the
norm — computed into buffers kept beside the state, which stays as it was until ``advance``.
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
from attnbench.families.mamba2.spec import FAMILY
from attnbench.families.states import ConstantState, LayerStack
from attnbench.families.torch_family import package_problem

FORMS = ("chunked", "recurrent")
KERNELS = ("torch", "mamba_ssm")
_NORM_EPS = 1e-5  # mamba_ssm's RMSNormGated default


def scan_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def segsum(x: Tensor) -> Tensor:
    """(…, T) → (…, T, T): out[i, j] = Σ_{j<k≤i} x_k for j ≤ i, −inf above the diagonal (Listing 1's stable form:
    a cumulative sum of masked copies, never a difference of large sums)."""
    length = x.shape[-1]
    x = x[..., None].expand(*x.shape, length)  # (…, T, T): x[…, k, j] = x_k
    below = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=-1)
    summed = x.masked_fill(~below, 0).cumsum(dim=-2)
    keep = torch.tril(torch.ones(length, length, dtype=torch.bool, device=x.device), diagonal=0)
    return summed.masked_fill(~keep, -math.inf)


def ssd_chunked(
    x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk: int, initial: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The chunked SSD scan. x (B, T, H, P) = Δ·x; a (B, T, H) = Δ·A; b, c (B, T, H, N) (groups repeated to heads);
    ``initial`` (B, H, P, N) or zero. Returns y (B, T, H, P) and the state after the last token (B, H, P, N)."""
    batch, length, heads, p = x.shape
    n = b.shape[-1]
    block = min(chunk, max(length, 1))
    pad = -length % block
    if pad:  # zero steps: nothing added, nothing decayed
        x, b, c = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, b, c))
        a = F.pad(a, (0, 0, 0, pad))
    k = (length + pad) // block
    xs = x.view(batch, k, block, heads, p).permute(0, 1, 3, 2, 4)  # (B, k, H, l, P)
    bs = b.view(batch, k, block, heads, n).permute(0, 1, 3, 2, 4)  # (B, k, H, l, N)
    cs = c.view(batch, k, block, heads, n).permute(0, 1, 3, 2, 4)  # (B, k, H, l, N)
    a_chunks = a.view(batch, k, block, heads).permute(0, 3, 1, 2)  # (B, H, k, l)
    a_cumsum = a_chunks.cumsum(dim=-1)  # (B, H, k, l)
    # 1. Inside each chunk: (C·Bᵀ ⊙ L)·X, L[i, j] = exp(Σ_{j<s≤i} a_s) below the diagonal.
    decays = segsum(a_chunks).exp().permute(0, 2, 1, 3, 4)  # (B, k, H, l, l)
    scores = cs @ bs.transpose(-1, -2)  # (B, k, H, l, l)
    y_diag = (scores * decays) @ xs  # (B, k, H, l, P)
    # 2. Each chunk's final state: Σ_s exp(Σ_{s<r≤end} a_r)·B_sᵀ x_s.
    to_end = (a_cumsum[..., -1:] - a_cumsum).exp().permute(0, 2, 1, 3)  # (B, k, H, l)
    states = (bs * to_end[..., None]).transpose(-1, -2) @ xs  # (B, k, H, N, P)
    # 3. Across chunk boundaries: state z = Σ_{c ≤ z} (decay from c's end to z's end)·state_c.
    start = torch.zeros(batch, heads, p, n, device=x.device, dtype=x.dtype) if initial is None else initial
    states = torch.cat([start.transpose(-1, -2)[:, None], states], dim=1)  # (B, k+1, H, N, P)
    chunk_decay = segsum(F.pad(a_cumsum[..., -1], (1, 0))).exp()  # (B, H, k+1, k+1)
    flat = states.permute(0, 2, 1, 3, 4).reshape(batch, heads, k + 1, n * p)  # (B, H, k+1, N·P)
    carried = (chunk_decay @ flat).view(batch, heads, k + 1, n, p).permute(0, 2, 1, 3, 4)  # (B, k+1, H, N, P)
    entering, final = carried[:, :-1], carried[:, -1]  # the state entering each chunk, and after the last
    # 4. The entering state's share of each output: exp(Σ_{start<r≤i} a_r)·C_i·state.
    from_start = a_cumsum.exp().permute(0, 2, 1, 3)  # (B, k, H, l)
    y_off = (cs * from_start[..., None]) @ entering  # (B, k, H, l, P)
    y = (y_diag + y_off).permute(0, 1, 3, 2, 4).reshape(batch, k * block, heads, p)
    return y[:, :length], final.transpose(-1, -2)  # (B, T, H, P), (B, H, P, N)


def ssd_recurrent(
    x: Tensor, a: Tensor, b: Tensor, c: Tensor, chunk: int = 0, initial: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """The same scan one token at a time (``chunk`` unused; the signature is ``ssd_chunked``'s)."""
    batch, length, heads, p = x.shape
    n = b.shape[-1]
    h = torch.zeros(batch, heads, p, n, device=x.device, dtype=x.dtype) if initial is None else initial
    out = []
    for t in range(length):
        h = a[:, t, :, None, None].exp() * h + x[:, t, :, :, None] @ b[:, t, :, None, :]  # (B, H, P, N)
        out.append((h @ c[:, t, :, :, None])[..., 0])  # (B, H, P)
    y = torch.stack(out, dim=1) if out else x.new_zeros(batch, 0, heads, p)
    return y, h


_SCANS = {"chunked": ssd_chunked, "recurrent": ssd_recurrent}


def mamba_ssm_scan() -> Any:
    """``mamba_ssm``'s fused chunked scan (``mamba_chunk_scan_combined``); ImportError where it is not installed."""
    return importlib.import_module("mamba_ssm.ops.triton.ssd_combined").mamba_chunk_scan_combined


class Mamba2State(ConstantState):
    """One layer's decode state, and the buffers a step computes the next one into (not part of ``tensors``)."""

    def __init__(self, conv: Tensor, ssm: Tensor) -> None:
        self.conv, self.ssm = conv, ssm  # (B, conv_dim, d_conv), (B, H, P, N)
        self.next_conv, self.next_ssm = torch.empty_like(conv), torch.empty_like(ssm)
        self.stepped = False

    def tensors(self) -> Iterator[Tensor]:
        yield self.conv
        yield self.ssm

    def advance(self) -> None:
        if not self.stepped:
            raise ValueError("advance() needs a step first")
        self.conv.copy_(self.next_conv)
        self.ssm.copy_(self.next_ssm)
        self.stepped = False

    def scratch(self) -> Iterator[Tensor]:
        yield self.next_conv
        yield self.next_ssm

    def drop_scratch(self) -> None:
        del self.next_conv, self.next_ssm  # a step after this has nowhere to write: the state is being measured


class Mamba2(nn.Module):
    """One Mamba-2 layer, (B, T, d_model) -> (B, T, d_model) (module notes)."""

    # A verify runs the drafts as decode steps, keeping the state after each (attnbench.families.serving).
    rollback_method = "checkpoint"

    def __init__(
        self,
        d_model: int,
        *,
        d_state: int = 64,
        head_dim: int = 64,
        expand: int = 2,
        d_conv: int = 4,
        groups: int = 1,
        chunk: int = 64,
        form: str = "chunked",
        kernel: str = "torch",
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        for name, value in (("d_model", d_model), ("d_state", d_state), ("head_dim", head_dim), ("expand", expand)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        for name, value in (("d_conv", d_conv), ("groups", groups), ("chunk", chunk)):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}")
        inner = expand * d_model
        if inner % head_dim:
            raise ValueError(f"head_dim {head_dim} must divide d_inner = expand × d_model = {inner}")
        heads = inner // head_dim
        if heads % groups:
            raise ValueError(f"groups {groups} must divide the {heads} SSM heads")
        if form not in FORMS:
            raise ValueError(f"unknown form {form!r}; one of: {', '.join(FORMS)}")
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}; one of: {', '.join(KERNELS)}")
        self.d_model, self.inner, self.heads, self.head_dim = d_model, inner, heads, head_dim
        self.d_state, self.d_conv, self.groups, self.chunk = d_state, d_conv, groups, chunk
        self.form, self.kernel = form, kernel
        self.conv_dim = inner + 2 * groups * d_state
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        # Made in mamba_ssm's order (in_proj, conv, dt_bias, A_log, D, norm, out_proj), so a seed fixes the same draws.
        self.in_proj = nn.Linear(d_model, 2 * inner + 2 * groups * d_state + heads, bias=False, **kw)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, d_conv, groups=self.conv_dim, padding=d_conv - 1, **kw)
        # dt log-uniform in [1e-3, 0.1], stored as its inverse softplus; A uniform in [1, 16] (mamba_ssm's init).
        dt = torch.exp(torch.rand(heads, device=device) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        dt = dt.clamp(min=1e-4)
        self.dt_bias = nn.Parameter((dt + torch.log(-torch.expm1(-dt))).to(dtype or torch.get_default_dtype()))
        a = torch.empty(heads, device=device).uniform_(1, 16)
        self.A_log = nn.Parameter(torch.log(a).to(dtype or torch.get_default_dtype()))
        self.D = nn.Parameter(torch.ones(heads, **kw))
        self.norm_weight = nn.Parameter(torch.ones(inner, **kw))
        self.out_proj = nn.Linear(inner, d_model, bias=False, **kw)

    # ------------------------------------------------------------------------------------------------ pieces
    def _split_in(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """z (…, d_inner), xBC (…, conv_dim), dt (…, H)."""
        z, xbc, dt = self.in_proj(u).split([self.inner, self.conv_dim, self.heads], dim=-1)
        return z, xbc, dt

    def _conv(self, xbc: Tensor, before: Tensor | None) -> Tensor:
        """SiLU(causal depthwise conv) over (B, T, conv_dim); ``before`` (B, conv_dim, d_conv − 1): the inputs
        preceding this piece (zero at the start)."""
        length = xbc.shape[1]
        if before is None:
            out = self.conv1d(xbc.transpose(1, 2))[..., :length]  # left padding d_conv − 1, the right cut
        else:
            joined = torch.cat([before, xbc.transpose(1, 2)], dim=-1)  # (B, conv_dim, d_conv − 1 + T)
            out = F.conv1d(joined, self.conv1d.weight, self.conv1d.bias, groups=self.conv_dim)
        return F.silu(out).transpose(1, 2)  # (B, T, conv_dim)

    def _heads(self, xbc: Tensor, dt: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """x (B, T, H, P), Δ (B, T, H), B and C (B, T, H, N) with each group's B, C repeated for its heads; in the
        scan's dtype."""
        batch, length, _ = xbc.shape
        acc = scan_dtype(xbc.dtype)
        x, b, c = xbc.to(acc).split([self.inner, self.groups * self.d_state, self.groups * self.d_state], dim=-1)
        x = x.view(batch, length, self.heads, self.head_dim)
        per_group = self.heads // self.groups
        b = b.view(batch, length, self.groups, self.d_state).repeat_interleave(per_group, dim=2)
        c = c.view(batch, length, self.groups, self.d_state).repeat_interleave(per_group, dim=2)
        delta = F.softplus(dt.to(acc) + self.dt_bias.to(acc))  # (B, T, H)
        return x, delta, b, c, -self.A_log.to(acc).exp()

    def _finish(self, y: Tensor, z: Tensor) -> Tensor:
        """out_proj(RMSNorm(y ⊙ SiLU(z)) · weight), y (B, T, d_inner) in the scan's dtype. The norm is per group of
        d_inner / groups channels, as mamba_ssm's RMSNormGated(group_size=d_inner // ngroups): with groups > 1 a
        norm over all of d_inner computes a different layer."""
        gated = y * F.silu(z.to(y.dtype))
        grouped = gated.unflatten(-1, (self.groups, -1))
        normed = (grouped * torch.rsqrt(grouped.pow(2).mean(dim=-1, keepdim=True) + _NORM_EPS)).flatten(-2)
        return self.out_proj((normed * self.norm_weight.to(y.dtype)).to(z.dtype))

    def _scan(self, xbc: Tensor, dt: Tensor, initial: Tensor | None) -> tuple[Tensor, Tensor]:
        """y (B, T, d_inner) and the final state, from the conv's output and dt."""
        if self.kernel == "mamba_ssm":
            return self._kernel_scan(xbc, dt, initial)
        x, delta, b, c, a = self._heads(xbc, dt)
        y, final = _SCANS[self.form](x * delta[..., None], delta * a, b, c, self.chunk, initial)
        y = y + x * self.D.to(y.dtype)[:, None]
        return y.flatten(2), final

    def _kernel_scan(self, xbc: Tensor, dt: Tensor, initial: Tensor | None) -> tuple[Tensor, Tensor]:
        """The chunked scan as mamba_ssm's fused kernel, in its layout: x (B, T, H, P), dt (B, T, H) before the
        softplus (the kernel adds dt_bias and applies it), A (H,), B and C (B, T, G, N) per group."""
        batch, length, _ = xbc.shape
        x, b, c = xbc.split([self.inner, self.groups * self.d_state, self.groups * self.d_state], dim=-1)
        y, final = mamba_ssm_scan()(
            x.reshape(batch, length, self.heads, self.head_dim),
            dt,
            -self.A_log.float().exp(),
            b.reshape(batch, length, self.groups, self.d_state),
            c.reshape(batch, length, self.groups, self.d_state),
            self.chunk,
            D=self.D,
            dt_bias=self.dt_bias,
            dt_softplus=True,
            initial_states=initial,
            return_final_states=True,
        )
        return y.flatten(2).to(scan_dtype(xbc.dtype)), final

    # ------------------------------------------------------------------------------------------------ forward
    def forward(self, u: Tensor) -> Tensor:
        z, xbc, dt = self._split_in(u)
        y, _ = self._scan(self._conv(xbc, None), dt, None)
        return self._finish(y, z)

    # ------------------------------------------------------------------------------------------------ decoding
    def init_state(self, batch: int, capacity: int) -> Mamba2State:
        """The conv's inputs and the SSM state at zero; the same size after any number of tokens (``capacity``
        does not matter)."""
        weight = self.in_proj.weight
        conv = torch.zeros(batch, self.conv_dim, self.d_conv, device=weight.device, dtype=weight.dtype)
        ssm = torch.zeros(
            batch, self.heads, self.head_dim, self.d_state, device=weight.device, dtype=scan_dtype(weight.dtype)
        )
        return Mamba2State(conv, ssm)

    def prefill(self, u: Tensor, state: Mamba2State, *, output: bool = True) -> Tensor | None:
        """The layer's own form over the context, from the state it carries; the state after its last token."""
        z, xbc, dt = self._split_in(u)
        before = state.conv[..., 1:]  # the d_conv − 1 inputs before this piece
        y, final = self._scan(self._conv(xbc, before), dt, state.ssm)
        inputs = torch.cat([state.conv, xbc.transpose(1, 2)], dim=-1)  # (B, conv_dim, d_conv + T)
        state.conv.copy_(inputs[..., -self.d_conv :])
        state.ssm.copy_(final)
        return self._finish(y, z) if output else None

    def step(self, u: Tensor, state: Mamba2State) -> Tensor:
        """(B, 1, d_model) -> (B, 1, d_model): mamba_ssm's single step; the state stays as it was."""
        z, xbc, dt = self._split_in(u[:, 0])  # (B, ·)
        state.next_conv[..., :-1].copy_(state.conv[..., 1:])  # the window, shifted by the new input
        state.next_conv[..., -1].copy_(xbc)
        conv = (state.next_conv * self.conv1d.weight[:, 0]).sum(dim=-1)  # (B, conv_dim)
        if self.conv1d.bias is not None:
            conv = conv + self.conv1d.bias
        x, delta, b, c, a = self._heads(F.silu(conv)[:, None], dt[:, None])  # one token
        x, delta, b, c = x[:, 0], delta[:, 0], b[:, 0], c[:, 0]  # (B, H, P), (B, H), (B, H, N) ×2
        decay = (delta * a).exp()[..., None, None]  # (B, H, 1, 1)
        state.next_ssm.copy_(decay * state.ssm + (x * delta[..., None])[..., None] @ b[:, :, None, :])
        state.stepped = True
        y = (state.next_ssm @ c[..., None])[..., 0] + x * self.D.to(x.dtype)[:, None]  # (B, H, P)
        return self._finish(y.flatten(1)[:, None], z[:, None])

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, d_inner={self.inner}, heads={self.heads}, head_dim={self.head_dim}, "
            f"d_state={self.d_state}, groups={self.groups}, d_conv={self.d_conv}, chunk={self.chunk}, "
            f"form={self.form}, kernel={self.kernel}"
        )


class Mamba2Stack(LayerStack):
    """``layers`` Mamba-2 layers applied in turn (scope core: the layers alone, as nn.LSTM(num_layers=…) stacks)."""

    def __init__(self, d_model: int, layers: int, **options: Any) -> None:
        super().__init__([Mamba2(d_model, **options) for _ in range(layers)])


def _options(case: Case) -> dict[str, Any]:
    return {
        name: FAMILY.option(case, name)
        for name in ("d_state", "head_dim", "expand", "d_conv", "groups", "chunk", "form", "kernel")
    }


class Mamba2Torch(ChunkedFormFamily):
    def build(self, case: Case, device: str, dtype: torch.dtype) -> nn.Module:
        options = {**_options(case), "device": device, "dtype": dtype}
        return recurrent_network(
            case,
            lambda: Mamba2Stack(case.d_model, case.layers, **options),
            lambda _: Mamba2(case.d_model, **options),
            case.d_model,
            device,
            dtype,
        )

    def unavailable(self, case: Case, device_type: str) -> str | None:
        """Why the fused kernel (``kernel: mamba_ssm``) cannot run here, found before building."""
        if FAMILY.option(case, "kernel") != "mamba_ssm":
            return None
        if device_type != "cuda":
            return "mamba2 kernel mamba_ssm: the mamba-ssm package's kernels are Triton, CUDA only"
        return package_problem("mamba2 kernel mamba_ssm", "mamba_ssm.ops.triton.ssd_combined")


TORCH = Mamba2Torch()
