"""A user's model is checked for its dtype by the bulk of its parameters: a bf16 model may keep a few in float32."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from attnbench.core.cases import Case
from attnbench.families.user.layers import TORCH, UserModelError, dtype_problem
from attnbench.families.user.spec import UserModel


class MambaLike(nn.Module):
    """mamba_ssm's Mamba2 in bf16: its weights bf16, A_log and D float32; a RoPE table kept as a float32 buffer."""

    def __init__(self, d: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_proj = nn.Linear(d, 4 * d, bias=False, dtype=dtype)
        self.out_proj = nn.Linear(4 * d, d, bias=False, dtype=dtype)
        self.A_log = nn.Parameter(torch.zeros(8, dtype=torch.float32))
        self.D = nn.Parameter(torch.ones(8, dtype=torch.float32))
        self.register_buffer("inv_freq", torch.ones(d // 2, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


def mamba_like(request: Any) -> nn.Module:
    return MambaLike(request.d_model, request.torch_dtype)


def mostly_float32(request: Any) -> nn.Module:
    return MambaLike(request.d_model, torch.float32)


def user_case(factory: str) -> Case:
    user = UserModel(f"{__name__}:{factory}", "recurrent", "config")
    return Case(factory, "forward", "bfloat16", "cpu", 1, 8, 16, 2, 1, True, definition=user.definition())


def test_a_bf16_model_with_float32_scan_parameters_and_buffers_builds() -> None:
    built = TORCH.build(user_case("mamba_like"), "cpu", torch.bfloat16)
    assert {p.dtype for p in built.parameters()} == {torch.bfloat16, torch.float32}


def test_a_model_mostly_in_another_dtype_is_refused_naming_its_largest_parameter() -> None:
    with pytest.raises(UserModelError) as refused:
        TORCH.build(user_case("mostly_float32"), "cpu", torch.bfloat16)
    assert "in_proj.weight" in str(refused.value) and "torch.float32" in str(refused.value)


@pytest.mark.parametrize(("bf16", "fp32", "refused"), [(50, 50, False), (49, 51, True), (0, 0, False)])
def test_half_the_parameter_elements_is_the_bulk(bf16: int, fp32: int, refused: bool) -> None:
    module = nn.Module()
    module.a = nn.Parameter(torch.zeros(bf16, dtype=torch.bfloat16))
    module.b = nn.Parameter(torch.zeros(fp32, dtype=torch.float32))
    assert (dtype_problem(module, torch.bfloat16) is not None) == refused
