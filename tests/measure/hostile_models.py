"""Factories of user models that misbehave, for the executor's tests: each names itself as
``tests.measure.hostile_models:NAME`` in a case's ``UserModel``."""

from __future__ import annotations

import sys
from typing import Any

import torch
from torch import nn


class Linear(nn.Module):
    """(B, T, d) -> (B, T, d); ``output`` changes what a call returns."""

    def __init__(self, request: Any, output: Any = None) -> None:
        super().__init__()
        self.lin = nn.Linear(request.d_model, request.d_model, device=request.device, dtype=request.torch_dtype)
        self.output = output

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        return y if self.output is None else self.output(y)


def fine(request: Any) -> nn.Module:
    return Linear(request)


def exits(request: Any) -> nn.Module:
    sys.exit(3)


def exits_in_forward(request: Any) -> nn.Module:
    return Linear(request, output=lambda y: sys.exit(0))


def interrupts(request: Any) -> nn.Module:
    raise KeyboardInterrupt


def one_thread(request: Any) -> nn.Module:
    torch.set_num_threads(1)
    return Linear(request)


def no_onednn(request: Any) -> nn.Module:
    torch.backends.mkldnn.enabled = False
    return Linear(request)


def float64_default(request: Any) -> nn.Module:
    torch.set_default_dtype(torch.float64)
    return Linear(request)


def float64_output(request: Any) -> nn.Module:
    return Linear(request, output=lambda y: y.double())


def meta_output(request: Any) -> nn.Module:
    return Linear(request, output=lambda y: torch.empty_like(y, device="meta"))
