"""Every model name attnbench knows, as plain data (DESIGN §6).

Torch-free on purpose: ``validate``, ``report`` and ``compare`` must know every registry name and option without
importing torch. ``attnbench.models`` supplies a builder for each entry; a test holds the two in step.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Family = Literal["recurrent", "attention"]
OptionType = type[bool] | type[int] | type[float] | type[str]


@dataclass(frozen=True)
class OptionSpec:
    """One model option a config may set under ``model_options.<model>``."""

    name: str
    type: OptionType
    default: bool | int | float | str
    help: str


@dataclass(frozen=True)
class ModelSpec:
    name: str
    family: Family
    summary: str
    # Devices the kernel exists for at all; finer limits (dtype, head dim) are found by probing a tiny input.
    devices: tuple[str, ...] = ("cpu", "cuda")
    # A Python package the model needs beyond torch (import name).
    package: str | None = None
    options: tuple[OptionSpec, ...] = ()

    def option(self, name: str) -> OptionSpec | None:
        return next((o for o in self.options if o.name == name), None)


_RNN_OPTIONS = (
    OptionSpec(
        "bidirectional",
        bool,
        False,
        "run both directions; each gets d_model/2 hidden units so the output width stays d_model",
    ),
)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            "lstm",
            "recurrent",
            "torch.nn.LSTM, hidden = d_model (cuDNN on GPU, oneDNN/native on CPU)",
            options=_RNN_OPTIONS,
        ),
        ModelSpec(
            "gru",
            "recurrent",
            "torch.nn.GRU, hidden = d_model (cuDNN on GPU, oneDNN/native on CPU)",
            options=_RNN_OPTIONS,
        ),
        ModelSpec("vanilla", "attention", "explicit QKᵀ/√d → softmax → ·V; materialises the n×n score matrix per head"),
        ModelSpec("sdpa-math", "attention", "F.scaled_dot_product_attention forced to the MATH backend"),
        ModelSpec("sdpa-flash", "attention", "F.scaled_dot_product_attention forced to FLASH_ATTENTION"),
        ModelSpec(
            "sdpa-efficient",
            "attention",
            "F.scaled_dot_product_attention forced to EFFICIENT_ATTENTION (memory-efficient, xFormers-style)",
            devices=("cuda",),
        ),
        ModelSpec(
            "sdpa-cudnn", "attention", "F.scaled_dot_product_attention forced to CUDNN_ATTENTION", devices=("cuda",)
        ),
        ModelSpec(
            "sdpa",
            "attention",
            "F.scaled_dot_product_attention with PyTorch's own dispatch (the kernel chosen is recorded)",
        ),
        ModelSpec(
            "flash-attn",
            "attention",
            "flash_attn.flash_attn_func from the Dao-AILab package",
            devices=("cuda",),
            package="flash_attn",
        ),
    )
}

MODEL_NAMES: tuple[str, ...] = tuple(MODELS)
# What a config or --device may ask for, and what a resolved case records.
DEVICE_REQUEST = re.compile(r"auto|cpu|cuda|cuda:\d+")
RESOLVED_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")
# backward = the backward pass alone (graph kept, grads cleared), so train can be checked against forward + backward.
MODES: tuple[str, ...] = ("forward", "train", "backward")


def is_recurrent(model: str) -> bool:
    return MODELS[model].family == "recurrent"
