"""Distribution-free summary statistics of timing samples. Pure Python (layer 1), no numpy.

Timing samples are skewed (a floor set by the hardware, a tail of interruptions), so the centre we report is
the median and its uncertainty comes from order statistics, not from a normal approximation of the mean.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache


@lru_cache(maxsize=4096)
def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int] | None:
    """0-based ranks (lo, hi) of the sorted samples that bound the median with ≥ ``confidence``.

    The number of samples below the true median is Binomial(n, ½), so [x_(j), x_(n-1-j)] covers it with
    probability 1 − 2·P(B ≤ j) (e.g. Conover, *Practical Nonparametric Statistics*, §3.2). We take the largest
    j that keeps that ≥ ``confidence``. Returns None when n is too small for any interval (n < 6 at 95 %).
    """
    alpha = 1.0 - confidence
    if n < 1:
        return None
    if n > 1000:
        # Normal approximation of the binomial; exact enough and avoids huge integers.
        half = 0.5 * statistics.NormalDist().inv_cdf(1 - alpha / 2) * math.sqrt(n)
        j = max(0, math.floor(n / 2 - half) - 1)
        return j, n - 1 - j
    total = 2**n
    cumulative = 0
    best: int | None = None
    for j in range(n // 2):
        cumulative += math.comb(n, j)
        if 2 * cumulative / total <= alpha:
            best = j
        else:
            break
    if best is None:
        return None
    # P(B <= best) <= alpha/2, so 1-based [x_(best+1), x_(n-best)] covers the median with >= confidence.
    return best, n - 1 - best


@dataclass(frozen=True)
class Summary:
    """Statistics of one set of samples (same unit as the samples)."""

    n: int
    median: float
    mean: float
    std: float
    min: float
    max: float
    q1: float
    q3: float
    ci_low: float
    ci_high: float
    outliers: int

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def ci_halfwidth_rel(self) -> float:
        """The CI's wider side relative to the median: the quantity the stopping rule drives down. Timing
        samples are skewed (a long upper tail), so averaging the two sides would let the upper one run past
        the target."""
        if self.median <= 0 or not math.isfinite(self.ci_high - self.ci_low):
            return math.inf
        return max(self.median - self.ci_low, self.ci_high - self.median) / self.median

    @property
    def iqr_rel(self) -> float:
        return self.iqr / self.median if self.median > 0 else math.inf


def summarize(samples: Sequence[float], confidence: float = 0.95) -> Summary:
    """Median, spread, a distribution-free CI of the median and a Tukey-fence outlier count."""
    if not samples:
        raise ValueError("summarize() needs at least one sample")
    ordered = sorted(samples)
    n = len(ordered)
    median = statistics.median(ordered)
    if n >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    ranks = median_ci_ranks(n, confidence)
    ci_low, ci_high = (ordered[ranks[0]], ordered[ranks[1]]) if ranks else (-math.inf, math.inf)
    fence = 1.5 * (q3 - q1)
    outliers = sum(1 for x in ordered if x < q1 - fence or x > q3 + fence)
    return Summary(
        n=n,
        median=median,
        mean=statistics.fmean(ordered),
        std=statistics.stdev(ordered) if n >= 2 else 0.0,
        min=ordered[0],
        max=ordered[-1],
        q1=q1,
        q3=q3,
        ci_low=ci_low,
        ci_high=ci_high,
        outliers=outliers,
    )
