"""Attention sinks (gpt-oss's learned per-head logit in the softmax's denominator): every core that takes them equals
a reference written out here in float64 — values and gradients, with and without a window, causal or not, GQA —;
the SDPA cores run them on their own backend (spied); decode after a prefill, a chunked prefill and packed lengths
equal the whole sequence; the counts (parameters, formula ids) are the spec's; the cores without sinks are refused."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import Tensor

from attnbench.core.cases import Case
from attnbench.families.attention import layers as at
from attnbench.families.attention.layers import SelfAttention, own_core
from attnbench.families.catalogue import cannot_build
from attnbench.families.flops import count_flops, count_parameters
from attnbench.families.registry import (
    build_model,
    make_decode_inputs,
    make_input,
    parameter_count,
    probe,
    torch_family,
)
from attnbench.families.states import decodable, packed, prefill
from tests.support import tiny_case

F64 = torch.float64
EXACT: dict[str, Any] = {"atol": 1e-10, "rtol": 1e-10}
CORES = ("vanilla", "sdpa-math", "sdpa-flash", "sdpa")
N = 13


def reference(q: Tensor, k: Tensor, v: Tensor, sinks: Tensor, *, causal: bool, window: int) -> Tensor:
    """o_i = Σ_j e^{l_ij} v_j / (e^{s_h} + Σ_j e^{l_ij}) over the keys query i sees, each pair by hand (gpt-oss's
    ``sdpa`` with sinks: the sink logit concatenated to the scores, softmax, the sink's column dropped)."""
    heads, length, d = q.shape[1], q.shape[2], q.shape[3]
    group = heads // k.shape[1]
    out = torch.zeros_like(q)
    for h in range(heads):
        kh, vh = k[:, h // group], v[:, h // group]
        for i in range(length):
            seen = [
                j
                for j in range(length)
                if (j <= i or not causal) and (not window or (i - j < window and (causal or j - i < window)))
            ]
            logits = q[:, h, i : i + 1] @ kh[:, seen].transpose(-1, -2) / d**0.5  # (B, 1, |seen|)
            weights = torch.cat([sinks[h].expand(q.shape[0], 1, 1), logits], dim=-1).softmax(-1)[..., 1:]
            out[:, h, i] = (weights @ vh[:, seen])[:, 0]
    return out


def case(model: str, *, heads_kv: int = 4, causal: bool = True, mode: str = "forward", **options: Any) -> Case:
    made = tiny_case(model, mode=mode, dtype="float64", seq_len=N, d_model=32, heads=4, layers=1, causal=causal)
    chosen = {"sinks": True, **options} | ({"heads_kv": heads_kv} if heads_kv != 4 else {})
    return replace(made, options=tuple(sorted(chosen.items())))


def attention_of(net: torch.nn.Module) -> SelfAttention:
    return next(m for m in net.modules() if isinstance(m, SelfAttention))


@pytest.mark.parametrize("heads_kv", [4, 2])
@pytest.mark.parametrize(("causal", "window"), [(True, 0), (True, 5), (False, 0), (False, 4)])
@pytest.mark.parametrize("model", CORES)
def test_every_core_equals_the_reference_values_and_gradients(
    model: str, causal: bool, window: int, heads_kv: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case(model, heads_kv=heads_kv, causal=causal, **({"window": window} if window else {}))
    torch.manual_seed(0)
    net = build_model(c, "cpu", F64)
    layer = attention_of(net)
    assert layer.sinks is not None and layer.sinks.shape == (4,)
    calls: list[int] = []
    if model != "vanilla":  # the SDPA cores run the sinks through their backend: spied
        explicit = at.SdpaCore.explicit

        def spy(self: at.SdpaCore, *args: Any, **kw: Any) -> Tensor:
            calls.append(1)
            return explicit(self, *args, **kw)

        monkeypatch.setattr(at.SdpaCore, "explicit", spy)
    x = make_input(c, "cpu", F64).requires_grad_()
    with at.pinned_backend(net):
        got = net(x)
    params = [x, *net.parameters()]
    got_grads = torch.autograd.grad(got.square().sum(), params)
    q, k, v = layer._heads(x, 0)
    want = layer._merge(reference(q, k, v, layer.sinks, causal=causal, window=window))
    want_grads = torch.autograd.grad(want.square().sum(), params)
    torch.testing.assert_close(got, want, **EXACT)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, **EXACT)
    assert bool(calls) == (model != "vanilla")


def test_sinks_change_the_output_and_nothing_else() -> None:
    """Same seed: the same projections with sinks or without, and a different output."""
    torch.manual_seed(0)
    plain = build_model(replace(case("sdpa-flash"), options=()), "cpu", F64)
    torch.manual_seed(0)
    sunk = build_model(case("sdpa-flash"), "cpu", F64)
    for name, p in plain.named_parameters():
        torch.testing.assert_close(dict(sunk.named_parameters())[name], p, atol=0, rtol=0)
    x = make_input(case("sdpa-flash"), "cpu", F64)
    with torch.no_grad():
        assert (plain(x) - sunk(x)).abs().max() > 1e-3
        attention_of(sunk).sinks.fill_(-1e4)  # type: ignore[union-attr]  # a sink that takes nothing
        torch.testing.assert_close(sunk(x), plain(x), **EXACT)


@pytest.mark.parametrize("heads_kv", [4, 2])
@pytest.mark.parametrize("window", [0, 5])
@pytest.mark.parametrize("model", CORES)
def test_a_step_after_a_prefill_equals_the_whole_sequence(model: str, window: int, heads_kv: int) -> None:
    c = case(model, mode="decode", heads_kv=heads_kv, scope="block", **({"window": window} if window else {}))
    torch.manual_seed(0)
    net = build_model(replace(c, layers=2), "cpu", F64).eval()
    context, token = make_decode_inputs(c, "cpu", F64)
    with torch.inference_mode():
        full = net(torch.cat([context, token, token], dim=1))
        state = prefill(net, context, c.span + 1)
        torch.testing.assert_close(decodable(net).step(token, state)[:, 0], full[:, -2], **EXACT)
        state.advance()
        torch.testing.assert_close(decodable(net).step(token, state)[:, 0], full[:, -1], **EXACT)


@pytest.mark.parametrize("model", ["sdpa-flash", "vanilla"])
def test_a_chunked_prefill_and_packed_lengths_equal_the_whole_sequence(model: str) -> None:
    c = case(model, scope="block")
    torch.manual_seed(0)
    net = build_model(c, "cpu", F64).eval()
    x = make_input(c, "cpu", F64)
    decoder = decodable(net)
    with torch.inference_mode(), own_core(), at.pinned_backend(net):
        whole = net(x)
        for chunk in (1, 4, N):
            state = decoder.init_state(2, N)
            outputs = [decoder.prefill(x[:, s : s + chunk], state, output=True) for s in range(0, N, chunk)]
            torch.testing.assert_close(torch.cat(outputs, dim=1), whole, **EXACT)
        lengths = [5, 8]
        joined = torch.cat([x[:1, :5], x[1:, :8]], dim=1)
        got = packed(net, joined, lengths)
        torch.testing.assert_close(got[:, :5], net(x[:1, :5]), **EXACT)
        torch.testing.assert_close(got[:, 5:], net(x[1:, :8]), **EXACT)


def test_the_counts_and_the_rules() -> None:
    c = case("sdpa-flash", window=5)
    assert parameter_count(build_model(c, "cpu", F64)) == count_parameters(c)
    assert count_parameters(c) == count_parameters(replace(c, options=(("window", 5),))) + 4  # one logit per head
    assert count_flops(c).formula == "attention-window-sinks-v1"
    assert count_flops(replace(c, mode="decode")).formula == "attention-window-sinks-decode-v1"
    assert count_flops(c).flops == count_flops(replace(c, options=(("window", 5),))).flops
    for model in ("flash-attn", "flex"):
        problem = cannot_build(case(model))
        assert problem is not None and problem.option == "sinks"
    assert probe(case("sdpa-flash", window=5), "cpu") is None
    # SDPA saw padded heads and one more key: a sinks row claims no dispatched kernel, a plain row does.
    assert "sdpa_kernel" not in torch_family(case("sdpa")).extras(case("sdpa"), "cpu")
    plain = replace(case("sdpa"), options=())
    assert "sdpa_kernel" in torch_family(plain).extras(plain, "cpu")
