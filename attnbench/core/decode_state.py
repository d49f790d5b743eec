"""The bytes a decoder carries from one token to the next, from shapes and dtype (torch-free).

Attention keeps K and V of every position it has seen, in every layer: its KV cache grows ∝ n. A recurrent model
keeps a fixed-size state whatever n: h (and c for an LSTM) per layer. This is the ``state_bytes`` of a decode row,
computed; the executor also measures what the allocated state holds (``state_mem_bytes``), and a test holds this
count equal to the bytes of the tensors ``attnbench.measure.models`` allocates.

- Attention: 2 (K and V) × layers × batch × (n + 1) positions × H_kv × head_dim × the dtype's bytes. The cache
  holds the n context positions and the slot the new token's K and V are written into; H_kv·head_dim is d_model
  for multi-head attention, H / H_kv times less under GQA (MQA: one head). A sliding window of W keeps a ring of
  min(n + 1, W) slots, so its cache stops growing at n = W.
- Linear attention: S (head_dim × head_dim) and z (head_dim) per key/value head, layer and sequence, in float32
  for 16-bit models (its accumulation dtype, ``attnbench.measure.models.linear``); constant in n.
- LSTM: 2 (h and c) × layers × batch × hidden; GRU: 1 × …; in the model's dtype.
- minGRU/minLSTM: layers × batch × hidden, in the scan's dtype (float32 for 16-bit models, which keeps the
  recurrence from losing its state to rounding: ``attnbench.measure.models.minrnn``).

Bookkeeping the kernels need beside the state (flash-attn's int32 ``cache_seqlens``: 4 bytes per sequence) is
not counted.
"""

from __future__ import annotations

from attnbench.core.cases import Case
from attnbench.core.flops import kv_width, recurrent_hidden

DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
# h and c of an LSTM cell; h alone for GRU and the min-RNNs.
_STATE_VECTORS = {"lstm": 2, "gru": 1, "mingru": 1, "minlstm": 1}


def state_dtype(case: Case) -> str:
    """The dtype the state is kept in: the model's, except float32 for 16-bit min-RNNs and linear attention."""
    if case.model in ("mingru", "minlstm", "linear-attn") and DTYPE_BYTES[case.dtype] < 4:
        return "float32"
    return case.dtype


def state_bytes(case: Case) -> int:
    """Bytes of the KV cache (attention) or recurrent state that a decode step at context ``case.seq_len`` reads."""
    element = DTYPE_BYTES[state_dtype(case)]
    if case.family == "attention":
        slots = min(case.span, case.window) if case.window else case.span
        return 2 * case.layers * case.batch * slots * kv_width(case) * element
    if case.model == "linear-attn":
        head_dim = case.d_model // (case.heads or 1)
        return case.layers * case.batch * (case.heads_kv or 0) * (head_dim * head_dim + head_dim) * element
    if case.model not in _STATE_VECTORS:
        raise ValueError(f"no decode state for recurrent model {case.model!r}; known: {', '.join(_STATE_VECTORS)}")
    return _STATE_VECTORS[case.model] * case.layers * case.batch * recurrent_hidden(case) * element
