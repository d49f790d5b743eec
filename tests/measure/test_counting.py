"""Counted FLOPs (a user model's): causal SDPA credited the pairs its mask keeps, as the built-in formulas are, and
no count at all where an op without a formula ran."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from attnbench.families.flops import count_flops
from attnbench.families.registry import build_model, make_input
from attnbench.families.shared import causal_pairs
from attnbench.timing.counting import count_call
from attnbench.timing.torch_executor import counted_extras
from tests.support import tiny_case


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_a_causal_sdpa_call_counts_the_pairs_its_mask_keeps(mode: str) -> None:
    q = torch.randn(2, 4, 64, 16, requires_grad=mode == "train")

    def call(causal: bool) -> Any:
        def step() -> None:
            out = F.scaled_dot_product_attention(q, q, q, is_causal=causal)
            if mode == "train":
                out.sum().backward()

        return step

    full, causal = count_call(call(False)).flops, count_call(call(True)).flops
    assert full is not None and causal is not None and full > 0  # the CPU flash kernel had no formula at all
    assert causal * 64 * 64 == full * causal_pairs(64, 64)


@pytest.mark.parametrize("scope", ["core", "block"])
def test_a_causal_transformer_counted_on_the_device_matches_the_built_in_formula(scope: str) -> None:
    """A user's causal transformer (here the built-in, counted as a user's would be) gets the FLOPs a built-in is
    credited: before, the CPU flash core counted 0 and a GPU one every pair, twice the causal core at long n."""
    case = tiny_case("sdpa-flash", batch=2, seq_len=32, d_model=32, heads=4, layers=2, causal=True, scope=scope)
    torch.manual_seed(0)
    model = build_model(case, "cpu", torch.float32).eval()
    x = make_input(case, "cpu", torch.float32)
    with torch.inference_mode():
        counted = count_call(lambda: model(x))
    assert counted.flops == count_flops(case).flops and not counted.uncounted


def test_a_call_running_an_op_without_a_formula_stores_no_flops_and_says_which() -> None:
    lstm = torch.nn.LSTM(16, 16, batch_first=True)
    x = torch.randn(2, 10, 16)
    with torch.inference_mode():
        counted = count_call(lambda: lstm(x))
    assert counted.flops is None
    assert counted.uncounted and set(counted.uncounted) <= {"aten.lstm", "aten.mkldnn_rnn_layer"}
    extras = counted_extras(counted)
    assert "flops" not in extras and "flops_formula" not in extras
    assert all(op in str(extras["flops_uncounted"]) for op in counted.uncounted)
    linear = torch.nn.Linear(16, 16)
    assert counted_extras(count_call(lambda: linear(x))) == {
        "flops": 2 * 2 * 10 * 16 * 16,
        "executed_flops": 2 * 2 * 10 * 16 * 16,
        "flops_formula": "counted-v1",
    }


def test_a_packages_own_op_counts_as_uncounted() -> None:
    lib = torch.library.Library("attnbench_test_counting", "FRAGMENT")
    lib.define("mix(Tensor x) -> Tensor")
    lib.impl("mix", lambda x: x @ x.transpose(-1, -2), "CPU")
    x = torch.randn(4, 8)
    assert count_call(lambda: torch.ops.attnbench_test_counting.mix(x)).uncounted == ("attnbench_test_counting.mix",)


def test_a_triton_kernel_launched_from_python_counts_as_uncounted(monkeypatch: pytest.MonkeyPatch) -> None:
    """fla and mamba_ssm launch Triton kernels from autograd Functions: no op reaches the dispatcher."""

    class JITFunction:
        def __init__(self, name: str) -> None:
            self.__name__ = name

        def run(self, *args: Any, **kwargs: Any) -> str:
            return "launched"

    jit = types.ModuleType("triton.runtime.jit")
    jit.JITFunction = JITFunction  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton.runtime.jit", jit)
    kernel = JITFunction("chunk_scan_fwd")
    counted = count_call(lambda: kernel.run(grid=(1,)))
    assert counted.flops is None and counted.uncounted == ("triton:chunk_scan_fwd",)
    assert JITFunction.run(kernel) == "launched"  # put back as it was


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION"])
def test_the_fused_cuda_kernels_are_counted_causal(backend: str) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    counts = []
    for causal in (False, True):

        def step(causal: bool = causal) -> None:
            with sdpa_kernel(getattr(SDPBackend, backend)):
                F.scaled_dot_product_attention(q, q, q, is_causal=causal).sum().backward()

        try:
            counts.append(count_call(step).flops)
        except RuntimeError as exc:  # this GPU or torch has no such kernel for these inputs
            pytest.skip(f"{backend}: {exc}")
    full, causal = counts
    assert full is not None and causal is not None
    assert causal * 256 * 256 == full * causal_pairs(256, 256)
