"""Shards partition a sweep's cases exactly, deterministically, and stably (core.shards)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench.config.grid import Axes, expand
from attnbench.core.cases import Case
from attnbench.core.errors import AttnbenchError
from attnbench.core.shards import Shard, parse_shard, shard_of, split
from tests.support import ROOT

MODELS = ("lstm", "gru", "vanilla", "sdpa-flash", "sdpa", "mingru")


@st.composite
def configs(draw: st.DrawFn) -> list[Case]:
    """The cases of a random config: a random subset of every axis, crossed as `expand` crosses a config."""

    def some(values: list[int] | tuple[str, ...]) -> tuple:  # type: ignore[type-arg]
        return tuple(draw(st.lists(st.sampled_from(values), min_size=1, max_size=min(3, len(values)), unique=True)))

    axes = Axes(
        models=some(MODELS),
        modes=some(("forward", "train", "backward")),  # type: ignore[arg-type]
        dtypes=some(("float32", "bfloat16")),
        batch=some([1, 2, 4]),
        seq_len=some([8, 16, 64, 256, 1024]),
        d_model=some([16, 64]),
        heads=some([1, 2, 4]),
        layers=some([1, 2]),
        causal=tuple(draw(st.lists(st.booleans(), min_size=1, max_size=2, unique=True))),
        device=draw(st.sampled_from(["cpu", "cuda:0", "cuda:3"])),
    )
    return expand(axes)


@settings(max_examples=60, deadline=None)
@given(cases=configs(), count=st.integers(min_value=1, max_value=12))
@pytest.mark.slow
def test_shards_partition_the_cases_exactly(cases: list[Case], count: int) -> None:
    shards = split(cases, count)
    assert len(shards) == count
    # Every case in exactly one shard, none invented, each shard in the config's order.
    flat = [case for shard in shards for case in shard]
    assert sorted(flat, key=cases.index) == cases and len(flat) == len(cases)
    for index, shard in enumerate(shards):
        assert shard == Shard(index, count).select(cases)
        assert all(Shard(index, count).holds(case) for case in shard)


@settings(max_examples=40, deadline=None)
@given(cases=configs(), more=configs(), count=st.integers(min_value=1, max_value=8))
def test_adding_unrelated_cases_moves_no_case_to_another_shard(cases: list[Case], more: list[Case], count: int) -> None:
    grown = cases + [c for c in more if c not in cases]
    before = {c.key: i for i, shard in enumerate(split(cases, count)) for c in shard}
    after = {c.key: i for i, shard in enumerate(split(grown, count)) for c in shard}
    assert all(after[key] == index for key, index in before.items())


def test_a_case_lands_in_the_same_shard_in_every_process_and_on_every_gpu_index() -> None:
    # str hashes are salted per process (PYTHONHASHSEED); the shard must not be.
    key = "model=lstm|mode=forward|dtype=float32|device=cuda|batch=1|seq_len=8|d_model=16|heads=-|layers=1|causal=true"
    code = f"from attnbench.core.shards import shard_of; print(shard_of({key!r}, 7))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert int(other.stdout) == shard_of(key, 7)
    a = Case("lstm", "forward", "float32", "cuda:0", 1, 8, 16, None, 1, True)
    assert Shard(shard_of(a.key, 5), 5).holds(Case("lstm", "forward", "float32", "cuda:3", 1, 8, 16, None, 1, True))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("3/3", "0 ≤ i < 3"),
        ("-1/3", "0 ≤ i < 3"),
        ("0/0", "N must be at least 1"),
        ("1/-2", "N must be at least 1"),
        ("1", "expected i/N"),
        ("a/b", "expected i/N"),
        ("1/2/3", "expected i/N"),
        ("0/100000", "at most 10000 shards"),
    ],
)
def test_a_bad_shard_spec_says_what_is_allowed(text: str, problem: str) -> None:
    with pytest.raises(AttnbenchError, match="--shard") as caught:
        parse_shard(text)
    assert problem in caught.value.message and caught.value.hint


def test_a_shard_spec_reads_back() -> None:
    assert parse_shard(" 2 / 5 ") == Shard(2, 5) and str(Shard(2, 5)) == "2/5"
    with pytest.raises(ValueError):
        Shard(5, 5)
