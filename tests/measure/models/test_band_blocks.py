"""A windowed SDPA core over a long sequence attends block by block (``band_blocks``): each block's queries against
the keys its band reaches, one fused call each, so its work is the band's and not n². Held to the written-out
reference in float64 — values and gradients, causal or not, GQA, with and without sinks —; the blocks are proved to
have run (SDPA spied: one call per block, no n×n mask made); the executed FLOPs count the blocks' pairs."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import Tensor

from attnbench.families.attention import layers as at
from attnbench.families.attention import spec
from attnbench.families.flops import count_flops, executed_flops, window_pairs
from attnbench.families.registry import build_model, make_input
from tests.measure.models.test_sinks import EXACT, F64, attention_of, case, reference

BLOCK = 4  # queries per block here: a 13-token sequence over windows of 3 and 4 is 4 blocks


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spec, "BAND_BLOCK", BLOCK)


def test_the_blocks_cover_every_query_once_and_every_key_the_band_keeps() -> None:
    for causal in (True, False):
        for length, window in ((13, 3), (13, 4), (40, 5), (41, 9)):
            spans = spec.band_blocks(length, window, causal=causal)
            assert [s for s, *_ in spans] == list(range(0, length, max(window, BLOCK)))
            assert spans[-1][1] == length
            for start, end, first, last in spans:
                for i in range(start, end):
                    seen = [j for j in range(length) if i - j < window and (j <= i if causal else j - i < window)]
                    assert first <= min(seen) and max(seen) < last
    assert spec.band_blocks(8, 3, causal=True) == ()  # two blocks or fewer: one call does no more work
    assert spec.band_blocks(100, 0, causal=True) == ()


@pytest.mark.parametrize("sinks", [True, False])
@pytest.mark.parametrize("heads_kv", [4, 2])
@pytest.mark.parametrize(("causal", "window"), [(True, 3), (True, 5), (False, 3)])
@pytest.mark.parametrize("model", ["sdpa-math", "sdpa-flash", "sdpa"])
def test_blocks_equal_the_reference_values_and_gradients(
    model: str, causal: bool, window: int, heads_kv: int, sinks: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    c = case(model, heads_kv=heads_kv, causal=causal, window=window, sinks=sinks)
    spans = spec.band_blocks(c.seq_len, window, causal=causal)
    assert len(spans) >= 3
    torch.manual_seed(0)
    net = build_model(c, "cpu", F64)
    calls: list[tuple[int, int]] = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q: Tensor, k: Tensor, *args: Any, **kw: Any) -> Tensor:
        calls.append((q.shape[-2], k.shape[-2]))
        return sdpa(q, k, *args, **kw)

    monkeypatch.setattr(at.F, "scaled_dot_product_attention", spy)
    monkeypatch.setattr(at.MaskCache, "additive", lambda *a, **kw: pytest.fail("an n×n mask was made"))
    x = make_input(c, "cpu", F64).requires_grad_()
    with at.pinned_backend(net):
        got = net(x)
    assert calls == [(end - start, last - first + sinks) for start, end, first, last in spans]
    params = [x, *net.parameters()]
    got_grads = torch.autograd.grad(got.square().sum(), params)
    layer = attention_of(net)
    q, k, v = layer._heads(x, 0)
    logits = layer.sinks if layer.sinks is not None else torch.full((4,), -1e4, dtype=F64)  # -1e4: no sink
    want = layer._merge(reference(q, k, v, logits, causal=causal, window=window))
    want_grads = torch.autograd.grad(want.square().sum(), params)
    torch.testing.assert_close(got, want, **EXACT)
    for g, w in zip(got_grads, want_grads, strict=True):
        if g is not None or w is not None:
            torch.testing.assert_close(g, w, **EXACT)


def test_the_executed_flops_are_the_blocks_pairs() -> None:
    c = replace(case("sdpa-flash", window=3, sinks=False), seq_len=41)
    spans = spec.band_blocks(41, 3, causal=True)
    pairs = sum((end - start) * (last - first) for start, end, first, last in spans)
    useful = window_pairs(41, 3, causal=True)
    assert useful < pairs < 41 * 41 // 2
    assert executed_flops(c) - count_flops(c).flops == (pairs - useful) * 4 * c.batch * c.d_model
