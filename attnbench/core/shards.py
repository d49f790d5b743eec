"""Shards: the i-th of N disjoint, deterministic slices of a sweep's cases (``sweep --shard i/N``).

A case belongs to shard ``sha256(case.key) mod N``. The key is the case's identity across runs (``Case.key``,
without the device index), so a case lands in the same shard on every machine, in every process and whatever
else the config holds: adding or removing unrelated cases never moves a case to another shard. The price is that
the slices are only roughly equal (a multinomial split), which a job array does not mind.

Stdlib only: the sweep (measure), the merge (analysis) and the submission (measure) share this one rule.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from attnbench.core.cases import Case
from attnbench.core.errors import AttnbenchError

_SPEC = re.compile(r"\s*(-?\d+)\s*/\s*(-?\d+)\s*")

MAX_SHARDS = 10_000  # a sweep is capped at 10 000 cases (100 000 with --force); more shards than that is a typo

C = TypeVar("C", bound=Case)


def shard_of(key: str, count: int) -> int:
    """The shard (0 ≤ shard < count) that holds the case with this key."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") % count


@dataclass(frozen=True, order=True)
class Shard:
    """Slice ``index`` of ``count`` (0-based, as Slurm numbers array tasks)."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_SHARDS or not 0 <= self.index < self.count:
            raise ValueError(f"not a shard: {self.index}/{self.count}")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, case: Case) -> bool:
        return shard_of(case.key, self.count) == self.index

    def select(self, cases: Iterable[C]) -> list[C]:
        """The cases of this shard, in their given order."""
        return [case for case in cases if self.holds(case)]

    def to_dict(self) -> dict[str, int]:
        return {"index": self.index, "count": self.count}


def split(cases: Iterable[C], count: int) -> list[list[C]]:
    """Every shard's cases, shard by shard, each in the given order: a partition of ``cases``."""
    shards: list[list[C]] = [[] for _ in range(count)]
    for case in cases:
        shards[shard_of(case.key, count)].append(case)
    return shards


def parse_shard(text: str, option: str = "--shard") -> Shard:
    """``"i/N"`` → ``Shard(i, N)``; anything else is an ``AttnbenchError`` saying what is allowed."""
    match = _SPEC.fullmatch(text)
    if match is None:
        raise AttnbenchError(
            f"{option} {text!r}: expected i/N, two whole numbers such as 0/4",
            hint="the shards of an N-way split are 0/N, 1/N, …, (N-1)/N",
        )
    index, count = int(match[1]), int(match[2])
    if count < 1:
        raise AttnbenchError(f"{option} {text}: N must be at least 1", hint="--shard 0/1 is the whole sweep")
    if count > MAX_SHARDS:
        raise AttnbenchError(f"{option} {text}: at most {MAX_SHARDS} shards", hint="a shard should hold a few cases")
    if not 0 <= index < count:
        raise AttnbenchError(
            f"{option} {text}: the index must satisfy 0 ≤ i < {count}",
            hint=f"shards are numbered from 0: 0/{count} … {count - 1}/{count}",
        )
    return Shard(index, count)
