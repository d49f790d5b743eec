"""The serving questions' cases (issue 41): two generic fields, keyed and written only when set, so every existing
key and row reads as it always did; sizes as a person writes them."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from attnbench.core.cases import MODES, SERVING_PARAMS, Case
from attnbench.core.units import GIB, MIB, parse_bytes
from tests.support import tiny_case

PLAIN_KEY = (
    "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=16|d_model=16|heads=-|layers=1|causal=true"
)


def test_a_case_without_serving_keys_and_writes_as_it_always_did() -> None:
    case = tiny_case("lstm")
    assert case.key == PLAIN_KEY
    assert "serving" not in case.to_dict() and "packing" not in case.to_dict()
    assert Case.from_dict(json.loads(json.dumps(case.to_dict()))) == case


def test_serving_parameters_and_packed_lengths_key_label_and_round_trip() -> None:
    verify = replace(tiny_case("sdpa-flash", causal=True), mode="verify", serving=(("accept", 2), ("draft", 4)))
    assert verify.key.endswith("|accept=2|draft=4") and "accept=2 draft=4" in verify.label
    packed = replace(tiny_case("lstm"), batch=3, seq_len=9, packing=(4, 9, 1))
    assert packed.key == PLAIN_KEY.replace("batch=2|seq_len=16", "batch=3|seq_len=9") + "|packing=4+9+1"
    for case in (verify, packed):
        stored = json.loads(json.dumps(case.to_dict()))
        assert Case.from_dict(stored) == case
    assert verify.to_dict()["serving"] == {"accept": 2, "draft": 4} and packed.to_dict()["packing"] == [4, 9, 1]


def test_each_mode_counts_its_tokens_and_positions() -> None:
    base = tiny_case("lstm", batch=3, seq_len=10)
    assert replace(base, mode="capacity").tokens == 3 and replace(base, mode="capacity").span == 11
    prefill = replace(base, mode="prefill", serving=(("prefill_chunk", 4),))
    assert prefill.tokens == 30 and prefill.span == 10 and prefill.param("prefill_chunk") == 4
    verify = replace(base, mode="verify", serving=(("accept", 1), ("draft", 5)))
    assert verify.tokens == 15 and verify.span == 15 and verify.param("memory_budget") == 0
    assert replace(base, packing=(7, 2, 10)).tokens == 19
    assert set(SERVING_PARAMS) < set(MODES)


@pytest.mark.parametrize(
    ("text", "size"),
    [("4GiB", 4 * GIB), ("512 MiB", 512 * MIB), ("1.5GB", 1_500_000_000), ("1048576", 1_048_576), ("1KB", 1000)],
)
def test_sizes_read_as_written(text: str, size: int) -> None:
    assert parse_bytes(text) == size


@pytest.mark.parametrize("text", ["4 gib", "", "-1GiB", "GiB", "4 GiBs", "1kiB", "2 mB"])
def test_a_size_without_a_known_unit_is_refused(text: str) -> None:
    with pytest.raises(ValueError):  # "1kiB" was a KeyError (issue 50 §3.5): a traceback
        parse_bytes(text)


@pytest.mark.parametrize("text", ["9" * 400, "9" * 400 + "TiB", "99999999999TiB"])
def test_a_size_too_large_for_a_number_is_refused(text: str) -> None:
    with pytest.raises(ValueError):  # 400 digits overflowed to infinity: an OverflowError (issue 50 §3.5)
        parse_bytes(text)
