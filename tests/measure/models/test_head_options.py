"""The attention family's head options (issue 49: published models at their own shapes): ``head_dim`` apart from
d_model / heads, projections without biases, the output gate and the per-head query/key RMSNorm. Each is held to
a literal reference computed here from the built layer's weights, forward and gradients; the counts (parameters,
FLOPs, KV cache) are held to the built module and to torch's own FLOP counter; and each decodes to its forward."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from attnbench.families.attention.layers import SelfAttention
from attnbench.families.catalogue import cannot_build
from attnbench.families.flops import count_flops, count_parameters
from attnbench.families.registry import build_model, make_input, parameter_count
from attnbench.families.state_bytes import state_bytes
from tests.measure.models.test_decoding import decode_case, decoded_against_forward
from tests.support import tiny_case

OPTIONS: list[dict[str, Any]] = [
    {"head_dim": 12},
    {"bias": False},
    {"output_gate": True},
    {"qk_norm": True},
    {"head_dim": 12, "bias": False, "output_gate": True, "qk_norm": True, "heads_kv": 2},
]


def _layer(model: torch.nn.Module) -> SelfAttention:
    return next(m for m in model.modules() if isinstance(m, SelfAttention))


def reference(layer: SelfAttention, x: torch.Tensor) -> torch.Tensor:
    """The layer written out: q, k, v (and the gate) from the projection's rows, RMSNorm per head, causal softmax
    attention with each key/value head repeated for its query heads, the gate's sigmoid, the output projection."""
    h, kv, d = layer.heads, layer.heads_kv, layer.head_dim
    b, t, _ = x.shape
    w, bias = layer.qkv.weight, layer.qkv.bias
    rows = F.linear(x, w, bias)
    q, k, v = rows[..., : h * d], rows[..., h * d : h * d + kv * d], rows[..., h * d + kv * d : h * d + 2 * kv * d]
    q = q.reshape(b, t, h, d).transpose(1, 2)
    k = k.reshape(b, t, kv, d).transpose(1, 2).repeat_interleave(h // kv, dim=1)
    v = v.reshape(b, t, kv, d).transpose(1, 2).repeat_interleave(h // kv, dim=1)
    if layer.q_norm is not None and layer.k_norm is not None:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps) * layer.q_norm.weight
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + torch.finfo(x.dtype).eps) * layer.k_norm.weight
    scores = (q @ k.transpose(-2, -1)) / d**0.5
    scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, h * d)
    if layer.gate is not None:
        y = y * torch.sigmoid(F.linear(x, layer.gate.weight, layer.gate.bias))
    return layer.out(y)


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o))
@pytest.mark.parametrize("model", ["vanilla", "sdpa-math", "sdpa"])
def test_each_head_option_computes_the_layer_written_out(model: str, options: dict[str, Any]) -> None:
    case = tiny_case(model, mode="train", dtype="float64", seq_len=11, d_model=32, heads=4, causal=True, **options)
    torch.manual_seed(0)
    built = build_model(case, "cpu", torch.float64)
    x = make_input(case, "cpu", torch.float64).requires_grad_(True)
    x_ref = x.detach().clone().requires_grad_(True)
    out, ref = built(x), reference(_layer(built), x_ref)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-10)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    assert x.grad is not None and x_ref.grad is not None
    torch.testing.assert_close(x.grad, x_ref.grad, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("scope", ["core", "block", "model"])
@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o))
def test_the_counts_are_the_built_modules(options: dict[str, Any], scope: str) -> None:
    extra = {"scope": scope, "vocab": 97} if scope == "model" else {"scope": scope}
    # vanilla: its core is two explicit matmuls, which torch's counter sees (an SDPA kernel on the CPU it does not)
    case = tiny_case("vanilla", seq_len=9, d_model=32, heads=4, layers=2, causal=True, **options, **extra)
    assert cannot_build(case) is None
    model = build_model(case, "cpu", torch.float32)
    assert parameter_count(model) == count_parameters(case)
    if scope == "core":  # torch's own count of one forward call: every matmul the formula counts, nothing else
        with FlopCounterMode(display=False) as counter:
            model(make_input(case, "cpu", torch.float32))
        # vanilla computes all n² scores: the unmasked count
        assert counter.get_total_flops() == count_flops(replace(case, causal=False)).flops


def test_the_kv_cache_is_h_kv_times_head_dim_wide() -> None:
    case = tiny_case("sdpa", mode="decode", seq_len=20, d_model=32, heads=4, causal=True, head_dim=12, heads_kv=2)
    assert state_bytes(case) == 2 * case.layers * case.batch * 21 * 2 * 12 * 4


def test_without_head_dim_heads_must_divide_d_model() -> None:
    problem = cannot_build(tiny_case("sdpa", d_model=30, heads=4, causal=True))
    assert problem is not None and problem.option == "head_dim"
    assert cannot_build(tiny_case("sdpa", d_model=30, heads=4, causal=True, head_dim=8)) is None


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: "-".join(o))
def test_each_head_option_decodes_to_its_forward(options: dict[str, Any]) -> None:
    decoded, reference_ = decoded_against_forward(decode_case("sdpa", **options))
    torch.testing.assert_close(decoded, reference_, atol=1e-10, rtol=1e-10)
