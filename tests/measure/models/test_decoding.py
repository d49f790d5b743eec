"""Decoding (issue 13): every model, at every scope, decodes with the weights of its whole-sequence form.

The equality the issue asks for: after a prefill of n tokens, the step for token n (and the ones after it,
advancing the state) equals the whole-sequence forward's output at that position — float64 near round-off,
float32 to what reordered sums allow. Also: a step leaves the state at n (so every timed call is the same call),
writes its slot in place, and allocates the bytes ``core.decode_state`` computes. The ``gpu`` tests run the CUDA
kernels (flash-attn's KV-cache path, the fused SDPA backends, bf16) where a GPU exists.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from typing import Any

import pytest
import torch

from attnbench.core.cases import Case
from attnbench.families.catalogue import MODELS
from attnbench.families.registry import build_model, make_decode_inputs, make_input, probe, torch_dtype
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import KVCache, decodable, prefill, tensor_bytes
from tests.support import mentions, tiny_case

RECURRENT = ("lstm", "gru", "mingru", "minlstm")
CPU_ATTENTION = ("vanilla", "sdpa-math", "sdpa-flash", "sdpa")
GPU_ATTENTION = ("vanilla", "sdpa-math", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa", "flash-attn")
TOLERANCE = {"float64": 1e-10, "float32": 1e-5, "bfloat16": 5e-2, "float16": 5e-3}
STEPS = 3  # tokens decoded one after another past the context
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def decode_case(
    model: str,
    scope: str = "core",
    *,
    dtype: str = "float64",
    device: str = "cpu",
    n: int = 13,
    layers: int = 2,
    d_model: int = 32,
    **options: Any,
) -> Case:
    """A decode case of batch 2 (heads 4 for attention) at context ``n``; scope model gets a 97-token vocabulary."""
    if scope != "core":
        options = {"scope": scope, "vocab": 97, **options} if scope == "model" else {"scope": scope, **options}
    return tiny_case(
        model,
        mode="decode",
        dtype=dtype,
        device=device,
        seq_len=n,
        d_model=d_model,
        heads=4,
        layers=layers,
        causal=True,
        **options,
    )


def decoded_against_forward(case: Case, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(decoded, reference): tokens n…n+STEPS−1 stepped after a prefill of n, and the forward's same positions.

    The model is built for STEPS − 1 more positions than the case (learned tables must reach the last token);
    both paths use that one model."""
    dtype = torch_dtype(case.dtype)
    torch.manual_seed(0)
    model = build_model(replace(case, seq_len=case.seq_len + STEPS - 1), device, dtype).eval()
    n = case.seq_len
    whole = make_input(replace(case, mode="forward", seq_len=n + STEPS), device, dtype)
    with torch.inference_mode():
        reference = model(whole)[:, n:]
        decoder = decodable(model)
        state = decoder.init_state(case.batch, n + STEPS)
        assert decoder.prefill(whole[:, :n], state, output=False) is None
        outputs = []
        for t in range(STEPS):
            token = whole[:, n + t : n + t + 1]
            first = decoder.step(token, state)
            again = decoder.step(token, state)  # a step leaves the state at n: the same call, the same output
            torch.testing.assert_close(again, first, atol=0, rtol=0)
            outputs.append(first)
            state.advance()
    return torch.cat(outputs, dim=1), reference


def variants(models: tuple[str, ...]) -> list[tuple[str, str, str]]:
    """(model, scope, positional) for every scope and every positional encoding the model takes."""
    out = []
    for model in models:
        spec = MODELS[model].option("positional")
        assert spec is not None and spec.choices is not None
        out += [(model, scope, kind) for scope in ("core", "block", "model") for kind in spec.choices]
    return out


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(("model", "scope", "positional"), variants(RECURRENT + CPU_ATTENTION))
def test_decoding_after_a_prefill_equals_the_whole_sequence_forward(
    model: str, scope: str, positional: str, dtype: str
) -> None:
    case = decode_case(model, scope, dtype=dtype, positional=positional)
    decoded, reference = decoded_against_forward(case)
    assert decoded.shape == reference.shape == (2, STEPS, 32)
    tolerance = TOLERANCE[dtype]
    torch.testing.assert_close(decoded, reference, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("model", ["mingru", "minlstm"])
def test_the_sequential_scan_decodes_the_same_as_the_parallel(model: str) -> None:
    parallel, reference = decoded_against_forward(decode_case(model, "block"))
    sequential, _ = decoded_against_forward(decode_case(model, "block", scan="sequential"))
    torch.testing.assert_close(sequential, reference, atol=1e-10, rtol=1e-10)
    torch.testing.assert_close(parallel, sequential, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("model", ["lstm", "gru", "mingru", "sdpa"])
def test_matched_blocks_and_an_empty_context_decode_too(model: str) -> None:
    options = {"match": "params"} if model in RECURRENT else {}
    decoded, reference = decoded_against_forward(decode_case(model, "block", d_model=64, **options))
    torch.testing.assert_close(decoded, reference, atol=1e-10, rtol=1e-10)
    first, reference = decoded_against_forward(decode_case(model, "core", n=0))  # the very first token
    torch.testing.assert_close(first, reference, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize(
    ("model", "scan"), [("lstm", ""), ("gru", ""), ("mingru", "parallel"), ("minlstm", "sequential")]
)
def test_a_recurrent_context_may_be_prefilled_in_chunks(model: str, scan: str) -> None:
    options = {"scan": scan} if scan else {}
    case = decode_case(model, "model", n=20, positional="sinusoidal", **options)
    torch.manual_seed(0)
    module = build_model(case, "cpu", torch.float64).eval()
    context, token = make_decode_inputs(case, "cpu", torch.float64)
    decoder = decodable(module)
    with torch.inference_mode():
        whole = prefill(module, context, case.span)
        chunked = decoder.init_state(case.batch, case.span)
        for start in (0, 7, 14):  # 7 + 7 + 6 tokens, the positions carrying on from chunk to chunk
            decoder.prefill(context[:, start : start + 7], chunked, output=False)
        assert chunked.position == whole.position == 20
        torch.testing.assert_close(decoder.step(token, chunked), decoder.step(token, whole), atol=1e-10, rtol=1e-10)


def test_an_attention_prefill_appends_to_its_cache_and_fill_stays_one_pass() -> None:
    """A second prefill appends (a prompt's next chunk, issue 41); the cache's ``fill`` still refuses a second pass."""
    case = decode_case("sdpa", n=8)
    module = build_model(case, "cpu", torch.float64)
    context, _ = make_decode_inputs(case, "cpu", torch.float64)
    with torch.inference_mode():
        state = prefill(module, context, 20)
        decodable(module).prefill(context, state, output=False)
        assert all(layer.length == 16 for layer in state.layers)
        with pytest.raises(ValueError, match="one pass"):
            state.layers[0].fill(context[:, :, :4], context[:, :, :4])


@pytest.mark.parametrize("scope", ["core", "block", "model"])
@pytest.mark.parametrize("model", [*RECURRENT, *CPU_ATTENTION])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_state_holds_exactly_the_bytes_computed_for_it(model: str, scope: str, dtype: str) -> None:
    case = decode_case(model, scope, dtype=dtype, n=40)
    torch.manual_seed(0)
    module = build_model(case, "cpu", torch_dtype(dtype))
    context, _ = make_decode_inputs(case, "cpu", torch_dtype(dtype))
    with torch.inference_mode():
        state = prefill(module, context, case.span)
    assert tensor_bytes(state) == state_bytes(case)


def test_kv_cache_grows_with_n_and_recurrent_state_does_not() -> None:
    sizes = {m: [state_bytes(decode_case(m, n=n, dtype="float32")) for n in (128, 1024)] for m in ("sdpa", "lstm")}
    assert sizes["sdpa"] == [2 * 2 * 2 * (n + 1) * 32 * 4 for n in (128, 1024)]  # K and V, layers, batch, n + 1, d
    assert sizes["lstm"] == [2 * 2 * 2 * 32 * 4] * 2  # h and c, layers, batch, hidden


def test_a_step_writes_its_slot_in_place_and_reads_the_whole_cache() -> None:
    case = decode_case("sdpa", layers=1, n=5)
    torch.manual_seed(0)
    model = build_model(case, "cpu", torch.float64).eval()
    context, token = make_decode_inputs(case, "cpu", torch.float64)
    with torch.inference_mode():
        state = prefill(model, context, case.span)
        cache = state.layers[0]
        assert isinstance(cache, KVCache)
        pointer, before = cache.storage.data_ptr(), cache.storage.clone()
        assert cache.length == 5 and not before[:, :, :, 5].any()  # slot n is empty until a step writes it
        decodable(model).step(token, state)
    assert cache.storage.data_ptr() == pointer and cache.length == 5
    assert torch.equal(cache.storage[:, :, :, :5], before[:, :, :, :5])  # the context is untouched
    assert cache.storage[:, :, :, 5].abs().sum() > 0  # the new token's K and V are in slot n


def test_a_full_cache_refuses_another_token() -> None:
    case = decode_case("vanilla", layers=1, n=4)
    model = build_model(case, "cpu", torch.float64).eval()
    context, token = make_decode_inputs(case, "cpu", torch.float64)
    with torch.inference_mode():
        state = prefill(model, context, case.span)
        decodable(model).step(token, state)
        state.advance()
        with pytest.raises(ValueError, match="the KV cache is full"):
            decodable(model).step(token, state)


def test_advance_needs_a_step_first() -> None:
    case = decode_case("gru", layers=1, n=4)
    model = build_model(case, "cpu", torch.float64)
    context, _ = make_decode_inputs(case, "cpu", torch.float64)
    with torch.inference_mode():
        state = prefill(model, context, case.span)
    with pytest.raises(ValueError, match="needs a step first"):
        state.advance()


def test_a_bidirectional_rnn_cannot_decode_and_the_probe_says_why() -> None:
    model = build_model(
        replace(decode_case("lstm", layers=1), options=(("bidirectional", True),)), "cpu", torch.float32
    )
    with pytest.raises(NotImplementedError, match="bidirectional lstm"):
        decodable(model).init_state(2, 8)
    bidirectional = replace(decode_case("lstm", dtype="float32"), causal=False, options=(("bidirectional", True),))
    assert "bidirectional" in str(probe(bidirectional, "cpu"))
    encoder = replace(decode_case("sdpa", dtype="float32"), causal=False)
    assert "causal" in str(probe(encoder, "cpu"))


@pytest.mark.parametrize("model", [*RECURRENT, *CPU_ATTENTION])
def test_every_cpu_model_probes_as_decodable(model: str) -> None:
    assert probe(decode_case(model, "model", dtype="float32", positional="learned", max_len=14), "cpu") is None


def test_learned_positions_must_reach_the_new_token() -> None:
    short = decode_case("sdpa", "model", dtype="float32", positional="learned", max_len=13)  # n = 13 needs 14
    assert mentions(str(probe(short, "cpu")), "max_len", values=(13,))


# ----------------------------------------------------------------------------------------------------------- GPU
@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("scope", ["core", "block", "model"])
def test_flash_attn_decodes_through_its_kv_cache_kernel(scope: str, dtype: str) -> None:
    if importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash_attn is not installed")
    case = decode_case("flash-attn", scope, dtype=dtype, device="cuda", d_model=256, positional="rope")
    decoded, reference = decoded_against_forward(case, "cuda")
    torch.testing.assert_close(decoded, reference, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    torch.manual_seed(0)
    model = build_model(case, "cuda", torch_dtype(dtype))
    context, _ = make_decode_inputs(case, "cuda", torch_dtype(dtype))
    with torch.inference_mode():
        state = prefill(model, context, case.span)
    body = state.body if hasattr(state, "body") else state
    cache = body.layers[0]
    assert cache.layout == "bnhd" and cache.seqlens.dtype == torch.int32  # the kernel's layout, preallocated
    assert int(cache.seqlens[0]) == case.seq_len


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("model", [*RECURRENT, "mamba2", "linear-attn", *GPU_ATTENTION])
def test_every_model_decodes_in_bfloat16_on_the_gpu(model: str) -> None:
    case = decode_case(model, "block", dtype="bfloat16", device="cuda", d_model=256, n=100)
    reason = probe(case, "cuda")
    if reason is not None:
        pytest.skip(reason)
    decoded, reference = decoded_against_forward(case, "cuda")
    torch.testing.assert_close(decoded.float(), reference.float(), atol=TOLERANCE["bfloat16"], rtol=0.05)


def _state_tensors(state: Any) -> list[torch.Tensor]:
    """Every tensor a state object holds, however deep (its layers, its body, their buffers)."""
    found: list[torch.Tensor] = []
    for value in vars(state).values():
        items = value if isinstance(value, list) else [value]
        for item in items:
            if isinstance(item, torch.Tensor):
                found.append(item)
            elif hasattr(item, "__dict__"):
                found += _state_tensors(item)
    return found


@pytest.mark.parametrize("model", ["linear-attn", "mamba2", "lstm", "sdpa"])
def test_every_tensor_a_step_writes_in_place_is_marked_static(model: str) -> None:
    """A compiled step under CUDA graphs takes only tensors marked static as mutable inputs: the state and the
    buffers the next state is computed into (linear attention's and Mamba-2's), else inductor skips the graph."""
    from attnbench.timing.decode_setup import static_tensors

    case = decode_case(model, "model", dtype="float32", vocab=97)
    torch.manual_seed(0)
    built = build_model(case, "cpu", torch.float32).eval()
    context, token = make_decode_inputs(case, "cpu", torch.float32)
    with torch.inference_mode():
        state = prefill(built, context, case.span)
        held = _state_tensors(state)
        before = [t.clone() for t in held]
        decodable(built).step(token, state)
    written = {t.data_ptr() for t, old in zip(held, before, strict=True) if not torch.equal(t, old)}
    marked = {t.data_ptr() for t in static_tensors(state)}
    assert written <= marked
    assert bool(written) == (model != "lstm")  # an LSTM step's new h and c are new tensors, kept aside
    if model in ("linear-attn", "mamba2"):
        assert len(marked) > len(list(state.tensors()))  # the next-state buffers, beside the state
