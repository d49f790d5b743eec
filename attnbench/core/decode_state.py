"""The bytes a decoder carries from one token to the next, from shapes and dtype (torch-free).

Attention keeps K and V of every position it has seen, in every layer: its KV cache grows ∝ n. A recurrent model
keeps a fixed-size state whatever n: h (and c for an LSTM) per layer. This is the ``state_bytes`` of a decode row,
computed; the executor also measures what the allocated state holds (``state_mem_bytes``), and a test holds this
count equal to the bytes of the tensors ``attnbench.measure.models`` allocates.

- Attention: 2 (K and V) × layers × batch × (n + 1) positions × d_model × the dtype's bytes. The cache holds the
  n context positions and the slot the new token's K and V are written into (heads × head_dim = d_model).
- LSTM: 2 (h and c) × layers × batch × hidden; GRU: 1 × …; in the model's dtype.
- minGRU/minLSTM: layers × batch × hidden, in the scan's dtype (float32 for 16-bit models, which keeps the
  recurrence from losing its state to rounding: ``attnbench.measure.models.minrnn``).

Bookkeeping the kernels need beside the state (flash-attn's int32 ``cache_seqlens``: 4 bytes per sequence) is
not counted.
"""

from __future__ import annotations

from attnbench.core.cases import Case
from attnbench.core.flops import recurrent_hidden

DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
# h and c of an LSTM cell; h alone for GRU and the min-RNNs.
_STATE_VECTORS = {"lstm": 2, "gru": 1, "mingru": 1, "minlstm": 1}


def state_dtype(case: Case) -> str:
    """The dtype the state is kept in: the model's, except the min-RNN scan's float32 for 16-bit models."""
    if case.model in ("mingru", "minlstm") and DTYPE_BYTES[case.dtype] < 4:
        return "float32"
    return case.dtype


def state_bytes(case: Case) -> int:
    """Bytes of the KV cache (attention) or recurrent state that a decode step at context ``case.seq_len`` reads."""
    element = DTYPE_BYTES[state_dtype(case)]
    if case.family == "attention":
        return 2 * case.layers * case.batch * case.span * case.d_model * element
    if case.model not in _STATE_VECTORS:
        raise ValueError(f"no decode state for recurrent model {case.model!r}; known: {', '.join(_STATE_VECTORS)}")
    return _STATE_VECTORS[case.model] * case.layers * case.batch * recurrent_hidden(case) * element
