"""``compare``'s threshold language: ``median:5%`` on the command line, ``{default: 5%, lstm: 8%}`` in a file.

Parsed into a ``Thresholds`` value whose ``for_model`` gives the relative slowdown a model may show before it
counts (pytest-benchmark's idea). Only relative thresholds on the median: a verdict is about a ratio of medians.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from attnbench.core.catalogue import MODEL_NAMES
from attnbench.core.errors import AttnbenchError
from attnbench.core.units import format_percent

DEFAULT_THRESHOLD = 0.05

# ---------------------------------------------------------------------------------------------------- thresholds

_THRESHOLD = re.compile(r"^\s*(?:(?P<stat>[a-z_]+)\s*:\s*)?(?P<value>[0-9]*\.?[0-9]+)\s*%\s*$")


def parse_threshold(text: object, where: str = "--fail-on") -> float:
    """``median:5%`` or ``5%`` → 0.05. Only relative thresholds on the median: the verdict is about a ratio."""
    if not isinstance(text, str):
        raise AttnbenchError(
            f"{where}: expected a percentage such as '5%', found {text!r}",
            hint="write the threshold as a percentage string, e.g. median:5% (quote it in YAML: '5%')",
        )
    match = _THRESHOLD.match(text)
    if match is None or (match["stat"] or "median") != "median":
        raise AttnbenchError(
            f"{where}: cannot read {text!r} as a threshold",
            hint="use median:P% (e.g. median:5%); compare judges the ratio of medians, so no other statistic "
            "or absolute time is accepted",
        )
    value = float(match["value"]) / 100
    if not 0 < value < 1:
        raise AttnbenchError(f"{where}: {text!r} is out of range", hint="a threshold is above 0 % and below 100 %")
    return value


def parse_fraction(text: str, where: str) -> float:
    """``3%`` or ``0.03`` → 0.03; for the noise floor, where 0 is allowed (trust the samples alone)."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise AttnbenchError(f"{where}: cannot read {text!r}", hint="write a percentage such as 3%") from None
    if not 0 <= value < 1 or not math.isfinite(value):
        raise AttnbenchError(f"{where}: {text!r} is out of range", hint="from 0 % up to (not including) 100 %")
    return value


@dataclass(frozen=True)
class Thresholds:
    """The relative slowdown each model may show before it counts: ``default``, with per-model overrides."""

    default: float = DEFAULT_THRESHOLD
    per_model: Mapping[str, float] = field(default_factory=dict)

    def for_model(self, model: str) -> float:
        return self.per_model.get(model, self.default)

    def describe(self) -> str:
        """``5 %`` or ``5 %; lstm 8 %``."""
        text = format_percent(self.default)
        extra = "; ".join(f"{model} {format_percent(value)}" for model, value in sorted(self.per_model.items()))
        return f"{text}; {extra}" if extra else text


def thresholds_from(data: object, path: Path, fail_on: str | None = None) -> Thresholds:
    """The thresholds a ``--thresholds`` file holds, as parsed YAML: a mapping ``{default: 5%, lstm: 8%}``.
    ``fail_on`` (the command line) overrides its default. Reading the file is the CLI's (with the config reader,
    which refuses a key given twice rather than keep the last)."""
    if not isinstance(data, dict):
        raise AttnbenchError(
            f"--thresholds: {path} must hold a mapping of model names to percentages",
            hint="e.g. {default: 5%, lstm: 8%}",
        )
    default = DEFAULT_THRESHOLD
    per_model: dict[str, float] = {}
    for key, value in data.items():
        where = f"{path}, key '{key}'"
        if key == "default":
            default = parse_threshold(value, where)
        elif key in MODEL_NAMES:
            per_model[key] = parse_threshold(value, where)
        else:
            raise AttnbenchError(
                f"{where}: unknown model {key!r}", hint=f"keys are 'default' or a model: {', '.join(MODEL_NAMES)}"
            )
    if fail_on is not None:
        default = parse_threshold(fail_on)
    return Thresholds(default, per_model)
