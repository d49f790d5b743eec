"""``NumericCheck``: whether what a row timed computed the right function, held to its family's reference. Torch-free.

Before a case is timed, ``timing.reference_check`` runs the same path (kernel, dtype, options, mode) once on a small
input and compares its output (and, for decode, the state after a prefill and a step) with the family's readable
form in float64: the recurrent form for a chunked or fused kernel, the explicit attention for a fused one, eager for
a compiled model, a user model's own ``reference`` method. ``rel_err`` is the largest absolute difference over the
largest absolute reference value, per compared tensor, the largest of those; a case passes when it is at most the
dtype's tolerance (``TOLERANCE``, stated in docs/explanation/methodology.md). A case that fails is an ``incorrect``
row, never timed.

Schema history: added to results.jsonl rows as the optional key ``check`` (absent in older rows and in rows of
runs that never ran a check, which read back as "not checked"); the status ``incorrect`` at the same time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from attnbench.results import fields

CheckStatus = Literal["passed", "failed", "unchecked", "skipped"]
# passed/failed: compared with the reference; unchecked: the model has no reference (a user model without a
# ``reference`` method); skipped: not compared, with the reason (the check turned off, a serving question).
CHECK_STATUSES: tuple[CheckStatus, ...] = ("passed", "failed", "unchecked", "skipped")

# The largest relative error (max |fast − reference| / max |reference|) a dtype's row may show. Measured on CPU for
# every built-in model, forward, train and decode, at the check's size (issue 50): float64 ≤ 7e-15, float32 ≤ 3e-6,
# float16 ≤ 0.013 and bfloat16 ≤ 0.04 (rwkv7's input gradient, both). The bounds leave 2.5× or more above those, and
# float32 room for TF32 (cuDNN's RNNs use it by default: ~1e-3); a wrong function reads far above (a swapped gate
# ~1; an offset of 1e-2 on outputs of order 1 reads ~1e-2, caught in float64 and float32).
TOLERANCE: dict[str, float] = {
    "float64": 1e-9,
    "float32": 5e-3,
    "float16": 5e-2,
    "bfloat16": 1e-1,
}

_OPTIONAL = ("max_abs_err", "rel_err", "tol", "seq_len", "reference", "reason", "duration_s")


def tolerance(dtype: str) -> float:
    """The relative error a row of ``dtype`` may show (an unknown dtype: float32's)."""
    return TOLERANCE.get(dtype, TOLERANCE["float32"])


@dataclass(frozen=True)
class NumericCheck:
    """One row's numerical check: its verdict, the errors it measured and the tolerance they were held to."""

    status: CheckStatus
    max_abs_err: float | None = None
    rel_err: float | None = None
    tol: float | None = None
    seq_len: int | None = None  # the tokens per sequence the check ran at
    reference: str = ""  # what the output was held to, in words ("form=recurrent, float64")
    reason: str = ""  # why it failed, was skipped or is unchecked
    # The check's wall time in the process that ran it (its cost; 0 in a row whose check an earlier row ran).
    duration_s: float | None = None

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        for name in _OPTIONAL:
            value = getattr(self, name)
            if value not in (None, ""):
                out[name] = value
        return out

    @classmethod
    def from_dict(cls, data: object) -> NumericCheck:
        """Read ``to_dict``'s output back; anything else raises ``fields.FieldError`` naming the key."""
        d = fields.record(data, "", ("status",), _OPTIONAL)

        def number(name: str) -> float | None:
            value = d.get(name)
            return None if value is None else fields.number(value, name)

        seq_len = d.get("seq_len")
        return cls(
            status=fields.choice(d["status"], "status", CHECK_STATUSES, "check status"),  # type: ignore[arg-type]
            max_abs_err=number("max_abs_err"),
            rel_err=number("rel_err"),
            tol=number("tol"),
            seq_len=None if seq_len is None else fields.integer(seq_len, "seq_len"),
            reference=fields.text(d.get("reference", ""), "reference"),
            reason=fields.text(d.get("reason", ""), "reason"),
            duration_s=None if d.get("duration_s") is None else fields.duration(d["duration_s"], "duration_s"),
        )


def bounded(value: float) -> float:
    """An error as a stored field holds it: at most ``fields.MAX_NUMBER`` (a wildly wrong kernel's 1e300 too)."""
    return min(value, fields.MAX_NUMBER)
