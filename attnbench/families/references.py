"""The models the instrument's own checks time (``calibrate``'s between-process noise, ``selfcheck``'s agreement
with independent timers), torch-free. They are chosen here, beside the families, so that no room outside them
names a model: each is picked for the kind of kernel it exercises, not for its family.
"""

from __future__ import annotations

__all__ = ["EXPLICIT_ATTENTION", "FUSED_ATTENTION", "STEPWISE_RECURRENCE"]

# A recurrence that steps token by token in the library's fused kernel (cuDNN on CUDA, oneDNN on a CPU): many
# small, dependent kernel calls per forward.
STEPWISE_RECURRENCE = "lstm"
# Attention written out as matmul → softmax → matmul: a few large kernels and the n² score matrix in memory.
EXPLICIT_ATTENTION = "vanilla"
# Attention in one fused kernel (SDPA's FLASH_ATTENTION backend, on every device).
FUSED_ATTENTION = "sdpa-flash"
