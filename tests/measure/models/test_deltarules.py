"""Gated DeltaNet, DeltaNet and RWKV-7: the chunked (WY/UT) cores, the recurrent cores and the papers' recurrences
written per token agree (values and gradients); the layers' two forms agree; decoding equals the whole-sequence
forward at every position; the torch-free formulas (parameters, FLOPs, state bytes) are the modules'; ``kernel: fla``
really routes through flash-linear-attention's functions."""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import inspect
import itertools
import sys
import types
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from attnbench.core.cases import Case, Mode
from attnbench.families.catalogue import cannot_build, no_effect
from attnbench.families.deltanet import layers as dn
from attnbench.families.deltanet.layers import DeltaNet, delta_rule_chunked, delta_rule_recurrent
from attnbench.families.flops import count_flops, count_parameters
from attnbench.families.registry import build_model, make_input, parameter_count, probe, torch_family
from attnbench.families.rwkv7 import layers as rw
from attnbench.families.rwkv7.layers import RWKV7, rwkv7_chunked, rwkv7_recurrent
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import decodable, packed, prefill, spans, tensor_bytes
from attnbench.families.torch_family import make_decode_inputs
from tests.support import mentions

F64 = torch.float64
TOL: dict[str, Any] = {"atol": 1e-10, "rtol": 1e-10}
B, H, DK, DV = 2, 2, 4, 5  # d_v ≠ d_k on purpose: a transposed state would not even run
LENGTHS = (13, 16)  # no chunk size above 1 below divides 13
CHUNKS = (1, 3, 4, 16)  # 16 ≥ T: one chunk
MODELS = ("gated-deltanet", "deltanet", "rwkv7")


# ----------------------------------------------------------------------------------------------- the papers
def delta_reference(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor, initial: Tensor
) -> tuple[Tensor, Tensor]:
    """S_t = S_{t−1}·α_t(I − β_t k_t k_tᵀ) + β_t v_t k_tᵀ, o_t = S_t q_t/√d_k, in the papers' d_v × d_k orientation
    with the explicit d_k × d_k transition (arXiv:2412.06464 eq. 10; DeltaNet α_t = 1); the state in and out
    key-major, as the layers keep it."""
    length, d_k = q.shape[2], q.shape[3]
    s = initial.transpose(-1, -2)  # (B, H, d_v, d_k)
    eye = torch.eye(d_k, dtype=q.dtype)
    out = []
    for t in range(length):
        k_t, b_t = k[:, :, t], beta[:, :, t][..., None, None]
        transition = eye - b_t * k_t[..., :, None] * k_t[..., None, :]
        if g is not None:
            transition = g[:, :, t].exp()[..., None, None] * transition
        s = s @ transition + b_t * v[:, :, t][..., :, None] * k_t[..., None, :]
        out.append((s @ q[:, :, t, :, None])[..., 0] * d_k**-0.5)
    return torch.stack(out, dim=2), s.transpose(-1, -2)


def rwkv7_reference(
    r: Tensor, w: Tensor, k: Tensor, v: Tensor, kk: Tensor, a: Tensor, initial: Tensor
) -> tuple[Tensor, Tensor]:
    """S_t = S_{t−1}(diag(e^{w_t}) − κ̂_tᵀ(a_t ⊙ κ̂_t)) + v_tᵀ k̃_t, o_t = S_t r_t (arXiv:2503.14456 eq. 14), the
    explicit N × N transition, the papers' orientation."""
    s = initial.transpose(-1, -2)
    out = []
    for t in range(r.shape[2]):
        kk_t = kk[:, :, t]
        transition = torch.diag_embed(w[:, :, t].exp()) - kk_t[..., :, None] * (a[:, :, t] * kk_t)[..., None, :]
        s = s @ transition + v[:, :, t][..., :, None] * k[:, :, t][..., None, :]
        out.append((s @ r[:, :, t, :, None])[..., 0])
    return torch.stack(out, dim=2), s.transpose(-1, -2)


def core_inputs(kind: str, length: int, seed: int = 0) -> dict[str, Tensor]:
    """Inputs in the ranges the layers make (every one needs a gradient), and a random entering state."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, dtype=F64)

    x: dict[str, Tensor] = {}
    if kind == "rwkv7":
        x = {
            "r": randn(B, H, length, DK),
            "w": -F.softplus(randn(B, H, length, DK)),  # wider than the layer's (−0.61, 0)
            "k": randn(B, H, length, DK),  # k̃ is not normalised
            "v": randn(B, H, length, DV),
            "kk": F.normalize(randn(B, H, length, DK), dim=-1),
            "a": torch.rand(B, H, length, DK, generator=gen, dtype=F64),
        }
    else:
        x = {
            "q": randn(B, H, length, DK),
            "k": F.normalize(randn(B, H, length, DK), dim=-1),
            "v": randn(B, H, length, DV),
            "beta": torch.rand(B, H, length, generator=gen, dtype=F64),
        }
        if kind == "gated-deltanet":
            x["g"] = -F.softplus(randn(B, H, length))
    x["initial"] = randn(B, H, DK, DV)
    return {name: t.requires_grad_() for name, t in x.items()}


Core = Callable[..., tuple[Tensor, Tensor]]


def cores(kind: str) -> tuple[Core, Core, Core]:
    """(reference, recurrent, chunked) with one signature: the inputs by name, then ``chunk``."""
    if kind == "rwkv7":
        return (
            lambda chunk=0, **x: rwkv7_reference(**x),
            lambda chunk=0, **x: rwkv7_recurrent(**x),
            lambda chunk=0, **x: rwkv7_chunked(chunk=chunk, **x),
        )
    gated = kind == "gated-deltanet"

    def split(x: dict[str, Tensor]) -> tuple[Tensor, ...]:
        return x["q"], x["k"], x["v"], x["g"] if gated else None, x["beta"]  # type: ignore[return-value]

    return (
        lambda chunk=0, **x: delta_reference(*split(x), x["initial"]),
        lambda chunk=0, **x: delta_rule_recurrent(*split(x), x["initial"]),
        lambda chunk=0, **x: delta_rule_chunked(*split(x), chunk, x["initial"]),
    )


def outputs_and_gradients(core: Core, x: dict[str, Tensor], **kw: Any) -> list[Tensor]:
    o, s = core(**x, **kw)
    gen = torch.Generator().manual_seed(123)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=F64)).sum() + (
        s * torch.randn(s.shape, generator=gen, dtype=F64)
    ).sum()
    return [o.detach(), s.detach(), *torch.autograd.grad(loss, list(x.values()))]


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("kind", MODELS)
def test_the_cores_equal_the_papers_recurrence_values_and_gradients(kind: str, length: int) -> None:
    reference, recurrent, chunked = cores(kind)
    x = core_inputs(kind, length)
    want = outputs_and_gradients(reference, x)
    for got in (outputs_and_gradients(recurrent, x), *(outputs_and_gradients(chunked, x, chunk=c) for c in CHUNKS)):
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, **TOL)


@pytest.mark.parametrize("kind", MODELS)
def test_a_sequence_in_two_pieces_is_the_whole(kind: str) -> None:
    _, _, chunked = cores(kind)
    x = {name: t.detach() for name, t in core_inputs(kind, 13).items()}
    whole, final = chunked(chunk=4, **x)
    first = {name: t if name == "initial" else t[:, :, :6] for name, t in x.items()}
    rest = {name: t[:, :, 6:] for name, t in x.items() if name != "initial"}
    y1, middle = chunked(chunk=4, **first)
    y2, last = chunked(chunk=4, initial=middle, **rest)
    torch.testing.assert_close(torch.cat([y1, y2], dim=2), whole, **TOL)
    torch.testing.assert_close(last, final, **TOL)


# ----------------------------------------------------------------------------------------------- the layers
D_MODEL, HEADS = 8, 2


def layer(model: str, *, chunk: int = 4, form: str = "chunked", **options: Any) -> DeltaNet | RWKV7:
    """A float64 layer with every parameter random (RWKV-7's per-channel recipe is too regular to test with)."""
    torch.manual_seed(0)
    made: DeltaNet | RWKV7
    if model == "rwkv7":
        made = RWKV7(D_MODEL, HEADS, decay_rank=3, a_rank=3, gate_rank=5, chunk=chunk, form=form, dtype=F64, **options)
    else:
        made = DeltaNet(D_MODEL, HEADS, gated=model == "gated-deltanet", chunk=chunk, form=form, dtype=F64, **options)
    with torch.no_grad():
        for p in made.parameters():
            p.copy_(0.5 * torch.randn_like(p))
    return made


def inputs(length: int, seed: int = 1) -> Tensor:
    return torch.randn(B, length, D_MODEL, generator=torch.Generator().manual_seed(seed), dtype=F64)


LAYERS = [
    ("gated-deltanet", {}),
    ("gated-deltanet", {"expand_v": 1, "output_gate": False, "head_dim": 3}),
    ("gated-deltanet", {"expand_v": 1, "heads_v": 4}),  # Qwen3-Next's grouped value heads
    ("deltanet", {}),
    ("deltanet", {"output_gate": True, "d_conv": 2}),
    ("rwkv7", {}),
]


@pytest.mark.parametrize(("model", "options"), LAYERS)
def test_the_layers_forms_agree_values_and_gradients(model: str, options: dict[str, Any]) -> None:
    made = layer(model, **options)
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
                for g, w in zip(
                    torch.autograd.grad(got.square().sum(), [x, *made.parameters()]), want_grads, strict=True
                ):
                    torch.testing.assert_close(g, w, **TOL)


@pytest.mark.parametrize("model", MODELS)
def test_a_layer_is_causal(model: str) -> None:
    made, x = layer(model), inputs(13)
    later = x.clone()
    later[:, 7:] += 1.0
    with torch.no_grad():
        torch.testing.assert_close(made(x)[:, :7], made(later)[:, :7], **TOL)


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
@pytest.mark.parametrize("model", MODELS)
def test_a_step_after_a_prefill_is_the_whole_sequence_at_every_position(model: str, form: str) -> None:
    made, x = layer(model, form=form), inputs(13)
    with torch.no_grad():
        whole = made(x)
        for n in range(13):  # n = 0, whole chunks and not
            state = made.init_state(B, 14)
            torch.testing.assert_close(made.prefill(x[:, :n], state), whole[:, :n], **TOL)
            step = made.step(x[:, n : n + 1], state)
            torch.testing.assert_close(step, whole[:, n : n + 1], **TOL)
            torch.testing.assert_close(made.step(x[:, n : n + 1], state), step, atol=0, rtol=0)  # the state stayed
        state = made.init_state(B, 14)
        steps = []
        for t in range(13):  # token by token from the empty state
            steps.append(made.step(x[:, t : t + 1], state))
            state.advance()
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, **TOL)


@pytest.mark.parametrize("model", MODELS)
def test_a_context_in_pieces_is_the_context_in_one(model: str) -> None:
    made, x = layer(model), inputs(13)
    with torch.no_grad():
        one = made.init_state(B, 14)
        whole = made.prefill(x, one)
        for cut in (1, 4, 6, 12):
            two = made.init_state(B, 14)
            pieces = torch.cat([made.prefill(x[:, :cut], two), made.prefill(x[:, cut:], two)], dim=1)  # type: ignore[list-item]
            torch.testing.assert_close(pieces, whole, **TOL)
            for a, b in zip(two.tensors(), one.tensors(), strict=True):
                torch.testing.assert_close(a, b, **TOL)


def test_advance_needs_a_step_first() -> None:
    state = layer("deltanet").init_state(B, 4)
    with pytest.raises(ValueError, match="needs a step first"):
        state.advance()


def test_bad_sizes_say_which() -> None:
    with pytest.raises(ValueError) as caught:
        DeltaNet(8, 3)
    assert mentions(str(caught.value), "heads", "d_model", values=(3, 8))

    with pytest.raises(ValueError, match="heads must be positive"):
        DeltaNet(8, 0)
    with pytest.raises(ValueError, match="unknown form"):
        RWKV7(8, 2, form="parallel")
    with pytest.raises(ValueError, match="unknown kernel"):
        DeltaNet(8, 2, kernel="triton")
    assert DeltaNet(8, 3, head_dim=4).d_k == 4  # a head_dim of its own needs no division


# ----------------------------------------------------------------------------------------------- the network
def case(
    model: str, mode: Mode = "forward", seq_len: int = 13, *, dtype: str = "float32", layers: int = 2, **options: Any
) -> Case:
    chosen = {"chunk": 4, **options} if mode != "decode" else options
    return Case(model, mode, dtype, "cpu", 2, seq_len, 16, 2, layers, True, tuple(sorted(chosen.items())))


@pytest.mark.parametrize("scope", ["core", "block", "model"])
@pytest.mark.parametrize("model", MODELS)
def test_decoding_equals_the_whole_sequence_forward(model: str, scope: str) -> None:
    c = case(model, "decode", 11, dtype="float64", scope=scope, **({"vocab": 50} if scope == "model" else {}))
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
@pytest.mark.parametrize("model", MODELS)
def test_the_decode_state_is_constant_in_n_and_is_the_formula(model: str, dtype: str) -> None:
    sizes = []
    for n in (1, 5, 40):
        c = case(model, "decode", n, dtype=dtype, scope="block")
        net = build_model(c, "cpu", getattr(torch, dtype))
        context, token = make_decode_inputs(c, "cpu", getattr(torch, dtype))
        with torch.inference_mode():
            state = prefill(net, context, c.span)
            decodable(net).step(token, state)
            state.advance()
        state.drop_scratch()
        assert tensor_bytes(state) == state_bytes(c)
        sizes.append(state_bytes(c))
        memories = [t for t in state.tensors() if t.dim() == 4]
        assert len(memories) == 2 and all(t.dtype == torch.float32 for t in memories)  # fla's dtype, for bf16 too
    assert sizes[0] == sizes[1] == sizes[2]


def test_the_state_bytes_by_hand() -> None:
    # Gated DeltaNet, d_model 16, 2 heads: d_k 8, d_v 16; conv inputs 3 × (2·2·8 + 2·16) = 192; memory 2·8·16 = 256.
    assert state_bytes(case("gated-deltanet", "decode", layers=1)) == 2 * (192 + 256) * 4
    # bfloat16: the conv inputs in 2 bytes, the memory in float32.
    assert state_bytes(case("gated-deltanet", "decode", dtype="bfloat16", layers=1)) == 2 * (192 * 2 + 256 * 4)
    # RWKV-7: the previous token (16) and 2 heads of 8 × 8.
    assert state_bytes(case("rwkv7", "decode", layers=1)) == 2 * (16 + 128) * 4


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("gated-deltanet", {}),
        ("gated-deltanet", {"scope": "block", "head_dim": 6, "expand_v": 3}),
        ("gated-deltanet", {"scope": "model", "vocab": 97, "output_gate": False}),
        ("gated-deltanet", {"scope": "block", "heads_v": 4, "expand_v": 1}),
        ("deltanet", {"heads_v": 6}),
        ("deltanet", {}),
        ("deltanet", {"output_gate": True, "d_conv": 3, "positional": "learned"}),
        ("rwkv7", {}),
        ("rwkv7", {"scope": "block", "decay_rank": 8, "gate_rank": 4}),
    ],
)
def test_the_parameter_count_is_the_formula(model: str, options: dict[str, Any]) -> None:
    c = case(model, **options)
    assert parameter_count(build_model(c, "cpu", torch.float32)) == count_parameters(c)


def test_rwkv7_ranks_are_flas_by_default() -> None:
    # fla: decay = a = max(32, round(2.5·√d·(N/64)/32)·32), gate = max(32, round(5·√d/32)·32).
    assert RWKV7(1024, 16).ranks == (64, 64, 160)  # round(2.5) = 2: Python rounds half to even, as fla does
    assert RWKV7(768, 12).ranks == (64, 64, 128)
    assert RWKV7(64, 4).ranks == (32, 32, 32)


def counted(c: Case) -> dict[str, int]:
    """What torch's FlopCounterMode sees of one call of ``c``, by op."""
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


def test_the_counter_does_not_see_a_triangular_solve() -> None:
    """Why the formula's ``solve`` is left out where it is held to the counter."""
    a = torch.eye(5, dtype=F64) + torch.randn(5, 5, dtype=F64).tril(-1)
    with FlopCounterMode(display=False) as counter:
        torch.linalg.solve_triangular(a, torch.randn(5, 3, dtype=F64), upper=False, unitriangular=True)
    assert counter.get_total_flops() == 0


@pytest.mark.parametrize(
    ("seq_len", "options"),
    [
        (13, {}),
        (16, {}),
        (13, {"chunk": 16}),
        (13, {"chunk": 1}),
        (13, {"form": "recurrent"}),
        (13, {"scope": "block"}),
    ],
)
@pytest.mark.parametrize("model", MODELS)
def test_the_flop_formula_is_what_the_counter_sees(model: str, seq_len: int, options: dict[str, Any]) -> None:
    """Exactly, less the triangular solve, which the counter does not see (and which is 0 for chunks of 1)."""
    c = case(model, seq_len=seq_len, **options)
    ops, ours = counted(c), count_flops(c)
    assert set(ops) <= {"aten.mm", "aten.addmm", "aten.bmm"}  # the conv is element-wise: nothing else is counted
    assert sum(ops.values()) == ours.flops - ours.detail.get("solve", 0)
    assert ops.get("aten.mm", 0) + ops.get("aten.addmm", 0) == ours.detail["projections"]  # Linear; the core's: bmm
    assert ("solve" in ours.detail) == (options.get("form") != "recurrent" and options.get("chunk") != 1)


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
@pytest.mark.parametrize("model", MODELS)
def test_the_train_formula_is_within_its_bound_of_the_counter(model: str, form: str) -> None:
    """train = forward + 2 × forward. Stated bound: the counter's train FLOPs are within 12 % of the formula's less
    the solve. The projections' backward is exactly twice; the cores' differs by the solve's backward (one more solve
    and a c × (d_k + d_v) × c product per chunk) and by the first token's products with a zero state, which needs no
    gradient."""
    c = case(model, "train", 16, form=form)
    ops, ours = counted(c), count_flops(c)
    visible = ours.flops - ours.detail.get("solve", 0) - ours.detail.get("solve_backward", 0)
    assert abs(sum(ops.values()) / visible - 1) <= 0.12
    assert ours.flops == 3 * count_flops(case(model, seq_len=16, form=form)).flops


@pytest.mark.parametrize("scope", ["core", "block"])
@pytest.mark.parametrize("model", MODELS)
def test_a_decode_step_is_one_step_of_the_recurrence(model: str, scope: str) -> None:
    c = case(model, "decode", 40, scope=scope)
    assert sum(counted(c).values()) == count_flops(c).flops
    assert count_flops(c).formula == f"{model}-recurrent{'-block' * (scope == 'block')}-decode-v1"
    assert count_flops(case(model, "decode", 4000, scope=scope)).flops == count_flops(c).flops  # constant in n


def test_the_formula_ids() -> None:
    assert count_flops(case("gated-deltanet")).formula == "gated-deltanet-chunked-v1"
    assert count_flops(case("deltanet", form="recurrent")).formula == "deltanet-recurrent-v1"
    assert count_flops(case("rwkv7", scope="block")).formula == "rwkv7-chunked-block-v1"
    assert count_flops(case("rwkv7", "decode")).formula == "rwkv7-recurrent-decode-v1"
    assert count_flops(case("gated-deltanet", "decode", scope="model", vocab=50)).formula == (
        "gated-deltanet-recurrent-model-decode-v1"
    )


def test_the_flops_by_hand() -> None:
    # Gated DeltaNet, one sequence of 5 tokens, d_model 16, 2 heads (d_k 8, d_v 16), chunk 4: a chunk of 4 and one of 1.
    c = Case("gated-deltanet", "forward", "float32", "cpu", 1, 5, 16, 2, 1, True, (("chunk", 4),))
    width = 2 * 2 * 8 + 2 * 16 + 2 + 2 + 2 * 16  # q, k, v, β, the decay's input, the output gate
    projections = 2 * 5 * 16 * width + 2 * 5 * 32 * 16
    chunk4 = 4 * 16 * 8 + 2 * 16 * 16 + 6 * 4 * 8 * 16
    chunk1 = 4 * 8 + 2 * 16 + 6 * 8 * 16
    assert dict(count_flops(c).detail) == {
        "projections": projections,
        "core": 2 * (chunk4 + chunk1),
        "solve": 2 * 4 * 3 * (8 + 16),
    }
    # RWKV-7 recurrent: 8·d_k·d_v per token and head; projections 8·d² and the LoRAs 4·d·(32 + 32 + 32) per token.
    r = Case("rwkv7", "forward", "float32", "cpu", 1, 5, 16, 2, 1, True, (("form", "recurrent"),))
    assert dict(count_flops(r).detail) == {"projections": 5 * (8 * 256 + 4 * 16 * 96), "core": 2 * 5 * 8 * 64}


# ----------------------------------------------------------------------------------------------- the rules
def test_options_that_change_nothing_are_refused() -> None:
    for model in MODELS:
        chunk = no_effect(model, "chunk", {"form": "recurrent"})
        assert chunk is not None and chunk.option == "chunk"
        assert no_effect(model, "chunk", {"kernel": "fla"}) is not None  # fla's kernel chooses its own
        kernel = no_effect(model, "kernel", {"form": "recurrent"})
        assert kernel is not None and kernel.option == "kernel"
        assert no_effect(model, "chunk", {}) is None and no_effect(model, "kernel", {}) is None
        assert no_effect(model, "vocab", {}) is not None  # the shared network rules hold too


def test_cases_that_describe_no_model_say_which_option() -> None:
    odd = Case("deltanet", "forward", "float32", "cpu", 1, 8, 10, 3, 1, True)
    problem = cannot_build(odd)
    assert problem is not None and problem.option == "head_dim"
    assert cannot_build(Case("deltanet", "forward", "float32", "cpu", 1, 8, 10, 3, 1, True, (("head_dim", 4),))) is None
    uneven = cannot_build(Case("rwkv7", "forward", "float32", "cpu", 1, 8, 10, 3, 1, True))
    assert uneven is not None and uneven.option is None  # RWKV-7 has no head_dim to point at: the sizes are the case's
    rope = cannot_build(case("rwkv7", positional="rope"))
    assert rope is not None and rope.option == "positional"


# ----------------------------------------------------------------------------------------------- kernel: fla
@pytest.mark.parametrize("model", MODELS)
def test_the_kernel_is_an_unsupported_row_where_it_cannot_run(model: str) -> None:
    reason = probe(case(model, kernel="fla"), "cpu")
    assert reason is not None and reason.startswith(f"{model} kernel fla:") and "CUDA only" in reason
    fp32 = torch_family(case(model, kernel="fla")).unavailable(case(model, kernel="fla"), "cuda")
    if importlib.util.find_spec("fla") is None:  # without fla the package is the reason, whatever the dtype
        assert fp32 is not None and fp32.startswith(f"{model} kernel fla: package fla")


def refusing_kernel(q, k, v, *rest, scale=None, initial_state=None, output_final_state=False, **kwargs):  # type: ignore[no-untyped-def]
    """fla 0.6's chunk_delta_rule's guard, as some releases also put it in chunk_gated_delta_rule."""
    assert q.dtype != torch.float32, "ChunkDeltaRuleFunction does not support float32. Please use bfloat16."
    return q, None


def accepting_kernel(q, k, v, *rest, scale=None, initial_state=None, output_final_state=False, **kwargs):  # type: ignore[no-untyped-def]
    return q, None


def installed(monkeypatch: pytest.MonkeyPatch, model: str, kernel: Callable[..., Any]) -> None:
    """``kernel`` as the installed fla's function for ``model``, under a wrapper as fla's dispatch puts one."""
    module, name = FLA_MODULES[model]
    package = types.ModuleType(module)
    setattr(package, name, functools.wraps(kernel)(lambda *a, **kw: kernel(*a, **kw)))
    monkeypatch.setitem(sys.modules, module, package)
    monkeypatch.setitem(sys.modules, "fla", types.ModuleType("fla"))


@pytest.mark.parametrize("model", MODELS)
def test_float32_is_refused_where_the_installed_kernel_asserts_it_away(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 48, item 9: read from the installed function, so an fla whose chunk_gated_delta_rule asserts
    q.dtype != float32 gives an unsupported row, not an error; one that takes float32 runs it."""
    fp32, bf16 = case(model, kernel="fla"), case(model, dtype="bfloat16", kernel="fla")
    installed(monkeypatch, model, refusing_kernel)
    reason = torch_family(fp32).unavailable(fp32, "cuda")
    assert reason is not None and reason.startswith(f"{model} kernel fla:") and "float32" in reason
    assert torch_family(bf16).unavailable(bf16, "cuda") is None
    installed(monkeypatch, model, accepting_kernel)
    assert torch_family(fp32).unavailable(fp32, "cuda") is None


@pytest.mark.parametrize("named", [True, False])
@pytest.mark.parametrize("model", MODELS)
def test_head_first_false_is_passed_where_the_installed_kernel_names_it(
    model: str, named: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A release whose kernel takes ``head_first`` (default True in some) gets False: ours are (B, T, H, D). One that
    only has ``**kwargs`` gets nothing (fla 0.6 raises on head_first passed there)."""
    calls: list[dict[str, Any]] = []
    inner = fake_kernel(model, calls)
    seen: list[Any] = []

    def kernel(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.pop("head_first", "absent"))
        return inner(*args, **kwargs)

    params = list(inspect.signature(inner).parameters.values())
    if named:
        params.append(inspect.Parameter("head_first", inspect.Parameter.KEYWORD_ONLY, default=True))
    kernel.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    module, name = FLA_MODULES[model]
    package = types.ModuleType(module)
    setattr(package, name, kernel)
    monkeypatch.setitem(sys.modules, module, package)
    with torch.no_grad():
        layer(model, kernel="fla")(inputs(13))
    assert seen == [False if named else "absent"] and len(calls) == 1


@pytest.mark.parametrize("model", MODELS)
def test_a_kernel_fla_row_records_the_version_of_fla_that_ran(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def version(name: str) -> str:
        if name == "fla-core":
            return "0.6.0"
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    fused = case(model, dtype="bfloat16", kernel="fla")
    assert torch_family(fused).extras(fused, "cuda") == {"fla_version": "0.6.0"}
    assert torch_family(case(model)).extras(case(model), "cuda") == {}  # the torch kernel: no fla ran


FLA_MODULES = {
    "gated-deltanet": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "deltanet": ("fla.ops.delta_rule", "chunk_delta_rule"),
    "rwkv7": ("fla.ops.rwkv7", "chunk_rwkv7"),
}


def fake_kernel(model: str, calls: list[dict[str, Any]]) -> Callable[..., Any]:
    """fla's contract, computed with the torch form: (B, T, H, D) inputs, the state (B, H, d_k, d_v); returns the
    output (B, T, H, d_v) and the final state or None."""

    def head_major(*ts: Tensor) -> list[Tensor]:
        return [t.transpose(1, 2) for t in ts]

    def finish(o: Tensor, s: Tensor, output_final_state: bool) -> tuple[Tensor, Tensor | None]:
        return o.transpose(1, 2), s if output_final_state else None

    if model == "rwkv7":

        def rwkv(r, w, k, v, a, b, *, scale, initial_state, output_final_state, safe_gate, lower_bound, chunk_size):  # type: ignore[no-untyped-def]
            calls.append({"r": r.shape, "scale": scale, "state": initial_state is not None, "bound": lower_bound})
            r, w, k, v, a, b = head_major(r, w, k, v, a, b)
            kk = -a  # fla's layer passes a = −κ̂, b = κ̂ ⊙ a
            o, s = rwkv7_chunked(r, w, k, v, kk, b / kk, 64, initial_state)
            return finish(o, s, output_final_state)

        return rwkv

    def delta(q, k, v, *rest, scale, initial_state, output_final_state):  # type: ignore[no-untyped-def]
        calls.append({"q": q.shape, "scale": scale, "state": initial_state is not None, "gates": len(rest)})
        g, beta = (rest[0], rest[1]) if len(rest) == 2 else (None, rest[0])
        q, k, v, beta = head_major(q, k, v, beta)
        o, s = delta_rule_chunked(q, k, v, None if g is None else g.transpose(1, 2), beta, 64, initial_state)
        return finish(o, s, output_final_state)

    return delta


@pytest.mark.parametrize("model", MODELS)
def test_kernel_fla_routes_through_the_packages_function(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused path, proven to run: a stand-in for fla records each call (the real one needs a GPU)."""
    calls: list[dict[str, Any]] = []
    module, name = FLA_MODULES[model]
    package = types.ModuleType(module)
    setattr(package, name, fake_kernel(model, calls))
    monkeypatch.setitem(sys.modules, module, package)
    fused = layer(model, kernel="fla")
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
    for a, b in zip(state.tensors(), plain.tensors(), strict=True):
        torch.testing.assert_close(a, b, **TOL)
    assert len(calls) == 3 and [c["state"] for c in calls] == [False, True, True]
    shape = calls[0]["r" if model == "rwkv7" else "q"]
    assert shape == (B, 13, HEADS, 4)  # time-major, as fla takes it
    assert calls[0]["scale"] == (1.0 if model == "rwkv7" else 4**-0.5)


def varlen(kernel: Callable[..., Any], calls: list[Tensor]) -> Callable[..., Any]:
    """``kernel`` (fla's contract on one batch) as fla's varlen contract: x (1, T, …) holding the sequences that
    ``cu_seqlens`` delimits, each run alone from a zero state; records each call's ``cu_seqlens``."""

    def packed(*args: Tensor, cu_seqlens: Tensor, cu_seqlens_cpu: Tensor, **kwargs: Any) -> tuple[Tensor, None]:
        calls.append(cu_seqlens)
        assert kwargs["initial_state"] is None and torch.equal(cu_seqlens_cpu, cu_seqlens.cpu())
        ends = cu_seqlens.tolist()
        outs = [kernel(*(t[:, a:b] for t in args), **kwargs)[0] for a, b in itertools.pairwise(ends)]
        return torch.cat(outs, dim=1), None

    named = list(inspect.signature(kernel).parameters.values())
    varlen_args = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY) for n in ("cu_seqlens", "cu_seqlens_cpu")]
    packed.__signature__ = inspect.Signature(named + varlen_args)  # type: ignore[attr-defined]
    return packed


PACKING = (6, 2, 9)  # 2 < d_conv − 1: a short conv that leaked across a start would read the sequence before


@pytest.mark.parametrize("model", MODELS)
def test_packed_lengths_with_kernel_fla_run_one_varlen_call_per_layer(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52, item 4: packed lengths with ``kernel: fla`` run ONE call of fla's kernel per layer over the joined
    sequences, with their cu_seqlens (int64, as fla takes them), instead of a loop over the sequences; the short conv
    (RWKV-7's token shift) reads zero across each sequence's start. fla's Triton kernels cannot run on this CPU, so a
    substitute stands in where our code resolves the function (``fla_function``): fla's varlen contract, computed
    per segment by the family's own torch chunked core; the packed output must be each sequence alone, in float64.
    The real kernel runs in ``test_the_real_fla_kernel_packs_its_sequences_in_one_varlen_call`` (CUDA)."""
    calls: list[Tensor] = []
    monkeypatch.setattr(
        rw if model == "rwkv7" else dn, "fla_function", lambda *_: varlen(fake_kernel(model, []), calls)
    )
    c = replace(case(model, "forward", kernel="fla", scope="block"), batch=len(PACKING), packing=PACKING)
    torch.manual_seed(0)
    module = build_model(c, "cpu", F64).eval()
    x = torch.randn(1, sum(PACKING), c.d_model, dtype=F64)
    with torch.no_grad():
        out = packed(module, x, PACKING)
        assert [cu.tolist() for cu in calls] == [[0, 6, 8, 17]] * c.layers  # one call per layer, the lengths'
        assert all(cu.dtype == torch.int64 for cu in calls) and calls[0] is calls[1]  # built once, shared
        for layer_ in module.modules():
            if isinstance(layer_, DeltaNet | RWKV7):
                layer_.kernel = "torch"
        calls.clear()
        for start, end in spans(PACKING):
            torch.testing.assert_close(out[:, start:end], module(x[:, start:end]), **TOL)
        torch.testing.assert_close(packed(module, x, PACKING), out, **TOL)  # the torch kernel: one by one, as before
    assert not calls


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@cuda
@pytest.mark.gpu
@pytest.mark.compiles(limit_s=60)  # Triton compiles fla's chunk kernels (a dozen per rule) on a cold cache
@pytest.mark.parametrize("model", MODELS)
def test_the_real_fla_kernel_runs_and_agrees_with_the_torch_form(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    module, name = FLA_MODULES[model]
    real = getattr(
        pytest.importorskip(module, reason="the fla package (flash-linear-attention) is not installed"), name
    )
    calls: list[int] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    family = rw if model == "rwkv7" else dn
    monkeypatch.setattr(family, "fla_function", lambda *_: spy)
    torch.manual_seed(0)
    made: DeltaNet | RWKV7
    if model == "rwkv7":
        made = RWKV7(256, 4, kernel="fla", device="cuda", dtype=torch.bfloat16)
    else:
        made = DeltaNet(256, 4, gated=model == "gated-deltanet", kernel="fla", device="cuda", dtype=torch.bfloat16)
    x = torch.randn(2, 256, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        fused = made(x)
        made.kernel = "torch"
        plain = made(x)
    assert calls, f"fla's {name} was never called"
    torch.testing.assert_close(fused.float(), plain.float(), atol=5e-2, rtol=5e-2)


@cuda
@pytest.mark.gpu
@pytest.mark.compiles(limit_s=60)  # Triton compiles fla's varlen kernels on a cold cache
@pytest.mark.parametrize("model", MODELS)
def test_the_real_fla_kernel_packs_its_sequences_in_one_varlen_call(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 52, item 4, on the real kernel: a packed call of a 2-layer stack is one call of fla's function per
    layer, with the lengths' cu_seqlens, and equals each sequence run alone (through the same kernel, bf16)."""
    module, name = FLA_MODULES[model]
    real = getattr(
        pytest.importorskip(module, reason="the fla package (flash-linear-attention) is not installed"), name
    )
    calls: list[Tensor | None] = []

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs.get("cu_seqlens"))
        return real(*args, **kwargs)

    spy.__signature__ = inspect.signature(real)  # type: ignore[attr-defined]  # the arguments it names: fla's
    monkeypatch.setattr(rw if model == "rwkv7" else dn, "fla_function", lambda *_: spy)
    torch.manual_seed(0)
    options: dict[str, Any] = {"kernel": "fla", "device": "cuda", "dtype": torch.bfloat16}
    stack: nn.Module
    if model == "rwkv7":
        stack = rw.RWKV7Stack(256, 4, 2, **options)
    else:
        stack = dn.DeltaNetStack(256, 4, 2, gated=model == "gated-deltanet", **options)
    lengths = (100, 3, 157)
    x = torch.randn(1, sum(lengths), 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        out = packed(stack, x, lengths)
        assert len(calls) == 2, f"fla's {name}: {len(calls)} calls for 2 layers"
        for cu in calls:
            assert cu is not None and cu.dtype == torch.int64 and cu.tolist() == [0, 100, 103, 260]
        for start, end in spans(lengths):
            alone = stack(x[:, start:end])
            torch.testing.assert_close(out[:, start:end].float(), alone.float(), atol=5e-2, rtol=5e-2)


@cuda
@pytest.mark.gpu
@pytest.mark.compiles(limit_s=60)  # the probe runs fla's forward and backward: Triton compiles them, cold
@pytest.mark.parametrize("model", MODELS)
def test_a_sweep_case_with_kernel_fla_probes_on_the_gpu(model: str) -> None:
    pytest.importorskip(FLA_MODULES[model][0], reason="the fla package (flash-linear-attention) is not installed")
    c = Case(model, "train", "bfloat16", "cuda", 2, 128, 256, 4, 1, True, (("kernel", "fla"),))
    assert probe(c, "cuda") is None
    assert torch_family(c).extras(c, "cuda").get("fla_version")  # the installed fla, recorded in the row
    fp32 = replace(c, dtype="float32")  # refused up front exactly where the installed kernel asserts it away
    refuses = dn.fla_refuses_float32(dn.fla_function(*FLA_MODULES[model]))
    assert (torch_family(fp32).unavailable(fp32, "cuda") is not None) == refuses


@pytest.mark.parametrize("form", ["chunked", "recurrent"])
@pytest.mark.parametrize("model", ["gated-deltanet", "deltanet"])
def test_value_heads_run_the_rule_per_value_head_on_their_key_heads_q_and_k(model: str, form: str) -> None:
    """heads_v = 2·heads (fla's num_v_heads): the same as a layer of heads_v heads whose q and k weights repeat each
    key head's for its value heads; counted as the counter sees it; decoding to its forward."""
    grouped = layer(model, heads_v=4, expand_v=1, form=form)
    plain = DeltaNet(D_MODEL, 4, gated=model == "gated-deltanet", head_dim=4, expand_v=1, chunk=4, form=form, dtype=F64)
    d_k = grouped.d_k
    with torch.no_grad():
        for name, p in plain.named_parameters():
            if name != "in_proj.weight" and name != "conv_weight":
                p.copy_(dict(grouped.named_parameters())[name])
        rows = grouped.in_proj.weight
        q, k = rows[: 2 * d_k], rows[2 * d_k : 4 * d_k]
        repeat = [t.view(2, d_k, -1).repeat_interleave(2, dim=0).reshape(4 * d_k, -1) for t in (q, k)]
        plain.in_proj.weight.copy_(torch.cat([*repeat, rows[4 * d_k :]]))
        cq, ck = grouped.conv_weight[: 2 * d_k], grouped.conv_weight[2 * d_k : 4 * d_k]
        conv = [t.view(2, d_k, -1).repeat_interleave(2, dim=0).reshape(4 * d_k, -1) for t in (cq, ck)]
        plain.conv_weight.copy_(torch.cat([*conv, grouped.conv_weight[4 * d_k :]]))
        x = inputs(13)
        torch.testing.assert_close(grouped(x), plain(x), **TOL)
    c = case(model, seq_len=13, heads_v=4, expand_v=1, form=form)
    ops, ours = counted(c), count_flops(c)
    assert sum(ops.values()) == ours.flops - ours.detail.get("solve", 0)
    # 2 layers × 2 sequences × (the conv's last 3 inputs of 2·2·8 + 4·8, and 4 value heads' 8 × 8 memory), float32
    assert state_bytes(replace(c, mode="decode")) == 2 * 2 * (3 * (2 * 2 * 8 + 4 * 8) + 4 * 8 * 8) * 4


def test_value_heads_must_be_a_multiple_of_the_key_heads() -> None:
    problem = cannot_build(case("gated-deltanet", heads_v=3))
    assert problem is not None and problem.option == "heads_v"
