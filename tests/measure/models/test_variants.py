"""The attention variants of issue 14 compute what they claim: GQA/MQA, sliding windows and linear attention.

Each is held to an independent reference, forward and gradients, in float64 near round-off and float32 to what
reordered sums allow: GQA against the same model with its K/V heads repeated into multi-head weights, a window
against a literal per-query loop over its band, linear attention's three forms against each other and against
the paper's per-token formula; and each decodes to what its forward computes (``test_decoding`` holds the
protocol; these add the ring buffer past the window and the linear state).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest
import torch

from attnbench.core.cases import Case
from attnbench.families.attention.layers import band_mask
from attnbench.families.flops import count_flops, count_parameters, window_pairs
from attnbench.families.linear.layers import linear_attention, retnet_decay
from attnbench.families.registry import build_model, make_input, parameter_count, probe, torch_dtype
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import KVCache, decodable, prefill, tensor_bytes
from tests.measure.models.test_decoding import decode_case, decoded_against_forward
from tests.measure.models.test_models import TOLERANCES, forward_and_grads
from tests.support import heads_kv_of, mentions, tiny_case

CPU_CORES = ("vanilla", "sdpa-math", "sdpa-flash", "sdpa")


def case_of(model: str, *, dtype: str = "float64", seq_len: int = 13, causal: bool = True, **options: Any) -> Case:
    return tiny_case(
        model, mode="train", dtype=dtype, seq_len=seq_len, d_model=32, heads=4, layers=2, causal=causal, **options
    )


def compare(case: Case, reference: Case, *, dtype: str) -> None:
    """``case`` and ``reference`` (its weights mapped by ``weights``) give the same output and input gradient."""
    torch.manual_seed(1)
    x = torch.randn(2, case.seq_len, 32, dtype=torch_dtype(dtype))
    grad = torch.randn_like(x)
    out, grads = forward_and_grads(case, x, grad)
    ref, ref_grads = forward_and_grads(reference, x, grad)
    atol, gtol = TOLERANCES[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=atol)
    torch.testing.assert_close(grads["input"], ref_grads["input"], atol=gtol, rtol=gtol)
    for name, g in grads.items():  # the same parameters, so the same weight gradients too
        if name in ref_grads and g.shape == ref_grads[name].shape:
            torch.testing.assert_close(g, ref_grads[name], atol=gtol, rtol=gtol)


# ---------------------------------------------------------------------------------------------------- GQA
def _mha_from_gqa(case: Case, dtype: torch.dtype) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The GQA model and a multi-head one whose K/V projection rows repeat the GQA model's per query head."""
    torch.manual_seed(0)
    gqa = build_model(case, "cpu", dtype)
    mha = build_model(replace(case, options=tuple(o for o in case.options if o[0] != "heads_kv")), "cpu", dtype)
    heads, kv = case.heads or 0, heads_kv_of(case) or 0
    d = case.d_model // heads
    with torch.no_grad():
        for (name, p_gqa), (_, p_mha) in zip(gqa.named_parameters(), mha.named_parameters(), strict=True):
            if p_gqa.shape == p_mha.shape:
                p_mha.copy_(p_gqa)
                continue
            # qkv weight (d + 2·kv·D, d) or bias: Q rows as they are, each K/V head's rows repeated G times.
            q, k, v = p_gqa.split([case.d_model, kv * d, kv * d], dim=0)

            def repeat(t: torch.Tensor) -> torch.Tensor:
                return t.unflatten(0, (kv, d)).repeat_interleave(heads // kv, dim=0).flatten(0, 1)

            p_mha.copy_(torch.cat([q, repeat(k), repeat(v)]))
            assert name.endswith(("qkv.weight", "qkv.bias"))
    return gqa, mha


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("heads_kv", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("window", [0, 5], ids=["full", "window"])
@pytest.mark.parametrize("model", [*CPU_CORES, "linear-attn"])
def test_gqa_equals_multi_head_attention_with_repeated_kv_heads(
    model: str, window: int, heads_kv: int, dtype: str
) -> None:
    if model == "linear-attn" and window:
        pytest.skip("linear attention has no window")
    options: dict[str, Any] = {"heads_kv": heads_kv} | ({"window": window} if window else {})
    case = case_of(model, dtype=dtype, **options)
    gqa, mha = _mha_from_gqa(case, torch_dtype(dtype))
    x = torch.randn(2, case.seq_len, 32, dtype=torch_dtype(dtype), requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    out, ref = gqa(x), mha(x2)
    atol, gtol = TOLERANCES[dtype]
    torch.testing.assert_close(out, ref, atol=atol, rtol=atol)
    grad = torch.randn_like(out)
    out.backward(grad)
    ref.backward(grad)
    assert x.grad is not None and x2.grad is not None
    torch.testing.assert_close(x.grad, x2.grad, atol=gtol, rtol=gtol)


@pytest.mark.parametrize("heads_kv", [2, 1])
@pytest.mark.parametrize("model", [m for m in CPU_CORES if m != "vanilla"])
def test_every_core_computes_the_same_gqa_as_vanilla(model: str, heads_kv: int) -> None:
    for dtype in ("float64", "float32"):
        compare(
            case_of(model, dtype=dtype, heads_kv=heads_kv),
            case_of("vanilla", dtype=dtype, heads_kv=heads_kv),
            dtype=dtype,
        )


@pytest.mark.parametrize("model", [*CPU_CORES, "linear-attn"])
def test_gqa_shrinks_the_projection_and_the_kv_state_by_heads_over_heads_kv(model: str) -> None:
    sizes = {}
    for kv in (4, 2, 1):
        case = decode_case(model, n=40, heads_kv=kv) if kv != 4 else decode_case(model, n=40)
        model_ = build_model(case, "cpu", torch.float64)
        assert parameter_count(model_) == count_parameters(case)
        state = prefill(model_, make_input(case, "cpu", torch.float64), case.span)
        assert tensor_bytes(state) == state_bytes(case)
        sizes[kv] = state_bytes(case)
    assert sizes[4] == 2 * sizes[2] == 4 * sizes[1]


def test_heads_kv_must_divide_heads() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        build_model(case_of("sdpa", heads_kv=3), "cpu", torch.float64)


# ---------------------------------------------------------------------------------------------------- window
def _band_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int, causal: bool) -> torch.Tensor:
    """Per query, softmax over exactly the keys of its band, written as a loop (no mask)."""
    out = torch.empty_like(q)
    length = q.shape[-2]
    for i in range(length):
        low = max(0, i - window + 1)
        high = i + 1 if causal else min(length, i + window)
        scores = (q[..., i : i + 1, :] @ k[..., low:high, :].transpose(-2, -1)) * q.shape[-1] ** -0.5
        out[..., i : i + 1, :] = scores.softmax(-1) @ v[..., low:high, :]
    return out


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "both-sides"])
@pytest.mark.parametrize("window", [1, 4, 13])
def test_the_band_mask_is_the_window(window: int, causal: bool) -> None:
    keep = band_mask(13, causal=causal, window=window, device=torch.device("cpu"))
    assert keep is not None
    assert int(keep.sum()) == window_pairs(13, window, causal=causal)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 13, 8, dtype=torch.float64) for _ in range(3))
    from attnbench.families.attention.layers import VanillaCore

    torch.testing.assert_close(VanillaCore(causal, window)(q, k, v), _band_reference(q, k, v, window, causal))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "both-sides"])
@pytest.mark.parametrize("model", [m for m in CPU_CORES if m != "vanilla"])
def test_every_core_computes_the_same_window_as_vanilla(model: str, causal: bool, dtype: str) -> None:
    compare(
        case_of(model, dtype=dtype, causal=causal, window=4, seq_len=40),
        case_of("vanilla", dtype=dtype, causal=causal, window=4, seq_len=40),
        dtype=dtype,
    )


def test_a_window_as_long_as_the_sequence_is_full_causal_attention() -> None:
    compare(case_of("sdpa", window=13), case_of("vanilla"), dtype="float64")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n", [3, 6, 40], ids=["inside", "at-the-edge", "wrapped"])
@pytest.mark.parametrize("model", CPU_CORES)
def test_a_windowed_decode_reads_its_ring_buffer_and_equals_the_forward(model: str, n: int, dtype: str) -> None:
    case = decode_case(model, n=n, dtype=dtype, window=5, heads_kv=2)
    decoded, reference = decoded_against_forward(case)
    tolerance = {"float64": 1e-10, "float32": 1e-5}[dtype]
    torch.testing.assert_close(decoded, reference, atol=tolerance, rtol=tolerance)


def test_the_ring_stops_growing_at_the_window() -> None:
    sizes = [state_bytes(decode_case("sdpa", n=n, window=8)) for n in (2, 7, 8, 100, 10_000)]
    assert sizes[0] < sizes[1] == sizes[2] == sizes[3] == sizes[4]
    cache = KVCache(1, 1, 2, 100, layout="bhnd", device=torch.device("cpu"), dtype=torch.float64, window=4)
    keys = torch.arange(10, dtype=torch.float64).view(1, 1, 10, 1).expand(1, 1, 10, 2)
    cache.fill(keys, keys)
    assert sorted(cache.keys(10)[0, 0, :, 0].tolist()) == [6.0, 7.0, 8.0, 9.0]  # the last window, slot p mod 4
    assert cache.keys(10)[0, 0, 2, 0] == 6.0


def test_windowed_flops_count_the_band_and_grow_linearly_past_it() -> None:
    full = [count_flops(replace(case_of("sdpa-flash", window=64), seq_len=n)).detail["core"] for n in (1024, 2048)]
    assert full[1] / full[0] == pytest.approx(2, rel=0.05)
    decode = [count_flops(decode_case("sdpa", n=n, window=64)).detail["core"] for n in (100, 1000)]
    assert decode[0] == decode[1]


# ---------------------------------------------------------------------------------------------------- linear
def _per_token_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gamma: torch.Tensor | None) -> torch.Tensor:
    """The paper's formula for each query, literally: Σ_s≤t γ^(t−s) φ(q_t)·φ(k_s) v_s / Σ_s≤t γ^(t−s) φ(q_t)·φ(k_s)."""
    heads = q.shape[1]
    k, v = k.repeat_interleave(heads // k.shape[1], 1), v.repeat_interleave(heads // v.shape[1], 1)
    phi_q, phi_k = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
    out = torch.empty_like(q)
    g = None if gamma is None else gamma.repeat_interleave(heads // gamma.shape[0])
    for t in range(q.shape[2]):
        weights = phi_q[:, :, t : t + 1] @ phi_k[:, :, : t + 1].transpose(-2, -1)  # (B, H, 1, t + 1)
        if g is not None:
            weights = weights * g[:, None, None] ** torch.arange(t, -1, -1, dtype=q.dtype)
        out[:, :, t : t + 1] = (weights @ v[:, :, : t + 1]) / (weights.sum(-1, keepdim=True) + 1e-6)
    return out


@pytest.mark.parametrize("decay", [False, True], ids=["plain", "retnet"])
@pytest.mark.parametrize("heads_kv", [4, 2, 1])
@pytest.mark.parametrize("seq_len", [1, 16, 37])
@pytest.mark.parametrize("form", ["chunked", "recurrent", "parallel"])
def test_each_linear_form_is_the_papers_formula(form: str, seq_len: int, heads_kv: int, decay: bool) -> None:
    torch.manual_seed(0)
    q = torch.randn(2, 4, seq_len, 8, dtype=torch.float64)
    k, v = (torch.randn(2, heads_kv, seq_len, 8, dtype=torch.float64) for _ in range(2))
    gamma = retnet_decay(heads_kv) if decay else None
    y, _, _ = linear_attention(q, k, v, form=form, decay=gamma, chunk=16)
    torch.testing.assert_close(y, _per_token_reference(q, k, v, gamma), atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("scope", ["core", "block"])
@pytest.mark.parametrize("form", ["recurrent", "parallel"])
def test_the_linear_forms_train_to_the_same_gradients(form: str, scope: str, dtype: str) -> None:
    options = {"form": form, "decay": "retnet", "heads_kv": 2} | ({"scope": scope} if scope != "core" else {})
    reference = {"decay": "retnet", "heads_kv": 2, "chunk": 7} | ({"scope": scope} if scope != "core" else {})
    compare(
        case_of("linear-attn", dtype=dtype, seq_len=40, **options),
        case_of("linear-attn", dtype=dtype, seq_len=40, **reference),
        dtype=dtype,
    )


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("n", [0, 1, 13, 70])
@pytest.mark.parametrize("decay", ["none", "retnet"])
@pytest.mark.parametrize("scope", ["core", "block", "model"])
def test_linear_attention_decodes_as_an_rnn_to_its_forward(scope: str, decay: str, n: int, dtype: str) -> None:
    case = decode_case("linear-attn", scope, n=n, dtype=dtype, decay=decay, heads_kv=2, chunk=16)
    decoded, reference = decoded_against_forward(case)
    tolerance = {"float64": 1e-10, "float32": 1e-5}[dtype]
    torch.testing.assert_close(decoded, reference, atol=tolerance, rtol=tolerance)


def test_a_linear_prefill_may_come_in_chunks() -> None:
    case = decode_case("linear-attn", n=50, decay="retnet", chunk=16)
    torch.manual_seed(0)
    model = build_model(case, "cpu", torch.float64).eval()
    context = make_input(case, "cpu", torch.float64)
    decoder = decodable(model)
    whole, parts = decoder.init_state(2, 51), decoder.init_state(2, 51)
    with torch.inference_mode():
        decoder.prefill(context, whole, output=False)
        for start in (0, 7, 30):  # 7, 23 and 20 tokens: none a multiple of the chunk
            decoder.prefill(context[:, start : {0: 7, 7: 30, 30: 50}[start]], parts, output=False)
    for a, b in zip(whole.tensors(), parts.tensors(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_the_linear_state_is_constant_in_n_and_float32_for_bf16() -> None:
    assert state_bytes(decode_case("linear-attn", n=10)) == state_bytes(decode_case("linear-attn", n=100_000))
    bf16 = decode_case("linear-attn", n=10, dtype="bfloat16")
    assert state_bytes(bf16) == state_bytes(decode_case("linear-attn", n=10, dtype="float32"))


def test_linear_flops_have_an_id_per_form_and_the_forms_scale_as_they_should() -> None:
    def core(form: str, n: int) -> int:
        return count_flops(replace(case_of("linear-attn", form=form), mode="forward", seq_len=n)).detail["core"]

    ids = {count_flops(case_of("linear-attn", form=form)).formula for form in ("chunked", "recurrent", "parallel")}
    assert ids == {"linear-attn-chunked-v1", "linear-attn-recurrent-v1", "linear-attn-parallel-v1"}
    # A decode step is the recurrent step whatever form filled the state.
    assert count_flops(decode_case("linear-attn", form="parallel")).formula == "linear-attn-recurrent-decode-v1"
    assert core("recurrent", 2048) == 2 * core("recurrent", 1024)
    assert core("chunked", 2048) == 2 * core("chunked", 1024)
    assert core("parallel", 2048) / core("parallel", 1024) == pytest.approx(4, rel=0.01)


@pytest.mark.parametrize("mode", ["forward", "train", "backward", "decode"])
@pytest.mark.parametrize(
    "options", [{"form": "recurrent"}, {"form": "parallel", "heads_kv": 1}, {"decay": "retnet", "feature": "relu"}]
)
def test_linear_attention_probes_as_runnable_in_every_mode(options: dict[str, Any], mode: str) -> None:
    case = replace(case_of("linear-attn", **options), mode=mode)  # type: ignore[arg-type]
    assert probe(case, "cpu") is None
    assert probe(replace(case_of("sdpa", window=4, heads_kv=1), mode=mode), "cpu") is None  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_linear_attention_in_bfloat16_stays_near_float64(dtype: str) -> None:
    torch.manual_seed(0)
    q = torch.randn(1, 4, 300, 16, dtype=torch.float64)
    k, v = torch.randn(1, 2, 300, 16, dtype=torch.float64), torch.randn(1, 2, 300, 16, dtype=torch.float64)
    reference, _, _ = linear_attention(q, k, v)
    low, _, _ = linear_attention(q.to(torch.bfloat16), k.to(torch.bfloat16), v.to(torch.bfloat16))
    assert low.dtype == torch.bfloat16
    assert float((low.double() - reference).abs().max()) < 2e-2


# ---------------------------------------------------------------------------------------------------- GPU
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
GPU_VARIANTS = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "sdpa", "flash-attn", "flex")


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("options", [{"heads_kv": 2}, {"heads_kv": 1, "window": 16}, {"window": 16}])
@pytest.mark.parametrize("model", GPU_VARIANTS)
def test_gpu_cores_compute_vanillas_gqa_and_window_in_bf16_or_say_why_not(model: str, options: dict[str, Any]) -> None:
    case = replace(case_of(model, dtype="bfloat16", seq_len=64, **options), device="cuda")
    reason = probe(case, "cuda")
    if reason is not None:
        assert reason  # e.g. sdpa-flash's kernel takes no mask: unsupported, with torch's words
        pytest.skip(reason)
    generator = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 64, 32, generator=generator, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(2, 64, 32, generator=generator, device="cuda", dtype=torch.bfloat16)
    ref, ref_grads = forward_and_grads(replace(case, model="vanilla"), x, grad, "cuda", compute_dtype=torch.float32)
    out, grads = forward_and_grads(case, x, grad, "cuda")
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(grads["input"].float(), ref_grads["input"], atol=2e-2, rtol=2e-2)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("n", [6, 40])
@pytest.mark.parametrize("model", ["flash-attn", "sdpa", "flex", "linear-attn"])
def test_gpu_decode_of_gqa_windows_and_linear_attention_equals_the_forward(model: str, n: int) -> None:
    options: dict[str, Any] = {"heads_kv": 2} | ({} if model == "linear-attn" else {"window": 16})
    case = decode_case(model, "block", dtype="bfloat16", device="cuda", d_model=256, n=n, **options)
    reason = probe(case, "cuda")
    if reason is not None:
        pytest.skip(reason)
    decoded, reference = decoded_against_forward(case, "cuda")
    torch.testing.assert_close(decoded.float(), reference.float(), atol=5e-2, rtol=0.05)


def test_the_fla_kernel_is_an_unsupported_row_with_its_reason_where_it_cannot_run() -> None:
    for mode in ("forward", "train", "decode"):
        case = replace(case_of("linear-attn", kernel="fla"), mode=mode)  # type: ignore[arg-type]
        assert mentions(probe(case, "cpu") or "", "fla", "CUDA")  # the kernel asked for, and what it needs


def _fake_fla(calls: list[dict[str, object]]) -> object:
    """chunk_linear_attn's contract (B, T, H, D) in and out, normalised, scale as given; computed with the torch
    chunked form; fla's guard against a head-first layout (T < H raises DeprecationWarning) included."""
    import types

    from attnbench.families.linear.layers import linear_attention

    def chunk_linear_attn(
        q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=True, head_first=False
    ):  # type: ignore[no-untyped-def]
        calls.append({"q": tuple(q.shape), "scale": scale, "normalize": normalize, "head_first": head_first})
        if q.shape[1] < q.shape[2]:
            raise DeprecationWarning(f"seq_len ({q.shape[1]}) < num_heads ({q.shape[2]})")
        y, _, _ = linear_attention(
            q.transpose(1, 2),
            k.transpose(1, 2),
            v.transpose(1, 2),
            form="chunked",
            feature="relu",
            decay=None,
            chunk=64,
        )
        return y.transpose(1, 2), None

    module = types.ModuleType("fla.ops.linear_attn")
    module.chunk_linear_attn = chunk_linear_attn  # type: ignore[attr-defined]
    return module


def test_kernel_fla_routes_through_flas_function_and_says_when_it_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    """The rows labelled fla once timed the torch form (the option never reached the model): a stand-in package
    proves each layer now calls chunk_linear_attn, in its layout, with q unscaled."""
    import sys

    calls: list[dict[str, object]] = []
    monkeypatch.setitem(sys.modules, "fla.ops.linear_attn", _fake_fla(calls))
    case = case_of("linear-attn", seq_len=24, kernel="fla")  # two layers
    torch.manual_seed(0)
    built = build_model(case, "cpu", torch.float64)
    built(make_input(case, "cpu", torch.float64))
    assert calls == [{"q": (2, 24, 4, 8), "scale": 1.0, "normalize": True, "head_first": False}] * 2
    # T < H: fla's guard, an unsupported case that says why (not an error row).
    short = case_of("linear-attn", seq_len=3, kernel="fla")
    with pytest.raises(NotImplementedError) as caught:
        build_model(short, "cpu", torch.float64)(make_input(short, "cpu", torch.float64))
    assert mentions(str(caught.value), "seq_len", "heads", values=(3, 4))


@pytest.mark.parametrize("heads_kv", [4, 2])
def test_packed_lengths_with_kernel_fla_run_one_varlen_call_per_layer(
    heads_kv: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52, item 4: packed lengths with ``kernel: fla`` run ONE call of chunk_linear_attn per layer over the
    joined sequences, with their cu_seqlens (int64, as fla takes them), instead of a loop over the sequences. fla's
    Triton kernels cannot run on this CPU, so a substitute stands in where our code resolves the function
    (``fla_chunked``): fla's varlen contract, computed per segment by the torch chunked form; the packed output must
    be each sequence alone, in float64. The real kernel runs in
    ``test_the_real_fla_kernel_packs_linear_attention_in_one_varlen_call`` (CUDA)."""
    from attnbench.families.linear import layers as linear
    from attnbench.families.states import packed, spans

    calls: list[torch.Tensor] = []
    one = _fake_fla([]).chunk_linear_attn  # type: ignore[attr-defined]

    def chunk_linear_attn(
        q, k, v, scale=None, initial_state=None, output_final_state=False, normalize=True, cu_seqlens=None
    ):  # type: ignore[no-untyped-def]
        calls.append(cu_seqlens)
        ends = [0, q.shape[1]] if cu_seqlens is None else cu_seqlens.tolist()  # None: one sequence alone
        outs = [
            one(q[:, a:b], k[:, a:b], v[:, a:b], scale, None, False, normalize)[0] for a, b in itertools.pairwise(ends)
        ]
        return torch.cat(outs, dim=1), None

    monkeypatch.setattr(linear, "fla_chunked", lambda: chunk_linear_attn)
    lengths = (9, 4, 11)  # each ≥ heads: fla's head-first guard would refuse a shorter one alone
    case = replace(case_of("linear-attn", kernel="fla", heads_kv=heads_kv), batch=3, seq_len=11, packing=lengths)
    torch.manual_seed(0)
    module = build_model(case, "cpu", torch.float64).eval()
    x = make_input(case, "cpu", torch.float64)
    with torch.no_grad():
        out = packed(module, x, lengths)
        assert [cu.tolist() for cu in calls] == [[0, 9, 13, 24]] * case.layers  # one call per layer, the lengths'
        assert all(cu.dtype == torch.int64 for cu in calls) and calls[0] is calls[1]  # built once, shared
        calls.clear()
        alone = [module(x[:, a:b]) for a, b in spans(lengths)]
        assert len(calls) == len(lengths) * case.layers  # alone: one (non-varlen) call per sequence and layer
        for (a, b), each in zip(spans(lengths), alone, strict=True):
            torch.testing.assert_close(out[:, a:b], each, atol=1e-10, rtol=1e-10)


@cuda
@pytest.mark.gpu
@pytest.mark.compiles(limit_s=60)  # Triton compiles fla's varlen kernels on a cold cache
def test_the_real_fla_kernel_packs_linear_attention_in_one_varlen_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52, item 4, on the real kernel: a packed call is one call of chunk_linear_attn per layer, with the
    lengths' cu_seqlens, and equals each sequence run alone (through the same kernel, bf16)."""
    import inspect

    from attnbench.families.linear import layers as linear
    from attnbench.families.states import packed, spans

    lengths = (100, 37, 157)
    whole = replace(case_of("linear-attn", dtype="bfloat16", seq_len=157, kernel="fla"), device="cuda", batch=3)
    reason = probe(whole, "cuda")  # the kernel itself (the packed case's probe is the serving question's)
    if reason is not None:
        assert reason.startswith("linear-attn kernel fla:")
        pytest.skip(reason)
    case = replace(whole, packing=lengths)
    real = linear.fla_chunked()
    calls: list[torch.Tensor | None] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("cu_seqlens"))
        return real(*args, **kwargs)

    spy.__signature__ = inspect.signature(real)  # type: ignore[attr-defined]  # the arguments it names: fla's
    monkeypatch.setattr(linear, "fla_chunked", lambda: spy)
    torch.manual_seed(0)
    module = build_model(case, "cuda", torch.bfloat16).eval()
    x = make_input(case, "cuda", torch.bfloat16)
    with torch.no_grad():
        out = packed(module, x, lengths)
        assert len(calls) == case.layers, f"chunk_linear_attn: {len(calls)} calls for {case.layers} layers"
        for cu in calls:
            assert cu is not None and cu.dtype == torch.int64 and cu.tolist() == [0, 100, 137, 294]
        for a, b in spans(lengths):
            torch.testing.assert_close(out[:, a:b].float(), module(x[:, a:b]).float(), atol=5e-2, rtol=5e-2)


@cuda
@pytest.mark.gpu
@pytest.mark.parametrize("heads_kv", [4, 2])
def test_the_fla_kernel_computes_the_chunked_form_or_says_why_not(
    heads_kv: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from attnbench.families.linear import layers as linear

    case = replace(
        case_of("linear-attn", dtype="bfloat16", seq_len=200, kernel="fla", heads_kv=heads_kv), device="cuda"
    )
    reason = probe(case, "cuda")
    if reason is not None:
        assert reason.startswith("linear-attn kernel fla:")
        pytest.skip(reason)
    called: list[int] = []
    real = linear.fla_chunked()

    def spy(*args: object, **kwargs: object) -> object:
        called.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(linear, "fla_chunked", lambda: spy)
    generator = torch.Generator(device="cuda").manual_seed(1)
    x = torch.randn(2, 200, 32, generator=generator, device="cuda", dtype=torch.bfloat16)
    grad = torch.randn(2, 200, 32, generator=generator, device="cuda", dtype=torch.bfloat16)
    reference = replace(case, options=tuple(o for o in case.options if o[0] != "kernel"))
    ref, ref_grads = forward_and_grads(reference, x, grad, "cuda", compute_dtype=torch.float32)
    out, grads = forward_and_grads(case, x, grad, "cuda")
    assert called, "the fla kernel was never called: the row would time the torch form"
    torch.testing.assert_close(out.float(), ref, atol=3e-2, rtol=3e-2)
    torch.testing.assert_close(grads["input"].float(), ref_grads["input"], atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("model", ["vanilla", "sdpa-math"])
def test_a_models_band_is_made_once_per_length_bool_only_and_shared_by_its_layers(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per call it was an int64 (T, T) distance matrix, 8·T² bytes (+8 GiB at 32k) in every timed call."""
    from attnbench.families.attention import layers as attention

    made: list[torch.Tensor | None] = []
    real = attention.band_mask

    def counting(length: int, **kwargs: object) -> torch.Tensor | None:
        made.append(real(length, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(attention, "band_mask", counting)
    case = Case(model, "forward", "float32", "cpu", 1, 32, 16, 2, 3, True, (("window", 8),))
    built = build_model(case, "cpu", torch.float32)
    x = make_input(case, "cpu", torch.float32)
    with torch.inference_mode():
        for _ in range(3):
            built(x)
    assert len(made) == 1 and made[0] is not None and made[0].dtype == torch.bool
    built(x)  # with grads on: a mask of its own (an inference-mode tensor cannot be saved for a backward)
    assert len(made) == 2


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sdpa_reads_its_band_as_a_cached_additive_mask_in_the_rows_dtype(
    dtype: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bool mask SDPA converts to an additive one inside every call (2·T² bytes per layer and call in 16-bit, which
    the kernel then reads): the model hands it the additive mask, made once."""
    from attnbench.families.attention import layers as attention

    masks: list[torch.Tensor] = []
    real = attention.F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        masks.append(kwargs["attn_mask"])
        return real(*args, **kwargs)

    monkeypatch.setattr(attention.F, "scaled_dot_product_attention", spy)
    case = Case("sdpa-math", "forward", dtype, "cpu", 1, 32, 16, 2, 2, True, (("window", 8),))
    built = build_model(case, "cpu", torch_dtype(dtype))
    x = make_input(case, "cpu", torch_dtype(dtype))
    with torch.inference_mode():
        for _ in range(2):
            built(x)
    assert len(masks) == 4  # two layers, two calls
    assert all(m is masks[0] for m in masks)  # one tensor, made once
    assert masks[0].dtype == torch_dtype(dtype)
    keep = band_mask(32, causal=True, window=8, device=torch.device("cpu"))
    assert keep is not None
    assert torch.equal(masks[0] == 0, keep) and bool(torch.isneginf(masks[0][~keep]).all())


def test_flex_block_masks_come_from_create_block_mask_compiled_not_its_deprecated_flag(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from attnbench.families.attention import layers as attention

    calls: list[tuple[Any, ...]] = []

    def compiled(*args: Any, **kwargs: Any) -> str:
        calls.append((*args, kwargs))
        return "block mask"

    monkeypatch.setattr(attention, "_COMPILED_BLOCK_MASK", [compiled])
    cache = attention.MaskCache()
    for _ in range(2):  # once per length for every layer
        assert cache.block(64, causal=True, window=0, device=torch.device("cpu")) == "block mask"
    assert len(calls) == 1
    *args, kwargs = calls[0]
    assert args[1:] == [None, None, 64, 64] and kwargs == {"device": torch.device("cpu")}  # no _compile=True
