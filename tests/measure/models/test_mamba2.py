"""Mamba-2: the chunked SSD form, the recurrence and a per-token reference agree (values and gradients); decoding
equals the whole-sequence forward; the torch-free formulas (parameters, FLOPs, state bytes) are the modules';
``kernel: mamba_ssm`` really routes through the package's kernel."""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnbench.core.cases import Case, Mode
from attnbench.families.catalogue import cannot_build, option_of
from attnbench.families.flops import count_flops, count_parameters
from attnbench.families.mamba2 import layers as m2
from attnbench.families.mamba2.layers import Mamba2, ssd_chunked, ssd_recurrent
from attnbench.families.registry import build_model, make_input, parameter_count, probe
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import decodable, prefill, tensor_bytes
from attnbench.families.torch_family import make_decode_inputs
from tests.support import mentions

F64 = torch.float64
SIZES = {"d_state": 16, "head_dim": 8, "chunk": 8}


def case(mode: Mode = "forward", seq_len: int = 32, *, dtype: str = "float32", layers: int = 2, **options: Any) -> Case:
    chosen = {**SIZES, **options}
    return Case("mamba2", mode, dtype, "cpu", 2, seq_len, 32, None, layers, True, tuple(sorted(chosen.items())))


def reference(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """The recurrence written out per sequence, head, channel and token: h = e^a·h + x·B, y = C·h."""
    batch, length, heads, _ = x.shape
    y = torch.zeros_like(x)
    for i in range(batch):
        for h in range(heads):
            state = h0[i, h].clone()  # (P, N)
            for t in range(length):
                state = math.e ** a[i, t, h] * state + torch.outer(x[i, t, h], b[i, t, h])
                y[i, t, h] = state @ c[i, t, h]
    return y


def inputs(length: int, *, dtype: torch.dtype = F64, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    batch, heads, p, n = 2, 3, 4, 5
    x = torch.randn(batch, length, heads, p, generator=g, dtype=dtype)
    a = -torch.rand(batch, length, heads, generator=g, dtype=dtype)  # Δ·A ≤ 0: decays
    b = torch.randn(batch, length, heads, n, generator=g, dtype=dtype)
    c = torch.randn(batch, length, heads, n, generator=g, dtype=dtype)
    h0 = torch.randn(batch, heads, p, n, generator=g, dtype=dtype)
    return x, a, b, c, h0


@pytest.mark.parametrize("length", [32, 37, 5, 8])
def test_chunked_and_recurrent_scans_equal_the_reference(length: int) -> None:
    x, a, b, c, h0 = inputs(length)
    want = reference(x, a, b, c, h0)
    for scan in (ssd_chunked, ssd_recurrent):
        y, final = scan(x, a, b, c, 8, h0)
        torch.testing.assert_close(y, want, atol=1e-12, rtol=1e-12)
        torch.testing.assert_close(final, ssd_recurrent(x, a, b, c, 0, h0)[1], atol=1e-12, rtol=1e-12)


def test_a_sequence_in_two_pieces_is_the_whole() -> None:
    x, a, b, c, h0 = inputs(29)
    whole, final = ssd_chunked(x, a, b, c, 8, h0)
    first, middle = ssd_chunked(x[:, :13], a[:, :13], b[:, :13], c[:, :13], 8, h0)
    rest, last = ssd_chunked(x[:, 13:], a[:, 13:], b[:, 13:], c[:, 13:], 8, middle)
    torch.testing.assert_close(torch.cat([first, rest], 1), whole)
    torch.testing.assert_close(last, final)


@pytest.mark.parametrize(("dtype", "tolerance"), [(F64, 1e-10), (torch.float32, 2e-4)])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("length", [24, 21, 5])
def test_the_layers_forms_agree_values_and_gradients(
    dtype: torch.dtype, tolerance: float, groups: int, length: int
) -> None:
    torch.manual_seed(0)
    layer = Mamba2(32, d_state=16, head_dim=8, chunk=8, groups=groups, dtype=dtype)
    u = torch.randn(2, length, 32, dtype=dtype, requires_grad=True)
    results = []
    for form in ("chunked", "recurrent"):
        layer.form = form
        layer.zero_grad()
        u.grad = None
        out = layer(u)
        out.backward(torch.ones_like(out))
        grads = [u.grad.clone(), *(p.grad.clone() for p in layer.parameters())]  # type: ignore[union-attr]
        results.append((out.detach(), grads))
    (out_c, grads_c), (out_r, grads_r) = results
    torch.testing.assert_close(out_c, out_r, atol=tolerance, rtol=tolerance)
    for g_c, g_r in zip(grads_c, grads_r, strict=True):
        torch.testing.assert_close(g_c, g_r, atol=tolerance * 10, rtol=tolerance * 10)


@pytest.mark.parametrize("scope", ["core", "block", "model"])
def test_decoding_equals_the_whole_sequence_forward(scope: str) -> None:
    c = case("decode", 19, dtype="float64", scope=scope, **({"vocab": 50} if scope == "model" else {}))
    torch.manual_seed(0)
    model = build_model(c, "cpu", F64).eval()
    context, token = make_decode_inputs(c, "cpu", F64)
    with torch.inference_mode():
        full = model(torch.cat([context, token], dim=1))
        state = prefill(model, context, c.span)
        step = decodable(model).step(token, state)
        torch.testing.assert_close(step[:, 0], full[:, -1])
        torch.testing.assert_close(decodable(model).step(token, state), step)  # the state stayed as it was
        state.advance()
        longer = model(torch.cat([context, token, token], dim=1))
        torch.testing.assert_close(decodable(model).step(token, state)[:, 0], longer[:, -1])


def test_a_long_context_may_come_in_pieces() -> None:
    torch.manual_seed(0)
    layer = Mamba2(32, d_state=16, head_dim=8, chunk=8, dtype=F64)
    u = torch.randn(2, 30, 32, dtype=F64)
    with torch.no_grad():
        whole, pieces = layer.init_state(2, 31), layer.init_state(2, 31)
        layer.prefill(u, whole, output=False)
        for start in (0, 11, 20):
            layer.prefill(u[:, start : start + {0: 11, 11: 9, 20: 10}[start]], pieces, output=False)
    for a, b in zip(whole.tensors(), pieces.tensors(), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_decode_state_is_constant_in_n_and_is_the_formula(dtype: str) -> None:
    sizes = []
    for n in (8, 64):
        c = case("decode", n, dtype=dtype)
        model = build_model(c, "cpu", getattr(torch, dtype))
        context, _ = make_decode_inputs(c, "cpu", getattr(torch, dtype))
        with torch.inference_mode():
            state = prefill(model, context, c.span)
        sizes.append(tensor_bytes(state))
        assert tensor_bytes(state) == state_bytes(c)
        ssm = [t for t in state.tensors() if t.dim() == 4]
        assert ssm and all(t.dtype == torch.float32 for t in ssm)  # the scan's dtype, for bf16 too
    assert sizes[0] == sizes[1]


@pytest.mark.parametrize(
    "options", [{}, {"scope": "block"}, {"scope": "model", "vocab": 97}, {"groups": 2}, {"expand": 1}]
)
def test_the_parameter_count_is_the_formula(options: dict[str, Any]) -> None:
    c = case(**options)
    assert parameter_count(build_model(c, "cpu", torch.float32)) == count_parameters(c)


def counted(c: Case) -> dict[str, int]:
    torch.manual_seed(0)
    model = build_model(c, "cpu", torch.float32)
    counter = FlopCounterMode(display=False)
    if c.mode == "decode":
        context, token = make_decode_inputs(c, "cpu", torch.float32)
        with torch.inference_mode():
            state = prefill(model.eval(), context, c.span)
            with counter:
                decodable(model).step(token, state)
    else:
        x = make_input(c, "cpu", torch.float32)
        if c.mode == "forward":
            with counter, torch.inference_mode():
                model(x)
        else:
            x.requires_grad_(True)
            with counter:
                model(x).sum().backward()
    return {str(op): int(flops) for op, flops in counter.get_flop_counts().get("Global", {}).items()}


def conv_flops(c: Case) -> int:
    """What the counter sees of the depthwise conv (padded on both sides, then cut): outside the formula."""
    conv_dim = 2 * c.d_model + 2 * int(option_of(c, "groups")) * int(option_of(c, "d_state"))
    return (
        c.layers * 2 * c.batch * (c.seq_len + int(option_of(c, "d_conv")) - 1) * conv_dim * int(option_of(c, "d_conv"))
    )


@pytest.mark.parametrize(
    ("seq_len", "options"),
    [(32, {}), (37, {}), (5, {}), (32, {"form": "recurrent"}), (32, {"groups": 2}), (32, {"scope": "block"})],
)
def test_the_flop_formula_is_what_the_counter_sees(seq_len: int, options: dict[str, Any]) -> None:
    c = case(seq_len=seq_len, **options)
    ops, ours = counted(c), count_flops(c)
    assert ops["aten.convolution"] == conv_flops(c)
    assert ops["aten.mm"] + ops["aten.bmm"] == ours.flops
    assert ops["aten.mm"] == ours.detail["projections"]


def test_the_train_formula_is_three_forwards_of_products() -> None:
    c = case("train")
    ops, ours = counted(c), count_flops(c)
    # Every product's backward is two products of its size; the conv's backward the counter counts on its own.
    assert ops["aten.mm"] + ops["aten.bmm"] == ours.flops == 3 * count_flops(case()).flops


@pytest.mark.parametrize(("seq_len", "share"), [(32768, 0.13), (131072, 0.375)])
def test_mamba_ssm_passes_states_linearly_so_its_formula_has_no_quadratic_term(seq_len: int, share: float) -> None:
    """The torch form multiplies the chunks' states by a (k+1)² decay matrix; mamba_ssm's kernel scans them
    element-wise. At d_model 1024, chunk 64 the quadratic term is ≈ 14 % of the torch count at 32k, ≈ 38 % at 128k."""
    torch_form = Case("mamba2", "forward", "bfloat16", "cuda", 1, seq_len, 1024, None, 1, True)
    kernel = Case("mamba2", "forward", "bfloat16", "cuda", 1, seq_len, 1024, None, 1, True, (("kernel", "mamba_ssm"),))
    heads, k, n, p = 2048 // 64, seq_len // 64, 64, 64
    assert count_flops(torch_form).flops - count_flops(kernel).flops == heads * 2 * (k + 1) ** 2 * n * p
    assert (count_flops(torch_form).flops - count_flops(kernel).flops) / count_flops(torch_form).flops == (
        pytest.approx(share, abs=0.01)
    )
    assert count_flops(kernel).formula == "mamba2-chunked-mamba_ssm-v1"
    assert count_flops(torch_form).formula == "mamba2-chunked-v1"
    assert count_flops(replace(kernel, mode="train")).flops == 3 * count_flops(kernel).flops
    # A decode step is the recurrence's whatever kernel filled the state.
    step = replace(torch_form, mode="decode")
    assert count_flops(step).formula == "mamba2-recurrent-decode-v1"


def test_a_decode_step_is_one_step_of_the_recurrence() -> None:
    c = case("decode", 40)
    assert sum(counted(c).values()) == count_flops(c).flops
    assert count_flops(c).formula == "mamba2-recurrent-decode-v1"
    assert count_flops(case("decode", 4000)).flops == count_flops(c).flops  # constant in n


def test_bad_sizes_say_which() -> None:
    with pytest.raises(ValueError) as caught:
        Mamba2(32, head_dim=7)
    assert mentions(str(caught.value), "head_dim", "d_inner", values=(7,))

    with pytest.raises(ValueError, match="groups 3 must divide"):
        Mamba2(32, head_dim=8, groups=3)
    with pytest.raises(ValueError, match="unknown form"):
        Mamba2(32, head_dim=8, form="parallel")
    problem = cannot_build(case(head_dim=7))
    assert problem is not None and problem.option == "head_dim"


# ----------------------------------------------------------------------------------------------- the kernel
def test_the_kernel_is_an_unsupported_row_where_it_cannot_run() -> None:
    reason = probe(case(kernel="mamba_ssm"), "cpu")
    assert mentions(reason or "", "mamba_ssm", "CUDA")


def _fake_kernel(calls: list[dict[str, Any]]) -> Callable[..., Any]:
    """mamba_chunk_scan_combined's contract, computed with the torch form: x (B, T, H, P), dt (B, T, H) before
    softplus, A (H,), B and C (B, T, G, N) per group."""

    def kernel(x, dt, A, B, C, chunk_size, *, D, dt_bias, dt_softplus, initial_states, return_final_states):  # type: ignore[no-untyped-def]
        calls.append({"x": x.shape, "dt": dt.shape, "A": A.shape, "B": B.shape, "chunk": chunk_size})
        assert dt_softplus and return_final_states
        delta = torch.nn.functional.softplus(dt + dt_bias)
        heads = x.shape[2]
        b, c = (t.repeat_interleave(heads // t.shape[2], dim=2) for t in (B, C))
        y, final = ssd_chunked(x * delta[..., None], delta * A, b, c, chunk_size, initial_states)
        return y + x * D[:, None], final

    return kernel


def test_kernel_mamba_ssm_routes_through_the_packages_function(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused path, proven to run: a stand-in for the package records each call (the real one needs a GPU)."""
    calls: list[dict[str, Any]] = []
    package = types.ModuleType("mamba_ssm.ops.triton.ssd_combined")
    package.mamba_chunk_scan_combined = _fake_kernel(calls)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.ssd_combined", package)
    torch.manual_seed(0)
    fused = Mamba2(32, d_state=16, head_dim=8, chunk=8, groups=2, kernel="mamba_ssm", dtype=F64)
    u = torch.randn(2, 21, 32, dtype=F64)
    out = fused(u)
    assert calls == [{"x": (2, 21, 8, 8), "dt": (2, 21, 8), "A": (8,), "B": (2, 21, 2, 16), "chunk": 8}]
    fused.kernel = "torch"
    torch.testing.assert_close(out, fused(u))


@pytest.mark.gpu
@pytest.mark.compiles(limit_s=60)  # Triton compiles the SSD kernels (forward and backward) on a cold cache
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 2e-3), (torch.bfloat16, 5e-2)])
@pytest.mark.parametrize("train", [False, True])
def test_the_real_kernel_runs_and_agrees_with_the_torch_form(
    dtype: torch.dtype, tolerance: float, train: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fused kernel against the torch form, in the dtypes a sweep runs it in (bf16 keeps A_log, D and the scan
    in float32 where mamba_ssm does) and through its backward, which a train row times."""
    real = pytest.importorskip("mamba_ssm.ops.triton.ssd_combined", reason="the mamba-ssm package is not installed")
    calls: list[int] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real.mamba_chunk_scan_combined(*args, **kwargs)

    monkeypatch.setattr(m2, "mamba_ssm_scan", lambda: spy)
    torch.manual_seed(0)
    layer = Mamba2(256, d_state=64, head_dim=64, chunk=64, kernel="mamba_ssm", device="cuda", dtype=dtype)
    u = torch.randn(2, 256, 256, device="cuda", dtype=dtype)

    def run(kernel: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
        layer.kernel = kernel
        layer.zero_grad(set_to_none=True)
        x = u.clone().requires_grad_(train)
        with torch.set_grad_enabled(train):
            out = layer(x)
        if not train:
            return out.detach(), []
        out.float().square().mean().backward()
        assert x.grad is not None
        return out.detach(), [x.grad, *(p.grad for p in layer.parameters() if p.grad is not None)]

    fused, fused_grads = run("mamba_ssm")
    plain, plain_grads = run("torch")
    assert calls, "the mamba_ssm kernel was never called"
    torch.testing.assert_close(fused.float(), plain.float(), atol=tolerance, rtol=tolerance)
    assert len(fused_grads) == len(plain_grads)
    for got, want in zip(fused_grads, plain_grads, strict=True):  # gradients are small: held by their norms
        assert float((got.float() - want.float()).norm()) <= tolerance * float(want.float().norm()) + 1e-12


def test_the_gated_norm_is_per_group_as_mamba_ssm_normalises() -> None:
    torch.manual_seed(0)
    layer = Mamba2(32, d_state=16, head_dim=8, groups=2, dtype=torch.float64)
    with torch.no_grad():
        layer.norm_weight.copy_(torch.rand_like(layer.norm_weight) + 0.5)
    y, z = torch.randn(2, 5, 64, dtype=F64), torch.randn(2, 5, 64, dtype=F64)
    gated = y * torch.nn.functional.silu(z)
    halves = [h / h.pow(2).mean(-1, keepdim=True).add(m2._NORM_EPS).sqrt() for h in gated.chunk(2, dim=-1)]
    expected = layer.out_proj(torch.cat(halves, dim=-1) * layer.norm_weight)
    torch.testing.assert_close(layer._finish(y, z), expected)
    # One norm over all 64 channels is another layer: the groups' scales differ here.
    whole = gated / gated.pow(2).mean(-1, keepdim=True).add(m2._NORM_EPS).sqrt()
    assert not torch.allclose(layer.out_proj(whole * layer.norm_weight), expected)
