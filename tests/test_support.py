"""The helpers tests hold rendered text with: the numbers a line states and the names it gives, never its wording."""

from __future__ import annotations

import pytest

from tests.support import mentions, numbers


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("vanilla: time ∝ n^2.00 (95 % CI 1.90–2.10, n=64–1024, 3 points)", [2.0, 95, 1.9, 2.1, 64, 1024, 3]),
        ("+5.3 % beyond ±3 %; −50.3 %, -0.5", [5.3, 3, -50.3, -0.5]),  # signs, a minus sign, no en dash as one
        ("lstm train float32 b=4 n=64 d=64 on an H200, cuda:0", [4, 64, 64, 0]),  # digits inside a word are not
        ("no number here", []),
    ],
)
def test_numbers_are_read_as_written(text: str, found: list[float]) -> None:
    assert numbers(text) == pytest.approx(found)


def test_mentions_wants_every_name_and_value_in_one_text() -> None:
    notes = ["polled: gpu_util_pct, mem_util_pct", "throttled: SwPowerCap, the clock 9.1 % below 1980 MHz"]
    assert mentions(notes, "SwPowerCap", values=(9.1, 1980))
    assert not mentions(notes, "SwPowerCap", "gpu_util_pct")  # named, but in two different notes
    assert not mentions(notes, "SwPowerCap", values=(9,))  # 9.1 is not 9
    assert mentions(notes[0], "mem_util_pct") and not mentions([], "anything")
