"""Experiment configuration: a YAML file in, a validated, frozen ``Experiment`` out (DESIGN §8).

Layer 3: stdlib, yaml, pydantic and the torch-free core only. One way through: read the file → parse it
with ``yaml.safe_load`` → apply ``--set`` overrides → pydantic checks keys, types and ranges → plain code
checks what spans fields (heads divide d_model, grid size, model options) → ``Experiment``. Every problem on
the way is one ``ConfigError`` naming the file and line, the key path, what was wrong and what is allowed; no
yaml or pydantic exception leaves these modules.

This module is the schema and the public API. Reading the source (file, YAML, line index, ``--set``) lives in
``config_source``; pydantic's errors in plain words, and where each error points, in ``config_messages``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from attnbench.cases import Axes, Case, Mode, Options, TimingPolicy, expand
from attnbench.catalogue import (
    DEVICE_REQUEST,
    DTYPES,
    MATCH_TOLERANCE,
    MODEL_NAMES,
    MODELS,
    MODES,
    PRESET_NAMES,
    PRESETS,
    OptionSpec,
    is_recurrent,
    option_problem,
)
from attnbench.config_messages import (
    MAX_BATCH,
    MAX_D_MODEL,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SAMPLES,
    MAX_SEQ_LEN,
    MAX_THREADS,
    MAX_TOKENS,
    OVERRIDE,
    Context,
    Path_,
    describe,
    did_you_mean,
    from_validation,
)
from attnbench.config_source import (
    BUILTIN,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NODES,
    apply_override,
    builtin_config_text,
    builtin_source,
    parse_override,
    parse_yaml,
    read_file,
)
from attnbench.errors import ConfigError
from attnbench.flops import match_error

__all__ = [
    "AXIS_NAMES",
    "BUILTIN",
    "DEFAULT_AXES",
    "MAX_BATCH",
    "MAX_CASES",
    "MAX_DEPTH",
    "MAX_D_MODEL",
    "MAX_FILE_BYTES",
    "MAX_HEADS",
    "MAX_LAYERS",
    "MAX_NAME_LEN",
    "MAX_NODES",
    "MAX_SAMPLES",
    "MAX_SEQ_LEN",
    "MAX_THREADS",
    "MAX_TOKENS",
    "OVERRIDE",
    "ConfigModel",
    "Experiment",
    "GridModel",
    "Path_",
    "TimingModel",
    "builtin_config_text",
    "load_experiment",
    "load_experiment_text",
    "parse_override",
]

# The caps checked here; those the schema's ranges use sit in config_messages (which quotes them), those on
# the source (file bytes, nodes, depth) in config_source. All are importable from this module.
MAX_CASES = 10_000
MAX_NAME_LEN = 64

DEFAULT_AXES: dict[str, list[Any]] = {"d_model": [512], "heads": [8], "layers": [1], "causal": [False]}
AXIS_NAMES = ("d_model", "heads", "layers", "causal")  # may sit at the top level or under grid, not both

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")


# ---------------------------------------------------------------------------------------------------- schema
def _as_list(value: Any) -> Any:
    """A scalar where a list is allowed means a one-element list."""
    return value if isinstance(value, list) else [value]


def _yaml_off(value: Any) -> Any:
    """YAML 1.1 reads a bare ``off`` as false: ``telemetry: off`` means the word."""
    return "off" if value is False else value


def _preset_names(value: Any) -> Any:
    """``presets: [bert-base, lstm-110m]`` (or one name) means ``presets: {names: [...]}``."""
    return {"names": value} if isinstance(value, list | str) else value


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


class PresetsModel(_Strict):
    """Fixed-size models (``catalogue.PRESETS``) cased beside the grid; batch and seq_len default to the grid's."""

    names: Names
    core: Names = Field(default_factory=lambda: ["sdpa"])  # the attention model(s) attention presets run on
    modes: Names | None = None
    batch: Batches | None = None
    seq_len: SeqLens | None = None


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
    warmup_audit: Annotated[int, Field(ge=0, le=1000)] = _POLICY.warmup_audit
    warmup_agree: Annotated[float, Field(gt=0, lt=1)] = _POLICY.warmup_agree
    processes: Annotated[int, Field(ge=1, le=50)] = _POLICY.processes
    cache: Literal["warm", "cold"] = _POLICY.cache
    cuda_graph: bool = _POLICY.cuda_graph


class ConfigModel(_Strict):
    name: str
    description: str = ""
    device: str = "auto"
    models: Names
    model_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    modes: Names = Field(default_factory=lambda: ["forward", "train"])
    dtype: Names = Field(default_factory=lambda: ["float32"])
    grid: GridModel
    # Published-size models (bert-base, lstm-110m, …) beside the grid, at their own batch and seq_len; a bare
    # list of names is short for {names: [...]}.
    presets: Annotated[PresetsModel | None, BeforeValidator(_preset_names)] = None
    d_model: DModels | None = None
    heads: HeadCounts | None = None
    layers: LayerCounts | None = None
    causal: Flags | None = None
    threads: Annotated[int, Field(gt=0, le=MAX_THREADS)] | None = None
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    timing: TimingModel = Field(default_factory=TimingModel)
    # Each case in a worker process, so a segfault, a hang or a poisoned CUDA context costs one row, not the
    # sweep. null = on for CUDA devices (where those failures happen), off on CPU.
    isolate: bool | None = None
    # A case still running after this long is killed and recorded as `timeout`. null = 60 s + 10 × max_case_s.
    case_timeout_s: Seconds | None = None
    # Once a model runs out of memory at some seq_len, record its longer lengths as oom without running them.
    skip_larger_after_oom: bool = True
    # Hardware telemetry sampled in a background thread around each case's timed window: off, basic (NVML
    # utilisation/memory/power/clocks on a GPU, psutil CPU use), or full (basic + NVML GPM counters on Hopper+).
    telemetry: Annotated[Literal["off", "basic", "full"], BeforeValidator(_yaml_off)] = "basic"
    # null = 20 ms on a GPU; 100 ms on a CPU, where the sampler shares the cores being measured (at 20 ms it cost
    # 1.4 % there, at 100 ms under 1 %: results/telemetry-overhead-cpu.md).
    telemetry_interval_s: Annotated[float, Field(ge=0.001, le=10.0)] | None = None


_SECTIONS: dict[Path_, type[BaseModel]] = {
    (): ConfigModel,
    ("grid",): GridModel,
    ("timing",): TimingModel,
    ("presets",): PresetsModel,
}


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
    isolate: bool | None = None  # None: decided by the device (on for CUDA)
    case_timeout_s: float | None = None
    skip_larger_after_oom: bool = True
    telemetry: str = "basic"
    telemetry_interval_s: float | None = None
    presets: tuple[Axes, ...] = ()  # one fixed-size grid per preset named under presets, cased after the grid

    def interval_for(self, device: str) -> float:
        """The telemetry sampler's polling interval on ``device`` (see ConfigModel.telemetry_interval_s)."""
        if self.telemetry_interval_s is not None:
            return self.telemetry_interval_s
        return 0.02 if device.startswith("cuda") else 0.1

    def isolate_on(self, device: str) -> bool:
        return self.isolate if self.isolate is not None else device.startswith("cuda")

    @property
    def timeout_s(self) -> float:
        """Wall-clock limit for one case in a worker: warm-up, sampling, memory pass and start-up."""
        return self.case_timeout_s if self.case_timeout_s is not None else 60.0 + 10.0 * self.timing.max_case_s

    def cases(self, device: str) -> list[Case]:
        """Every case, model-major with seq_len innermost, for a resolved device ("cpu", "cuda:0"); the presets'
        cases follow the grid's."""
        presets = [case for axes in self.presets for case in expand(dataclasses.replace(axes, device=device))]
        if self.tokens is None:
            grid = expand(dataclasses.replace(self.axes, device=device))
        else:
            # batch is a function of seq_len: cross with one placeholder batch, then fill it in. The order and
            # the de-duplication are exactly expand()'s, because batch adds no freedom of its own.
            tokens = self.tokens
            crossed = expand(dataclasses.replace(self.axes, device=device, batch=(1,)))
            grid = [dataclasses.replace(case, batch=tokens // case.seq_len) for case in crossed]
        return list(dict.fromkeys([*grid, *presets]))


# ---------------------------------------------------------------------------------------------------- public
def load_experiment(
    path: str | Path | None,
    overrides: Sequence[str] = (),
    *,
    device_type: str = "cpu",
    force: bool = False,
) -> Experiment:
    """Load and validate an experiment; ``path=None`` means the built-in default for ``device_type``.
    ``force`` lifts the cap on the number of cases (``--force``)."""
    if path is None:
        text, source = builtin_config_text(device_type), builtin_source(device_type)
    else:
        text, source = read_file(Path(path), str(path)), str(path)
    return load_experiment_text(text, source, overrides, force=force)


def load_experiment_text(text: str, source: str, overrides: Sequence[str] = (), *, force: bool = False) -> Experiment:
    """Validate YAML text; ``source`` names it in errors (a path, or ``builtin:…``)."""
    data, lines = parse_yaml(text, source)
    if not isinstance(data, dict):
        what = "empty" if data is None else f"{describe(data)}, not a mapping of keys to values"
        raise ConfigError(
            f"the top level is {what}",
            where=source,
            hint="start from configs/default.yaml: name, models, modes, dtype, grid, …",
        )
    touched: list[Path_] = []
    for text_ in overrides:
        keys, value = parse_override(text_)
        apply_override(data, keys, value, touched)
    ctx = Context(source, lines, data, touched)
    try:
        model = ConfigModel.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc, ctx, _SECTIONS) from None
    return _build(model, ctx, force)


def resolved_text(resolved: Mapping[str, Any]) -> str:
    """A stored run's resolved config as YAML that ``load_experiment_text`` reads back to the same sha256."""
    return yaml.safe_dump(dict(resolved), sort_keys=False)


# ---------------------------------------------------------------------------------------------------- checks
def _build(m: ConfigModel, ctx: Context, force: bool = False) -> Experiment:
    """Checks that span fields, then the Experiment."""
    _check_name(m.name, ctx)
    if not DEVICE_REQUEST.fullmatch(m.device):
        raise ctx.error(
            f"device {m.device!r} is not one of auto, cpu, cuda, cuda:N",
            ("device",),
            hint=did_you_mean(m.device, ["auto", "cpu", "cuda", "cuda:0"]),
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
    options, written_options = _check_model_options(m, axes, ctx)
    presets, written_presets = _check_presets(m, ctx)
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
        # Only when given, so that configs without presets keep the sha256 they always had.
        **({"presets": written_presets} if written_presets is not None else {}),
        "modes": m.modes,
        "dtype": m.dtype,
        "grid": grid,
        "threads": m.threads,
        "seed": m.seed,
        "timing": m.timing.model_dump(),
        "isolate": m.isolate,
        "case_timeout_s": m.case_timeout_s,
        "skip_larger_after_oom": m.skip_larger_after_oom,
        "telemetry": m.telemetry,
        "telemetry_interval_s": m.telemetry_interval_s,
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
        isolate=m.isolate,
        case_timeout_s=m.case_timeout_s,
        skip_larger_after_oom=m.skip_larger_after_oom,
        telemetry=m.telemetry,
        telemetry_interval_s=m.telemetry_interval_s,
        presets=presets,
    )
    _check_size(experiment, ctx, force)
    return experiment


def _check_name(name: str, ctx: Context) -> None:
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


def _check_names(values: list[str], allowed: Sequence[str], what: str, path: Path_, ctx: Context) -> None:
    for i, value in enumerate(values):
        if value not in allowed:
            raise ctx.error(
                f"unknown {what} {value!r}; valid: {', '.join(allowed)}",
                ctx.item(path, i),
                hint=did_you_mean(value, allowed),
            )
    _check_unique(values, what, path, ctx)


def _check_unique(values: Sequence[Any], what: str, path: Path_ | None, ctx: Context) -> None:
    seen: set[Any] = set()
    for i, value in enumerate(values):
        if (type(value), value) in seen and path is not None:
            shown = repr(value) if isinstance(value, str) else json.dumps(value)
            raise ctx.error(f"{what} {shown} is listed twice", ctx.item(path, i))
        seen.add((type(value), value))


def _tied_batches(tokens: int, seq_lens: list[int], ctx: Context) -> list[int]:
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


def _check_heads(heads: list[int], d_models: list[int], path: Path_ | None, ctx: Context) -> None:
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
    m: ConfigModel, axes: Mapping[str, list[Any]], ctx: Context
) -> tuple[dict[str, tuple[Options, ...]], dict[str, dict[str, Any]]]:
    """Option sets per model, checked against the catalogue, and the options as written.

    A list of values for an option crosses them (``scope: [core, block]`` runs both). In each set, options left
    at their default, and options that have no effect given the others (``vocab`` below scope model), are
    dropped, so that neither changes a case's key; an option whose given value has no effect anywhere is refused.
    """
    result: dict[str, tuple[Options, ...]] = {}
    written: dict[str, dict[str, Any]] = {}
    for model, given in m.model_options.items():
        path: Path_ = ("model_options", model)
        if model not in MODELS:
            raise ctx.error(
                f"unknown model {model!r}; valid: {', '.join(MODEL_NAMES)}",
                path,
                hint=did_you_mean(model, MODEL_NAMES),
            )
        if model not in m.models:
            raise ctx.error(
                f"options are given for {model!r}, which is not in models ({', '.join(m.models)})",
                path,
                hint=f"add {model} to models or delete model_options.{model}",
            )
        spec = MODELS[model]
        names: list[str] = []
        values: list[list[Any]] = []
        for name, raw in given.items():
            option = spec.option(name)
            if option is None:
                known = ", ".join(o.name for o in spec.options if o.name != "preset") or "none"
                raise ctx.error(
                    f"unknown option {name!r} for {model}; its options: {known}",
                    (*path, name),
                    hint=did_you_mean(name, [o.name for o in spec.options]),
                )
            if name == "preset":
                raise ctx.error(
                    "a preset fixes d_model, heads, layers and options together, so it is not a model option",
                    (*path, name),
                    hint=f"name it under the top-level presets key: presets: {{names: [{', '.join(PRESET_NAMES)}]}}",
                )
            listed = raw if isinstance(raw, list) else [raw]
            if not listed:
                raise ctx.error("must not be empty: give at least one value", (*path, name))
            checked = [_option_value(v, option, model, ctx.item((*path, name), i), ctx) for i, v in enumerate(listed)]
            _check_unique(checked, f"{name} value", (*path, name), ctx)
            written.setdefault(model, {})[name] = checked if isinstance(raw, list) else checked[0]
            names.append(name)
            values.append(checked)
        sets: list[Options] = []
        unused: dict[str, str] = {}  # option → why it had no effect, while it has had none in any set
        used: set[str] = set()
        for combination in itertools.product(*values):
            chosen = dict(zip(names, combination, strict=True))
            _check_combination(model, chosen, axes, path, ctx)
            kept = []
            for name, value in chosen.items():
                problem = option_problem(model, name, chosen)
                if problem is None:
                    used.add(name)
                    if value != _spec(model, name).default:
                        kept.append((name, value))
                else:
                    unused.setdefault(name, problem)
            options = tuple(sorted(kept))
            if options not in sets:
                sets.append(options)
        for name, listed in zip(names, values, strict=True):
            default = _spec(model, name).default
            if name not in used and any(v != default for v in listed):
                raise ctx.error(
                    f"{name} has no effect on {model} here: {unused[name]}",
                    (*path, name),
                    hint=_NO_EFFECT_HINTS.get(name, f"remove {name}"),
                )
        if sets != [()]:
            result[model] = tuple(sets)
    return result, written


_NO_EFFECT_HINTS = {
    "vocab": "add scope: model, or remove vocab",
    "max_len": "add positional: learned, or remove max_len",
    "match": "add scope: block (or model), or remove match",
    "ffn_mult": "attention: add scope: block or model; recurrent: scope block or model with match: params",
}


def _spec(model: str, name: str) -> OptionSpec:
    option = MODELS[model].option(name)
    assert option is not None  # names were checked against the catalogue before
    return option


def _check_combination(
    model: str, chosen: Mapping[str, Any], axes: Mapping[str, list[Any]], path: Path_, ctx: Context
) -> None:
    """Checks that need one option set together with the grid's widths and lengths."""

    def value(name: str) -> Any:
        return chosen.get(name, _spec(model, name).default)

    if value("positional") == "learned" and value("max_len"):
        max_len = value("max_len")
        for n in axes["seq_len"]:
            if n > max_len:
                raise ctx.error(
                    f"max_len {max_len} is below grid seq_len {n}: the learned table would not cover the sequence",
                    (*path, "max_len"),
                    hint=f"raise max_len to at least {max(axes['seq_len'])}, or set 0 (= each case's seq_len)",
                )
    if is_recurrent(model):
        bidirectional = bool(chosen.get("bidirectional", False))
        if bidirectional:
            for d in axes["d_model"]:
                if d % 2:
                    raise ctx.error(
                        f"bidirectional {model} gives each direction d_model/2 units, so d_model "
                        f"must be even; {d} is odd",
                        (*path, "bidirectional"),
                    )
        if value("scope") != "core" and value("match") == "params":
            for d in axes["d_model"]:
                error = match_error(model, d, 2 if bidirectional else 1, value("ffn_mult"))
                if error > MATCH_TOLERANCE:
                    raise ctx.error(
                        f"match: params finds no hidden width for {model} at d_model {d} within "
                        f"{MATCH_TOLERANCE:.0%} of the attention block's parameters (best is {error:.1%} off)",
                        (*path, "match"),
                        hint="use a larger d_model (the sizes move in coarse steps when it is small), or match: hidden",
                    )
        return
    if value("positional") == "rope":
        for h in axes["heads"]:
            for d in axes["d_model"]:
                if d % h == 0 and (d // h) % 2:
                    raise ctx.error(
                        f"rope rotates pairs of features, so head_dim = d_model / heads must be even; "
                        f"{d} / {h} = {d // h}",
                        (*path, "positional"),
                        hint="choose heads so that d_model / heads is even",
                    )


def _option_value(value: Any, option: OptionSpec, model: str, path: Path_, ctx: Context) -> Any:
    """``value`` as ``option`` takes it (type, choices, range), or the error that says what is allowed."""
    kind = option.type
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is float and number and math.isfinite(value):
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        low, high = option.minimum, option.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            raise ctx.error(f"must be an integer from {low} to {high}, got {value}", path)
        return value
    if kind is str and isinstance(value, str):
        if option.name == "positional" and value == "rope" and is_recurrent(model):
            raise ctx.error(
                f"positional rope rotates attention's queries and keys, and {model} has none",
                path,
                hint="use sinusoidal or learned (added to the input), or none: a recurrence knows the order already",
            )
        if option.choices is not None and value not in option.choices:
            raise ctx.error(
                f"{option.name} {value!r} is not one of: {', '.join(option.choices)}",
                path,
                hint=did_you_mean(value, option.choices),
            )
        return value
    word = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}[kind]
    if kind is str and option.choices is not None:
        word = f"one of {', '.join(option.choices)}"
    raise ctx.error(f"must be {word}, got {describe(value)}", path)


def _check_presets(m: ConfigModel, ctx: Context) -> tuple[tuple[Axes, ...], dict[str, Any] | None]:
    """One fixed-size grid per preset named under ``presets``, and the section fully resolved."""
    p = m.presets
    if p is None:
        return (), None
    _check_names(p.names, PRESET_NAMES, "preset", ("presets", "names"), ctx)
    attention = [name for name in MODEL_NAMES if not is_recurrent(name)]
    for i, core in enumerate(p.core):
        if core not in attention:
            what = f"{core} is recurrent" if core in MODELS else f"unknown attention model {core!r}"
            raise ctx.error(
                f"{what}; presets.core names the attention model attention presets are built on",
                ctx.item(("presets", "core"), i),
                hint=did_you_mean(core, attention) or f"valid: {', '.join(attention)}",
            )
    _check_unique(p.core, "attention model", ("presets", "core"), ctx)
    if "core" in p.model_fields_set and all(PRESETS[name].model is not None for name in p.names):
        raise ctx.error(
            f"presets.core has no effect: every preset listed ({', '.join(p.names)}) is built on its own model",
            ("presets", "core"),
            hint="remove core, or add an attention preset such as bert-base",
        )
    modes = p.modes or m.modes
    _check_names(modes, MODES, "mode", ("presets", "modes"), ctx)
    batch = p.batch or m.grid.batch
    if batch is None:
        raise ctx.error(
            "presets need batch sizes: the grid has tokens, not batch, to inherit",
            ("presets",),
            hint="add presets.batch, e.g. batch: [8]",
        )
    seq_lens = p.seq_len or m.grid.seq_len
    seq_path: Path_ = ("presets", "seq_len") if p.seq_len is not None else ("grid", "seq_len")
    _check_unique(batch, "batch", ("presets", "batch") if p.batch is not None else ("grid", "batch"), ctx)
    _check_unique(seq_lens, "seq_len", seq_path, ctx)
    grids = []
    for name in p.names:
        preset = PRESETS[name]
        for i, n in enumerate(seq_lens):
            if preset.max_seq_len is not None and n > preset.max_seq_len:
                raise ctx.error(
                    f"{name} has {preset.max_seq_len} learned positions; seq_len {n} is longer",
                    ctx.item(seq_path, i),
                    hint=f"give presets.seq_len values up to {preset.max_seq_len}; for longer sequences run the "
                    f"model on the grid with scope: model (and positional: rope or sinusoidal)",
                )
        models = tuple(p.core) if preset.model is None else (preset.model,)
        grids.append(
            Axes(
                models=models,
                modes=tuple(cast(list[Mode], modes)),
                dtypes=tuple(m.dtype),
                batch=tuple(batch),
                seq_len=tuple(seq_lens),
                d_model=(preset.d_model,),
                heads=(preset.heads or 1,),  # recurrent presets: expand() records heads=None
                layers=(preset.layers,),
                causal=(False,),  # encoders; a unidirectional recurrence is causal by construction
                device=m.device,
                model_options={model: (preset.options,) for model in models},
            )
        )
    resolved = {"names": p.names, "core": p.core, "modes": modes, "batch": batch, "seq_len": seq_lens}
    return tuple(grids), resolved


def _check_timing(t: TimingModel, ctx: Context) -> None:
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


def _check_size(experiment: Experiment, ctx: Context, force: bool = False) -> None:
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
    cap = 100 * MAX_CASES if force else MAX_CASES
    if count > cap:
        raise ctx.error(
            f"the grid expands to {count} cases; the cap is {cap}" + (" even with --force" if force else ""),
            ("grid",),
            hint="narrow an axis, or split the sweep into several configs"
            + ("" if force else "; --force allows up to 100 times more"),
        )
