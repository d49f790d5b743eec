"""``Measurement``: the raw samples of one timed case, with statistics computed from them on demand.

Pure Python. Raw samples are always kept (and stored), so any statistic can be recomputed later from
a results file — ``compare`` tests against them rather than against our summaries.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Literal, get_args

from attnbench.core.stats import Summary, student_t_975, summarize
from attnbench.results import fields

# too_slow_for_budget: timing.min_samples samples did not fit in timing.max_case_s; the row is not ``ok``.
# run_once: one call after the warm-up (sweep --run-once), for an nsys or ncu run; an ok row with no CI.
StopReason = Literal["converged", "budget", "max_samples", "too_slow_for_budget", "run_once"]

NOISY_IQR_REL = 0.10  # IQR/median above this marks a cell as noisy (torch.utils.benchmark uses the same cut)
# Iglewicz & Hoaglin's cut for the modified z-score 0.6745·(x − median)/MAD: above it a sample is an outlier.
MODIFIED_Z_CUT = 3.5
_OPTIONAL = ("warnings", "warmup_moved", "replicate_medians_s", "injected_delay_s")


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
    # Timed samples the warm-up audit moved into the warm-up (they ran slower than the samples after them).
    warmup_moved: int = 0
    # One median per fresh worker process when the case ran as between-process replicates (timing.processes).
    replicate_medians_s: tuple[float, ...] = ()
    # Seconds of busy-wait added to every timed call by ``--inject-slowdown`` (only to validate ``compare``).
    injected_delay_s: float = 0.0

    @cached_property
    def within(self) -> Summary:
        """Statistics of the pooled samples alone: the within-process view."""
        return summarize(self.samples_s)

    @cached_property
    def summary(self) -> Summary:
        """The case's statistics. With replicates, the CI of the median also covers the between-process
        spread: a t-interval on the replicate medians around the pooled median, whichever side is wider."""
        within = self.within
        k = len(self.replicate_medians_s)
        if k < 2:
            return within
        half = student_t_975(k - 1) * statistics.stdev(self.replicate_medians_s) / math.sqrt(k)
        return replace(
            within,
            ci_low=min(within.ci_low, within.median - half),
            ci_high=max(within.ci_high, within.median + half),
        )

    @property
    def between_process_rel(self) -> float | None:
        """Standard deviation of the replicate medians over their mean; None without replicates."""
        if len(self.replicate_medians_s) < 2:
            return None
        return statistics.stdev(self.replicate_medians_s) / statistics.fmean(self.replicate_medians_s)

    @property
    def within_process_rel(self) -> float:
        """IQR over median of the pooled samples: the spread inside one process."""
        return self.within.iqr_rel

    @property
    def first_sample_mz(self) -> float | None:
        """Modified z-score of the first timed sample against all of them (None when the MAD is 0)."""
        if len(self.samples_s) < 3:
            return None
        centre = statistics.median(self.samples_s)
        mad = statistics.median(abs(x - centre) for x in self.samples_s)
        return None if mad == 0 else 0.6745 * (self.samples_s[0] - centre) / mad

    @property
    def median_s(self) -> float:
        return self.summary.median

    @property
    def noisy(self) -> bool:
        """The tables' "~": IQR above ``NOISY_IQR_REL`` of the median, or the CI target was not reached."""
        return self.summary.iqr_rel > NOISY_IQR_REL or not self.converged

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
            # Later fields are written only when they say something, so older rows read back unchanged.
            **({"warmup_moved": self.warmup_moved} if self.warmup_moved else {}),
            **({"replicate_medians_s": list(self.replicate_medians_s)} if self.replicate_medians_s else {}),
            **({"injected_delay_s": self.injected_delay_s} if self.injected_delay_s else {}),
        }

    @classmethod
    def from_dict(cls, data: object) -> Measurement:
        """Read ``to_dict``'s output back; anything else raises ``fields.FieldError`` naming the key."""
        required = [name for name in cls.__dataclass_fields__ if name not in _OPTIONAL]
        m = fields.record(data, "", required, _OPTIONAL)
        samples = fields.items(m["samples_s"], "samples_s", fields.seconds)
        if not samples:
            raise fields.FieldError("samples_s", "expected at least one sample, found an empty list")
        return cls(
            samples_s=tuple(samples),
            calls_per_sample=fields.integer(m["calls_per_sample"], "calls_per_sample"),
            warmup_calls=fields.integer(m["warmup_calls"], "warmup_calls", minimum=0),
            warmup_s=fields.duration(m["warmup_s"], "warmup_s"),
            converged=fields.flag(m["converged"], "converged"),
            stop_reason=fields.choice(m["stop_reason"], "stop_reason", get_args(StopReason), "stop reason"),  # type: ignore[arg-type]
            target_ci=fields.number(m["target_ci"], "target_ci", positive=True, maximum=1.0),
            warnings=tuple(fields.items(m.get("warnings", []), "warnings", fields.text)),
            warmup_moved=fields.integer(m.get("warmup_moved", 0), "warmup_moved", minimum=0),
            replicate_medians_s=tuple(
                fields.items(m.get("replicate_medians_s", []), "replicate_medians_s", fields.seconds)
            ),
            injected_delay_s=fields.duration(m.get("injected_delay_s", 0.0), "injected_delay_s"),
        )
