"""A mode prefix row (issue 52 item 3) as the run folder stores it: its case's parameters keyed and bounded, its
extras typed, its summary columns filled. No torch here."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from attnbench.core.cases import Case
from attnbench.results.fields import FieldError
from attnbench.results.records import Result
from tests.support import tiny_case

SERVING = (("checkpoint_every", 8), ("prefix_tokens", 24), ("requests", 4))


def prefix_case() -> Case:
    return replace(tiny_case("lstm", seq_len=32), mode="prefix", batch=1, serving=SERVING)


def test_a_prefix_case_keys_counts_its_tokens_and_round_trips() -> None:
    case = prefix_case()
    assert case.key.endswith("|checkpoint_every=8|prefix_tokens=24|requests=4")
    assert case.tokens == 4 * 32 and case.span == 32  # every request's whole prompt
    assert Case.from_dict(json.loads(json.dumps(case.to_dict()))) == case
    stored = Result(case, "unsupported", "why").to_dict()
    assert Result.from_dict(json.loads(json.dumps(stored))).case == case


@pytest.mark.parametrize(("name", "value"), [("requests", 0), ("prefix_tokens", 0), ("checkpoint_every", -1)])
def test_a_stored_prefix_parameter_out_of_bounds_is_refused_by_key(name: str, value: int) -> None:
    stored = Result(prefix_case(), "unsupported", "why").to_dict()
    stored["case"]["serving"][name] = value
    with pytest.raises(FieldError) as caught:
        Result.from_dict(stored)
    assert caught.value.key == f"case.serving.{name}"


def test_a_stored_prefix_extra_of_the_wrong_type_is_refused() -> None:
    stored = Result(prefix_case(), "unsupported", "why").to_dict()
    stored["extra"] = {"prefix_held_bytes": "many"}
    with pytest.raises(FieldError):
        Result.from_dict(stored)
