"""``Measurement``: the raw samples of one timed case, with statistics computed from them on demand.

Layer 2, pure Python. Raw samples are always kept (and stored), so any statistic can be recomputed later from
a results file — ``compare`` tests against them rather than against our summaries.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

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

    @property
    def calls(self) -> int:
        return len(self.samples_s) * self.calls_per_sample

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
    def from_dict(cls, data: Mapping[str, object]) -> Measurement:
        return cls(
            samples_s=tuple(float(x) for x in data["samples_s"]),  # type: ignore[attr-defined]
            calls_per_sample=int(data["calls_per_sample"]),  # type: ignore[call-overload]
            warmup_calls=int(data["warmup_calls"]),  # type: ignore[call-overload]
            warmup_s=float(data["warmup_s"]),  # type: ignore[arg-type]
            converged=bool(data["converged"]),
            stop_reason=data["stop_reason"],  # type: ignore[arg-type]
            target_ci=float(data["target_ci"]),  # type: ignore[arg-type]
            warnings=tuple(str(w) for w in data.get("warnings", ())),  # type: ignore[attr-defined]
        )
