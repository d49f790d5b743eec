"""Experiment configuration: a YAML file in, a validated, frozen ``Experiment`` out.

Stdlib, yaml, pydantic and ``core`` only. One way through: read the file → parse it
with ``yaml.safe_load`` → apply ``--set`` overrides → pydantic checks keys, types and ranges → plain code
checks what spans fields (heads divide d_model, grid size, model options) → ``Experiment``. Every problem on
the way is one ``ConfigError`` naming the file and line, the key path, what was wrong and what is allowed; no
yaml or pydantic exception leaves these modules.

This module is the schema and the public API. Reading the source (file, YAML, line index, ``--set``) lives in
``config.source``; pydantic's errors in plain words, and where each error points, in ``config.messages``; the
``model_options`` and ``presets`` sections checked against the catalogue in ``config.options``; decode cases
(``modes: [decode]`` or a ``decode:`` section) in ``config.decoding``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from attnbench.config.decoding import check_decode, decode_section
from attnbench.config.messages import (
    OVERRIDE,
    Context,
    Path_,
    describe,
    did_you_mean,
    from_validation,
)
from attnbench.config.options import check_model_options, check_names, check_presets, check_unique, preset_names
from attnbench.config.source import (
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
from attnbench.core.cases import (  # the size caps, re-exported here with the config's own
    MAX_BATCH,
    MAX_D_MODEL,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SAMPLES,
    MAX_SEQ_LEN,
    MAX_THREADS,
    MAX_TOKENS,
    Axes,
    Case,
    Level,
    Mode,
    TimingPolicy,
    default_interval_s,
    expand,
)
from attnbench.core.catalogue import DEVICE_REQUEST, DTYPES, MODEL_NAMES, MODELS, MODES, has_heads
from attnbench.core.errors import ConfigError

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

# The caps checked here; those the schema's ranges use sit in core.cases (stored rows are held to them too;
# config.messages quotes them), those on the source (file bytes, nodes, depth) in config.source. All are importable
# from this module.
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
    # The docstring under each field is its description in the JSON Schema (`attnbench schema`), which editors
    # show on hover: say what the key does and what it takes, in one or two sentences.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, use_attribute_docstrings=True)


class GridModel(_Strict):
    """The axes crossed into cases: every combination is one case."""

    batch: Batches | None = None
    """Sequences per call; each value is crossed with every seq_len. Give batch or tokens."""
    tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS)] | None = None
    """Tokens per call instead of batch: batch = tokens // seq_len, so every case moves the same number."""
    seq_len: SeqLens
    """Tokens per sequence: the axis the comparison is about."""
    d_model: DModels | None = None
    """Model width: the RNN hidden size, the attention embedding size (here or at the top level)."""
    heads: HeadCounts | None = None
    """Attention heads, each must divide d_model; ignored by recurrent models (here or at the top level)."""
    heads_kv: HeadCounts | None = None
    """Key/value heads (GQA; 1 = MQA), crossed into every model with a heads_kv option; each must divide every
    heads (here or at the top level); left out = heads."""
    layers: LayerCounts | None = None
    """Stacked layers (or blocks) of each model (here or at the top level)."""
    causal: Flags | None = None
    """Causal attention mask (true) or full attention (false); a unidirectional RNN is causal by construction."""


class PresetsModel(_Strict):
    """Fixed-size models (``catalogue.PRESETS``) cased beside the grid; batch and seq_len default to the grid's."""

    names: Names
    """Presets to run: bert-base, lstm-110m, mingru-110m."""
    core: Names = Field(default_factory=lambda: ["sdpa"])
    """The attention model(s) an attention preset (bert-base) is built on."""
    modes: Names | None = None
    """The presets' modes; null = the config's modes."""
    batch: Batches | None = None
    """The presets' batch sizes; null = the grid's."""
    seq_len: SeqLens | None = None
    """The presets' sequence lengths; null = the grid's."""


class DecodeModel(_Strict):
    """Decode cases beside the grid, at their own context lengths; each key left out is the grid's (models: the
    config's). Always causal: a decode step sees the tokens before it only."""

    models: Names | None = None
    """Models that decode (the config's models when left out); attention decodes causally."""
    seq_len: SeqLens | None = None
    """Context lengths n: the KV cache or recurrent state holds n tokens when the next one is timed."""
    batch: Batches | None = None
    """Sequences decoded side by side (the grid's batch when left out)."""


class TimingModel(_Strict):
    """``TimingPolicy``'s fields with their ranges; the defaults are the policy's own (a test holds them)."""

    target_ci: Annotated[float, Field(gt=0, lt=1)] = _POLICY.target_ci
    """Stop sampling once the 95 % CI of the median is within ± this fraction of it (0.01 = ±1 %)."""
    min_samples: Annotated[int, Field(ge=3, le=MAX_SAMPLES)] = _POLICY.min_samples
    """Never stop with fewer samples than this."""
    max_samples: Annotated[int, Field(ge=3, le=MAX_SAMPLES)] = _POLICY.max_samples
    """Never take more samples than this."""
    min_time_s: Seconds = _POLICY.min_time_s
    """Sample for at least this many seconds."""
    max_case_s: Seconds = _POLICY.max_case_s
    """The whole budget of a case in seconds, warm-up included; a case that runs out says converged: false."""
    warmup_min_calls: Annotated[int, Field(ge=1, le=MAX_SAMPLES)] = _POLICY.warmup_min_calls
    """Untimed calls first: the last this many must agree (warmup_settle) before timing starts."""
    warmup_max_s: Seconds = _POLICY.warmup_max_s
    """The longest warm-up in seconds before timing starts anyway."""
    warmup_settle: Annotated[float, Field(gt=0, lt=1)] = _POLICY.warmup_settle
    """Warm-up calls within this fraction of their median count as settled."""
    min_sample_s: Seconds = _POLICY.min_sample_s
    """A sample shorter than this many seconds is built from several calls, so clock resolution vanishes."""
    warmup_audit: Annotated[int, Field(ge=0, le=1000)] = _POLICY.warmup_audit
    """The first this many timed samples must agree with the later ones, else they join the warm-up; 0 = off."""
    warmup_agree: Annotated[float, Field(gt=0, lt=1)] = _POLICY.warmup_agree
    """How closely (a fraction) the audited samples' median must agree with the later samples'."""
    processes: Annotated[int, Field(ge=1, le=50)] = _POLICY.processes
    """Run every case in this many fresh worker processes; the spread of their medians widens the CI."""
    cache: Literal["warm", "cold"] = _POLICY.cache
    """GPU only. cold: flush the device's L2 before every timed call (not timed); warm: do not."""
    cuda_graph: bool = _POLICY.cuda_graph
    """GPU only: replay forward passes from a captured CUDA graph, which removes per-kernel launch cost."""
    process_warmup_s: Annotated[float, Field(ge=0, le=60)] = _POLICY.process_warmup_s
    """Before the first case of each process, this many seconds of a mixed parallel workload, so the first case does
    not pay for thread pools, clock ramp-up and first-use initialisation; 0 = none."""


class ConfigModel(_Strict):
    """An attnbench experiment: which models to time, on which grid, how carefully."""

    name: str
    """Names the experiment and its run folders (results/runs/<time>-<name>-<device>/): lower-case letters,
    digits, '.', '_' and '-'."""
    description: str = ""
    """Free text, kept in run.json."""
    device: str = "auto"
    """auto (CUDA when torch can use it, else the CPU), cpu, cuda or cuda:N; --device overrides it."""
    models: Names
    """The models to time; `attnbench models` says which run here and why not."""
    model_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Options per model, e.g. {sdpa: {scope: block}}; a list of values crosses them, each a variant of its own."""
    modes: Names = Field(default_factory=lambda: ["forward", "train"])
    """forward (under inference_mode), train (forward + backward), backward (the backward pass alone) and decode
    (one new token after a context of seq_len: a KV cache or a recurrent state filled outside the timing)."""
    dtype: Names = Field(default_factory=lambda: ["float32"])
    """Floating-point types to time."""
    grid: GridModel
    """The axes crossed into cases: batch (or tokens) and seq_len, and optionally d_model, heads, layers, causal."""
    presets: Annotated[PresetsModel | None, BeforeValidator(preset_names)] = None
    """Published-size models (bert-base, lstm-110m, mingru-110m) beside the grid, at their own batch and seq_len;
    a bare list of names is short for {names: [...]}."""
    decode: DecodeModel | None = None
    """Decode cases (one new token after a context of seq_len) with lengths, batches and models of their own."""
    d_model: DModels | None = None
    """Model width: the RNN hidden size, the attention embedding size (here or under grid)."""
    heads: HeadCounts | None = None
    """Attention heads, each must divide d_model; ignored by recurrent models (here or under grid)."""
    heads_kv: HeadCounts | None = None
    """Key/value heads (GQA; 1 = MQA), crossed into every model with a heads_kv option; each must divide every
    heads (here or under grid); left out = heads."""
    layers: LayerCounts | None = None
    """Stacked layers (or blocks) of each model (here or under grid)."""
    causal: Flags | None = None
    """Causal attention mask (true) or full attention (false); a unidirectional RNN is causal by construction."""
    threads: Annotated[int, Field(gt=0, le=MAX_THREADS)] | None = None
    """torch CPU threads; null = torch's default (one per core)."""
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    """Seeds inputs and weights, so reruns time the same numbers."""
    timing: TimingModel = Field(default_factory=TimingModel)
    """How carefully each case is timed (seconds throughout)."""
    isolate: bool | None = None
    """Each case in a worker process, so a segfault, a hang or a poisoned CUDA context costs one row, not the
    sweep; null = on for CUDA devices (where those failures happen), off on a CPU."""
    case_timeout_s: Seconds | None = None
    """A case still running after this many seconds is killed and recorded as timeout (with isolation);
    null = 60 s + 10 × timing.max_case_s."""
    skip_larger_after_oom: bool = True
    """Once a model runs out of memory at some seq_len, record its longer lengths as oom without running them."""
    telemetry: Annotated[Literal["off", "basic", "full"], BeforeValidator(_yaml_off)] = "basic"
    """Hardware telemetry around each case's timed window: off; basic (NVML utilisation, memory, power and clocks
    on a GPU, psutil CPU use); full (basic + NVML GPM counters on Hopper and newer)."""
    telemetry_interval_s: Annotated[float, Field(ge=0.001, le=10.0)] | None = None
    """The sampler's polling interval in seconds; null = 100 ms: on a CPU the sampler shares the cores being
    measured (at 20 ms it cost 1.4 %: results/telemetry-overhead-cpu.md); on a GPU utilisation, power and clocks
    come from NVML's own sample buffers, so the poll reads only memory in use, temperature and clock reasons."""


_SECTIONS: dict[Path_, type[BaseModel]] = {
    (): ConfigModel,
    ("grid",): GridModel,
    ("timing",): TimingModel,
    ("presets",): PresetsModel,
    ("decode",): DecodeModel,
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
    telemetry: Level = "basic"
    telemetry_interval_s: float | None = None
    presets: tuple[Axes, ...] = ()  # one fixed-size grid per preset named under presets, cased after the grid
    decode: Axes | None = None  # the decode: section's grid, cased after the grid and before the presets

    def interval_for(self, device: str) -> float:
        """The telemetry sampler's polling interval on ``device`` (see ConfigModel.telemetry_interval_s)."""
        if self.telemetry_interval_s is not None:
            return self.telemetry_interval_s
        return default_interval_s(device)

    def isolate_on(self, device: str) -> bool:
        # Replicates are fresh worker processes, so they need isolation whatever `isolate` says.
        if self.timing.processes > 1:
            return True
        return self.isolate if self.isolate is not None else device.startswith("cuda")

    @property
    def timeout_s(self) -> float:
        """Wall-clock limit for one case in a worker: warm-up, sampling, memory pass and start-up."""
        return self.case_timeout_s if self.case_timeout_s is not None else 60.0 + 10.0 * self.timing.max_case_s

    def cases(self, device: str) -> list[Case]:
        """Every case, model-major with seq_len innermost, for a resolved device ("cpu", "cuda:0"); the decode
        section's and then the presets' cases follow the grid's."""
        extra = (*(() if self.decode is None else (self.decode,)), *self.presets)
        presets = [case for axes in extra for case in expand(dataclasses.replace(axes, device=device))]
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


def stored_experiment(resolved: Mapping[str, Any], source: str) -> Experiment:
    """The experiment a stored run was swept from, read back from its resolved config (the case cap lifted: the
    sweep already checked it)."""
    return load_experiment_text(resolved_text(resolved), source, force=True)


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
    check_names(m.models, MODEL_NAMES, "model", ("models",), ctx)
    check_names(m.modes, MODES, "mode", ("modes",), ctx)
    check_names(m.dtype, DTYPES, "dtype", ("dtype",), ctx)

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
        check_unique(values, axis, paths[axis], ctx)

    if m.grid.tokens is not None:
        axes["batch"] = _tied_batches(m.grid.tokens, m.grid.seq_len, ctx)
    if any(has_heads(model) for model in m.models):
        _check_heads(axes["heads"], axes["d_model"], paths["heads"], ctx)
    heads_kv_path = _check_heads_kv(m, axes["heads"], ctx)
    axes["heads_kv"] = (m.heads_kv or m.grid.heads_kv or [0]) if heads_kv_path else [0]
    options, written_options = check_model_options(m, axes, ctx)
    if "decode" in m.modes:
        causal_path = paths["causal"] if paths["causal"] is not None else ("modes",)
        check_decode(m.models, axes["causal"], causal_path, options, m.grid.seq_len, ctx)
    decode, written_decode = decode_section(m, axes, options, ctx)
    presets, written_presets = check_presets(m, ctx)
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
        heads_kv=tuple(axes["heads_kv"]),
    )
    grid: dict[str, Any] = {"tokens": m.grid.tokens} if m.grid.tokens is not None else {"batch": m.grid.batch}
    grid.update(seq_len=m.grid.seq_len, **{axis: axes[axis] for axis in AXIS_NAMES})
    if heads_kv_path:  # only when given, so that configs without it keep the sha256 they always had
        grid["heads_kv"] = axes["heads_kv"]
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
        **({"decode": written_decode} if written_decode is not None else {}),
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
        decode=decode,
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


def _check_heads_kv(m: ConfigModel, heads: list[int], ctx: Context) -> Path_ | None:
    """Where the grid's heads_kv was given (top level or under grid), after checking every value divides every
    heads and some model takes it; None when it was not given."""
    if m.heads_kv is not None and m.grid.heads_kv is not None:
        raise ctx.error("heads_kv is given both at the top level and under grid; keep one", ("grid", "heads_kv"))
    values = m.heads_kv or m.grid.heads_kv
    if values is None:
        return None
    path: Path_ = ("heads_kv",) if m.heads_kv is not None else ("grid", "heads_kv")
    check_unique(values, "heads_kv", path, ctx)
    takers = [model for model in m.models if MODELS[model].option("heads_kv") is not None]
    if not takers:
        raise ctx.error(
            f"heads_kv has no effect: no model listed ({', '.join(m.models)}) has key/value heads",
            path,
            hint="add an attention model (sdpa, vanilla, flash-attn, flex) or linear-attn, or remove heads_kv",
        )
    for i, kv in enumerate(values):
        for h in heads:
            if kv > h or h % kv:
                divisors = [str(k) for k in range(1, h + 1) if h % k == 0]
                raise ctx.error(
                    f"heads_kv {kv} does not divide heads {h}: each key/value head serves heads / heads_kv query "
                    "heads, which must be whole",
                    ctx.item(path, i),
                    hint=f"heads_kv values that divide {h}: {', '.join(divisors)} (1 = multi-query, {h} = multi-head)",
                )
    return path


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
