"""Fakes for true seams only: a seeded clock for the timing loop."""

from __future__ import annotations

import random
from collections.abc import Callable


class FakeClock:
    """Each call of the timed function 'takes' a duration drawn from ``durations``; time advances by it.

    ``durations(call_index, rng)`` returns seconds, so a test can script warm-up (slow first calls), noise
    levels and drifts exactly, with a fixed seed.
    """

    def __init__(
        self, durations: Callable[[int, random.Random], float], seed: int = 0, overhead_s: float = 0.0
    ) -> None:
        self.durations = durations
        self.rng = random.Random(seed)
        self.t = 0.0
        self.calls = 0
        self.overhead_s = overhead_s

    def now(self) -> float:
        return self.t

    def time(self, fn: Callable[[], object], calls_per_sample: int, samples: int) -> list[float]:
        out = []
        for _ in range(samples):
            total = 0.0
            for _ in range(calls_per_sample):
                fn()
                total += self.durations(self.calls, self.rng)
                self.calls += 1
            self.t += total + self.overhead_s
            out.append(total / calls_per_sample)
        return out


def gaussian(median_s: float, rel_sd: float, warmup_calls: int = 0, warmup_factor: float = 5.0):
    """Stationary noise around ``median_s`` after ``warmup_calls`` calls that are ``warmup_factor`` slower."""

    def durations(i: int, rng: random.Random) -> float:
        base = median_s * (warmup_factor if i < warmup_calls else 1.0)
        return max(base * 1e-3, rng.gauss(base, base * rel_sd))

    return durations
