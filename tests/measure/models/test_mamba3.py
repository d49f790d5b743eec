"""Mamba-3: the layer's chunked and recurrent forms equal the paper's recurrence written per token here (as
mamba_ssm's ``mamba3_siso_step_ref`` / ``mamba3_MIMO_step_ref`` write it) in float64, values and gradients, SISO and
MIMO, chunk sizes that do not divide n; a step after a prefill (and a prefill in pieces) equals the whole sequence;
the decode state is constant in n and is the formula; the parameter and FLOP formulas are the module's;
``kernel: mamba_ssm`` really routes through mamba3_siso_combined."""

from __future__ import annotations

import math
import sys
import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from attnbench.core.cases import Case, Mode
from attnbench.families.catalogue import cannot_build, no_effect
from attnbench.families.flops import count_flops, count_parameters
from attnbench.families.mamba3 import layers as m3
from attnbench.families.mamba3.layers import Mamba3
from attnbench.families.registry import build_model, make_input, parameter_count, probe
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import decodable, prefill, tensor_bytes
from attnbench.families.torch_family import make_decode_inputs

F64 = torch.float64
EXACT: dict[str, Any] = {"atol": 1e-10, "rtol": 1e-10}
B, D = 2, 16
SIZES = {"d_state": 8, "head_dim": 4, "expand": 2}  # 8 heads of 4 channels, N = 8
LENGTHS = (13, 16)
CHUNKS = (1, 3, 4, 16)


def reference(layer: Mamba3, u: Tensor) -> Tensor:
    """The paper's recurrence token by token from the layer's weights (arXiv:2603.15569; mamba_ssm's step
    references): θ_t = θ_{t−1} + π·tanh(φ_t)Δ_t; k_t, q_t = R(θ_t)(RMSNorm(B_t, C_t) + bias); h_t = α_t h_{t−1} +
    (1 − λ_t)Δ_t α_t k_{t−1}ᵀx_{t−1} + λ_tΔ_t k_tᵀx_t; y = Σ_r w^o_r (h_tᵀq_{t,r} + D x_{t,r}) SiLU(z ⊙ w^z_r)."""
    heads, p, n, rank = layer.heads, layer.head_dim, layer.d_state, layer.rank
    pairs = layer.angles
    z, x, bb, cc, dd_dt, dd_a, trap, phi = layer.in_proj(u).split(layer.widths, dim=-1)

    def norm(t: Tensor, w: Tensor) -> Tensor:
        return t / torch.sqrt(t.pow(2).mean(-1, keepdim=True) + 1e-5) * w

    def rot(t: Tensor, angle: Tensor) -> Tensor:  # t (B, H, R, N), angle (B, H, S): pairs (2i, 2i+1), i < S
        out = t.clone()
        for i in range(pairs):
            c, s = angle[..., i, None].cos(), angle[..., i, None].sin()
            out[..., 2 * i] = t[..., 2 * i] * c - t[..., 2 * i + 1] * s
            out[..., 2 * i + 1] = t[..., 2 * i] * s + t[..., 2 * i + 1] * c
        return out

    mimo_x = layer.mimo_x if rank > 1 else torch.ones(heads, 1, p, dtype=u.dtype)
    mimo_z = layer.mimo_z if rank > 1 else torch.ones(heads, 1, p, dtype=u.dtype)
    mimo_o = layer.mimo_o if rank > 1 else torch.ones(heads, 1, p, dtype=u.dtype)
    batch = u.shape[0]
    theta = torch.zeros(batch, heads, pairs, dtype=u.dtype)
    h = torch.zeros(batch, heads, p, n, dtype=u.dtype)  # mamba_ssm's orientation: (P, N)
    k_prev = torch.zeros(batch, heads, rank, n, dtype=u.dtype)
    x_prev = torch.zeros(batch, heads, rank, p, dtype=u.dtype)
    outs = []
    for t in range(u.shape[1]):
        dt = F.softplus(dd_dt[:, t] + layer.dt_bias)  # (B, H)
        a = torch.clamp(-F.softplus(dd_a[:, t]), max=-1e-4)
        lam = torch.sigmoid(trap[:, t])
        theta = theta + torch.tanh(phi[:, t])[:, None, :] * math.pi * dt[..., None]
        b_t = norm(bb[:, t].view(batch, 1, rank, n), layer.B_norm) + layer.B_bias[None]  # (B, H, R, N)
        c_t = norm(cc[:, t].view(batch, 1, rank, n), layer.C_norm) + layer.C_bias[None]
        k, q = rot(b_t, theta), rot(c_t, theta)
        v = x[:, t].view(batch, heads, 1, p) * mimo_x[None]  # (B, H, R, P)
        alpha = torch.exp(a * dt)[..., None, None]
        beta = ((1 - lam) * dt)[..., None, None] * alpha
        gamma = (lam * dt)[..., None, None]
        h = alpha * h + beta * torch.einsum("bhrn,bhrp->bhpn", k_prev, x_prev)
        h = h + gamma * torch.einsum("bhrn,bhrp->bhpn", k, v)
        y = torch.einsum("bhpn,bhrn->bhrp", h, q) + layer.D[None, :, None, None] * v
        gate = z[:, t].view(batch, heads, 1, p) * mimo_z[None]
        y = y * gate * torch.sigmoid(gate)
        outs.append(torch.einsum("bhrp,hrp->bhp", y, mimo_o).reshape(batch, heads * p))
        k_prev, x_prev = k, v
    return layer.out_proj(torch.stack(outs, dim=1))


def layer(**options: Any) -> Mamba3:
    torch.manual_seed(0)
    made = Mamba3(D, **{**SIZES, "chunk": 4, **options}, dtype=F64)
    with torch.no_grad():  # every parameter away from its initial value, so that a missing one shows
        for p in made.parameters():
            if p.dim() < 2:
                p.add_(0.3 * torch.randn_like(p))
        if made.rank > 1:
            for p in (made.mimo_x, made.mimo_z, made.mimo_o, made.B_bias, made.C_bias):
                p.add_(0.3 * torch.randn_like(p))
    return made


def inputs(length: int, seed: int = 1) -> Tensor:
    return torch.randn(B, length, D, generator=torch.Generator().manual_seed(seed), dtype=F64)


VARIANTS = [{}, {"mimo_rank": 2}, {"mimo_rank": 3, "rope_fraction": 1.0}]


@pytest.mark.parametrize("options", VARIANTS)
def test_both_forms_equal_the_papers_recurrence_values_and_gradients(options: dict[str, Any]) -> None:
    made = layer(**options)
    for length in LENGTHS:
        x = inputs(length).requires_grad_()
        want = reference(made, x)
        params = [x, *made.parameters()]
        want_grads = torch.autograd.grad(want.square().sum(), params)
        for form, chunks in (("recurrent", (1,)), ("chunked", CHUNKS)):
            made.form = form
            for chunk in chunks:
                made.chunk = chunk
                got = made(x)
                torch.testing.assert_close(got, want, **EXACT)
                if length == 13 and chunk in (1, 3):
                    for g, w in zip(torch.autograd.grad(got.square().sum(), params), want_grads, strict=True):
                        torch.testing.assert_close(g, w, **EXACT)


@pytest.mark.parametrize("options", [{"form": "chunked"}, {"form": "recurrent"}, {"mimo_rank": 2}])
def test_a_step_after_a_prefill_is_the_whole_sequence_at_every_position(options: dict[str, Any]) -> None:
    made, x = layer(**options), inputs(13)
    with torch.no_grad():
        whole = made(x)
        for n in range(13):
            state = made.init_state(B, 14)
            torch.testing.assert_close(made.prefill(x[:, :n], state), whole[:, :n], **EXACT)
            step = made.step(x[:, n : n + 1], state)
            torch.testing.assert_close(step, whole[:, n : n + 1], **EXACT)
            torch.testing.assert_close(made.step(x[:, n : n + 1], state), step, atol=0, rtol=0)  # the state stayed
        state = made.init_state(B, 14)
        pieces = [made.prefill(x[:, a:b], state) for a, b in ((0, 5), (5, 6), (6, 13))]  # a context in pieces
        torch.testing.assert_close(torch.cat(pieces, dim=1), whole, **EXACT)  # type: ignore[arg-type]


def test_bad_sizes_say_which() -> None:
    with pytest.raises(ValueError, match="head_dim 5 must divide d_inner 32"):
        Mamba3(16, head_dim=5)
    with pytest.raises(ValueError, match="unknown form"):
        Mamba3(16, head_dim=4, form="parallel")


# ----------------------------------------------------------------------------------------------- the network
def case(mode: Mode = "forward", seq_len: int = 13, *, dtype: str = "float32", layers: int = 2, **options: Any) -> Case:
    chosen = {**SIZES, **({"chunk": 4} if mode != "decode" else {}), **options}
    return Case("mamba3", mode, dtype, "cpu", B, seq_len, D, None, layers, True, tuple(sorted(chosen.items())))


@pytest.mark.parametrize("scope", ["core", "block", "model"])
def test_decoding_equals_the_whole_sequence_forward(scope: str) -> None:
    c = case("decode", 11, dtype="float64", scope=scope, **({"vocab": 50} if scope == "model" else {}))
    torch.manual_seed(0)
    net = build_model(c, "cpu", F64).eval()
    context, token = make_decode_inputs(c, "cpu", F64)
    with torch.inference_mode():
        full = net(torch.cat([context, token, token], dim=1))
        state = prefill(net, context, c.span)
        torch.testing.assert_close(decodable(net).step(token, state)[:, 0], full[:, -2], **EXACT)
        state.advance()
        torch.testing.assert_close(decodable(net).step(token, state)[:, 0], full[:, -1], **EXACT)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("rank", [1, 2])
def test_the_decode_state_is_constant_in_n_and_is_the_formula(dtype: str, rank: int) -> None:
    sizes = []
    for n in (1, 5, 40):
        c = case("decode", n, dtype=dtype, scope="block", mimo_rank=rank)
        net = build_model(c, "cpu", getattr(torch, dtype))
        context, token = make_decode_inputs(c, "cpu", getattr(torch, dtype))
        with torch.inference_mode():
            state = prefill(net, context, c.span)
            decodable(net).step(token, state)
            state.advance()
        state.drop_scratch()
        assert tensor_bytes(state) == state_bytes(c)
        sizes.append(state_bytes(c))
    assert sizes[0] == sizes[1] == sizes[2]
    # 8 heads: 2 angles, an 8 × 4 state, the last k (R × 8) and x (R × 4); float32; 2 layers, 2 sequences.
    assert sizes[0] == 2 * 2 * 8 * (2 + 32 + rank * 12) * 4


@pytest.mark.parametrize(
    "options", [{}, {"mimo_rank": 4}, {"scope": "block", "rope_fraction": 1.0}, {"scope": "model", "vocab": 97}]
)
def test_the_parameter_count_is_the_formula(options: dict[str, Any]) -> None:
    c = case(**options)
    assert parameter_count(build_model(c, "cpu", torch.float32)) == count_parameters(c)


def counted(c: Case) -> int:
    torch.manual_seed(0)
    net = build_model(c, "cpu", torch.float32)
    counter = FlopCounterMode(display=False)
    if c.mode == "decode":
        context, token = make_decode_inputs(c, "cpu", torch.float32)
        with torch.inference_mode():
            state = prefill(net.eval(), context, c.span)
            with counter:
                decodable(net).step(token, state)
    else:
        with counter, torch.inference_mode():
            net(make_input(c, "cpu", torch.float32))
    return int(counter.get_total_flops())


@pytest.mark.parametrize(
    ("mode", "options"),
    [
        ("forward", {}),
        ("forward", {"chunk": 5, "mimo_rank": 2}),
        ("forward", {"form": "recurrent", "mimo_rank": 3}),
        ("forward", {"scope": "block"}),
        ("decode", {}),
        ("decode", {"mimo_rank": 2, "scope": "block"}),
    ],
)
def test_the_flop_formula_is_what_the_counter_sees(mode: Mode, options: dict[str, Any]) -> None:
    c = case(mode, **options)
    assert counted(c) == count_flops(c).flops


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_the_train_formula_is_within_its_bound_of_the_counter(form: str) -> None:
    """train = 3 × forward; torch's count of a train call within 5 % (the first token's products with a zero state
    need no gradient)."""
    c = case("train", 16, form=form, mimo_rank=2)
    torch.manual_seed(0)
    net = build_model(c, "cpu", torch.float32)
    with FlopCounterMode(display=False) as counter:
        net(make_input(c, "cpu", torch.float32).requires_grad_()).sum().backward()
    assert abs(counter.get_total_flops() / count_flops(c).flops - 1) <= 0.05


def test_the_formula_ids_and_rules() -> None:
    assert count_flops(case()).formula == "mamba3-chunked-v1"
    assert count_flops(case("decode", scope="block")).formula == "mamba3-recurrent-block-decode-v1"
    assert count_flops(case("decode", 4000)).flops == count_flops(case("decode", 40)).flops  # constant in n
    assert count_flops(case("train")).flops == 3 * count_flops(case()).flops
    chunk = no_effect("mamba3", "chunk", {"form": "recurrent"})
    assert chunk is not None and chunk.option == "chunk"
    odd = cannot_build(case(head_dim=5))
    assert odd is not None and odd.option == "head_dim"
    fraction = cannot_build(case(rope_fraction=0.75))
    assert fraction is not None and fraction.option == "rope_fraction"


# ----------------------------------------------------------------------------------------------- kernel: mamba_ssm
def test_the_kernel_is_an_unsupported_row_where_it_cannot_run() -> None:
    reason = probe(case(kernel="mamba_ssm"), "cpu")
    assert reason is not None and reason.startswith("mamba3 kernel mamba_ssm:")
    mimo = m3.kernel_problem(case(kernel="mamba_ssm", mimo_rank=2), "cuda")
    assert mimo is not None and "MIMO" in mimo


def fake_siso(calls: list[dict[str, Any]]) -> Any:
    """mamba3_siso_combined's contract computed by the paper's recurrence (mamba_ssm's siso step reference)."""

    def kernel(*, Q, K, V, ADT, DT, Trap, Q_bias, K_bias, Angles, D, Z, chunk_size, Input_States, return_final_states):  # type: ignore[no-untyped-def]
        calls.append({"state": Input_States is not None, "v": V.shape})
        batch, length, heads, p = V.shape
        pairs = Angles.shape[-1]
        angle, h, k_prev, v_prev = (
            Input_States
            if Input_States is not None
            else (
                Q.new_zeros(batch, heads, pairs),
                Q.new_zeros(batch, heads, p, Q.shape[-1]),
                Q.new_zeros(batch, heads, Q.shape[-1]),
                Q.new_zeros(batch, heads, p),
            )
        )
        outs = []
        for t in range(length):
            angle = angle + torch.tanh(Angles[:, t]) * math.pi * DT[:, :, t, None]
            q = m3.rotate(Q[:, t].expand(-1, heads, -1) + Q_bias, angle)
            k = m3.rotate(K[:, t].expand(-1, heads, -1) + K_bias, angle)
            lam, alpha = torch.sigmoid(Trap[:, :, t]), torch.exp(ADT[:, :, t])
            beta, gamma = ((1 - lam) * DT[:, :, t] * alpha), lam * DT[:, :, t]
            h = alpha[..., None, None] * h + beta[..., None, None] * (v_prev[..., None] * k_prev[..., None, :])
            h = h + gamma[..., None, None] * (V[:, t][..., None] * k[..., None, :])
            y = torch.einsum("bhpn,bhn->bhp", h, q) + D[None, :, None] * V[:, t]
            outs.append(y * F.silu(Z[:, t]))
            k_prev, v_prev = k, V[:, t]
        y = torch.stack(outs, dim=1)
        return (y, angle, h, k_prev, v_prev) if return_final_states else y

    return kernel


def test_kernel_mamba_ssm_routes_through_mamba3_siso_combined(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused path, proven to run: a stand-in with the kernel's contract records each call."""
    calls: list[dict[str, Any]] = []
    module = types.ModuleType(m3.MAMBA_SSM_KERNEL[0])
    setattr(module, m3.MAMBA_SSM_KERNEL[1], fake_siso(calls))
    monkeypatch.setitem(sys.modules, m3.MAMBA_SSM_KERNEL[0], module)
    fused, x = layer(kernel="mamba_ssm"), inputs(13)
    with torch.no_grad():
        out = fused(x)
        state = fused.init_state(B, 14)
        fused.prefill(x[:, :7], state)
        fused.prefill(x[:, 7:], state)
        fused.kernel = "torch"
        torch.testing.assert_close(out, fused(x), **EXACT)
        plain = fused.init_state(B, 14)
        fused.prefill(x, plain)
    for a, b in zip(state.tensors(), plain.tensors(), strict=True):
        torch.testing.assert_close(
            torch.remainder(a, 2 * math.pi) if a.dim() == 3 and a.shape[-1] == 2 else a, b, **EXACT
        )
    assert [c["state"] for c in calls] == [False, True, True] and calls[0]["v"] == (B, 13, 8, 4)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.gpu
def test_the_real_mamba_ssm_kernel_runs_and_agrees_with_the_torch_form(monkeypatch: pytest.MonkeyPatch) -> None:
    real = getattr(
        pytest.importorskip(m3.MAMBA_SSM_KERNEL[0], reason="mamba_ssm with Mamba-3 kernels is not installed"),
        m3.MAMBA_SSM_KERNEL[1],
    )
    calls: list[int] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(m3, "mamba_ssm_function", lambda: spy)
    torch.manual_seed(0)
    made = Mamba3(256, kernel="mamba_ssm", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 256, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fused = made(x)
        made.kernel = "torch"
        plain = made(x)
    assert calls, "mamba_ssm's mamba3_siso_combined was never called"
    torch.testing.assert_close(fused.float(), plain.float(), atol=5e-2, rtol=5e-2)
