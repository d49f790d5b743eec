"""``compare``'s threshold language: ``median:5%`` on the command line, ``{default: 5%, lstm: 8%}`` in a file.

Parsed into a ``Thresholds`` value whose ``for_case`` gives the relative slowdown a case may show before it counts
(pytest-benchmark's idea). Only relative thresholds: a verdict is about a ratio. The median time per call is always
gated; ``peak_mem``, ``tokens_per_s`` and ``gbps`` are gated when a threshold names them (``--fail-on
peak_mem:10%``, or a key of that name in the file), as Bencher and github-action-benchmark gate any measure.

The file: ``default``, a model name, a ``model/mode`` pattern (shell wildcards on each part: ``lstm/train``,
``*/decode``, ``sdpa-*``), or a metric name whose value is a percentage (that metric's default) or a mapping of the
same keys. For a case, the first pattern in the file that matches wins, then its model's key, then the default::

    default: 5%            # median time, every case
    lstm: 8%               # median time, model lstm
    "*/decode": 10%        # median time, every decode case
    peak_mem: 10%          # peak memory, every case
    tokens_per_s: {default: 5%, "lstm/*": 8%}
"""

from __future__ import annotations

import fnmatch
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

from attnbench.core.cases import MODES
from attnbench.core.errors import AttnbenchError
from attnbench.core.units import format_percent
from attnbench.families.catalogue import MODEL_NAMES

if TYPE_CHECKING:
    from attnbench.core.cases import Case

DEFAULT_THRESHOLD = 0.05

# What a gate may judge: the median time per call (always), and the measures gated only when a threshold names them.
GateMetric = Literal["median", "tokens_per_s", "peak_mem", "gbps"]
GATE_METRICS: tuple[GateMetric, ...] = ("median", "tokens_per_s", "peak_mem", "gbps")

# ---------------------------------------------------------------------------------------------------- thresholds

_THRESHOLD = re.compile(r"^\s*(?:(?P<stat>[a-z_]+)\s*:\s*)?(?P<value>[0-9]*\.?[0-9]+)\s*%\s*$")


def parse_gate(text: object, where: str = "--fail-on") -> tuple[GateMetric, float]:
    """``median:5%``, ``peak_mem:10%`` or ``5%`` (the median) → (metric, 0.05)."""
    if not isinstance(text, str):
        raise AttnbenchError(
            f"{where}: expected a percentage such as '5%', found {text!r}",
            hint="write the threshold as a percentage string, e.g. median:5% (quote it in YAML: '5%')",
        )
    match = _THRESHOLD.match(text)
    metric = (match["stat"] or "median") if match is not None else ""
    if match is None or metric not in GATE_METRICS:
        raise AttnbenchError(
            f"{where}: cannot read {text!r} as a threshold",
            hint=f"use METRIC:P% with a metric of {', '.join(GATE_METRICS)} (e.g. median:5%, peak_mem:10%); "
            "a verdict is about a ratio, so no other statistic or absolute value is accepted",
        )
    value = float(match["value"]) / 100
    if not 0 < value < 1:
        raise AttnbenchError(f"{where}: {text!r} is out of range", hint="a threshold is above 0 % and below 100 %")
    return cast("GateMetric", metric), value


def parse_threshold(text: object, where: str = "--fail-on") -> float:
    """``median:5%`` or ``5%`` → 0.05: a threshold on the median time, where no other metric fits."""
    metric, value = parse_gate(text, where)
    if metric != "median":
        raise AttnbenchError(
            f"{where}: {text!r} is a threshold on {metric}, here only the median is judged",
            hint="use median:P% (e.g. median:5%)",
        )
    return value


def parse_fraction(text: str, where: str, *, below: float = 1.0) -> float:
    """``3%`` or ``0.03`` → 0.03, from 0 (allowed: trust the samples alone) up to ``below``. A change is bounded by
    100 %; a noise floor is a factor on the log scale (±100 % is ×2 either way), so it passes a larger ``below``."""
    raw = text.strip()
    try:
        value = float(raw[:-1]) / 100 if raw.endswith("%") else float(raw)
    except ValueError:
        raise AttnbenchError(f"{where}: cannot read {text!r}", hint="write a percentage such as 3%") from None
    if not 0 <= value < below or not math.isfinite(value):
        raise AttnbenchError(
            f"{where}: {text!r} is out of range", hint=f"from 0 % up to (not including) {below * 100:g} %"
        )
    return value


def _pattern_matches(pattern: str, case: Case) -> bool:
    model, _, mode = pattern.partition("/")
    return fnmatch.fnmatchcase(case.model, model) and fnmatch.fnmatchcase(case.mode, mode or "*")


@dataclass(frozen=True)
class Limits:
    """One metric's thresholds: ``default`` (None: not gated unless a model or pattern names the case), per-model
    values, and ``model/mode`` patterns in the order given (the first that matches wins)."""

    default: float | None = None
    per_model: Mapping[str, float] = field(default_factory=dict)
    patterns: tuple[tuple[str, float], ...] = ()

    def for_case(self, case: Case) -> float | None:
        for pattern, value in self.patterns:
            if _pattern_matches(pattern, case):
                return value
        return self.per_model.get(case.model, self.default)

    def describe(self) -> str:
        parts = [] if self.default is None else [format_percent(self.default)]
        parts += [f"{model} {format_percent(value)}" for model, value in sorted(self.per_model.items())]
        parts += [f"{pattern} {format_percent(value)}" for pattern, value in self.patterns]
        return "; ".join(parts)


@dataclass(frozen=True)
class Thresholds:
    """The relative slowdown each case may show before it counts: the median's ``default``, per-model overrides
    and ``model/mode`` patterns; and the other metrics gated (``metrics``: peak_mem, tokens_per_s, gbps)."""

    default: float = DEFAULT_THRESHOLD
    per_model: Mapping[str, float] = field(default_factory=dict)
    patterns: tuple[tuple[str, float], ...] = ()
    metrics: Mapping[GateMetric, Limits] = field(default_factory=dict)

    def for_model(self, model: str) -> float:
        return self.per_model.get(model, self.default)

    def for_case(self, case: Case) -> float:
        """The median's threshold for ``case``: the first matching pattern, else its model's, else the default."""
        value = Limits(self.default, self.per_model, self.patterns).for_case(case)
        return self.default if value is None else value

    def limit(self, metric: GateMetric, case: Case) -> float | None:
        """``metric``'s threshold for ``case``, or None when that metric is not gated for it."""
        if metric == "median":
            return self.for_case(case)
        limits = self.metrics.get(metric)
        return None if limits is None else limits.for_case(case)

    @property
    def gated(self) -> tuple[GateMetric, ...]:
        """The metrics besides the median that some threshold names, in ``GATE_METRICS`` order."""
        return tuple(m for m in GATE_METRICS if m != "median" and m in self.metrics)

    def describe(self) -> str:
        """``5 %`` or ``5 %; lstm 8 %``, then any pattern and other metric: ``; peak_mem 10 %``."""
        text = Limits(self.default, self.per_model, self.patterns).describe()
        extra = "; ".join(f"{metric} {self.metrics[metric].describe()}" for metric in self.gated)
        return f"{text}; {extra}" if extra else text


def _check_pattern(key: str, where: str) -> None:
    model, _, mode = key.partition("/")
    allowed = "keys are 'default', a metric, a model, or a model/mode pattern (* and ?, e.g. lstm/train, */decode)"
    if not any(fnmatch.fnmatchcase(name, model) for name in MODEL_NAMES):
        raise AttnbenchError(
            f"{where}: {model!r} matches no model", hint=f"{allowed}; models: {', '.join(MODEL_NAMES)}"
        )
    if mode and not any(fnmatch.fnmatchcase(name, mode) for name in MODES):
        raise AttnbenchError(f"{where}: {mode!r} matches no mode", hint=f"{allowed}; modes: {', '.join(MODES)}")


def _limits(data: Mapping[object, object], path: Path, prefix: str, metric: GateMetric) -> Limits:
    """One metric's mapping of ``default``, models and patterns."""
    default: float | None = None
    per_model: dict[str, float] = {}
    patterns: list[tuple[str, float]] = []
    for key, value in data.items():
        where = f"{path}, key '{prefix}{key}'"
        if not isinstance(key, str):
            raise AttnbenchError(f"{where}: a key must be text", hint="e.g. {default: 5%, lstm: 8%}")
        if isinstance(value, str) and ":" in value:
            stated, parsed = parse_gate(value, where)
            if stated != metric:
                raise AttnbenchError(
                    f"{where}: {value!r} names {stated}, under a key of {metric}", hint=f"write {metric}:P% or P%"
                )
        else:
            parsed = parse_gate(value, where)[1]
        if key == "default":
            default = parsed
        elif key in MODEL_NAMES:
            per_model[key] = parsed
        elif "/" in key or any(ch in key for ch in "*?["):
            _check_pattern(key, where)
            patterns.append((key, parsed))
        else:
            raise AttnbenchError(
                f"{where}: unknown model {key!r}",
                hint=f"keys are 'default', a metric ({', '.join(GATE_METRICS)}), a model ({', '.join(MODEL_NAMES)}) "
                "or a model/mode pattern such as lstm/train",
            )
    return Limits(default, per_model, tuple(patterns))


def thresholds_from(data: object, path: Path, fail_on: str | list[str] | tuple[str, ...] | None = None) -> Thresholds:
    """The thresholds a ``--thresholds`` file holds, as parsed YAML: a mapping ``{default: 5%, lstm: 8%}``, with
    patterns and other metrics (module docstring). ``fail_on`` (the command line, ``metric:P%`` each) overrides
    that metric's default. Reading the file is the CLI's (with the config reader, which refuses a key given twice
    rather than keep the last)."""
    if not isinstance(data, dict):
        raise AttnbenchError(
            f"--thresholds: {path} must hold a mapping of model names to percentages",
            hint="e.g. {default: 5%, lstm: 8%}",
        )
    median_keys: dict[object, object] = {}
    metrics: dict[GateMetric, Limits] = {}
    for key, value in data.items():
        if key in GATE_METRICS and key != "median":
            metric = cast("GateMetric", key)
            body = value if isinstance(value, dict) else {"default": value}
            metrics[metric] = _limits(body, path, f"{key}.", metric)
        elif key == "median":
            median_keys.update(value if isinstance(value, dict) else {"default": value})
        else:
            median_keys[key] = value
    median = _limits(median_keys, path, "", "median")
    return with_fail_on(
        Thresholds(
            DEFAULT_THRESHOLD if median.default is None else median.default, median.per_model, median.patterns, metrics
        ),
        fail_on,
    )


def with_fail_on(thresholds: Thresholds, fail_on: str | list[str] | tuple[str, ...] | None) -> Thresholds:
    """``thresholds`` with each ``--fail-on metric:P%`` setting that metric's default."""
    given = [fail_on] if isinstance(fail_on, str) else list(fail_on or ())
    default, metrics = thresholds.default, dict(thresholds.metrics)
    for text in given:
        metric, value = parse_gate(text)
        if metric == "median":
            default = value
        else:
            old = metrics.get(metric, Limits())
            metrics[metric] = Limits(value, old.per_model, old.patterns)
    return Thresholds(default, thresholds.per_model, thresholds.patterns, metrics)
