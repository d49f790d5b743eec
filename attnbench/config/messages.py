"""Plain words for what is wrong in a config: where an error points, and pydantic's errors restated.

The lowest of the config modules (``experiment`` ← ``options``, ``source`` ← this): stdlib, pydantic and
``core`` (errors, the size caps) only. ``Context`` turns a key path into ``file:line`` (or ``--set``) and builds the
``ConfigError``; ``from_validation`` turns the first of pydantic's errors into one such error, saying what is allowed.
"""

from __future__ import annotations

import datetime
import difflib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

# The caps on sizes live with Case (stored rows are held to them too); the words in _ALLOWED quote them.
from attnbench.core import cases as caps
from attnbench.core.errors import ConfigError

OVERRIDE = "--set"  # where an error points when the value came from a --set override

Path_ = tuple[str | int, ...]  # a key path: mapping keys as str, list indices as int


# ---------------------------------------------------------------------------------------------------- where
@dataclass(frozen=True)
class Context:
    """What an error needs to say where it is: the source, its line index, the data, the overridden paths."""

    source: str
    lines: dict[Path_, int]
    data: dict[Any, Any]
    touched: list[Path_]

    def error(self, message: str, path: Path_, hint: str = "") -> ConfigError:
        """The error for ``path``, pointing at its line (or at ``--set``)."""
        return ConfigError(message, where=self.where(path), key=dotted(path), hint=hint)

    def where(self, path: Path_) -> str:
        """``--set`` if an override wrote the path, else ``file:line`` of its nearest key, else the file."""
        if any(path[: len(t)] == t for t in self.touched):
            return OVERRIDE
        for end in range(len(path), 0, -1):  # the key itself, else the nearest enclosing key that exists
            if path[:end] in self.lines:
                return f"{self.source}:{self.lines[path[:end]]}"
        return self.source

    def item(self, path: Path_, index: int) -> Path_:
        """The path of item ``index`` of a list-valued key; the key itself where a scalar was written."""
        return (*path, index) if isinstance(self.value(path), list) else path

    def value(self, path: Path_) -> Any:
        node: Any = self.data
        for part in path:
            in_dict = isinstance(node, dict) and part in node
            in_list = isinstance(node, list) and isinstance(part, int) and part < len(node)
            if not (in_dict or in_list):
                return None
            node = node[part]
        return node

    def normalise(self, loc: tuple[str | int, ...]) -> tuple[Path_, bool]:
        """pydantic's loc → a key path into the data as written; True if the error is about a mapping key."""
        path: list[str | int] = []
        node: Any = self.data
        for part in loc:
            if part == "[key]":
                return tuple(path), True
            if isinstance(part, str) and part.startswith(TAG):
                continue  # which arm of a tagged union pydantic tried: not a key of the data
            if isinstance(node, list) and isinstance(part, int):
                path.append(part)
                node = node[part] if part < len(node) else None
            elif isinstance(node, dict) and (isinstance(part, str) or part in node):
                path.append(str(part))
                node = node.get(part)
            else:
                break  # an index pydantic added to a value it wrapped into a list
        return tuple(path), False


# Tags of the schema's tagged unions start with this, so a path into the data leaves them out (normalise).
TAG = "§"
# ``sections`` of from_validation name a mapping inside a list by this in place of the list's index.
ITEM = "[]"


# ---------------------------------------------------------------------------------------------------- words
_RANGE_KINDS = {
    "greater_than": "greater than",
    "greater_than_equal": "at least",
    "less_than": "less than",
    "less_than_equal": "at most",
}
_POSITIVE_SECONDS = "a positive number of seconds"
# What each ranged key allows, for the message when a value falls outside it.
_ALLOWED = {
    "batch": f"a positive integer, at most {caps.MAX_BATCH} (the cap)",
    "tokens": f"a positive integer, at most {caps.MAX_TOKENS} (the cap)",
    "seq_len": f"a positive integer, at most {caps.MAX_SEQ_LEN} = 2**22 (the cap)",
    "d_model": f"a positive integer, at most {caps.MAX_D_MODEL} (the cap)",
    "heads": f"a positive integer, at most {caps.MAX_HEADS} (the cap)",
    "layers": f"a positive integer, at most {caps.MAX_LAYERS} (the cap)",
    "threads": f"a positive integer, at most {caps.MAX_THREADS}, or null (a CPU: every CPU but one; a GPU: torch's)",
    "seed": "an integer from 0 to 2**63 - 1",
    "target_ci": "a fraction strictly between 0 and 1 (0.01 = stop at ±1 %)",
    "warmup_settle": "a fraction strictly between 0 and 1",
    "min_samples": f"an integer from 3 to {caps.MAX_SAMPLES}",
    "max_samples": f"an integer from 3 to {caps.MAX_SAMPLES}",
    "warmup_min_calls": f"an integer from 1 to {caps.MAX_SAMPLES}",
    "min_time_s": _POSITIVE_SECONDS,
    "max_case_s": _POSITIVE_SECONDS,
    "warmup_max_s": _POSITIVE_SECONDS,
    "min_sample_s": _POSITIVE_SECONDS,
    "process_warmup_s": "a number of seconds from 0 to 60 (0 = no process warm-up)",
}
_TYPE_WORDS = {
    "int_type": "an integer",
    "int_from_float": "an integer",
    "bool_type": "true or false",
    "string_type": "a string",
    "float_type": "a number",
    "list_type": "a list",
    "dict_type": "a mapping",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
}


def from_validation(exc: ValidationError, ctx: Context, sections: Mapping[Path_, type[BaseModel]]) -> ConfigError:
    """The first of pydantic's errors, in plain words, with the key path and line; ``sections`` maps the path
    of each mapping in the schema to its model, whose fields are the keys allowed there."""
    errors = exc.errors(include_url=False)
    # An unknown key usually explains a missing one (`modells:` leaves `models` unset): report it first.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    kind, value, limits = err["type"], err.get("input"), err.get("ctx") or {}
    path, about_key = ctx.normalise(tuple(err["loc"]))
    if about_key or kind == "invalid_key":
        return ctx.error(f"keys must be strings, got {describe(value)}", path)
    if kind in ("extra_forbidden", "missing"):
        section = tuple(ITEM if isinstance(part, int) else part for part in path[:-1])
        # Which arm of a tagged union pydantic tried (a hybrid entry, a factory entry) picks its own keys.
        arm = [part for part in err["loc"] if isinstance(part, str) and part.startswith(TAG)][-1:]
        model = sections.get((*section, *arm)) or sections.get(section)
        allowed = list(model.model_fields) if model is not None else []
        name = str(path[-1]) if path else ""
        if kind == "missing":
            return ctx.error(
                f"required key {name!r} is missing",
                path,
                hint=f"keys here: {', '.join(allowed)}",
            )
        return ctx.error(
            f"unknown key {name!r}; allowed keys here: {', '.join(allowed)}",
            path,
            hint=did_you_mean(name, allowed),
        )
    field = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
    if kind in _TYPE_WORDS:
        message = f"must be {_TYPE_WORDS[kind]}, got {describe(value)}"
        number = yaml11_number(value) if kind in _NUMBER_KINDS else None
        if number is not None:
            return ctx.error(
                message,
                path,
                hint=f"YAML reads {value} as text, not a number; write {number} (a dot in the mantissa and a sign in "
                "the exponent)",
            )
    elif kind in _RANGE_KINDS and field in _ALLOWED:
        message = f"must be {_ALLOWED[field]}, got {value!r}"
    elif kind in _RANGE_KINDS:
        bound = next(iter(limits.values()), "?")
        message = f"must be {_RANGE_KINDS[kind]} {bound}, got {value!r}"
    elif kind == "too_short":
        message = "must not be empty: give at least one value"
    elif kind == "finite_number":
        message = f"must be a finite number, got {value!r}"
    else:
        message = str(err["msg"])
    return ctx.error(message, path)


_NUMBER_KINDS = frozenset({"float_type", "int_type", "int_from_float"})
# A number in exponent notation as JSON, YAML 1.2 and Python write it; YAML 1.1 (PyYAML) reads a float only with a
# dot in the mantissa and a sign in the exponent, so `1e-9` and `1.0e3` are strings to it.
_EXPONENT = re.compile(r"\s*([-+]?)([0-9]+)(?:\.([0-9]*))?[eE]([-+]?)([0-9]+)\s*")


def yaml11_number(value: Any) -> str | None:
    """The YAML 1.1 spelling of a number YAML read as a string (``1e-9`` → ``1.0e-9``), or None."""
    match = _EXPONENT.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        return None
    sign, whole, fraction, exp_sign, exponent = match.groups()
    return f"{sign}{whole}.{fraction or '0'}e{exp_sign or '+'}{exponent}"


def describe(value: Any) -> str:
    """A value as a message names it: its type in words, and the value itself where it is short."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, int):
        text = repr(value)
        return f"{text if len(text) <= 24 else text[:20] + '…'} (an integer)"
    if isinstance(value, float):
        return f"{value!r} (a number)"
    if isinstance(value, str):
        return f"the string {value[:40]!r}" + ("…" if len(value) > 40 else "")
    if isinstance(value, list):
        return f"a list of {len(value)} item{'' if len(value) == 1 else 's'}"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, datetime.date):
        return f"a date ({value}; quote it to make it a string)"
    if isinstance(value, bytes):
        return "binary data"
    return "a set" if isinstance(value, set) else type(value).__name__


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """A hint naming the closest of ``choices``, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


def dotted(path: Path_) -> str:
    """A key path as written in messages: ``("grid", "seq_len", 0)`` → ``grid.seq_len[0]``."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text
