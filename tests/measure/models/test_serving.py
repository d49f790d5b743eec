"""The serving questions' equalities (issue 41), in float64 on tiny shapes, for every built-in family that answers:

- a prompt prefilled in chunks (several sizes, attention appending to its cache) gives the whole-sequence forward's
  outputs and the state a one-pass prefill leaves;
- a verify of k drafts gives the forward's outputs at those positions, and after its rollback to r accepted (r = 0
  and r = k included) the state and the next step's output are those of decoding the r tokens one by one;
- packed lengths give each sequence's forward run alone (values, and a train call's gradients).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch.nn.attention.bias import CausalBias

from attnbench.core.cases import Case
from attnbench.families.catalogue import MODELS, cannot_build
from attnbench.families.mla.layers import LatentCache
from attnbench.families.registry import build_model, make_input, probe
from attnbench.families.states import (
    KVCache,
    NetworkState,
    StackState,
    decodable,
    packed,
    rollback,
    spans,
    verify,
)
from tests.support import tiny_case

# The four the issue names first; the delta rules, RWKV-7 and the rest of the families besides.
FIRST = ("lstm", "mamba2", "linear-attn", "sdpa-flash")
OTHERS = (
    "gru",
    "mingru",
    "minlstm",
    "vanilla",
    "sdpa",
    "sdpa-math",
    "gated-deltanet",
    "deltanet",
    "rwkv7",
    "kda",
    "mla",
    "mamba3",
)
EXACT = {"atol": 1e-10, "rtol": 1e-10}
N = 21  # the context (a prompt of N, or a verify after N)


def case_of(model: str, scope: str = "core", **options: Any) -> Case:
    if scope != "core":
        options = {"scope": scope, **options}
    if scope == "model":
        rope = MODELS[model].option("positional")
        positional = "rope" if rope is not None and rope.choices is not None and "rope" in rope.choices else "learned"
        options = {"vocab": 97, "positional": positional, **options}
    return tiny_case(model, dtype="float64", seq_len=N, d_model=32, heads=4, layers=2, causal=True, **options)


def built(case: Case, positions: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The model (built for ``positions``, so learned tables reach the last) and an input of that many tokens."""
    torch.manual_seed(0)
    model = build_model(replace(case, seq_len=positions), "cpu", torch.float64).eval()
    return model, make_input(replace(case, seq_len=positions), "cpu", torch.float64)


def variants(models: tuple[str, ...]) -> list[tuple[str, str]]:
    return [(model, scope) for model in models for scope in ("core", "block", "model")]


def timed_call() -> Any:
    """The context a timed call runs in: attention's own core, as the executor's call context sets it."""
    from attnbench.families.attention.layers import own_core

    return own_core()


def states_equal(a: Any, b: Any) -> None:
    """Two states hold the same: a KV cache its length and the keys and values up to it (the slots past it are
    written before they are read), a network its position, every other state its tensors."""
    if isinstance(a, NetworkState):
        assert a.position == b.position
        states_equal(a.body, b.body)
    elif isinstance(a, StackState):
        for x, y in zip(a.layers, b.layers, strict=True):
            states_equal(x, y)
    elif isinstance(a, KVCache):
        assert a.length == b.length
        torch.testing.assert_close(a.keys(a.length), b.keys(b.length), **EXACT)
        torch.testing.assert_close(a.values(a.length), b.values(b.length), **EXACT)
    elif isinstance(a, LatentCache):  # MLA's: as a KV cache, the entries up to its length
        assert a.length == b.length
        torch.testing.assert_close(a.latent(a.length), b.latent(b.length), **EXACT)
    else:
        for x, y in zip(a.tensors(), b.tensors(), strict=True):
            torch.testing.assert_close(x, y, **EXACT)


@pytest.mark.parametrize(("model", "scope"), variants(FIRST) + variants(OTHERS))
def test_a_chunked_prefill_equals_the_whole_sequence_forward(model: str, scope: str) -> None:
    case = case_of(model, scope)
    module, x = built(case, N)
    decoder = decodable(module)
    with torch.inference_mode(), timed_call():
        reference = module(x)
        whole = decoder.init_state(2, N)
        decoder.prefill(x, whole, output=False)
        for chunk in (1, 4, 8, N):
            state = decoder.init_state(2, N)
            outputs = [decoder.prefill(x[:, s : s + chunk], state, output=True) for s in range(0, N, chunk)]
            torch.testing.assert_close(torch.cat(outputs, dim=1), reference, **EXACT)
            states_equal(state, whole)


@pytest.mark.parametrize(("model", "scope"), variants(FIRST) + variants(OTHERS))
@pytest.mark.parametrize("draft", [1, 4])
def test_a_rollback_leaves_what_decoding_the_accepted_tokens_would(model: str, scope: str, draft: int) -> None:
    case = case_of(model, scope)
    module, x = built(case, N + draft + 1)
    decoder = decodable(module)
    with torch.inference_mode(), timed_call():
        reference = module(x)
        for accept in range(draft + 1):
            state = decoder.init_state(2, N + draft + 1)
            decoder.prefill(x[:, :N], state, output=False)
            out = verify(module, x[:, N : N + draft], state)
            torch.testing.assert_close(out, reference[:, N : N + draft], **EXACT)
            rollback(module, state, draft)  # a rollback may be repeated with as many accepted or fewer
            rollback(module, state, accept)
            stepped = decoder.init_state(2, N + draft + 1)
            decoder.prefill(x[:, :N], stepped, output=False)
            for t in range(accept):  # the accepted drafts decoded one by one
                decoder.step(x[:, N + t : N + t + 1], stepped)
                stepped.advance()
            states_equal(state, stepped)
            token = x[:, N + accept : N + accept + 1]
            after = decoder.step(token, state)
            torch.testing.assert_close(after, decoder.step(token, stepped), **EXACT)
            torch.testing.assert_close(after, reference[:, N + accept : N + accept + 1], **EXACT)


LENGTHS = (5, 11, 1, 9)


@pytest.mark.parametrize(("model", "scope"), variants(FIRST) + variants(OTHERS))
def test_packed_lengths_equal_each_sequence_run_alone(model: str, scope: str) -> None:
    case = replace(case_of(model, scope), batch=len(LENGTHS), seq_len=max(LENGTHS), packing=LENGTHS)
    torch.manual_seed(0)
    module = build_model(case, "cpu", torch.float64).eval()
    x = make_input(case, "cpu", torch.float64)
    assert x.shape[:2] == (1, sum(LENGTHS))
    with torch.inference_mode():
        out = packed(module, x, LENGTHS)
        for start, end in spans(LENGTHS):
            torch.testing.assert_close(out[:, start:end], module(x[:, start:end]), **EXACT)


@pytest.mark.parametrize("model", FIRST)
def test_a_packed_train_call_has_the_gradients_of_each_sequence_alone(model: str) -> None:
    case = replace(case_of(model, "block"), mode="train", batch=len(LENGTHS), seq_len=11, packing=LENGTHS)
    torch.manual_seed(0)
    module = build_model(case, "cpu", torch.float64)
    x = make_input(case, "cpu", torch.float64)
    packed(module, x, LENGTHS).square().sum().backward()
    together = {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}
    module.zero_grad()
    for start, end in spans(LENGTHS):
        module(x[:, start:end]).square().sum().backward()
    for name, p in module.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(together[name], p.grad, **EXACT)


def test_a_hybrid_stack_answers_through_its_members() -> None:
    from attnbench.families.hybrid.spec import HybridModel

    case = replace(
        tiny_case("sdpa-flash", dtype="float64", seq_len=N, d_model=32, heads=4, layers=4, causal=True),
        model="gdn-mix",
        definition=HybridModel(("gated-deltanet", "lstm", "mamba2", "sdpa-flash")).definition(),
    )
    module, x = built(case, N + 5)
    decoder = decodable(module)
    with torch.inference_mode(), timed_call():
        reference = module(x)
        state = decoder.init_state(2, N + 5)
        outputs = [decoder.prefill(x[:, s : min(s + 8, N)], state, output=True) for s in range(0, N, 8)]
        torch.testing.assert_close(torch.cat(outputs, dim=1), reference[:, :N], **EXACT)
        torch.testing.assert_close(verify(module, x[:, N : N + 4], state), reference[:, N : N + 4], **EXACT)
        rollback(module, state, 2)
        torch.testing.assert_close(decoder.step(x[:, N + 2 : N + 3], state), reference[:, N + 2 : N + 3], **EXACT)
        out = packed(module, x[:1, :20], (6, 14))
        torch.testing.assert_close(out[:, 6:], module(x[:1, 6:20]), **EXACT)


def test_each_layer_says_how_it_rolls_back() -> None:
    methods = {}
    for model in ("lstm", "gru", "mingru", "mamba2", "linear-attn", "sdpa-flash", "gated-deltanet", "rwkv7"):
        module, _ = built(case_of(model), 4)
        found = {getattr(m, "rollback_method", None) for m in module.modules()} - {None}
        methods[model] = found
    assert methods["lstm"] == methods["gru"] == {"replay"}
    assert methods["sdpa-flash"] == {"truncate"}
    assert all(methods[m] == {"checkpoint"} for m in ("mingru", "mamba2", "linear-attn", "gated-deltanet", "rwkv7"))


def test_a_timed_chunk_attends_through_sdpa_with_the_causal_mask_bottom_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chunk path is the core's own kernel: SDPA under the model's backend, with a bottom-right ``CausalBias``
    (whose dispatch SDPA hands the call to), and what it computes is the forward's."""
    seen: list[tuple[int, int]] = []
    real = CausalBias._dispatch

    def spy(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, attn_mask: CausalBias, **kw: Any) -> Any:
        seen.append((attn_mask.seq_len_q, attn_mask.seq_len_kv))
        return real(query, key, value, attn_mask, **kw)

    monkeypatch.setattr(CausalBias, "_dispatch", staticmethod(spy))
    module, x = built(case_of("sdpa-flash"), N)
    decoder = decodable(module)
    with torch.inference_mode(), timed_call():
        state = decoder.init_state(2, N)
        decoder.prefill(x[:, :8], state, output=True)
        second = decoder.prefill(x[:, 8:], state, output=True)
        torch.testing.assert_close(second, module(x)[:, 8:], **EXACT)
    assert seen == [(N - 8, N), (N - 8, N)]  # each of the two layers: 13 queries against all 21 keys


def test_packed_lstm_lengths_go_through_a_packed_sequence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LSTM's own packed path (torch's varlen ``PackedSequence``) ran, not the loop over sequences."""
    calls: list[int] = []
    real = torch.nn.utils.rnn.pack_sequence

    def spy(sequences: Any, enforce_sorted: bool = True) -> Any:
        calls.append(len(sequences))
        return real(sequences, enforce_sorted=enforce_sorted)

    monkeypatch.setattr(torch.nn.utils.rnn, "pack_sequence", spy)
    module, _ = built(case_of("lstm"), 4)
    with torch.inference_mode():
        packed(module, torch.randn(1, sum(LENGTHS), 32, dtype=torch.float64), LENGTHS)
    assert calls == [len(LENGTHS)]


@pytest.mark.parametrize(
    ("model", "mode", "serving", "options", "words"),
    [
        ("flex", "prefill", (("prefill_chunk", 4),), {}, "exact shape"),
        ("sdpa", "verify", (("accept", 1), ("draft", 2)), {"window": 8}, "ring cache"),
        ("sdpa", "prefill", (("prefill_chunk", 4),), {"window": 8}, "ring cache"),
        ("lstm", "prefill", (("prefill_chunk", 4),), {"compile": "default"}, "eager"),
    ],
)
def test_a_question_a_family_cannot_answer_is_an_unsupported_row_with_its_reason(
    model: str, mode: str, serving: tuple[tuple[str, int], ...], options: dict[str, Any], words: str
) -> None:
    case = replace(tiny_case(model, seq_len=N, causal=True, **options), mode=mode, serving=serving)  # type: ignore[arg-type]
    problem = cannot_build(case)
    assert problem is not None and words in problem.message and problem.option is None
    reason = probe(case, "cpu")
    assert reason is not None and words in reason


def test_a_windowed_prefill_in_one_pass_and_a_windowed_packing_are_answered() -> None:
    one_pass = replace(
        tiny_case("sdpa", seq_len=N, causal=True, window=8), mode="prefill", serving=(("prefill_chunk", 0),)
    )
    assert cannot_build(one_pass) is None and probe(one_pass, "cpu") is None
    packs = replace(tiny_case("sdpa", seq_len=9, causal=True, window=4), batch=2, packing=(9, 3))
    assert probe(packs, "cpu") is None


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
GPU_CHUNKS = ["sdpa-flash", "sdpa-efficient", "sdpa", "vanilla"]
try:
    import flash_attn  # noqa: F401

    GPU_CHUNKS.append("flash-attn")
except ImportError:  # the package is optional: its rows are unsupported without it
    pass


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("model", GPU_CHUNKS)
def test_the_cuda_kernels_prefill_in_chunks_and_pack_lengths_as_the_forward(model: str) -> None:
    """The chunk path on the CUDA kernels (flash takes the bottom-right CausalBias natively; flash-attn aligns its
    causal mask bottom-right), and packed lengths (flash-attn's varlen kernel), against the forward in bf16."""
    case = tiny_case(model, dtype="bfloat16", device="cuda", seq_len=64, d_model=128, heads=2, layers=2, causal=True)
    torch.manual_seed(0)
    module = build_model(case, "cuda", torch.bfloat16).eval()
    x = make_input(case, "cuda", torch.bfloat16)
    decoder = decodable(module)
    with torch.inference_mode(), timed_call():
        reference = module(x)
        state = decoder.init_state(2, 64)
        outputs = [decoder.prefill(x[:, s : s + 16], state, output=True) for s in range(0, 64, 16)]
        torch.testing.assert_close(torch.cat(outputs, dim=1), reference, atol=5e-2, rtol=5e-2)
        out = packed(module, x[:1, :40], (24, 16))
        torch.testing.assert_close(out[:, 24:], module(x[:1, 24:40]), atol=5e-2, rtol=5e-2)


def test_flash_attns_varlen_packing_builds_its_cu_seqlens_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.tensor from a list is a pageable host-to-device copy, a synchronisation: made in every timed call, it
    stood inside the timing (issue 48, item 8). Now the first call (a warm-up's) makes it, the rest reuse it. The
    package runs on CUDA only, so a stand-in records what the kernel is handed."""
    import sys
    import types

    from attnbench.families.attention.layers import FlashAttnCore

    handed: list[torch.Tensor] = []

    def varlen(
        q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_q: torch.Tensor, cu_k: torch.Tensor, *rest: Any, **kw: Any
    ) -> torch.Tensor:
        handed.extend((cu_q, cu_k))
        return q

    package = types.ModuleType("flash_attn")
    package.flash_attn_func = lambda *a, **kw: a[0]  # type: ignore[attr-defined]
    package.flash_attn_varlen_func = varlen  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flash_attn", package)
    core = FlashAttnCore(causal=True)
    q = torch.randn(1, 2, 12, 4)
    made: list[object] = []
    real = torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *a, **kw: made.append(a[0]) or real(*a, **kw))
    for _ in range(3):
        core.varlen(q, q, q, (5, 7))
    assert made == [[0, 5, 12]]  # once, for the three calls
    assert all(t is handed[0] for t in handed) and handed[0].tolist() == [0, 5, 12]
    core.varlen(q, q, q, (4, 8))  # another packing: its own
    assert made[-1] == [0, 4, 12] and handed[-1].tolist() == [0, 4, 12]
