"""The bytes a decoder carries from one token to the next, from shapes and dtype (torch-free).

Attention keeps K and V of every position it has seen, in every layer: its KV cache grows ∝ n. A recurrent model
keeps a fixed-size state whatever n. This is the ``state_bytes`` of a decode row, computed by the model's family
(``attnbench.families.<family>``, which states its formula); the executor also measures what the allocated
state holds (``state_mem_bytes``), and a test holds the two equal for every built-in family. A model whose family
cannot compute it (a user's) has only the measured figure.
"""

from __future__ import annotations

from attnbench.core.cases import Case
from attnbench.families.catalogue import family_of
from attnbench.families.shared import DTYPE_BYTES

__all__ = ["DTYPE_BYTES", "state_bytes", "state_dtype"]


def state_dtype(case: Case) -> str:
    """The dtype the state is kept in: the model's, or float32 where a family accumulates 16-bit models in it."""
    return family_of(case).state_dtype(case)


def state_bytes(case: Case) -> int | None:
    """Bytes of the KV cache or recurrent state that a decode step at context ``case.seq_len`` reads; None where only
    the allocated state can tell."""
    return family_of(case).state_bytes(case)
