"""Unit constants and the only place numbers become human text (everything inside is SI)."""

from __future__ import annotations

import math
import re

KIB = 1024
MIB = 1024**2
GIB = 1024**3
TIB = 1024**4

# The largest number a stored count (or a model option) may hold: half of int64's range, above any count of bytes,
# FLOPs or parameters a row holds, and still an int64 after a round trip through float64 (pandas' way with an
# integer column that has blanks), which 2**63 - 1 is not. Readers refuse beyond it (results.fields); a config is
# held to it (config.checks.check_option_value) so that what a run accepts, it reads back.
MAX_INTEGER = 2**62


# A size as a person writes it: a number and a unit, binary (KiB … TiB) or decimal (kB … TB), or bytes alone.
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kKMGT]i?B|B)?\s*")
_SIZE_UNITS = {
    "B": 1,
    **{f"{p}iB": 1024 ** (i + 1) for i, p in enumerate("KMGT")},
    **{f"{p}B": 1000 ** (i + 1) for i, p in enumerate("kMGT")},
    "KB": 1000,
}


def parse_bytes(text: str) -> int:
    """``"4GiB"``, ``"512 MiB"``, ``"1.5GB"``, ``"1048576"`` as bytes (whole: a fraction of a byte rounds down);
    ValueError for anything else."""
    allowed = "a number and a unit (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB)"
    match = _SIZE.fullmatch(text)
    # The pattern lets a unit's case slip ("kiB"): a unit it matches but does not know is the same mistake.
    if match is None or (match.group(2) or "B") not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size: {allowed}")
    number, unit = match.groups()
    value = float(number) * _SIZE_UNITS[unit or "B"]
    if not math.isfinite(value) or value > MAX_INTEGER:  # 400 digits overflow a float; callers bound it tighter
        raise ValueError(f"{text!r} is too large a size: at most {MAX_INTEGER} bytes")
    return int(value)


def to_ms(seconds: float) -> float:
    """Seconds as milliseconds, for the formats whose columns are in ms (summary.csv, the dashboard exports)."""
    return seconds * 1e3


def to_mib(n_bytes: float) -> float:
    """Bytes as MiB, for the formats whose columns are in MiB (summary.csv, the dashboard exports, tables)."""
    return n_bytes / MIB


def _digits(value: float) -> str:
    """3 significant digits, but never exponent notation: 999.7 and 1023 (a value that rounds up past the
    unit's range, or a count of GiB) print as integers rather than '1e+03'."""
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e" in text else text


def format_seconds(seconds: float) -> str:
    """Pick ns/µs/ms/s so the number has 3-4 significant digits."""
    if not math.isfinite(seconds):
        return "n/a"
    for scale, unit in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if abs(seconds) >= scale:
            return f"{_digits(seconds / scale)} {unit}"
    return f"{_digits(seconds / 1e-9)} ns"


def format_bytes(n_bytes: float) -> str:
    if not math.isfinite(n_bytes):
        return "n/a"
    for scale, unit in ((TIB, "TiB"), (GIB, "GiB"), (MIB, "MiB"), (KIB, "KiB")):
        if abs(n_bytes) >= scale:
            return f"{_digits(n_bytes / scale)} {unit}"
    return f"{n_bytes:.0f} B"


def format_duration(seconds: float) -> str:
    """A wall-clock span for a person: ``"48 s"``, ``"4 min 10 s"``, ``"2 h 5 min"`` (whole seconds or minutes)."""
    if not math.isfinite(seconds):
        return "n/a"
    total = round(seconds)
    if total < 60:
        return f"{total} s"
    if total < 3600:
        minutes, secs = divmod(total, 60)
        return f"{minutes} min" + (f" {secs} s" if secs else "")
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h" + (f" {minutes} min" if minutes else "")


def format_rate(per_second: float) -> str:
    """Tokens per second with a k/M/G prefix."""
    if not math.isfinite(per_second):
        return "n/a"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(per_second) >= scale:
            return f"{_digits(per_second / scale)}{prefix}"
    return f"{_digits(per_second)}"


def format_flops(flops_per_s: float) -> str:
    """``"780 TFLOP/s"``: decimal prefixes, as vendors print them."""
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M")):
        if flops_per_s >= scale:
            return f"{flops_per_s / scale:.3g} {prefix}FLOP/s"
    return f"{flops_per_s:.3g} FLOP/s"


def format_bandwidth(bytes_per_s: float) -> str:
    """``"4.3 TB/s"``: decimal prefixes, as vendors print them."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M")):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.3g} {prefix}B/s"
    return f"{bytes_per_s:.3g} B/s"


def format_fixed(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals, a negative zero read as zero: a fitted exponent (``"1.98"``, ``"0.00"``)."""
    text = f"{x:.{digits}f}"
    return text[1:] if text == "-" + f"{0:.{digits}f}" else text


def format_number(x: float) -> str:
    """A whole number in full, anything else to 3 significant digits: a length that may be a fitted one."""
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.3g}"


def format_approx(x: float) -> str:
    """Two significant figures (below 100: a whole number): an interpolated length is no more precise than that."""
    if x < 100:
        return f"{x:.0f}"
    return f"{round(x, 1 - math.floor(math.log10(x))):.0f}"


def format_metric(value: object, digits: int = 1) -> str:
    """A stored metric (any JSON value) for a table cell: empty for None, a float with ``digits`` decimals, anything
    else as stored."""
    if value is None:
        return ""
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def format_pct(value: object) -> str:
    """A stored percentage (already × 100; any JSON value) as a whole percent, ``"n/a"`` where it is no number."""
    return f"{value:.0f} %" if isinstance(value, int | float) and not isinstance(value, bool) else "n/a"


def format_percent(fraction: float) -> str:
    """``0.05`` → ``"5 %"``: a threshold, a noise floor or a change, 3 significant digits."""
    return f"{fraction * 100:.3g} %"


def format_change(fraction: float) -> str:
    """A relative change, signed, one decimal: ``0.103`` → ``"+10.3 %"``."""
    return f"{fraction * 100:+.1f} %"


def format_change_interval(low: float, high: float) -> str:
    """An interval of relative changes: ``"+6.1 … +14.7 %"``."""
    return f"{low * 100:+.1f} … {high * 100:+.1f} %"


def plural(n: int, word: str) -> str:
    """``n`` and ``word``, with an s unless ``n`` is 1: "1 round", "3 rounds"."""
    return f"{n} {word}{'' if n == 1 else 's'}"


def count_of(value: object, word: str) -> str:
    """A stored count (an environment field: any JSON value) and ``word``: ``plural`` for an int, else the value
    as stored (or "?") before the plural word."""
    if isinstance(value, int) and not isinstance(value, bool):
        return plural(value, word)
    return f"{'?' if value is None else value} {word}s"
