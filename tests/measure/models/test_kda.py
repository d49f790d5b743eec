"""Kimi Delta Attention: the chunked and recurrent cores equal fla-core's own naive recurrence (loaded from the
installed package's file, no Triton) and the paper's recurrence with its explicit transition, values and gradients in
float64; the layer's two forms agree; decoding equals the whole sequence; the torch-free formulas (parameters, FLOPs,
state bytes) are the module's; ``kernel: fla`` really routes through ``chunk_kda``."""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import sys
import types
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.flop_counter import FlopCounterMode

from attnbench.core.cases import Case, Mode
from attnbench.families.catalogue import cannot_build, no_effect
from attnbench.families.flops import count_flops, count_parameters
from attnbench.families.kda import layers as kd
from attnbench.families.kda.layers import KDA, kda_chunked, kda_recurrent
from attnbench.families.registry import build_model, make_input, parameter_count, probe
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import decodable, packed, prefill, spans, tensor_bytes
from attnbench.families.torch_family import make_decode_inputs

F64 = torch.float64
TOL: dict[str, Any] = {"atol": 1e-10, "rtol": 1e-10}
B, H, DK, DV = 2, 2, 4, 5  # d_v ≠ d_k: a transposed state would not run
LENGTHS = (13, 16)  # no chunk above 1 below divides 13
CHUNKS = (1, 3, 4, 16)
D_MODEL, HEADS = 8, 2


def fla_naive() -> types.ModuleType:
    """fla-core's ``fla/ops/kda/naive.py``, loaded from its file: the package's ``__init__`` imports Triton, the
    reference itself only torch and einops."""
    spec = importlib.util.find_spec("fla")
    assert spec is not None and spec.submodule_search_locations, "fla-core (a test dependency) is not installed"
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / "kda" / "naive.py"
    loaded = importlib.util.spec_from_file_location("fla_kda_naive", path)
    assert loaded is not None and loaded.loader is not None
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    return module


def paper_reference(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial: Tensor) -> tuple[Tensor, Tensor]:
    """S_t = S_{t−1} Diag(α_t)(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t/√d_k (arXiv:2510.26692 eq. 1), the
    explicit d_k × d_k transition in the paper's d_v × d_k orientation; the state in and out key-major."""
    d_k = q.shape[-1]
    s = initial.transpose(-1, -2)
    eye = torch.eye(d_k, dtype=q.dtype)
    out = []
    for t in range(q.shape[2]):
        k_t, b_t = k[:, :, t], beta[:, :, t][..., None, None]
        transition = torch.diag_embed(g[:, :, t].exp()) @ (eye - b_t * k_t[..., :, None] * k_t[..., None, :])
        s = s @ transition + b_t * v[:, :, t][..., :, None] * k_t[..., None, :]
        out.append((s @ q[:, :, t, :, None])[..., 0] * d_k**-0.5)
    return torch.stack(out, dim=2), s.transpose(-1, -2)


def core_inputs(length: int, seed: int = 0, *, steep: bool = False) -> dict[str, Tensor]:
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=F64)

    g = -F.softplus(randn(B, H, length, DK)) * (40.0 if steep else 1.0)  # steep: e^{−G} overflows any factoring
    x = {
        "q": randn(B, H, length, DK),
        "k": F.normalize(randn(B, H, length, DK), dim=-1),
        "v": randn(B, H, length, DV),
        "g": g,
        "beta": torch.rand(B, H, length, generator=gen, dtype=F64),
        "initial": randn(B, H, DK, DV),
    }
    return {name: t.requires_grad_() for name, t in x.items()}


def fla_layout(naive: Callable[..., tuple[Tensor, Tensor]], **kw: Any) -> Callable[..., tuple[Tensor, Tensor]]:
    """An fla reference in our head-major layout."""

    def run(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial: Tensor) -> tuple[Tensor, Tensor]:
        o, s = naive(
            *(t.transpose(1, 2) for t in (q, k, v, g, beta)), initial_state=initial, output_final_state=True, **kw
        )
        return o.transpose(1, 2), s

    return run


def outputs_and_gradients(core: Callable[..., tuple[Tensor, Tensor]], x: dict[str, Tensor]) -> list[Tensor]:
    o, s = core(**x)
    gen = torch.Generator().manual_seed(123)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=F64)).sum() + (
        s * torch.randn(s.shape, generator=gen, dtype=F64)
    ).sum()
    return [o.detach(), s.detach(), *torch.autograd.grad(loss, list(x.values()))]


def assert_all_close(got: list[Tensor], want: list[Tensor]) -> None:
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, **TOL)


# ----------------------------------------------------------------------------------------------- the cores
@pytest.mark.parametrize("length", LENGTHS)
def test_the_cores_equal_flas_naive_recurrence_and_the_papers(length: int) -> None:
    """Held to the paper's recurrence in float64 at 1e-10; fla's naive reference computes in float32 (it casts its
    inputs), so it is held to within float32's rounding: it pins the layout and the convention (decay before the
    read), which the paper's equation leaves to the reader."""
    naive = fla_naive()
    x = core_inputs(length)
    want = outputs_and_gradients(paper_reference, x)
    for fla, ours in zip(outputs_and_gradients(fla_layout(naive.naive_recurrent_kda), x), want, strict=True):
        torch.testing.assert_close(fla.double(), ours, atol=2e-5, rtol=2e-5)
    assert_all_close(outputs_and_gradients(kda_recurrent, x), want)
    for chunk in CHUNKS:
        assert_all_close(outputs_and_gradients(lambda chunk=chunk, **kw: kda_chunked(chunk=chunk, **kw), x), want)


def test_the_chunked_core_equals_flas_naive_chunked_form_where_it_runs() -> None:
    """fla's naive chunked form asserts that the chunk divides T: 16 tokens in chunks of 4."""
    x = core_inputs(16, seed=3)
    want = outputs_and_gradients(fla_layout(fla_naive().naive_chunk_kda, chunk_size=4), x)
    got = outputs_and_gradients(lambda **kw: kda_chunked(chunk=4, **kw), x)
    for ours, fla in zip(got, want, strict=True):  # fla's reference computes in float32
        torch.testing.assert_close(ours, fla.double(), atol=2e-5, rtol=2e-5)


def test_steep_decays_stay_finite_in_the_chunked_form() -> None:
    """log α down to ≈ −200 per token: e^{−G} of a chunk's sum would overflow; the masked differences do not."""
    x = {name: t.detach().float() for name, t in core_inputs(13, steep=True).items()}
    want, _ = kda_recurrent(**x)
    got, _ = kda_chunked(chunk=8, **x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_a_sequence_in_two_pieces_is_the_whole() -> None:
    x = {name: t.detach() for name, t in core_inputs(13).items()}
    whole, final = kda_chunked(chunk=4, **x)
    first = {name: t[:, :, :6] if t.dim() > 3 or name == "beta" else t for name, t in x.items() if name != "initial"}
    rest = {name: t[:, :, 6:] if t.dim() > 3 or name == "beta" else t for name, t in x.items() if name != "initial"}
    a, mid = kda_chunked(chunk=4, initial=x["initial"], **first)
    b, end = kda_recurrent(initial=mid, **rest)
    torch.testing.assert_close(torch.cat([a, b], dim=2), whole, **TOL)
    torch.testing.assert_close(end, final, **TOL)


# ----------------------------------------------------------------------------------------------- the layer
def layer(**options: Any) -> KDA:
    torch.manual_seed(0)
    return KDA(D_MODEL, HEADS, chunk=4, dtype=F64, **options)


def inputs(length: int, seed: int = 1) -> Tensor:
    return torch.randn(B, length, D_MODEL, generator=torch.Generator().manual_seed(seed), dtype=F64)


@pytest.mark.parametrize("options", [{}, {"expand_v": 2, "output_gate": False, "head_dim": 3}])
def test_the_layers_forms_agree_values_and_gradients(options: dict[str, Any]) -> None:
    made = layer(**options)
    for length in LENGTHS:
        x = inputs(length).requires_grad_()
        made.form = "recurrent"
        want = made(x)
        want_grads = torch.autograd.grad(want.square().sum(), [x, *made.parameters()])
        made.form = "chunked"
        for chunk in CHUNKS:
            made.chunk = chunk
            got = made(x)
            torch.testing.assert_close(got, want, **TOL)
            if length == 13 and chunk in (3, 16):
                grads = torch.autograd.grad(got.square().sum(), [x, *made.parameters()])
                assert_all_close(list(grads), list(want_grads))


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
def test_a_step_after_a_prefill_is_the_whole_sequence_at_every_position(form: str) -> None:
    made, x = layer(form=form), inputs(13)
    with torch.no_grad():
        whole = made(x)
        for n in range(13):
            state = made.init_state(B, 14)
            torch.testing.assert_close(made.prefill(x[:, :n], state), whole[:, :n], **TOL)
            step = made.step(x[:, n : n + 1], state)
            torch.testing.assert_close(step, whole[:, n : n + 1], **TOL)
            torch.testing.assert_close(made.step(x[:, n : n + 1], state), step, atol=0, rtol=0)  # the state stayed


def test_a_layer_is_causal() -> None:
    made, x = layer(), inputs(13)
    later = x.clone()
    later[:, 7:] += 1.0
    with torch.no_grad():
        torch.testing.assert_close(made(x)[:, :7], made(later)[:, :7], **TOL)


def test_bad_sizes_say_which() -> None:
    with pytest.raises(ValueError, match="heads 3 must divide d_model 8"):
        KDA(8, 3)
    with pytest.raises(ValueError, match="unknown form"):
        KDA(8, 2, form="parallel")
    assert KDA(8, 3, head_dim=4).d_k == 4


# ----------------------------------------------------------------------------------------------- the network
def case(
    model: str = "kda",
    mode: Mode = "forward",
    seq_len: int = 13,
    *,
    dtype: str = "float32",
    layers: int = 2,
    **options: Any,
) -> Case:
    chosen = {"chunk": 4, **options} if mode != "decode" else options
    return Case(model, mode, dtype, "cpu", 2, seq_len, 16, 2, layers, True, tuple(sorted(chosen.items())))


@pytest.mark.parametrize("scope", ["core", "block", "model"])
def test_decoding_equals_the_whole_sequence_forward(scope: str) -> None:
    c = case(mode="decode", seq_len=11, dtype="float64", scope=scope, **({"vocab": 50} if scope == "model" else {}))
    torch.manual_seed(0)
    net = build_model(c, "cpu", F64).eval()
    context, token = make_decode_inputs(c, "cpu", F64)
    with torch.inference_mode():
        full = net(torch.cat([context, token], dim=1))
        state = prefill(net, context, c.span)
        step = decodable(net).step(token, state)
        torch.testing.assert_close(step[:, 0], full[:, -1], **TOL)
        state.advance()
        longer = net(torch.cat([context, token, token], dim=1))
        torch.testing.assert_close(decodable(net).step(token, state)[:, 0], longer[:, -1], **TOL)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_decode_state_is_constant_in_n_and_is_the_formula(dtype: str) -> None:
    sizes = []
    for n in (1, 5, 40):
        c = case(mode="decode", seq_len=n, dtype=dtype, scope="block")
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


def test_the_state_bytes_by_hand() -> None:
    # d_model 16, 2 heads: d_k = d_v = 8; conv inputs 3 × (2·2·8 + 2·8) = 144; memory 2·8·8 = 128; 2 sequences.
    assert state_bytes(case(mode="decode", layers=1)) == 2 * (144 + 128) * 4
    assert state_bytes(case(mode="decode", dtype="bfloat16", layers=1)) == 2 * (144 * 2 + 128 * 4)


@pytest.mark.parametrize(
    "options",
    [{}, {"scope": "block", "head_dim": 6, "expand_v": 3}, {"scope": "model", "vocab": 97, "output_gate": False}],
)
def test_the_parameter_count_is_the_formula(options: dict[str, Any]) -> None:
    c = case(**options)
    assert parameter_count(build_model(c, "cpu", torch.float32)) == count_parameters(c)


def counted(c: Case) -> dict[str, int]:
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
        x = make_input(c, "cpu", torch.float32)
        if c.mode == "forward":
            with counter, torch.inference_mode():
                net(x)
        else:
            x.requires_grad_(True)
            with counter:
                net(x).sum().backward()
    return {str(op): int(flops) for op, flops in counter.get_flop_counts().get("Global", {}).items()}


@pytest.mark.parametrize(
    ("seq_len", "options"),
    [
        (13, {}),
        (16, {}),
        (13, {"chunk": 16}),
        (13, {"chunk": 1}),
        (13, {"form": "recurrent"}),
        (13, {"scope": "block"}),
        (13, {"output_gate": False, "head_dim": 3, "expand_v": 2}),
    ],
)
def test_the_flop_formula_is_what_the_counter_sees(seq_len: int, options: dict[str, Any]) -> None:
    """Exactly, less the triangular solve, which the counter does not see."""
    c = case(seq_len=seq_len, **options)
    ops, ours = counted(c), count_flops(c)
    assert set(ops) <= {"aten.mm", "aten.addmm", "aten.bmm"}
    assert sum(ops.values()) == ours.flops - ours.detail.get("solve", 0)
    assert ops.get("aten.mm", 0) + ops.get("aten.addmm", 0) == ours.detail["projections"]
    assert ("solve" in ours.detail) == (options.get("form") != "recurrent" and options.get("chunk") != 1)


@pytest.mark.parametrize("scope", ["core", "block"])
def test_a_decode_step_is_one_step_of_the_recurrence(scope: str) -> None:
    c = case(mode="decode", seq_len=40, scope=scope)
    assert sum(counted(c).values()) == count_flops(c).flops
    assert count_flops(c).formula == f"kda-recurrent{'-block' * (scope == 'block')}-decode-v1"
    assert count_flops(case(mode="decode", seq_len=4000, scope=scope)).flops == count_flops(c).flops  # constant in n


def test_the_formula_ids_and_train() -> None:
    assert count_flops(case()).formula == "kda-chunked-v1"
    assert count_flops(case(form="recurrent")).formula == "kda-recurrent-v1"
    assert count_flops(case(mode="train", seq_len=16)).flops == 3 * count_flops(case(seq_len=16)).flops


def test_options_that_change_nothing_or_build_nothing_are_refused() -> None:
    chunk = no_effect("kda", "chunk", {"form": "recurrent"})
    assert chunk is not None and chunk.option == "chunk"
    assert no_effect("kda", "chunk", {"kernel": "fla"}) is not None
    assert no_effect("kda", "chunk", {}) is None
    odd = cannot_build(Case("kda", "forward", "float32", "cpu", 1, 8, 10, 3, 1, True))
    assert odd is not None and odd.option == "head_dim"


# ----------------------------------------------------------------------------------------------- kernel: fla
def test_the_kernel_is_an_unsupported_row_where_it_cannot_run() -> None:
    reason = probe(case(kernel="fla"), "cpu")
    assert reason is not None and reason.startswith("kda kernel fla:")
    wide = kd.kernel_problem(case(kernel="fla", head_dim=512), "cuda")
    assert wide is not None and "512" in wide and "256" in wide


def test_kernel_fla_routes_through_chunk_kda(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused path, proven to run: a stand-in with fla's contract records each call (the real one needs a GPU)."""
    calls: list[dict[str, Any]] = []

    def chunk_kda(q, k, v, g, beta, *, scale, initial_state, output_final_state):  # type: ignore[no-untyped-def]
        calls.append({"q": q.shape, "g": g.shape, "scale": scale, "state": initial_state is not None})
        o, s = kda_chunked(*(t.transpose(1, 2) for t in (q, k, v, g, beta)), 64, initial_state)
        return o.transpose(1, 2), s if output_final_state else None

    package = types.ModuleType("fla.ops.kda")
    package.chunk_kda = chunk_kda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fla.ops.kda", package)
    fused = layer(kernel="fla")
    x = inputs(13)
    with torch.no_grad():
        out = fused(x)
        state = fused.init_state(B, 14)
        fused.prefill(x[:, :7], state)
        fused.prefill(x[:, 7:], state)
        fused.kernel = "torch"
        torch.testing.assert_close(out, fused(x), **TOL)
        plain = fused.init_state(B, 14)
        fused.prefill(x, plain)
    assert_all_close(list(state.tensors()), list(plain.tensors()))
    assert [c["state"] for c in calls] == [False, True, True]
    assert calls[0]["q"] == (B, 13, HEADS, 4) and calls[0]["g"] == (B, 13, HEADS, 4) and calls[0]["scale"] == 0.5


def test_kernel_fla_passes_head_first_false_where_the_installed_chunk_kda_names_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As the delta rules (issue 48): an fla whose default is head-first would read (B, T, H, D) as (B, H, T, D)."""
    seen: list[object] = []

    def chunk_kda(q, k, v, g, beta, *, scale, initial_state, output_final_state, head_first=True):  # type: ignore[no-untyped-def]
        seen.append(head_first)
        o, s = kda_chunked(*(t.transpose(1, 2) for t in (q, k, v, g, beta)), 64, initial_state)
        return o.transpose(1, 2), s if output_final_state else None

    package = types.ModuleType("fla.ops.kda")
    package.chunk_kda = chunk_kda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fla.ops.kda", package)
    with torch.no_grad():
        layer(kernel="fla")(inputs(13))
    assert seen == [False]


PACKING = (6, 2, 9)  # 2 < d_conv − 1: a short conv that leaked across a start would read the sequence before


def test_packed_lengths_with_kernel_fla_run_one_varlen_call_per_layer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52, item 4: packed lengths with ``kernel: fla`` run ONE call of ``chunk_kda`` per layer over the joined
    sequences, with their cu_seqlens (int64, as fla takes them), instead of a loop over the sequences; the short conv
    reads zero across each sequence's start. fla's Triton kernels cannot run on this CPU, so a substitute stands in
    where our code resolves the function (``fla_function``): fla's varlen contract, computed per segment by our
    torch chunked core; the packed output must be each sequence alone, in float64. The real kernel runs in
    ``test_the_real_chunk_kda_packs_its_sequences_in_one_varlen_call`` (CUDA)."""
    calls: list[Tensor] = []

    def chunk_kda(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu):  # type: ignore[no-untyped-def]
        calls.append(cu_seqlens)
        assert initial_state is None and torch.equal(cu_seqlens_cpu, cu_seqlens.cpu())
        ends, outs = cu_seqlens.tolist(), []
        for a, b in itertools.pairwise(ends):
            o, _ = kda_chunked(*(t[:, a:b].transpose(1, 2) for t in (q, k, v, g, beta)), 64, None)
            outs.append(o.transpose(1, 2))
        return torch.cat(outs, dim=1), None

    monkeypatch.setattr(kd, "fla_function", lambda *_: chunk_kda)
    c = replace(case(kernel="fla", scope="block"), batch=len(PACKING), packing=PACKING)
    torch.manual_seed(0)
    module = build_model(c, "cpu", F64).eval()
    x = torch.randn(1, sum(PACKING), c.d_model, dtype=F64)
    with torch.no_grad():
        out = packed(module, x, PACKING)
        assert [cu.tolist() for cu in calls] == [[0, 6, 8, 17]] * c.layers  # one call per layer, the lengths'
        assert all(cu.dtype == torch.int64 for cu in calls) and calls[0] is calls[1]  # built once, shared
        for layer_ in module.modules():
            if isinstance(layer_, KDA):
                layer_.kernel = "torch"
        calls.clear()
        for start, end in spans(PACKING):
            torch.testing.assert_close(out[:, start:end], module(x[:, start:end]), **TOL)
        torch.testing.assert_close(packed(module, x, PACKING), out, **TOL)  # the torch kernel: one by one, as before
    assert not calls


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.gpu
def test_the_real_chunk_kda_runs_and_agrees_with_the_torch_form(monkeypatch: pytest.MonkeyPatch) -> None:
    real = pytest.importorskip("fla.ops.kda", reason="flash-linear-attention's kernels need triton").chunk_kda
    calls: list[int] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(kd, "fla_function", lambda *_: spy)
    torch.manual_seed(0)
    made = KDA(256, 4, kernel="fla", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 256, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fused = made(x)
        made.kernel = "torch"
        plain = made(x)
    assert calls, "fla's chunk_kda was never called"
    torch.testing.assert_close(fused.float(), plain.float(), atol=5e-2, rtol=5e-2)


@cuda
@pytest.mark.gpu
@pytest.mark.compiles(limit_s=60)  # Triton compiles chunk_kda's varlen kernels on a cold cache
def test_the_real_chunk_kda_packs_its_sequences_in_one_varlen_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 52, item 4, on the real kernel: a packed call of a 2-layer stack is one call of ``chunk_kda`` per layer,
    with the lengths' cu_seqlens, and equals each sequence run alone (through the same kernel, bf16)."""
    real = pytest.importorskip("fla.ops.kda", reason="flash-linear-attention's kernels need triton").chunk_kda
    calls: list[Tensor | None] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("cu_seqlens"))
        return real(*args, **kwargs)

    spy.__signature__ = inspect.signature(real)  # type: ignore[attr-defined]  # the arguments it names: fla's
    monkeypatch.setattr(kd, "fla_function", lambda *_: spy)
    torch.manual_seed(0)
    stack = kd.KDAStack(256, 4, 2, kernel="fla", device="cuda", dtype=torch.bfloat16)
    lengths = (100, 3, 157)
    x = torch.randn(1, sum(lengths), 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        out = packed(stack, x, lengths)
        assert len(calls) == 2, f"chunk_kda: {len(calls)} calls for 2 layers"
        for cu in calls:
            assert cu is not None and cu.dtype == torch.int64 and cu.tolist() == [0, 100, 103, 260]
        for start, end in spans(lengths):
            alone = stack(x[:, start:end])
            torch.testing.assert_close(out[:, start:end].float(), alone.float(), atol=5e-2, rtol=5e-2)
