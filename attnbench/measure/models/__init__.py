"""The torch half of every model family, one module each, and the registry that finds them (torch lives here, with
the executor).

The names, options and formulas live in the torch-free ``attnbench.core.families``; a family's module here has the
same name and defines ``TORCH`` (``family.TorchFamily``): how to build it, probe it and what its rows record.
"""

from __future__ import annotations

from attnbench.measure.models.attention import gqa_path, math_precision_flag, pinned_backend, reduced_precision_math
from attnbench.measure.models.registry import (
    availability,
    build_model,
    make_decode_inputs,
    make_input,
    parameter_count,
    probe,
    row_extras,
    torch_dtype,
    torch_family,
)
from attnbench.measure.models.rnn import rnn_path

__all__ = [
    "availability",
    "build_model",
    "gqa_path",
    "make_decode_inputs",
    "make_input",
    "math_precision_flag",
    "parameter_count",
    "pinned_backend",
    "probe",
    "reduced_precision_math",
    "rnn_path",
    "row_extras",
    "torch_dtype",
    "torch_family",
]
