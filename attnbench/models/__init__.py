"""Model builders and backend probes (layer 5: with the executor, the only place that imports torch).

The names and options live in the torch-free ``attnbench.catalogue``; this package builds them.
"""

from __future__ import annotations

from attnbench.models.registry import (
    BUILDERS,
    availability,
    build_model,
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
    "make_input",
    "parameter_count",
    "probe",
    "sdpa_kernel_chosen",
    "torch_dtype",
]
