"""Model builders and backend probes (torch lives here, with the executor).

The names and options live in the torch-free ``attnbench.core.catalogue``; this package builds them.
"""

from __future__ import annotations

from attnbench.measure.models.registry import (
    BUILDERS,
    availability,
    build_model,
    make_decode_inputs,
    make_input,
    parameter_count,
    probe,
    sdpa_kernel_chosen,
    torch_dtype,
)

__all__ = [
    "BUILDERS",
    "availability",
    "build_model",
    "make_decode_inputs",
    "make_input",
    "parameter_count",
    "probe",
    "sdpa_kernel_chosen",
    "torch_dtype",
]
