"""Rounds over cases (``timing.rounds``): the sweep visits every case R times, A B C A B C …, and merges a case's
blocks into its one row.

Measured case after case, a sweep lets a neighbour's burst of load land on whichever cases ran while it lasted, and
the ratio of two cases (a speed-up, a crossover) takes the burst whole. Spread over the sweep in rounds (as pyperf
spreads a benchmark over processes), each case samples every stretch of the sweep alike, so contention slows all of
them together and their ratios survive it; the spread of a case's R block medians widens its CI
(``Measurement.replicate_medians_s``). Each block gets a round's share of the budget (``block_policy``) and warms
up again, since its case is built again.

A block that is not ok settles its case (its row is that block, as a failed replicate fails a case); an ok block
that is not the last is handed to ``on_block`` (the run folder's rounds.jsonl) so that an interrupted sweep resumes
from the rounds it finished. A case's row is written the moment its last round ends. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from attnbench.core.cases import Case, TimingPolicy
from attnbench.results.records import Result
from attnbench.sweeps.loop import OomSkipper
from attnbench.sweeps.replicated_executor import merge_replicates

# The fewest samples a block takes, whatever min_samples / rounds gives: a median's CI needs a few.
MIN_BLOCK_SAMPLES = 3


def block_policy(timing: TimingPolicy) -> TimingPolicy:
    """How one round of a case is timed: a round's share of its budget (max_case_s, min_time_s, the sample counts);
    the warm-up keeps its own length, at most the block's budget, since every round builds the case again."""
    rounds = timing.rounds
    if rounds <= 1:
        return timing
    least = max(MIN_BLOCK_SAMPLES, math.ceil(timing.min_samples / rounds))
    budget_s = timing.max_case_s / rounds
    return replace(
        timing,
        max_case_s=budget_s,
        min_time_s=timing.min_time_s / rounds,
        min_samples=least,
        max_samples=max(least, math.ceil(timing.max_samples / rounds)),
        warmup_max_s=min(timing.warmup_max_s, budget_s),
        rounds=1,
    )


def run_rounds(
    cases: Sequence[Case],
    rounds: int,
    execute: Callable[[Case], Result],
    on_result: Callable[[int, Result], None],
    *,
    on_start: Callable[[int, Case], None] | None = None,
    on_round: Callable[[int, int], None] | None = None,
    on_block: Callable[[int, Result], None] | None = None,
    skipper: OomSkipper | None = None,
    done: Mapping[str, Sequence[Result]] | None = None,
) -> list[Result]:
    """Visit every case ``rounds`` times in round order; ``on_result(index, row)`` as each case's row is settled
    (its last round ended, or a block failed). ``done``: ok blocks an interrupted run kept, by case key (a case
    takes only the rounds it lacks). ``on_round(r, rounds)`` before round r; ``on_block(index, block)`` for each ok
    block that is not a case's last, after its work and before the next block starts."""
    blocks: dict[str, list[Result]] = {c.key: list((done or {}).get(c.key, ()))[: rounds - 1] for c in cases}
    settled: set[str] = set()
    results: list[Result] = []

    def settle(index: int, row: Result) -> None:
        settled.add(row.case.key)
        results.append(row)
        on_result(index, row)

    for number in range(1, rounds + 1):
        if on_round is not None:
            on_round(number, rounds)
        for index, case in enumerate(cases):
            held = blocks[case.key]
            if case.key in settled or len(held) >= number:
                continue
            if on_start is not None:
                on_start(index, case)
            # A longer length of a model that ran out of memory would too; a case with blocks keeps its evidence.
            result = skipper.skip(case) if skipper is not None and not held else None
            if result is None:
                result = execute(case)
            if skipper is not None:
                skipper.record(result)
            if not result.ok:
                settle(index, replace(result, reason=f"round {number} of {rounds}: {result.reason}"))
                continue
            if result.measurement is None:  # an ok row without timing (nothing to pool): it stands as it is
                settle(index, result)
                continue
            held.append(result)
            if len(held) >= rounds:
                settle(index, merge_replicates(held, unit="round"))
            elif on_block is not None:
                on_block(index, result)
    return results
