"""Stored rows of the serving questions (issue 41): their parameters and packed lengths read back, checked against
their bounds, and a capacity row's tokens per second counted at the batch it found."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from attnbench.core.cases import Case
from attnbench.results.fields import FieldError
from attnbench.results.measurement import Measurement
from attnbench.results.records import Result
from tests.support import tiny_case

VERIFY = replace(tiny_case("lstm", seq_len=32), mode="verify", serving=(("accept", 2), ("draft", 4)))
PACKED = replace(tiny_case("sdpa-flash", causal=True), batch=3, seq_len=9, packing=(4, 9, 1))
CAPACITY = replace(tiny_case("lstm", batch=1), mode="capacity", serving=(("memory_budget", 2**30),))


def stored(case: Case, **extra: Any) -> dict[str, Any]:
    measurement = Measurement((0.5, 0.5, 0.5), 1, 1, 0.0, True, "converged", 0.01)
    return json.loads(json.dumps(Result(case, "ok", measurement=measurement, extra=extra).to_dict()))


@pytest.mark.parametrize("case", [VERIFY, PACKED, CAPACITY], ids=["verify", "packed", "capacity"])
def test_a_serving_row_reads_back_as_it_was_written(case: Case) -> None:
    assert Result.from_dict(stored(case)).case == case


def test_a_capacity_row_counts_its_tokens_at_the_batch_it_found() -> None:
    row = Result.from_dict(stored(CAPACITY, capacity_batch=1000))
    assert row.tokens_per_call == 1000 and row.tokens_per_s == pytest.approx(2000)
    assert Result.from_dict(stored(PACKED)).tokens_per_call == 14  # the packed lengths' sum, not batch × seq_len


@pytest.mark.parametrize(
    ("case", "change", "key"),
    [
        (VERIFY, {"serving": {"accept": 5, "draft": 4}}, "serving.accept"),
        (VERIFY, {"serving": {"draft": 4}}, "serving"),
        (VERIFY, {"serving": {"accept": 1, "draft": 4, "prefill_chunk": 3}}, "serving"),
        (VERIFY, {"serving": {"accept": 0, "draft": 0}}, "serving.draft"),
        (CAPACITY, {"serving": {"memory_budget": 2**60}}, "serving.memory_budget"),
        (CAPACITY, {"serving": {"memory_budget": "1GiB"}}, "serving.memory_budget"),
        (PACKED, {"serving": {"prefill_chunk": 4}}, "serving"),
        (PACKED, {"packing": [4, 9]}, "packing"),
        (PACKED, {"packing": [4, 0, 1]}, "packing[1]"),
        (PACKED, {"packing": [4, 9, 1], "mode": "decode"}, "packing"),
        (PACKED, {"packing": "4+9+1"}, "packing"),
    ],
)
def test_a_serving_field_out_of_its_bounds_is_refused_by_key(case: Case, change: dict[str, Any], key: str) -> None:
    data = stored(case)
    data["case"].update(change)
    with pytest.raises(FieldError) as caught:
        Result.from_dict(data)
    assert caught.value.key == f"case.{key}"


@pytest.mark.parametrize(
    ("case", "extra"),
    [
        (CAPACITY, {"capacity_batch": -1000}),
        (CAPACITY, {"capacity_batch": 0}),
        (CAPACITY, {"bytes_per_sequence": -5}),
        (CAPACITY, {"weight_bytes": -1}),
        (VERIFY, {"verify_s": -0.5}),
        (VERIFY, {"rollback_s": -0.5}),
        (PACKED, {"padded_s": -0.5}),
        (PACKED, {"padded_tokens_per_s": -3.0}),
        (PACKED, {"flops": -(10**9)}),
        (PACKED, {"executed_flops": -1}),
        (PACKED, {"bytes_moved": -(10**6)}),
    ],
)
def test_a_stored_serving_value_out_of_its_bounds_is_refused_like_the_older_fields(
    case: Case, extra: dict[str, Any]
) -> None:
    """Issue 50 §3.6: a negative batch, time, FLOP count or byte count read back as a number (a negative tokens/s,
    % of peak or GB/s in every reader); a capacity of 0 divided by zero in report's pivot."""
    with pytest.raises(FieldError) as caught:
        Result.from_dict(stored(case, **extra))
    assert caught.value.key == f"extra.{next(iter(extra))}"
