"""The bytes one call must move to and from memory, torch-free: the x axis of a roofline, and what GB/s divides.

Compulsory traffic (Williams, Waterman & Patterson 2009, "Roofline", §2: the DRAM bytes a kernel cannot avoid): what
a call has to read and write however well each kernel reuses on-chip memory. The count is the lower bound the field
quotes for decoding — weights plus the KV cache or state read once per token (e.g. tritonbench's decoding
benchmarks, which report GB/s over the same bytes) — and, for a whole sequence, what crosses memory between the
kernels of one call as well (``Family.intermediate_elements``): a layer is several kernels (attention's fused QKV
projection, its core, its output projection), so Q, K, V and the core's output are written and read back, 8·B·T·d
per multi-head layer, however fused each kernel is. What a kernel keeps on chip (the score matrix of a fused core,
gate math) is left out, so a core that does not (vanilla, SDPA's math path) moves more, and its achieved bandwidth
reads correspondingly high. Per mode, with I those intermediates (bytes):

- forward: the weights read, the input read and the output written, the intermediates written and read back:
  W + X + Y + 2·I.
- backward (alone; the forward ran before the timing): the weights read (for dX) and their gradients written, the
  output's gradient read, the input read again and its gradient written (token ids take none), the intermediates
  the forward saved read back (I), and their gradients written and read between the backward's kernels (2·I):
  2·W + Y + 2·X + 3·I.
- train: both: 3·W + 3·X + 2·Y + 5·I.
- decode: the weights, the new token's input and output, the state read whole (``state_bytes``), and what a step
  writes back: the new token's K and V (one slot of a cache that grows with n: state / positions held) for
  attention, the whole state for a recurrence. A step's intermediates are one token's (a few d_model), left out.
- verify (k draft tokens after n): the weights once, the k tokens' input, output and intermediates as a forward's,
  the state of n read whole, and what the k tokens write back: the slots the cache grows by (k of them), and a fixed
  state once. The rollback after it is bookkeeping, not counted.

W = parameters × the dtype's bytes, except a table a call reads row by row (``Family.lookup_table``: the token
embedding at scope model, 21 % of bert-base's weights): a call reads the rows its B·T tokens gather (at most the
table), the backward reads none of it (token ids take no gradient) and writes its gradient whole (torch's
embedding gradient is dense). X = batch × tokens × d_model × the dtype's bytes (int64 ids at scope model);
Y = batch × tokens × d_model × the dtype's bytes. Each count carries a formula id, as FLOPs do.

History: v1 counted the whole embedding table as read and no intermediates (decode: the table only).
"""

from __future__ import annotations

from dataclasses import replace

from attnbench.core.cases import Case
from attnbench.families.catalogue import family_of
from attnbench.families.shared import DTYPE_BYTES

__all__ = ["BYTES_FORMULA", "bytes_moved"]

BYTES_FORMULA = "bytes-compulsory-v2"
_ID_BYTES = 8  # int64 token ids


def bytes_moved(case: Case, parameters: int | None, state_bytes: int | None = None) -> tuple[int, str] | None:
    """The compulsory bytes of one ``case.mode`` call and the formula id, or None without a parameter count (or,
    for decode, a state)."""
    if parameters is None:
        return None
    family = family_of(case)
    element = DTYPE_BYTES[case.dtype]
    ids = family.takes_tokens(case)
    x = case.tokens * (_ID_BYTES if ids else case.d_model * element)
    y = case.tokens * case.d_model * element
    table = family.lookup_table(case)
    rows, width = table if table is not None else (0, 0)
    # The weights a forward reads (a table only at its tokens' rows), and those the backward reads for dX (no table).
    forward_read = (max(parameters - rows * width, 0) + min(case.tokens, rows) * width) * element
    backward_read = max(parameters - rows * width, 0) * element
    gradients = parameters * element
    stem = BYTES_FORMULA.removesuffix("-v2")
    if case.mode == "decode":
        if state_bytes is None:
            return None
        # A step writes back the new token's K and V (one slot of a cache) or the whole state: the family says.
        written = family.state_written(case, state_bytes)
        return forward_read + x + y + state_bytes + written, f"{stem}-decode-v2"
    if case.mode == "verify":
        state = _verify_state(case)
        if state is None:
            return None
        drafts = replace(case, mode="forward", serving=(), seq_len=case.param("draft"))
        return forward_read + x + y + 2 * family.intermediate_elements(drafts) * element + state, f"{stem}-verify-v2"
    between = family.intermediate_elements(case) * element
    forward = forward_read + x + y + 2 * between
    backward = backward_read + gradients + y + x + (0 if ids else x) + 3 * between
    if case.mode == "forward":
        return forward, BYTES_FORMULA
    if case.mode == "backward":
        return backward, f"{stem}-backward-v2"
    return forward + backward, f"{stem}-train-v2"


def _verify_state(case: Case) -> int | None:
    """The state bytes a verify reads and writes (module notes): read at n, grown by the k slots a cache gains, and a
    fixed state written once (a step's write beyond its one slot of growth); None where the family cannot count."""
    family, drafts = family_of(case), case.param("draft")
    at_n = replace(case, mode="decode", serving=(), seq_len=case.seq_len - 1)  # a step's n − 1 positions and its own
    before, after = family.state_bytes(at_n), family.state_bytes(case)  # a verify holds n + k
    if before is None or after is None:
        return None
    grown = after - before
    return before + grown + max(family.state_written(at_n, before) - grown // drafts, 0)
