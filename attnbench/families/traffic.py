"""The bytes one call must move to and from memory, torch-free: the x axis of a roofline, and what GB/s divides.

Compulsory traffic (Williams, Waterman & Patterson 2009, "Roofline", §2: the DRAM bytes a kernel cannot avoid): what
a call has to read and write however well it reuses on-chip memory. Intermediates (Q, K, V, the score matrix of a
core that materialises it, gate pre-activations) are left out, since a fused kernel keeps them on chip; a core
that does not (vanilla, SDPA's math path) moves more, and its achieved bandwidth reads correspondingly high. The
count is the lower bound the field quotes for decoding — weights plus the KV cache or state read once per token
(e.g. tritonbench's decoding benchmarks, which report GB/s over the same bytes) — and it is the same for every
model, built-in or a user's, because it needs only the row's parameter count and its decode state:

- forward: the weights read once, the input read and the output written: W + X + Y.
- backward (alone): the weights read and their gradients written, the output's gradient read, the input read
  again and its gradient written (token ids take none): 2·W + Y + 2·X.
- train: both: 3·W + 3·X + 2·Y.
- decode: the weights, the new token's input and output, the state read whole (``state_bytes``), and what a step
  writes back: the new token's K and V (one slot of a cache that grows with n: state / positions held) for
  attention, the whole state for a recurrence.

W = parameters × the dtype's bytes; X = batch × tokens × d_model × the dtype's bytes (int64 ids at scope model);
Y = batch × tokens × d_model × the dtype's bytes. Each count carries a formula id, as FLOPs do.
"""

from __future__ import annotations

from attnbench.core.cases import Case
from attnbench.families.catalogue import family_of
from attnbench.families.shared import DTYPE_BYTES

__all__ = ["BYTES_FORMULA", "bytes_moved"]

BYTES_FORMULA = "bytes-compulsory-v1"
_ID_BYTES = 8  # int64 token ids


def bytes_moved(case: Case, parameters: int | None, state_bytes: int | None = None) -> tuple[int, str] | None:
    """The compulsory bytes of one ``case.mode`` call and the formula id, or None without a parameter count (or,
    for decode, a state)."""
    if parameters is None:
        return None
    element = DTYPE_BYTES[case.dtype]
    tokens = case.batch if case.mode == "decode" else case.batch * case.seq_len
    weights = parameters * element
    x = tokens * (_ID_BYTES if family_of(case).takes_tokens(case) else case.d_model * element)
    y = tokens * case.d_model * element
    stem = BYTES_FORMULA.removesuffix("-v1")
    if case.mode == "forward":
        return weights + x + y, BYTES_FORMULA
    if case.mode == "backward":
        return 2 * weights + y + (2 * x if not family_of(case).takes_tokens(case) else x), f"{stem}-backward-v1"
    if case.mode == "train":
        grad_x = 0 if family_of(case).takes_tokens(case) else x
        return 3 * weights + 2 * x + grad_x + 2 * y, f"{stem}-train-v1"
    if state_bytes is None:
        return None
    # A step writes back the new token's K and V (one slot of a cache) or the whole state: the family says.
    written = family_of(case).state_written(case, state_bytes)
    return weights + x + y + state_bytes + written, f"{stem}-decode-v1"
