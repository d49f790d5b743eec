"""Checks that a run's numbers agree with each other: train should cost what forward and backward cost apart.

Pure Python (results are read through their attributes only), so reports and claims may use it without torch.
``train`` times forward + backward in one call; ``forward`` (under inference_mode) and ``backward`` (alone, on a
retained graph) time the parts. Their sum should be within ±10 % of train; a case outside that band says one of
the three measures something the others do not, and the reason line says what that usually is.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from attnbench.core.units import format_seconds

if TYPE_CHECKING:
    from attnbench.results.records import Result

TRAIN_BAND = (0.9, 1.1)  # train / (forward + backward) outside this is flagged

_ABOVE = (
    "train costs more than its parts: its forward records the autograd graph and saves activations, which the "
    "inference-mode forward skips, and it allocates that graph every call where backward alone replays one"
)
_BELOW = (
    "train costs less than its parts: forward + backward pays the per-call overhead twice (an overhead-bound "
    "case?), or backward alone runs slower than inside train (its retained graph keeps saved tensors resident)"
)


@dataclass(frozen=True)
class TrainCheck:
    """train / (forward + backward) for one case measured in all three modes."""

    train: Result
    forward: Result
    backward: Result

    @property
    def ratio(self) -> float:
        return self.train.median_s / (self.forward.median_s + self.backward.median_s)

    @property
    def ratio_range(self) -> tuple[float, float] | None:
        """The ratio's bounds from the three medians' 95 % CIs; None when one has too few samples for a CI."""
        t, f, b = (r.timing.summary for r in (self.train, self.forward, self.backward))
        low = t.ci_low / (f.ci_high + b.ci_high)
        high = t.ci_high / (f.ci_low + b.ci_low) if f.ci_low + b.ci_low > 0 else math.inf
        return (low, high) if math.isfinite(low) and math.isfinite(high) else None

    @property
    def flagged(self) -> bool:
        return not TRAIN_BAND[0] <= self.ratio <= TRAIN_BAND[1]

    @property
    def reason(self) -> str:
        """Why a flagged ratio is likely off, and whether the samples could explain it; empty when not flagged."""
        if not self.flagged:
            return ""
        above = self.ratio > TRAIN_BAND[1]
        text = f"{'above' if above else 'below'} {TRAIN_BAND[int(above)]:g}: " + (_ABOVE if above else _BELOW)
        bounds = self.ratio_range
        if bounds is not None and bounds[0] <= TRAIN_BAND[1] and bounds[1] >= TRAIN_BAND[0]:
            text += f"; but within noise: the medians' 95 % CIs allow {bounds[0]:.2f}–{bounds[1]:.2f}"
        unsettled = [r.case.mode for r in (self.train, self.forward, self.backward) if not r.timing.converged]
        if unsettled:
            names = unsettled[0] if len(unsettled) == 1 else ", ".join(unsettled[:-1]) + " and " + unsettled[-1]
            text += f"; {names} did not reach the CI target, so noise may explain it"
        return text

    @property
    def parts_text(self) -> str:
        """'train 10.9 ms; forward 4.15 ms + backward 4.6 ms'."""
        return (
            f"train {format_seconds(self.train.median_s)}; forward {format_seconds(self.forward.median_s)} + "
            f"backward {format_seconds(self.backward.median_s)}"
        )

    @property
    def text(self) -> str:
        """'lstm train float32 b=4 n=256 d=256: 1.25 (train 10.9 ms; forward 4.15 ms + backward 4.6 ms)'."""
        return f"{self.train.case.label}: {self.ratio:.2f} ({self.parts_text})"


def train_checks(results: Sequence[Result]) -> list[TrainCheck]:
    """Every case timed ok in forward, backward and train (same key apart from the mode), in run order."""
    timed = {r.case.key: r for r in results if r.is_timed and r.median_s > 0}
    checks = []
    for r in results:
        if r.case.mode != "train" or timed.get(r.case.key) is not r:
            continue
        forward = timed.get(replace(r.case, mode="forward").key)
        backward = timed.get(replace(r.case, mode="backward").key)
        if forward is not None and backward is not None:
            checks.append(TrainCheck(r, forward, backward))
    return checks


def train_check_summary(checks: Sequence[TrainCheck]) -> str:
    """One line over all checks: how many sit inside the band, and the range of the ratio."""
    ratios = [c.ratio for c in checks]
    inside = sum(not c.flagged for c in checks)
    low, high = TRAIN_BAND
    return (
        f"train / (forward + backward), expected {low:g}–{high:g}: {inside} of {len(checks)} cases inside "
        f"(all: {min(ratios):.2f}–{max(ratios):.2f})"
    )
