"""Model builders and backend probes (torch lives here, with the executor).

The names and options live in the torch-free ``attnbench.core.catalogue``; this package builds them.
"""

from __future__ import annotations

from attnbench.measure.models.attention import math_precision_flag, pinned_backend, reduced_precision_math
from attnbench.measure.models.registry import (
    BUILDERS,
    availability,
    build_model,
    make_decode_inputs,
    make_input,
    parameter_count,
    probe,
    rnn_path,
    sdpa_kernel_chosen,
    torch_dtype,
)

__all__ = [
    "BUILDERS",
    "availability",
    "build_model",
    "make_decode_inputs",
    "make_input",
    "math_precision_flag",
    "parameter_count",
    "pinned_backend",
    "probe",
    "reduced_precision_math",
    "rnn_path",
    "sdpa_kernel_chosen",
    "torch_dtype",
]
