"""``Measurement``: the raw samples of one timed case, with statistics computed from them on demand.

Layer 2, pure Python. Raw samples are always kept (and stored), so any statistic can be recomputed later from
a results file — ``compare`` tests against them rather than against our summaries.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Literal, get_args

from attnbench import checks
from attnbench.stats import Summary, summarize

StopReason = Literal["converged", "budget", "max_samples"]

NOISY_IQR_REL = 0.10  # IQR/median above this marks a cell as noisy (torch.utils.benchmark uses the same cut)


@dataclass(frozen=True)
class Measurement:
    """Per-call seconds for each sample; a sample averages ``calls_per_sample`` back-to-back calls."""

    samples_s: tuple[float, ...]
    calls_per_sample: int
    warmup_calls: int
    warmup_s: float
    converged: bool
    stop_reason: StopReason
    target_ci: float
    warnings: tuple[str, ...] = ()

    @cached_property
    def summary(self) -> Summary:
        return summarize(self.samples_s)

    @property
    def median_s(self) -> float:
        return self.summary.median

    def to_dict(self) -> dict[str, object]:
        return {
            "samples_s": list(self.samples_s),
            "calls_per_sample": self.calls_per_sample,
            "warmup_calls": self.warmup_calls,
            "warmup_s": self.warmup_s,
            "converged": self.converged,
            "stop_reason": self.stop_reason,
            "target_ci": self.target_ci,
            "warnings": list(self.warnings),
        }

    @classmethod
    def from_dict(cls, data: object) -> Measurement:
        """Read ``to_dict``'s output back; anything else raises ``checks.FieldError`` naming the key."""
        m = checks.record(data, "", [name for name in cls.__dataclass_fields__ if name != "warnings"], ("warnings",))
        samples = checks.items(m["samples_s"], "samples_s", lambda x, key: checks.number(x, key, positive=True))
        if not samples:
            raise checks.FieldError("samples_s", "expected at least one sample, found an empty list")
        return cls(
            samples_s=tuple(samples),
            calls_per_sample=checks.integer(m["calls_per_sample"], "calls_per_sample"),
            warmup_calls=checks.integer(m["warmup_calls"], "warmup_calls", minimum=0),
            warmup_s=checks.number(m["warmup_s"], "warmup_s"),
            converged=checks.flag(m["converged"], "converged"),
            stop_reason=checks.choice(m["stop_reason"], "stop_reason", get_args(StopReason), "stop reason"),  # type: ignore[arg-type]
            target_ci=checks.number(m["target_ci"], "target_ci", positive=True),
            warnings=tuple(checks.items(m.get("warnings", []), "warnings", checks.text)),
        )
