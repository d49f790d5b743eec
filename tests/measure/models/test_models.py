"""The models package: every attention core computes the same function, shapes hold, probes explain.

Real torch on tiny shapes on CPU; the ``gpu`` class runs the CUDA-only kernels where a GPU exists.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest
import torch

from attnbench.core.cases import DTYPES, Case, Mode
from attnbench.families.attention.layers import sdpa_kernel_chosen
from attnbench.families.catalogue import FAMILIES, MODEL_NAMES, MODELS
from attnbench.families.registry import (
    _probe_tiny,
    availability,
    build_model,
    parameter_count,
    probe,
    torch_dtype,
    torch_family,
)
from attnbench.families.torch_family import TorchFamily
from tests.support import mentions

CPU_CORES = ("vanilla", "sdpa-math", "sdpa-flash", "sdpa")
GPU_CORES = ("sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flash-attn")
# (forward, gradient) tolerance, used as atol and rtol. float64 is held near round-off, float32 to what
# reordered sums allow: weight gradients sum over every token, so their error grows with B·T (≈1e-5 at 300).
TOLERANCES = {"float64": (1e-10, 1e-10), "float32": (1e-5, 1e-4)}


def attention_case(
    model: str,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    causal: bool = False,
    mode: Mode = "train",
    batch: int = 2,
    seq_len: int = 12,
    d_model: int = 32,
    heads: int = 4,
    layers: int = 2,
) -> Case:
    return Case(model, mode, dtype, device, batch, seq_len, d_model, heads, layers, causal)


def recurrent_case(model: str, *, bidirectional: bool = False, layers: int = 1, d_model: int = 16) -> Case:
    options = (("bidirectional", bidirectional),) if model in ("lstm", "gru") else ()
    return Case(model, "forward", "float32", "cpu", 2, 7, d_model, None, layers, not bidirectional, options)


Grads = dict[str, torch.Tensor]


def forward_and_grads(
    case: Case, x: torch.Tensor, grad_out: torch.Tensor, device: str = "cpu", compute_dtype: torch.dtype | None = None
) -> tuple[torch.Tensor, Grads]:
    """Output and gradients (input and every parameter) of the case's model with seed-0 weights.

    ``compute_dtype`` runs the model built in ``x.dtype`` at another precision (a float32 reference for bf16).
    """
    torch.manual_seed(0)
    model = build_model(case, device, x.dtype)
    if compute_dtype is not None:
        model, x, grad_out = model.to(compute_dtype), x.to(compute_dtype), grad_out.to(compute_dtype)
    x = x.detach().clone().requires_grad_(True)
    out = model(x)
    out.backward(grad_out)
    assert x.grad is not None
    grads = {"input": x.grad, **{name: p.grad for name, p in model.named_parameters() if p.grad is not None}}
    assert len(grads) == 1 + len(list(model.parameters()))
    return out.detach(), grads


# 300 tokens crosses the CPU flash kernel's query/key block sizes: its tiling and online softmax are tested.
@pytest.mark.parametrize("seq_len", [12, 300])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("model", [m for m in CPU_CORES if m != "vanilla"])
def test_core_equals_vanilla_forward_and_backward(model: str, causal: bool, dtype: str, seq_len: int) -> None:
    torch_type = torch_dtype(dtype)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, seq_len, 32, generator=generator, dtype=torch_type)
    grad_out = torch.randn(2, seq_len, 32, generator=generator, dtype=torch_type)
    reference = attention_case("vanilla", dtype=dtype, causal=causal, seq_len=seq_len)
    ref_out, ref_grads = forward_and_grads(reference, x, grad_out)
    candidate = attention_case(model, dtype=dtype, causal=causal, seq_len=seq_len)
    out, grads = forward_and_grads(candidate, x, grad_out)
    atol, grad_atol = TOLERANCES[dtype]
    torch.testing.assert_close(out, ref_out, atol=atol, rtol=atol)
    assert grads.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(grads[name], ref_grads[name], atol=grad_atol, rtol=grad_atol, msg=name)


def test_causal_output_ignores_the_future() -> None:
    torch.manual_seed(0)
    model = build_model(attention_case("vanilla", causal=True), "cpu", torch.float64)
    x = torch.randn(1, 12, 32, dtype=torch.float64)
    changed = x.clone()
    changed[:, 6:] += 1.0
    torch.testing.assert_close(model(x)[:, :6], model(changed)[:, :6])
    assert not torch.allclose(model(x)[:, 6:], model(changed)[:, 6:])


def test_cores_share_weights_for_a_seed() -> None:
    states = []
    for model in CPU_CORES:
        torch.manual_seed(3)
        states.append(build_model(attention_case(model), "cpu", torch.float32).state_dict())
    for state in states[1:]:
        assert state.keys() == states[0].keys()
        for key in state:
            assert torch.equal(state[key], states[0][key]), key


AVAILABLE_ON_CPU = [m for m, reason in availability("cpu").items() if reason is None]


@pytest.mark.parametrize("model", [m for m in AVAILABLE_ON_CPU if MODELS[m].kind == "attention"])
@pytest.mark.parametrize("layers", [1, 2])
def test_attention_shapes(model: str, layers: int) -> None:
    case = attention_case(model, batch=3, seq_len=5, layers=layers)
    with torch.inference_mode():  # as a forward row runs (flex has no CPU backward, so no graph may be built)
        out = build_model(case, "cpu", torch.float32)(torch.randn(3, 5, 32))
    assert out.shape == (3, 5, 32)


@pytest.mark.parametrize("bidirectional", [False, True], ids=["uni", "bi"])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("model", ["lstm", "gru"])
def test_recurrent_shapes(model: str, layers: int, bidirectional: bool) -> None:
    case = recurrent_case(model, bidirectional=bidirectional, layers=layers)
    module = build_model(case, "cpu", torch.float32)
    assert module(torch.randn(2, 7, 16)).shape == (2, 7, 16)


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("model", ["mingru", "minlstm"])
def test_parallel_rnn_shapes(model: str, layers: int) -> None:
    module = build_model(recurrent_case(model, layers=layers), "cpu", torch.float32)
    assert module(torch.randn(2, 7, 16)).shape == (2, 7, 16)
    assert len(next(iter(module.children()))) == layers  # one MinRNN per layer, stacked like nn.GRU(num_layers)


def test_recurrent_bidirectional_needs_even_width() -> None:
    with pytest.raises(ValueError, match="d_model must be even"):
        build_model(recurrent_case("gru", bidirectional=True, d_model=15), "cpu", torch.float32)


def test_parameter_count_of_attention() -> None:
    # Per layer: qkv d·3d + 3d, out d·d + d.
    module = build_model(attention_case("vanilla", d_model=32, layers=2), "cpu", torch.float32)
    assert parameter_count(module) == 2 * (32 * 96 + 96 + 32 * 32 + 32)


@pytest.mark.parametrize("model", ["sdpa-efficient", "sdpa-cudnn", "flash-attn"])
@pytest.mark.parametrize("mode", ["forward", "train"])
def test_probe_explains_cuda_only_models_on_cpu(model: str, mode: Mode) -> None:
    reason = probe(attention_case(model, mode=mode), "cpu")
    assert isinstance(reason, str)
    assert "CUDA" in reason


def test_probe_reports_torch_refusal_when_a_kernel_is_tried() -> None:
    # Past the catalogue's cheap device check, the tiny run itself turns torch's RuntimeError into a reason.
    reason = _probe_tiny(attention_case("sdpa-efficient"), "cpu")
    assert reason is not None
    assert mentions(reason, "EFFICIENT_ATTENTION", "float32", "cpu", values=(8,))  # backend, dtype, head_dim, device
    assert "No viable backend" in reason  # torch's own words, passed on


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize(
    "case",
    [recurrent_case("lstm"), recurrent_case("mingru"), attention_case("vanilla"), attention_case("sdpa-flash")],
    ids=["lstm", "mingru", "vanilla", "sdpa-flash"],
)
def test_probe_passes_what_runs_on_cpu(case: Case, mode: Mode) -> None:
    assert probe(replace(case, mode=mode), "cpu") is None


def test_probe_leaves_the_callers_rng_alone() -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    probe(attention_case("vanilla"), "cpu")
    torch.testing.assert_close(torch.rand(3), expected)


def test_availability_covers_the_catalogue() -> None:
    status = availability("cpu")
    assert tuple(status) == MODEL_NAMES
    assert status["vanilla"] is None
    assert status["sdpa-efficient"] is not None


def test_every_family_has_both_halves() -> None:
    """Each torch-free family has a torch half of the same name, and every model name belongs to one family."""
    assert [m for f in FAMILIES for m in (s.name for s in f.models)] == list(MODEL_NAMES)
    for family in FAMILIES:
        half = importlib.import_module(f"attnbench.families.{family.name}.layers").TORCH
        assert isinstance(half, TorchFamily), family.name
        for spec in family.models:
            assert spec.family == family.name
            assert torch_family(attention_case(spec.name) if spec.heads else recurrent_case(spec.name)) is half


def test_torch_dtype_covers_catalogue() -> None:
    assert {name: torch_dtype(name) for name in DTYPES}["bfloat16"] is torch.bfloat16
    with pytest.raises(ValueError, match="one of"):
        torch_dtype("int8")


@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sdpa_kernel_chosen_on_cpu(mode: Mode, dtype: str) -> None:
    chosen = sdpa_kernel_chosen(attention_case("sdpa", mode=mode, dtype=dtype, causal=True), "cpu")
    assert chosen is None or chosen in {"MATH", "FLASH_ATTENTION"}
    assert sdpa_kernel_chosen(recurrent_case("lstm"), "cpu") is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
class TestCudaKernels:
    """The fused CUDA kernels agree with vanilla in bf16, or the probe says why they cannot run."""

    @pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
    @pytest.mark.parametrize("model", GPU_CORES)
    def test_equals_vanilla_or_unsupported(self, model: str, causal: bool) -> None:
        case = attention_case(model, dtype="bfloat16", device="cuda", causal=causal, seq_len=64, d_model=128)
        reason = probe(case, "cuda")
        if reason is not None:
            assert isinstance(reason, str) and reason
            pytest.skip(reason)
        generator = torch.Generator(device="cuda").manual_seed(1)
        x = torch.randn(2, 64, 128, generator=generator, device="cuda", dtype=torch.bfloat16)
        grad_out = torch.randn(2, 64, 128, generator=generator, device="cuda", dtype=torch.bfloat16)
        vanilla = replace(case, model="vanilla")
        # The reference is vanilla on the same bf16 weights run in float32: a bf16 softmax would be the
        # noisier side of the comparison, and the fused kernels accumulate in float32 too.
        ref_out, ref_grads = forward_and_grads(vanilla, x, grad_out, "cuda", compute_dtype=torch.float32)
        out, grads = forward_and_grads(case, x, grad_out, "cuda")
        torch.testing.assert_close(out.float(), ref_out, atol=2e-2, rtol=2e-2)
        for name in ref_grads:
            torch.testing.assert_close(grads[name].float(), ref_grads[name], atol=2e-2, rtol=2e-2, msg=name)

    def test_sdpa_kernel_chosen_names_a_backend(self) -> None:
        case = attention_case("sdpa", dtype="bfloat16", device="cuda", seq_len=64, d_model=128)
        backends = {"FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"}
        assert sdpa_kernel_chosen(case, "cuda") in backends
