"""Numbers become text in one place; it must never print exponent notation in a table cell."""

from __future__ import annotations

from attnbench.core.units import MIB, format_bytes, format_duration, format_rate, format_seconds, plural


def test_three_significant_digits_in_the_right_unit() -> None:
    assert format_seconds(1.234e-3) == "1.23 ms"
    assert format_seconds(5e-7) == "500 ns"
    assert format_bytes(1.5 * MIB) == "1.5 MiB"
    assert format_rate(2.5e6) == "2.5M"


def test_values_that_round_past_the_unit_print_as_integers() -> None:
    assert format_seconds(0.9996) == "1000 ms"
    assert format_seconds(1500.0) == "1500 s"
    assert format_bytes(1023 * 1024) == "1023 KiB"
    assert format_bytes(1000 * MIB) == "1000 MiB"
    assert format_bytes(256 * 1024**4) == "256 TiB"
    assert "e+" not in format_rate(999_600)


def test_durations_read_as_a_clock_would() -> None:
    assert format_duration(0.4) == "0 s"
    assert format_duration(48.0) == "48 s"
    assert format_duration(59.6) == "1 min"
    assert format_duration(243.0) == "4 min 3 s"
    assert format_duration(7500.0) == "2 h 5 min"
    assert format_duration(7200.0) == "2 h"
    assert format_duration(float("inf")) == "n/a"


def test_plural_adds_an_s_unless_one() -> None:
    assert [plural(n, "interleaved round") for n in (0, 1, 3)] == [
        "0 interleaved rounds",
        "1 interleaved round",
        "3 interleaved rounds",
    ]
