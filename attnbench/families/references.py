"""The models the instrument's own checks time (``calibrate``'s between-process noise, ``selfcheck``'s agreement
with independent timers), torch-free. They are chosen here, beside the families, so that no room outside them
names a model: each is picked for the kind of kernel it exercises, not for its family.

``reference_case`` makes a case of one of them as its family says such a case is made (whether it carries heads,
whether it is causal by construction), so the rooms that time them hold no family's rules either.
"""

from __future__ import annotations

from attnbench.core.cases import Case, Mode
from attnbench.families.catalogue import MODELS, family_named

__all__ = ["EXPLICIT_ATTENTION", "FUSED_ATTENTION", "STEPWISE_RECURRENCE", "reference_case"]

# A recurrence that steps token by token in the library's fused kernel (cuDNN on CUDA, oneDNN on a CPU): many
# small, dependent kernel calls per forward.
STEPWISE_RECURRENCE = "lstm"
# Attention written out as matmul → softmax → matmul: a few large kernels and the n² score matrix in memory.
EXPLICIT_ATTENTION = "vanilla"
# Attention in one fused kernel (SDPA's FLASH_ATTENTION backend, on every device).
FUSED_ATTENTION = "sdpa-flash"


def reference_case(
    model: str, mode: Mode, dtype: str, device: str, batch: int, seq_len: int, d_model: int, heads: int
) -> Case:
    """A case of ``model`` at its defaults: ``heads`` only where its family's cases carry heads, and causal only
    where the family makes every case so (a recurrence); attention unmasked, as these checks time it."""
    spec = MODELS[model]
    causal = family_named(spec.family).causal(spec, {}, False)
    return Case(model, mode, dtype, device, batch, seq_len, d_model, heads if spec.heads else None, 1, causal)
