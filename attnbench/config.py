"""Experiment configuration: a YAML file in, a validated, frozen ``Experiment`` out (DESIGN §8).

Layer 3: stdlib, yaml, pydantic and the torch-free core only. One way through: read the file → parse it
with ``yaml.safe_load`` → apply ``--set`` overrides → pydantic checks keys, types and ranges → plain code
checks what spans fields (heads divide d_model, grid size, model options) → ``Experiment``. Every problem on
the way is one ``ConfigError`` naming the file and line, the key path, what was wrong and what is allowed; no
yaml or pydantic exception leaves this module.
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import hashlib
import json
import math
import os
import re
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, cast

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from attnbench.cases import Axes, Case, Mode, Options, TimingPolicy, expand
from attnbench.catalogue import DTYPES, MODEL_NAMES, MODELS, MODES, is_recurrent
from attnbench.errors import ConfigError

# Caps on sizes: far above anything a single accelerator can run, low enough to catch a typo (an extra zero
# or two) before it turns into an hour of allocator failures.
MAX_SEQ_LEN = 2**22
MAX_BATCH = 65_536
MAX_D_MODEL = 65_536
MAX_HEADS = 65_536
MAX_LAYERS = 256
MAX_TOKENS = 2**32
MAX_THREADS = 4_096
MAX_SAMPLES = 10_000_000
MAX_CASES = 10_000
MAX_FILE_BYTES = 1 << 20
# Values in a document, counted with aliases expanded: stops `&a [*a, *a, …]` bombs and cyclic aliases.
MAX_NODES = 100_000
MAX_DEPTH = 32  # a config is four levels deep; a cyclic alias (`&a [*a]`) is infinitely deep
MAX_NAME_LEN = 64

BUILTIN = {"cpu": "default-cpu", "cuda": "default-cuda"}
OVERRIDE = "--set"
DEFAULT_AXES: dict[str, list[Any]] = {"d_model": [512], "heads": [8], "layers": [1], "causal": [False]}
AXIS_NAMES = ("d_model", "heads", "layers", "causal")  # may sit at the top level or under grid, not both

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_DEVICE = re.compile(r"auto|cpu|cuda|cuda:[0-9]+")
_OVERRIDE_KEY = re.compile(r"[A-Za-z0-9_-]+")

Path_ = tuple[str | int, ...]  # a key path: mapping keys as str, list indices as int


# ---------------------------------------------------------------------------------------------------- schema
def _as_list(value: Any) -> Any:
    """A scalar where a list is allowed means a one-element list."""
    return value if isinstance(value, list) else [value]


Names = Annotated[list[str], BeforeValidator(_as_list), Field(min_length=1)]
Flags = Annotated[list[bool], BeforeValidator(_as_list), Field(min_length=1)]
Batches = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_BATCH)]],
    BeforeValidator(_as_list),
    Field(min_length=1),
]
SeqLens = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)]],
    BeforeValidator(_as_list),
    Field(min_length=1),
]
DModels = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_D_MODEL)]],
    BeforeValidator(_as_list),
    Field(min_length=1),
]
HeadCounts = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_HEADS)]],
    BeforeValidator(_as_list),
    Field(min_length=1),
]
LayerCounts = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_LAYERS)]],
    BeforeValidator(_as_list),
    Field(min_length=1),
]
Seconds = Annotated[float, Field(gt=0)]
_POLICY = TimingPolicy()


class _Strict(BaseModel):
    # strict: no "128" → 128, no true → 1, no 1.5 → 1; an int is still accepted where a float is asked for.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class GridModel(_Strict):
    batch: Batches | None = None
    tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS)] | None = None
    seq_len: SeqLens
    d_model: DModels | None = None
    heads: HeadCounts | None = None
    layers: LayerCounts | None = None
    causal: Flags | None = None


class TimingModel(_Strict):
    """``TimingPolicy``'s fields with their ranges; the defaults are the policy's own (a test holds them)."""

    target_ci: Annotated[float, Field(gt=0, lt=1)] = _POLICY.target_ci
    min_samples: Annotated[int, Field(ge=3, le=MAX_SAMPLES)] = _POLICY.min_samples
    max_samples: Annotated[int, Field(ge=3, le=MAX_SAMPLES)] = _POLICY.max_samples
    min_time_s: Seconds = _POLICY.min_time_s
    max_case_s: Seconds = _POLICY.max_case_s
    warmup_min_calls: Annotated[int, Field(ge=1, le=MAX_SAMPLES)] = _POLICY.warmup_min_calls
    warmup_max_s: Seconds = _POLICY.warmup_max_s
    warmup_settle: Annotated[float, Field(gt=0, lt=1)] = _POLICY.warmup_settle
    min_sample_s: Seconds = _POLICY.min_sample_s


class ConfigModel(_Strict):
    name: str
    description: str = ""
    device: str = "auto"
    models: Names
    model_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    modes: Names = Field(default_factory=lambda: list(MODES))
    dtype: Names = Field(default_factory=lambda: ["float32"])
    grid: GridModel
    d_model: DModels | None = None
    heads: HeadCounts | None = None
    layers: LayerCounts | None = None
    causal: Flags | None = None
    threads: Annotated[int, Field(gt=0, le=MAX_THREADS)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    timing: TimingModel = Field(default_factory=TimingModel)


_SECTIONS: dict[Path_, type[BaseModel]] = {(): ConfigModel, ("grid",): GridModel, ("timing",): TimingModel}


# ---------------------------------------------------------------------------------------------------- result
@dataclass(frozen=True)
class Experiment:
    """A validated experiment: the axes to cross, how to time each case, and the config that said so."""

    name: str
    source: str  # the file path as given, or "builtin:default-cpu" / "builtin:default-cuda"
    device: str  # as written: auto | cpu | cuda | cuda:N
    axes: Axes  # with tokens set, axes.batch lists the derived batch sizes; cases() is the authority
    timing: TimingPolicy
    threads: int | None
    seed: int
    resolved: dict[str, Any]
    sha256: str
    tokens: int | None = None  # grid.tokens: batch = tokens // seq_len for each seq_len

    def cases(self, device: str) -> list[Case]:
        """Every case, model-major with seq_len innermost, for a resolved device ("cpu", "cuda:0")."""
        if self.tokens is None:
            return expand(dataclasses.replace(self.axes, device=device))
        # batch is a function of seq_len: cross with one placeholder batch, then fill it in. The order and the
        # de-duplication are exactly expand()'s, because batch adds no freedom of its own.
        tokens = self.tokens
        crossed = expand(dataclasses.replace(self.axes, device=device, batch=(1,)))
        return [dataclasses.replace(case, batch=tokens // case.seq_len) for case in crossed]


# ---------------------------------------------------------------------------------------------------- public
def load_experiment(
    path: str | Path | None,
    overrides: Sequence[str] = (),
    *,
    device_type: str = "cpu",
) -> Experiment:
    """Load and validate an experiment; ``path=None`` means the built-in default for ``device_type``."""
    if path is None:
        return load_experiment_text(builtin_config_text(device_type), _builtin_source(device_type), overrides)
    return load_experiment_text(_read(Path(path), str(path)), str(path), overrides)


def load_experiment_text(text: str, source: str, overrides: Sequence[str] = ()) -> Experiment:
    """Validate YAML text; ``source`` names it in errors (a path, or ``builtin:…``)."""
    data, lines = _parse(text, source)
    if not isinstance(data, dict):
        what = "empty" if data is None else f"{_describe(data)}, not a mapping of keys to values"
        raise ConfigError(
            f"the top level is {what}",
            where=source,
            hint="start from configs/default.yaml: name, models, modes, dtype, grid, …",
        )
    touched: list[Path_] = []
    for text_ in overrides:
        keys, value = parse_override(text_)
        _apply_override(data, keys, value, touched)
    ctx = _Context(source, lines, data, touched)
    try:
        model = ConfigModel.model_validate(data)
    except ValidationError as exc:
        raise _from_validation(exc, ctx) from None
    return _build(model, ctx)


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"grid.seq_len=[64,128]"`` → ``(["grid", "seq_len"], [64, 128])``; the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep:
        raise ConfigError(
            f"expected key.path=value, got {text!r}",
            where=OVERRIDE,
            hint="e.g. --set grid.seq_len=[64,128] or --set timing.max_case_s=2",
        )
    keys = key.strip().split(".")
    if not all(_OVERRIDE_KEY.fullmatch(k) for k in keys):
        raise ConfigError(
            f"bad key path {key.strip()!r}: use dot-separated keys such as grid.seq_len",
            where=OVERRIDE,
            hint="e.g. --set timing.target_ci=0.02",
        )
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, OVERRIDE, with_line=False, key=".".join(keys)) from None
    except (ValueError, TypeError, AttributeError) as exc:  # an explicit !!int abc and its kin
        raise ConfigError(f"invalid value {raw!r}: {exc}", where=OVERRIDE, key=".".join(keys)) from None
    return keys, value


def builtin_config_text(device_type: str) -> str:
    """The text of the built-in default config for a device type ("cpu", "cuda"; "cuda:1" counts as cuda)."""
    stem = BUILTIN[_device_type(device_type)]
    return (resources.files("attnbench") / "builtin" / f"{stem}.yaml").read_text(encoding="utf-8")


# ---------------------------------------------------------------------------------------------------- reading
def _device_type(device_type: str) -> str:
    kind = device_type.split(":", 1)[0]
    if kind not in BUILTIN:
        raise ValueError(f"no built-in config for device type {device_type!r}; known: {', '.join(BUILTIN)}")
    return kind


def _builtin_source(device_type: str) -> str:
    return f"builtin:{BUILTIN[_device_type(device_type)]}"


def _read(path: Path, where: str) -> str:
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError(
                "is a directory, not a YAML file",
                where=where,
                hint="name a file such as configs/default.yaml",
            )
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError("is not a regular file", where=where)
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError(
                f"is {info.st_size} bytes; configs over {MAX_FILE_BYTES} bytes are refused",
                where=where,
            )
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(
            "no such file",
            where=where,
            hint="check the path; configs/ holds examples",
        ) from None
    except PermissionError:
        raise ConfigError("cannot be read: permission denied", where=where) from None
    except OSError as exc:
        raise ConfigError(f"cannot be read: {exc.strerror or exc}", where=where) from None
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})",
            where=where,
            hint="save the file as UTF-8",
        ) from None


def _parse(text: str, source: str) -> tuple[Any, dict[Path_, int]]:
    """Parse with ``yaml.safe_load``; also index the line of every key path from the composed nodes."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        lines = _line_index(node, source) if node is not None else {}
        return yaml.safe_load(text), lines
    except yaml.YAMLError as exc:
        raise _yaml_error(exc, source, with_line=True) from None
    except (ValueError, TypeError, AttributeError) as exc:  # !!int abc, !!timestamp xyz: raised raw by PyYAML
        raise ConfigError(f"invalid YAML value: {exc}", where=source) from None
    except RecursionError:
        raise ConfigError("invalid YAML: nested too deeply", where=source) from None


def _yaml_error(exc: yaml.YAMLError, where: str, *, with_line: bool, key: str = "") -> ConfigError:
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        if with_line and mark is not None:
            where = f"{where}:{mark.line + 1}"
        problem = exc.problem or ""
        unknown_tag = "could not determine a constructor" in problem
        if isinstance(exc, yaml.constructor.ConstructorError) and unknown_tag:
            tag = problem.rsplit(" ", 1)[-1]
            return ConfigError(
                f"YAML tag {tag} is not allowed: tags that construct objects are not allowed",
                where=where,
                key=key,
                hint="write plain mappings, lists, strings, numbers and booleans",
            )
        context = f" ({exc.context})" if exc.context else ""
        return ConfigError(f"invalid YAML: {problem}{context}", where=where, key=key)
    return ConfigError(f"invalid YAML: {str(exc).splitlines()[0]}", where=where, key=key)


def _line_index(root: yaml.Node, source: str) -> dict[Path_, int]:
    """Line (1-based) of every key and list item; refuses duplicate keys and alias bombs on the way."""
    lines: dict[Path_, int] = {}
    stack: list[tuple[Path_, yaml.Node]] = [((), root)]
    visited = 0
    while stack:
        path, node = stack.pop()
        visited += 1
        if len(path) > MAX_DEPTH:
            raise ConfigError(
                f"the document nests deeper than {MAX_DEPTH} levels",
                where=source,
                key=_dotted(path[:3]) + "…",
                hint="is an alias (*a) inside its own anchor (&a)?",
            )
        if visited > MAX_NODES:
            raise ConfigError(
                f"the document holds more than {MAX_NODES} values (counting aliases expanded)",
                where=source,
                hint="anchors and aliases (&a, *a) may not nest into a bomb",
            )
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    continue  # a list or mapping as a key: the constructor or the schema refuses it
                child = (*path, str(key_node.value))
                line = key_node.start_mark.line + 1
                if child in lines:
                    raise ConfigError(
                        f"key {key_node.value!r} appears twice (lines {lines[child]} and {line})",
                        where=f"{source}:{line}",
                        key=_dotted(child),
                        hint="YAML would silently keep the last one; delete one of them",
                    )
                lines[child] = line
                stack.append((child, value_node))
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                lines[(*path, i)] = item.start_mark.line + 1
                stack.append(((*path, i), item))
    return lines


def _apply_override(data: dict[Any, Any], keys: list[str], value: Any, touched: list[Path_]) -> None:
    node = data
    for i, key in enumerate(keys[:-1]):
        if key not in node:
            node[key] = {}
            touched.append(tuple(keys[: i + 1]))
        elif not isinstance(node[key], dict):
            raise ConfigError(
                f"cannot set {'.'.join(keys)}: {key!r} holds {_describe(node[key])}, not a mapping",
                where=OVERRIDE,
                key=".".join(keys[: i + 1]),
            )
        node = node[key]
    node[keys[-1]] = value
    touched.append(tuple(keys))


# ---------------------------------------------------------------------------------------------------- errors
@dataclass(frozen=True)
class _Context:
    """What an error needs to say where it is: the source, its line index, the data, the overridden paths."""

    source: str
    lines: dict[Path_, int]
    data: dict[Any, Any]
    touched: list[Path_]

    def error(self, message: str, path: Path_, hint: str = "") -> ConfigError:
        return ConfigError(message, where=self.where(path), key=_dotted(path), hint=hint)

    def where(self, path: Path_) -> str:
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
            if isinstance(node, list) and isinstance(part, int):
                path.append(part)
                node = node[part] if part < len(node) else None
            elif isinstance(node, dict) and (isinstance(part, str) or part in node):
                path.append(str(part))
                node = node.get(part)
            else:
                break  # an index pydantic added to a value it wrapped into a list
        return tuple(path), False


_RANGE_KINDS = {
    "greater_than": "greater than",
    "greater_than_equal": "at least",
    "less_than": "less than",
    "less_than_equal": "at most",
}
_POSITIVE_SECONDS = "a positive number of seconds"
# What each ranged key allows, for the message when a value falls outside it.
_ALLOWED = {
    "batch": f"a positive integer, at most {MAX_BATCH} (the cap)",
    "tokens": f"a positive integer, at most {MAX_TOKENS} (the cap)",
    "seq_len": f"a positive integer, at most {MAX_SEQ_LEN} = 2**22 (the cap)",
    "d_model": f"a positive integer, at most {MAX_D_MODEL} (the cap)",
    "heads": f"a positive integer, at most {MAX_HEADS} (the cap)",
    "layers": f"a positive integer, at most {MAX_LAYERS} (the cap)",
    "threads": f"a positive integer, at most {MAX_THREADS}, or null for torch's default",
    "seed": "an integer from 0 to 2**63 - 1",
    "target_ci": "a fraction strictly between 0 and 1 (0.01 = stop at ±1 %)",
    "warmup_settle": "a fraction strictly between 0 and 1",
    "min_samples": f"an integer from 3 to {MAX_SAMPLES}",
    "max_samples": f"an integer from 3 to {MAX_SAMPLES}",
    "warmup_min_calls": f"an integer from 1 to {MAX_SAMPLES}",
    "min_time_s": _POSITIVE_SECONDS,
    "max_case_s": _POSITIVE_SECONDS,
    "warmup_max_s": _POSITIVE_SECONDS,
    "min_sample_s": _POSITIVE_SECONDS,
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


def _from_validation(exc: ValidationError, ctx: _Context) -> ConfigError:
    """The first of pydantic's errors, in plain words, with the key path and line."""
    errors = exc.errors(include_url=False)
    # An unknown key usually explains a missing one (`modells:` leaves `models` unset): report it first.
    err = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    kind, value, limits = err["type"], err.get("input"), err.get("ctx") or {}
    path, about_key = ctx.normalise(tuple(err["loc"]))
    if about_key or kind == "invalid_key":
        return ctx.error(f"keys must be strings, got {_describe(value)}", path)
    if kind in ("extra_forbidden", "missing"):
        allowed = list(_SECTIONS[path[:-1]].model_fields) if path[:-1] in _SECTIONS else []
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
            hint=_did_you_mean(name, allowed),
        )
    field = next((str(p) for p in reversed(path) if isinstance(p, str)), "")
    if kind in _TYPE_WORDS:
        message = f"must be {_TYPE_WORDS[kind]}, got {_describe(value)}"
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


def _describe(value: Any) -> str:
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


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


def _dotted(path: Path_) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


# ---------------------------------------------------------------------------------------------------- checks
def _build(m: ConfigModel, ctx: _Context) -> Experiment:
    """Checks that span fields, then the Experiment."""
    _check_name(m.name, ctx)
    if not _DEVICE.fullmatch(m.device):
        raise ctx.error(
            f"device {m.device!r} is not one of auto, cpu, cuda, cuda:N",
            ("device",),
            hint=_did_you_mean(m.device, ["auto", "cpu", "cuda", "cuda:0"]),
        )
    _check_names(m.models, MODEL_NAMES, "model", ("models",), ctx)
    _check_names(m.modes, MODES, "mode", ("modes",), ctx)
    _check_names(m.dtype, DTYPES, "dtype", ("dtype",), ctx)

    axes: dict[str, list[Any]] = {}
    paths: dict[str, Path_ | None] = {}
    for axis in AXIS_NAMES:
        top, under = getattr(m, axis), getattr(m.grid, axis)
        if top is not None and under is not None:
            raise ctx.error(f"{axis} is given both at the top level and under grid; keep one", ("grid", axis))
        axes[axis] = top or under or DEFAULT_AXES[axis]
        paths[axis] = (axis,) if top is not None else ("grid", axis) if under is not None else None
    if m.grid.batch is not None and m.grid.tokens is not None:
        raise ctx.error(
            "grid.batch and grid.tokens exclude each other: give one",
            ("grid", "tokens"),
            hint="tokens fixes batch × seq_len; batch crosses every seq_len",
        )
    if m.grid.batch is None and m.grid.tokens is None:
        raise ctx.error(
            "grid needs batch (batch sizes to cross) or tokens (batch = tokens // seq_len)",
            ("grid",),
        )
    axes["seq_len"], paths["seq_len"] = m.grid.seq_len, ("grid", "seq_len")
    axes["batch"], paths["batch"] = m.grid.batch or [], ("grid", "batch")
    for axis, values in axes.items():
        _check_unique(values, axis, paths[axis], ctx)

    if m.grid.tokens is not None:
        axes["batch"] = _tied_batches(m.grid.tokens, m.grid.seq_len, ctx)
    if any(not is_recurrent(model) for model in m.models):
        _check_heads(axes["heads"], axes["d_model"], paths["heads"], ctx)
    options, written_options = _check_model_options(m, axes["d_model"], ctx)
    _check_timing(m.timing, ctx)

    timing = TimingPolicy(**m.timing.model_dump())
    axes_value = Axes(
        models=tuple(m.models),
        modes=tuple(cast(list[Mode], m.modes)),
        dtypes=tuple(m.dtype),
        batch=tuple(axes["batch"]),
        seq_len=tuple(m.grid.seq_len),
        d_model=tuple(axes["d_model"]),
        heads=tuple(axes["heads"]),
        layers=tuple(axes["layers"]),
        causal=tuple(axes["causal"]),
        device=m.device,
        model_options=options,
    )
    grid: dict[str, Any] = {"tokens": m.grid.tokens} if m.grid.tokens is not None else {"batch": m.grid.batch}
    grid.update(seq_len=m.grid.seq_len, **{axis: axes[axis] for axis in AXIS_NAMES})
    # The axes all sit under grid here, wherever they were written, so that equal experiments hash equal;
    # the result is itself a valid config.
    resolved: dict[str, Any] = {
        "name": m.name,
        "description": m.description,
        "device": m.device,
        "models": m.models,
        "model_options": written_options,
        "modes": m.modes,
        "dtype": m.dtype,
        "grid": grid,
        "threads": m.threads,
        "seed": m.seed,
        "timing": m.timing.model_dump(),
    }
    resolved = json.loads(json.dumps(resolved))  # a deep, plain copy
    sha = hashlib.sha256(json.dumps(resolved, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
    experiment = Experiment(
        name=m.name,
        source=ctx.source,
        device=m.device,
        axes=axes_value,
        timing=timing,
        threads=m.threads,
        seed=m.seed,
        resolved=resolved,
        sha256=sha,
        tokens=m.grid.tokens,
    )
    _check_size(experiment, ctx)
    return experiment


def _check_name(name: str, ctx: _Context) -> None:
    if _NAME.fullmatch(name) and len(name) <= MAX_NAME_LEN:
        return
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-._")[:MAX_NAME_LEN]
    raise ctx.error(
        f"name {name!r} is not allowed: it becomes part of a folder name, so use lower-case "
        f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most "
        f"{MAX_NAME_LEN} characters",
        ("name",),
        hint=f"e.g. {slug!r}" if slug else "",
    )


def _check_names(values: list[str], allowed: Sequence[str], what: str, path: Path_, ctx: _Context) -> None:
    for i, value in enumerate(values):
        if value not in allowed:
            raise ctx.error(
                f"unknown {what} {value!r}; valid: {', '.join(allowed)}",
                ctx.item(path, i),
                hint=_did_you_mean(value, allowed),
            )
    _check_unique(values, what, path, ctx)


def _check_unique(values: Sequence[Any], what: str, path: Path_ | None, ctx: _Context) -> None:
    seen: set[Any] = set()
    for i, value in enumerate(values):
        if (type(value), value) in seen and path is not None:
            shown = repr(value) if isinstance(value, str) else json.dumps(value)
            raise ctx.error(f"{what} {shown} is listed twice", ctx.item(path, i))
        seen.add((type(value), value))


def _tied_batches(tokens: int, seq_lens: list[int], ctx: _Context) -> list[int]:
    """grid.tokens: one batch per seq_len, so that every case moves the same number of tokens."""
    batches: list[int] = []
    for i, n in enumerate(seq_lens):
        path = ctx.item(("grid", "seq_len"), i)
        if tokens % n:
            raise ctx.error(
                f"seq_len {n} does not divide grid.tokens {tokens} (batch = tokens // seq_len must be whole)",
                path,
                hint="use seq_len values that divide tokens, e.g. powers of 2",
            )
        if tokens // n > MAX_BATCH:
            raise ctx.error(
                f"grid.tokens {tokens} / seq_len {n} = batch {tokens // n}, above the cap of {MAX_BATCH}",
                path,
            )
        batches.append(tokens // n)
    return list(dict.fromkeys(batches))


def _check_heads(heads: list[int], d_models: list[int], path: Path_ | None, ctx: _Context) -> None:
    for i, h in enumerate(heads):
        for d in d_models:
            if d % h:
                divisors = [str(k) for k in range(1, min(d, 128) + 1) if d % k == 0]
                raise ctx.error(
                    f"heads {h} does not divide d_model {d}: each head gets d_model / heads "
                    f"features, which must be whole",
                    ctx.item(path, i) if path else ("heads",),
                    hint=f"heads that divide {d}: {', '.join(divisors)}" + (", …" if d > 128 else ""),
                )


def _check_model_options(
    m: ConfigModel, d_models: list[int], ctx: _Context
) -> tuple[dict[str, Options], dict[str, dict[str, Any]]]:
    """Options per model, checked against the catalogue: those for the cases, where options left at their
    default are dropped so that writing a default out does not change a case's key, and those as written."""
    result: dict[str, Options] = {}
    written: dict[str, dict[str, Any]] = {}
    for model, given in m.model_options.items():
        path: Path_ = ("model_options", model)
        if model not in MODELS:
            raise ctx.error(
                f"unknown model {model!r}; valid: {', '.join(MODEL_NAMES)}",
                path,
                hint=_did_you_mean(model, MODEL_NAMES),
            )
        if model not in m.models:
            raise ctx.error(
                f"options are given for {model!r}, which is not in models ({', '.join(m.models)})",
                path,
                hint=f"add {model} to models or delete model_options.{model}",
            )
        spec = MODELS[model]
        chosen: list[tuple[str, Any]] = []
        for name, value in given.items():
            option = spec.option(name)
            if option is None:
                known = ", ".join(o.name for o in spec.options) or "none"
                raise ctx.error(
                    f"unknown option {name!r} for {model}; its options: {known}",
                    (*path, name),
                    hint=_did_you_mean(name, [o.name for o in spec.options]),
                )
            value = _option_value(value, option.type, (*path, name), ctx)
            written.setdefault(model, {})[name] = value
            if value != option.default:
                chosen.append((name, value))
        if dict(chosen).get("bidirectional"):
            for d in d_models:
                if d % 2:
                    raise ctx.error(
                        f"bidirectional {model} gives each direction d_model/2 units, so d_model "
                        f"must be even; {d} is odd",
                        (*path, "bidirectional"),
                    )
        if chosen:
            result[model] = tuple(sorted(chosen))
    return result, written


def _option_value(value: Any, kind: type, path: Path_, ctx: _Context) -> Any:
    if kind is bool and isinstance(value, bool):
        return value
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is float and number and math.isfinite(value):
        return float(value)
    if kind is str and isinstance(value, str):
        return value
    word = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}[kind]
    raise ctx.error(f"must be {word}, got {_describe(value)}", path)


def _check_timing(t: TimingModel, ctx: _Context) -> None:
    if t.max_samples < t.min_samples:
        raise ctx.error(
            f"max_samples {t.max_samples} is below min_samples {t.min_samples}",
            ("timing", "max_samples"),
            hint="max_samples must be at least min_samples",
        )
    if t.min_time_s > t.max_case_s:
        raise ctx.error(
            f"min_time_s {t.min_time_s} is above max_case_s {t.max_case_s}",
            ("timing", "min_time_s"),
            hint="min_time_s must be at most max_case_s, the whole budget of a case",
        )


def _check_size(experiment: Experiment, ctx: _Context) -> None:
    axes = experiment.axes
    batches = (1,) if experiment.tokens else axes.batch
    crossed = math.prod(
        len(v)
        for v in (
            axes.models,
            axes.modes,
            axes.dtypes,
            batches,
            axes.seq_len,
            axes.d_model,
            axes.heads,
            axes.layers,
            axes.causal,
        )
    )
    # Expanding is cheap, but not for a typo that crosses millions: refuse those before counting exactly.
    count = crossed if crossed > 100 * MAX_CASES else len(experiment.cases(experiment.device))
    if count > MAX_CASES:
        raise ctx.error(
            f"the grid expands to {count} cases; the cap is {MAX_CASES}",
            ("grid",),
            hint="narrow an axis, or split the sweep into several configs",
        )
