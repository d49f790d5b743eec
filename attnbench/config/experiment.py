"""Experiment configuration: a YAML file in, a validated, frozen ``Experiment`` out.

Stdlib, yaml, pydantic and ``core`` only. One way through: read the file → parse it
with ``yaml.safe_load`` → apply ``--set`` overrides → pydantic checks keys, types and ranges → plain code
checks what spans fields (heads divide d_model, grid size, model options) → ``Experiment``. Every problem on
the way is one ``ConfigError`` naming the file and line, the key path, what was wrong and what is allowed; no
yaml or pydantic exception leaves these modules.

This module is the public API and the checks that span sections; every import points down. Reading the source
(file, YAML, line index, ``--set``) lives in ``config.source``; pydantic's errors in plain words, and where each
error points, in ``config.messages``; the schema (pydantic models) in ``config.model``; checks any section uses in
``config.checks``; models the user brings (``factory:`` entries, installed plugins) in ``config.users``; the
``model_options`` and ``presets`` sections, and whether every case can be built, in ``config.options``; decode cases
(``modes: [decode]`` or a ``decode:`` section) in ``config.decoding``; the serving questions' keys (memory_budget,
prefill_chunk, draft, accept, packing) in ``config.serving``.
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
from typing import Any, cast

import yaml
from pydantic import ValidationError

from attnbench.config.checks import check_names, check_unique
from attnbench.config.decode_section import check_decode, decode_section
from attnbench.config.grid import Axes, expand
from attnbench.config.hybrids import check_hybrids
from attnbench.config.messages import (
    OVERRIDE,
    Context,
    Path_,
    describe,
    did_you_mean,
    from_validation,
)
from attnbench.config.model import (
    MAX_NAME_LEN,
    NAME,
    SECTION_ORDER,
    SECTIONS,
    ConfigModel,
    GridModel,
    TimingModel,
    UserModelEntry,
)
from attnbench.config.options import check_buildable, check_model_options, check_presets
from attnbench.config.serving import KEY_MODES, serving_axes
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
from attnbench.config.users import UserEntry, check_models
from attnbench.core.cases import (  # the size caps, re-exported here with the config's own
    DEFAULT_CACHE,
    DEVICE_REQUEST,
    DTYPES,
    MAX_BATCH,
    MAX_D_MODEL,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_SAMPLES,
    MAX_SEQ_LEN,
    MAX_THREADS,
    MAX_TOKENS,
    MODES,
    SERVING_PARAMS,
    STATEFUL_MODES,
    CacheState,
    Case,
    Level,
    Mode,
    TimingPolicy,
    default_interval_s,
)
from attnbench.core.errors import ConfigError
from attnbench.families.catalogue import MODELS, defined_spec, has_heads, option_axes

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
    "UserModelEntry",
    "builtin_config_text",
    "load_experiment",
    "load_experiment_text",
    "parse_override",
]

# The caps checked here; those the schema's ranges use sit in core.cases (stored rows are held to them too;
# config.messages quotes them), those on the source (file bytes, nodes, depth) in config.source. All are importable
# from this module.
MAX_CASES = 10_000

DEFAULT_AXES: dict[str, list[Any]] = {"d_model": [512], "heads": [8], "layers": [1], "causal": [False]}
AXIS_NAMES = ("d_model", "heads", "layers", "causal")  # may sit at the top level or under grid, not both


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
    presets: tuple[Axes, ...] = ()  # one fixed-size grid per preset named under presets
    decode: Axes | None = None  # the decode: section's grid
    order: tuple[str, ...] = SECTION_ORDER  # which section's cases run first
    check: bool = True  # hold each case's output to its family's reference before timing it (config ``check``)

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
        """Every case, model-major with seq_len innermost, for a resolved device ("cpu", "cuda:0"), the sections
        in ``order`` (by default the grid's, then the decode section's, then the presets')."""
        sections: dict[str, list[Case]] = {
            "grid": self._grid_cases(device),
            "decode": [] if self.decode is None else expand(dataclasses.replace(self.decode, device=device)),
            "presets": [case for axes in self.presets for case in expand(dataclasses.replace(axes, device=device))],
        }
        return list(dict.fromkeys(case for section in self.order for case in sections[section]))

    def _grid_cases(self, device: str) -> list[Case]:
        if self.tokens is None:
            grid = expand(dataclasses.replace(self.axes, device=device))
        else:
            # batch is a function of seq_len: cross with one placeholder batch, then fill it in. The order and
            # the de-duplication are exactly expand()'s, because batch adds no freedom of its own.
            tokens = self.tokens
            crossed = expand(dataclasses.replace(self.axes, device=device, batch=(1,)))
            grid = [dataclasses.replace(case, batch=tokens // case.seq_len) for case in crossed]
        return grid


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


def load_experiment_text(
    text: str, source: str, overrides: Sequence[str] = (), *, force: bool = False, stored: bool = False
) -> Experiment:
    """Validate YAML text; ``source`` names it in errors (a path, or ``builtin:…``). ``stored``: the text is a stored
    run's resolved config, whose ``users`` key says what each model the user brought was when it ran, so its
    cases expand without the user's code or plugins installed here."""
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
    known = data.pop("users", None) if stored else None
    ctx = Context(source, lines, data, touched)
    try:
        model = ConfigModel.model_validate(data)
    except ValidationError as exc:
        raise from_validation(exc, ctx, SECTIONS) from None
    return _build(model, ctx, force, known if isinstance(known, dict) else None, stored)


def resolved_text(resolved: Mapping[str, Any]) -> str:
    """A stored run's resolved config as YAML that ``load_experiment_text`` reads back to the same sha256."""
    return yaml.safe_dump(dict(resolved), sort_keys=False)


def stored_experiment(resolved: Mapping[str, Any], source: str) -> Experiment:
    """The experiment a stored run was swept from, read back from its resolved config (the case cap lifted: the
    sweep already checked it)."""
    return load_experiment_text(resolved_text(resolved), source, force=True, stored=True)


# ---------------------------------------------------------------------------------------------------- checks
# Settings the Experiment takes as the validated model holds them, under the same name.
_AS_GIVEN = (
    "name",
    "device",
    "threads",
    "seed",
    "isolate",
    "case_timeout_s",
    "skip_larger_after_oom",
    "telemetry",
    "telemetry_interval_s",
)
# Top-level keys the resolved config holds elsewhere (the axes under grid, cache under timing) or as their own check
# resolved them (the serving keys: ``config.serving``), so that equal experiments hash equal wherever a key was written.
# Every serving key (``config.serving.KEY_MODES``) resolves as ``serving.resolved`` gives it: only where given.
_ELSEWHERE = frozenset({*AXIS_NAMES, "cache", *KEY_MODES, *(key for keys in SERVING_PARAMS.values() for key in keys)})
# Keys added after the first configs: resolved only where a config sets them off their default, so that every
# config written before them keeps the sha256 it had.
_ADDED_LATER = frozenset({"presets", "decode", "order", "check"})


def _build(
    m: ConfigModel, ctx: Context, force: bool = False, known: Mapping[str, Any] | None = None, stored: bool = False
) -> Experiment:
    """Checks that span fields, then the Experiment; ``known``: a stored run's record of its user models;
    ``stored``: ``m`` is a stored run's resolved config."""
    _check_name(m.name, ctx)
    if not DEVICE_REQUEST.fullmatch(m.device):
        raise ctx.error(
            f"device {m.device!r} is not one of auto, cpu, cuda, cuda:N",
            ("device",),
            hint=did_you_mean(m.device, ["auto", "cpu", "cuda", "cuda:0"]),
        )
    hybrids = check_hybrids(m, ctx)
    names, users = check_models(m, ctx, known)
    check_names(m.modes, MODES, "mode", ("modes",), ctx)
    check_names(m.dtype, DTYPES, "dtype", ("dtype",), ctx)
    axes, paths = _axes(m, ctx)
    # A model you bring is handed heads too; a hybrid stack has them where a member has.
    # The models the config defines, by name: what their cases carry (``Case.definition``).
    defined = {**{name: entry.definition for name, entry in users.items()}, **hybrids}
    if any(defined_spec(n, d).heads for n, d in defined.items()) or any(m in MODELS and has_heads(m) for m in names):
        _check_heads(axes["heads"], axes["d_model"], paths["heads"], ctx)
    given_axes = _check_option_axes(m, names, ctx)
    option_values = {name: tuple(values) for name, (values, _) in given_axes.items()}
    # Before any option set is built: six options of a hundred values each are 10**12 sets.
    given_sets = {name: _listed_product(_given_options(m, name, users)) for name in names}
    combinations = _crossed(given_sets, option_values, m.modes, m.dtype, [1] if m.grid.tokens else axes["batch"], axes)
    _refuse_size(combinations, ctx, force, exact=False)
    options, written_options = check_model_options(m, names, users, hybrids, axes, ctx)
    if STATEFUL_MODES & set(m.modes):
        causal_path = paths["causal"] if paths["causal"] is not None else ("modes",)
        check_decode(names, axes["causal"], causal_path, options, defined, ctx)
    decode, written_decode = decode_section(m, names, axes, options, defined, option_values, ctx)
    order = _order(m, ctx)
    serving = serving_axes(m, ctx)
    presets, written_presets = check_presets(m, ctx, serving.serving)
    _check_timing(m.timing, ctx)
    cache = _cache(m, ctx)
    timing = _resolved_timing(m, stored)
    checked = {
        "model_options": written_options,
        "presets": written_presets,
        "decode": written_decode,
        "order": list(order),
        "grid": _grid(m, axes, option_values),  # every axis under grid, wherever it was written
        "timing": {**timing, "cache": cache},  # likewise cache under timing
    }
    # Only with models the user brought: what each was, so the stored run expands without their code.
    extra = {"users": {name: entry.record() for name, entry in users.items()}} if users else {}
    resolved = _resolved(m, checked, {**extra, **serving.resolved})
    experiment = Experiment(
        **{name: getattr(m, name) for name in _AS_GIVEN},
        source=ctx.source,
        axes=Axes(
            models=tuple(names),
            modes=tuple(cast(list[Mode], m.modes)),
            dtypes=tuple(m.dtype),
            **{axis: tuple(axes[axis]) for axis in ("batch", "seq_len", *AXIS_NAMES)},
            device=m.device,
            model_options=options,
            option_axes=option_values,
            defined=defined,
            serving=serving.serving,
            packing=serving.packing,
            kept=serving.kept,
        ),
        timing=TimingPolicy(**{**m.timing.model_dump(), "cache": cache}),
        resolved=resolved,
        sha256=hashlib.sha256(json.dumps(resolved, sort_keys=True, separators=(",", ":")).encode()).hexdigest(),
        tokens=m.grid.tokens,
        presets=presets,
        decode=decode,
        order=order,
        check=m.check == "on",
    )
    _check_size(experiment, ctx, force)
    axis_paths = {name: path for name, (_, path) in given_axes.items()}
    check_buildable(experiment.cases("cpu"), names, written_options, option_values, axis_paths, ctx)
    return experiment


def _resolved_timing(m: ConfigModel, stored: bool) -> dict[str, Any]:
    """The timing keys as resolved: a stored run's as stored (one from before a key, without it); a key added after
    the configs were pinned (``rounds``) only off its default, so that every older config keeps its sha256."""
    timing = m.timing.model_dump(exclude_unset=stored)
    if timing.get("rounds") == 1:
        del timing["rounds"]
    return timing


def _resolved(m: ConfigModel, checked: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The config as validated, every key in one place and one form (itself a valid config), derived from the model:
    each key as ``checked`` resolved it, else as the model holds it; ``after`` appended. A deep, plain copy."""
    dumped = m.model_dump()
    given = m.model_dump(exclude_defaults=True)
    resolved = {
        key: checked.get(key, dumped[key])
        for key in dumped
        if key not in _ELSEWHERE and key not in option_axes() and (key not in _ADDED_LATER or key in given)
    }
    return cast(dict[str, Any], json.loads(json.dumps({**resolved, **after})))


def _order(m: ConfigModel, ctx: Context) -> tuple[str, ...]:
    """Which section's cases run first: those ``order`` names, then the rest in ``SECTION_ORDER``."""
    if m.order is None:
        return SECTION_ORDER
    check_unique(m.order, "section", ("order",), ctx)
    return (*m.order, *(section for section in SECTION_ORDER if section not in m.order))


def _grid(
    m: ConfigModel, axes: Mapping[str, list[Any]], option_values: Mapping[str, tuple[Any, ...]]
) -> dict[str, Any]:
    """The grid as resolved: every axis under it, wherever it was written, and the option axes given."""
    grid: dict[str, Any] = {"tokens": m.grid.tokens} if m.grid.tokens is not None else {"batch": m.grid.batch}
    grid.update(seq_len=m.grid.seq_len, **{axis: axes[axis] for axis in AXIS_NAMES})
    return grid | {name: list(listed) for name, listed in option_values.items()}


def _axes(m: ConfigModel, ctx: Context) -> tuple[dict[str, list[Any]], dict[str, Path_ | None]]:
    """The grid's axes, each given once (at the top level or under grid) or defaulted, and where each was given."""
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
    return axes, paths


def _cache(m: ConfigModel, ctx: Context) -> CacheState | None:
    """The cache state the config times its cases in: given at the top level or under timing (not both, unless the
    top level's is an override: sweep --cache, or --set cache=…, which wins); else each mode's default, said as one
    value where every mode the config runs shares it (what the field always said: such a config keeps the sha256 it
    had), and None where they differ (``TimingPolicy.cache_for`` decides per case)."""
    if m.cache is not None and m.timing.cache is not None and ("cache",) not in ctx.touched:
        raise ctx.error("cache is given both at the top level and under timing; keep one", ("timing", "cache"))
    given = m.cache if m.cache is not None else m.timing.cache
    if given is not None:
        return given
    modes = {*m.modes, *(m.presets.modes or () if m.presets else ()), *(("decode",) if m.decode else ())}
    defaults = {DEFAULT_CACHE[mode] for mode in modes if mode in DEFAULT_CACHE}
    return defaults.pop() if len(defaults) == 1 else None


def _check_name(name: str, ctx: Context) -> None:
    if NAME.fullmatch(name) and len(name) <= MAX_NAME_LEN:
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


def _check_option_axes(m: ConfigModel, names: Sequence[str], ctx: Context) -> dict[str, tuple[list[Any], Path_]]:
    """The grid axes that set an option (``catalogue.option_axes``: heads_kv) given here, with where each was
    written (top level or under grid, not both), after checking that some listed model has the option. Whether a
    value fits each case (heads_kv dividing heads) is the family's rule, checked on every case (``check_buildable``)."""
    given: dict[str, tuple[list[Any], Path_]] = {}
    for name in option_axes():
        top, under = getattr(m, name), getattr(m.grid, name)
        if top is not None and under is not None:
            raise ctx.error(f"{name} is given both at the top level and under grid; keep one", ("grid", name))
        values = top if top is not None else under
        if values is None:
            continue
        path: Path_ = (name,) if top is not None else ("grid", name)
        check_unique(values, name, path, ctx)
        if not any(model in MODELS and MODELS[model].option(name) is not None for model in names):
            takers = [model for model, spec in MODELS.items() if spec.option(name) is not None]
            raise ctx.error(
                f"{name} has no effect: no model listed ({', '.join(names)}) has the option {name}",
                path,
                hint=f"add a model that has it ({', '.join(takers)}), or remove {name}",
            )
        given[name] = (list(values), path)
    return given


def _check_timing(t: TimingModel, ctx: Context) -> None:
    if t.rounds > 1 and t.processes > 1:
        raise ctx.error(
            f"rounds {t.rounds} with processes {t.processes}: a row keeps one median a round or one a process, "
            "not both",
            ("timing", "rounds"),
            hint="set one of timing.rounds or timing.processes above 1, and the other to 1",
        )
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


def _given_options(m: ConfigModel, model: str, users: Mapping[str, UserEntry]) -> Mapping[str, Any]:
    """A model's options as the config lists them: a config entry's own, or its model_options."""
    entry = users.get(model)
    return entry.given if entry is not None and entry.from_config else m.model_options.get(model, {})


def _listed_product(given: Mapping[str, Any]) -> int:
    """How many option sets listing ``given``'s values crosses into, at most (defaults and repeats make fewer)."""
    return math.prod(max(len(v), 1) if isinstance(v, list) else 1 for v in given.values())


def _crossed(
    option_sets: Mapping[str, int],
    option_axes: Mapping[str, Sequence[Any]],
    modes: Sequence[str],
    dtypes: Sequence[str],
    batches: Sequence[int],
    axes: Mapping[str, Sequence[Any]],
) -> int:
    """Every combination the axes cross, each model with its option sets: an upper bound on the cases (a decode of
    a non-causal model, a repeat, is dropped by expand), counted without making one."""
    sizes = [len(modes), len(dtypes), len(batches), *(len(axes[a]) for a in ("seq_len", "d_model", "heads", "layers"))]
    sizes += [len(axes["causal"]), *(len(values) for values in option_axes.values())]
    return sum(option_sets.values()) * math.prod(sizes)


def _check_size(experiment: Experiment, ctx: Context, force: bool = False) -> None:
    axes = experiment.axes
    option_sets = {model: len(axes.model_options.get(model, ((),))) for model in axes.models}
    grid = {
        "seq_len": axes.seq_len,
        "d_model": axes.d_model,
        "heads": axes.heads,
        "layers": axes.layers,
        "causal": axes.causal,
    }
    batches = (1,) if experiment.tokens else axes.batch
    crossed = _crossed(option_sets, axes.option_axes, axes.modes, axes.dtypes, batches, grid)
    # Expanding is cheap, but not for a typo that crosses millions: refuse those before counting exactly.
    crossed *= max((len(sets) for sets in axes.serving.values()), default=1)
    if crossed > 100 * MAX_CASES:
        _refuse_size(crossed, ctx, force, exact=False)
    _refuse_size(len(experiment.cases(experiment.device)), ctx, force, exact=True)


def _refuse_size(count: int, ctx: Context, force: bool, *, exact: bool) -> None:
    """The error for more cases than the cap (``MAX_CASES``, 100 times more with ``--force``); ``count`` not
    ``exact``: the combinations the axes cross, refused only beyond the cap even --force allows."""
    cap = 100 * MAX_CASES if force else MAX_CASES
    if count <= (cap if exact else 100 * MAX_CASES):
        return
    raise ctx.error(
        f"the grid expands to {count} cases; the cap is {cap}" + (" even with --force" if force else ""),
        ("grid",),
        hint="narrow an axis, or split the sweep into several configs"
        + ("" if force else "; --force allows up to 100 times more"),
    )
