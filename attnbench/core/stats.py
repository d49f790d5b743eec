"""Distribution-free summary statistics of timing samples. Pure Python, no numpy.

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


# Two-sided 95 % quantiles of Student's t for 1–30 degrees of freedom (any table, e.g. NIST/SEMATECH §1.3.6.7.2).
_T_975 = (
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228,
    2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086,
    2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
)  # fmt: skip


def student_t_975(df: int) -> float:
    """t_{0.975, df}: the multiplier of a 95 % confidence interval from ``df + 1`` values."""
    if df < 1:
        raise ValueError("student_t_975() needs at least one degree of freedom")
    if df <= len(_T_975):
        return _T_975[df - 1]
    # Cornish–Fisher expansion of t in z: within 1e-4 of the exact quantile from 31 degrees of freedom on.
    z = statistics.NormalDist().inv_cdf(0.975)
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


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
