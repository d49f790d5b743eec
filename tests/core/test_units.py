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


def test_the_number_formatters_the_readings_share() -> None:
    """The formatters analysis, report and claims once each kept to themselves (issue 47): one place now."""
    from attnbench.core.units import format_approx, format_fixed, format_metric, format_number, format_pct

    assert [format_fixed(x) for x in (1.984, -0.001, -1.5, 0.0)] == ["1.98", "0.00", "-1.50", "0.00"]
    assert format_fixed(-0.01, 1) == "0.0"
    assert [format_number(x) for x in (512.0, 1024, 1500.5, 0.123456)] == ["512", "1024", "1.5e+03", "0.123"]
    assert [format_approx(x) for x in (42.4, 99.6, 1234.0, 15678.9)] == ["42", "100", "1200", "16000"]
    assert [format_metric(v) for v in (None, 1.25, 3, "x")] == ["", "1.2", "3", "x"]
    assert format_metric(4.25, 2) == "4.25" and format_metric(1800.4, 0) == "1800"
    assert [format_pct(v) for v in (97.4, 12, None, True, "x")] == ["97 %", "12 %", "n/a", "n/a", "n/a"]
