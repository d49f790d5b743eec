"""Checks for values read back from the JSON attnbench wrote (run.json, results.jsonl). Stdlib only.

Each check returns its value, narrowed to the type it promised, or raises ``FieldError`` naming the key path, what
was expected and what was found. The reader that knows the file and line adds them (``results.load_run``).

Numbers are bounded as well as typed: a stored file is data anyone can hand us, and a sample of 1e308 s or a peak of
10**400 bytes would pass a type check and then overflow the statistics, the fits and the exports. The bounds are
far beyond any real measurement, so that arithmetic on what passes stays finite.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from attnbench.core.units import MAX_INTEGER

T = TypeVar("T")

MAX_NUMBER = 1e21  # above any FLOP/s, byte rate, watt or joule a machine reaches; products of two stay finite
# A time per call: from a picosecond (no call of any model is shorter than a clock tick) to 115 days.
MIN_SECONDS = 1e-12
MAX_SECONDS = 1e7

_KINDS = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", list: "a list", dict: "an object"}


class FieldError(ValueError):
    """One bad value: ``key`` is its dotted path inside the record ("" for the record itself)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}" if key else problem)
        self.key = key
        self.problem = problem


def found(value: object) -> str:
    """A short description of a JSON value for an error message: its JSON type and, for scalars, the value."""
    if value is None:
        return "null"
    kind = _KINDS.get(type(value), type(value).__name__)
    if isinstance(value, list | dict):
        return kind
    shown = json.dumps(value, ensure_ascii=False) if isinstance(value, str | int | float) else repr(value)
    return f"{kind} {shown if len(shown) <= 40 else shown[:37] + '...'}"


def expected(key: str, wanted: str, value: object) -> FieldError:
    return FieldError(key, f"expected {wanted}, found {found(value)}")


def record(value: object, key: str, required: Collection[str], optional: Collection[str] = ()) -> Mapping[str, Any]:
    """A JSON object with exactly these keys: every required one, any of the optional ones, nothing else."""
    if not isinstance(value, dict):
        raise expected(key, "an object", value)
    missing = [name for name in required if name not in value]
    if missing:
        raise FieldError(key, f"missing key {', '.join(repr(m) for m in missing)}")
    unknown = sorted(str(name) for name in value if name not in required and name not in optional)
    if unknown:
        known = ", ".join([*required, *optional])
        raise FieldError(key, f"unknown key {', '.join(repr(u) for u in unknown)} (known: {known})")
    return value


def path(parent: str, name: str | int) -> str:
    if isinstance(name, int):
        return f"{parent}[{name}]"
    return f"{parent}.{name}" if parent else name


def text(value: object, key: str) -> str:
    if not isinstance(value, str):
        raise expected(key, "a string", value)
    return value


def flag(value: object, key: str) -> bool:
    if not isinstance(value, bool):
        raise expected(key, "true or false", value)
    return value


def integer(value: object, key: str, minimum: int = 1, maximum: int = MAX_INTEGER) -> int:
    """An integer (not a bool, not 64.0) from ``minimum`` to ``maximum``."""
    wanted = "a positive integer" if minimum == 1 else f"an integer ≥ {minimum}"
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise expected(key, wanted, value)
    if value > maximum:
        raise expected(key, f"{wanted} of at most {maximum}", value)
    return value


def number(value: object, key: str, *, positive: bool = False, maximum: float = MAX_NUMBER) -> float:
    """A finite number, at least 0 (above 0 when ``positive``), at most ``maximum``."""
    ok = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (value > 0 if positive else value >= 0)
    )
    wanted = "a positive finite number" if positive else "a finite number ≥ 0"
    if not ok:
        raise expected(key, wanted, value)
    if value > maximum:  # type: ignore[operator]
        raise expected(key, f"{wanted} of at most {maximum:g}", value)
    return float(value)  # type: ignore[arg-type]


def seconds(value: object, key: str) -> float:
    """A time per call: a positive finite number from ``MIN_SECONDS`` to ``MAX_SECONDS``."""
    time = number(value, key, positive=True, maximum=MAX_SECONDS)
    if time < MIN_SECONDS:
        raise expected(key, f"a time per call of at least {MIN_SECONDS:g} s", value)
    return time


def duration(value: object, key: str) -> float:
    """A length of time that may be 0 (a warm-up, a case's wall time), at most ``MAX_SECONDS``."""
    return number(value, key, maximum=MAX_SECONDS)


def choice(value: object, key: str, allowed: Collection[str], what: str = "value") -> str:
    if not isinstance(value, str):
        raise expected(key, f"a {what} (one of: {', '.join(allowed)})", value)
    if value not in allowed:
        raise FieldError(key, f"unknown {what} {json.dumps(value, ensure_ascii=False)}; one of: {', '.join(allowed)}")
    return value


def items(value: object, key: str, check: Callable[[object, str], T]) -> list[T]:
    """A JSON list, each element passed through ``check`` with its index in the key path."""
    if not isinstance(value, list):
        raise expected(key, "a list", value)
    return [check(item, path(key, index)) for index, item in enumerate(value)]


def nested(key: str, parse: Callable[[Any], T], value: object) -> T:
    """Run another record's ``from_dict``, prefixing the key path of anything it finds wrong."""
    try:
        return parse(value)
    except FieldError as exc:
        raise FieldError(path(key, exc.key) if exc.key else key, exc.problem) from None
