"""The ``model_options:`` and ``presets:`` sections, checked against the catalogue, and every case checked buildable.

Between ``experiment`` (which builds the Experiment) and the schema, ``checks`` and ``messages`` below it: stdlib,
the torch-free core and the catalogue only. ``check_model_options`` gives the option sets per model that
``Axes.model_options`` crosses (a user model's through ``config.users``); ``check_presets`` gives one fixed-size
grid per preset; both also return the section as written, resolved, for the experiment's sha256.
``check_buildable`` asks the model's family of every case whether it can be built (``catalogue.cannot_build``: the
rule lives once, in the family) and points a refusal at the key that made it so.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, cast

from attnbench.config.checks import check_names, check_option_value, check_unique, inherited_lengths
from attnbench.config.grid import Axes
from attnbench.config.messages import Context, Path_, describe, did_you_mean
from attnbench.config.model import ConfigModel, PresetsModel
from attnbench.config.users import UserEntry, user_option_sets
from attnbench.core.cases import (
    MODES,
    PARALLEL,
    SERVING_PARAMS,
    STATEFUL_MODES,
    Case,
    Definition,
    Mode,
    Options,
    Serving,
)
from attnbench.core.units import format_bytes, parse_bytes
from attnbench.families.catalogue import (
    HYBRID,
    MODEL_NAMES,
    MODELS,
    PRESET_CORE_DEFAULT,
    PRESET_CORES,
    PRESET_NAMES,
    PRESETS,
    PUBLISHED,
    ModelSpec,
    OptionSpec,
    Published,
    cannot_build,
    define,
    family_named,
    family_of,
    has_heads,
    no_effect,
    published_problem,
)
from attnbench.families.shared import DTYPE_BYTES

__all__ = ["check_buildable", "check_model_options", "check_presets", "option_value"]


def check_model_options(
    m: ConfigModel,
    names: Sequence[str],
    users: Mapping[str, UserEntry],
    hybrids: Mapping[str, Definition],
    axes: Mapping[str, list[Any]],
    ctx: Context,
) -> tuple[dict[str, tuple[Options, ...]], dict[str, dict[str, Any]]]:
    """Option sets per model, checked against the catalogue (or the user model's entry), and the options as written.

    A list of values for an option crosses them (``scope: [core, block]`` runs both). In each set, options left
    at their default, and options that have no effect given the others (``vocab`` below scope model), are
    dropped, so that neither changes a case's key; an option whose given value has no effect anywhere is refused.
    A user model keeps every option it has (its key says everything its factory was given).
    """
    result: dict[str, tuple[Options, ...]] = {}
    written: dict[str, dict[str, Any]] = {}
    for model, given in m.model_options.items():
        path: Path_ = ("model_options", model)
        if model not in MODELS and model not in users and model not in hybrids:
            raise ctx.error(
                f"unknown model {model!r}; valid: {', '.join(MODEL_NAMES)}",
                path,
                hint=did_you_mean(model, [*MODEL_NAMES, *users]),
            )
        if model not in names:
            raise ctx.error(
                f"options are given for {model!r}, which is not in models ({', '.join(names)})",
                path,
                hint=f"add {model} to models or delete model_options.{model}",
            )
        if model in users:
            result[model], written[model] = user_option_sets(users[model], given, path, ctx, option_value)
            continue
        spec = HYBRID.entry_spec(model) if model in hybrids else MODELS[model]
        sets, written[model] = _builtin_option_sets(spec, given, axes, path, ctx)
        if sets != [()]:
            result[model] = tuple(sets)
    for model, entry in users.items():
        if model not in result:  # no model_options for it: its entry's own options, or a plugin's defaults
            result[model], _ = user_option_sets(entry, {}, ("models",), ctx, option_value)
    return result, {model: options for model, options in written.items() if options}


def _builtin_option_sets(
    spec: ModelSpec, given: Mapping[str, Any], axes: Mapping[str, list[Any]], path: Path_, ctx: Context
) -> tuple[list[Options], dict[str, Any]]:
    model = spec.name
    names: list[str] = []
    values: list[list[Any]] = []
    written: dict[str, Any] = {}
    for name, raw in given.items():
        option = spec.option(name)
        if option is None:
            known = ", ".join(o.name for o in spec.options if o.name != "preset") or "none"
            takers = [m for m, s in MODELS.items() if s.option(name) is not None and name != "preset"]
            elsewhere = f"{name} is an option of {', '.join(takers)}" if takers else ""
            raise ctx.error(
                f"unknown option {name!r} for {model}; its options: {known}",
                (*path, name),
                hint=did_you_mean(name, [o.name for o in spec.options])
                or elsewhere
                or "`attnbench models` lists every model's options",
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
        checked = [option_value(v, option, model, ctx.item((*path, name), i), ctx) for i, v in enumerate(listed)]
        check_unique(checked, f"{name} value", (*path, name), ctx)
        written[name] = checked if isinstance(raw, list) else checked[0]
        names.append(name)
        values.append(checked)
    sets: list[Options] = []
    unused: dict[str, tuple[str, str]] = {}  # option → why it had no effect and the hint, while it has had none
    used: set[str] = set()
    for combination in itertools.product(*values):
        chosen = dict(zip(names, combination, strict=True))
        _check_lengths(spec, chosen, axes, path, ctx)
        kept = []
        for name, value in chosen.items():
            problem = no_effect(model, name, chosen, spec)
            if problem is None:
                used.add(name)
                if value != _spec(spec, name).default:
                    kept.append((name, value))
            else:
                unused.setdefault(name, (problem.message, problem.hint))
        options = tuple(sorted(kept))
        if options not in sets:
            sets.append(options)
    for name, listed in zip(names, values, strict=True):
        default = _spec(spec, name).default
        if name not in used and any(v != default for v in listed):
            why, hint = unused[name]
            raise ctx.error(
                f"{name} has no effect on {model} here: {why}", (*path, name), hint=hint or f"remove {name}"
            )
    return sets, written


def _spec(spec: ModelSpec, name: str) -> OptionSpec:
    option = spec.option(name)
    assert option is not None  # names were checked against the catalogue before
    return option


def _check_lengths(
    spec: ModelSpec, chosen: Mapping[str, Any], axes: Mapping[str, list[Any]], path: Path_, ctx: Context
) -> None:
    """An option that changes nothing at any of the grid's lengths (a window as long as every sequence): the
    family's rule (``Family.no_effect_up_to``)."""
    longest = max(axes["seq_len"])
    family = family_named(spec.family)
    for name, value in chosen.items():
        problem = family.no_effect_up_to(spec.name, name, value, longest)
        if problem is not None:
            raise ctx.error(problem.message, (*path, name), hint=problem.hint)


def check_buildable(
    cases: Sequence[Case],
    models: Sequence[str],
    written: Mapping[str, Mapping[str, Any]],
    axis_values: Mapping[str, Sequence[Any]],
    axis_paths: Mapping[str, Path_],
    ctx: Context,
) -> None:
    """Every case describes a model its family can build (``catalogue.cannot_build``), else the error at the key the
    family names: the option as written for that model, the value of the grid axis that set it (heads_kv), or the
    model's entry in models."""
    seen: set[tuple[str, tuple[tuple[str, Any], ...], int, int | None, str, int]] = set()
    for case in cases:
        # What a serving question cannot ask of a model is its row's reason (unsupported), not the config's error:
        # the config is judged on the decode step or the plain call the question builds on.
        case = replace(case, mode="decode" if case.mode in SERVING_PARAMS else case.mode, serving=(), packing=())
        # The family's rules depend on the model, its options, the widths, the mode and the length only.
        what = (case.model, case.options, case.d_model, case.heads, case.mode, case.seq_len)
        if what in seen:
            continue
        seen.add(what)
        problem = cannot_build(case)
        if problem is None:
            continue
        given = written.get(case.model, {})
        if problem.option is not None and problem.option in given:
            path: Path_ = ("model_options", case.model, problem.option)
        elif problem.option is not None and problem.option in axis_paths:
            values = list(axis_values[problem.option])
            value = case.given(problem.option)
            path = axis_paths[problem.option]
            path = ctx.item(path, values.index(value)) if value in values else path
        else:
            path = ctx.item(("models",), list(models).index(case.model)) if case.model in models else ("models",)
        raise ctx.error(f"{case.model}: {problem.message}", path, hint=problem.hint)


def option_value(value: Any, option: OptionSpec, model: str, path: Path_, ctx: Context) -> Any:
    """``value`` as ``option`` takes it (type, choices, range), or the error that says what is allowed."""
    kind = option.type
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is bool and isinstance(value, bool):
        return value
    if kind is float and number and math.isfinite(value):
        low, high = option.minimum, option.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            raise ctx.error(
                f"must be a number from {low} to {high}, got {value}", path, hint=f"{option.name}: {option.help}"
            )
        check_option_value(value, option.name, path, ctx)
        return float(value)
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        low, high = option.minimum, option.maximum
        if (low is not None and value < low) or (high is not None and value > high):
            raise ctx.error(
                f"must be an integer from {low} to {high}, got {value}", path, hint=f"{option.name}: {option.help}"
            )
        check_option_value(value, option.name, path, ctx)
        return value
    if kind is str and isinstance(value, str):
        check_option_value(value, option.name, path, ctx)
        refused = option.refusal(value)
        if refused is not None:
            raise ctx.error(f"{refused[0]} ({model})", path, hint=refused[1])
        if option.choices is not None and value not in option.choices:
            raise ctx.error(
                f"{option.name} {value!r} is not one of: {', '.join(option.choices)}",
                path,
                hint=did_you_mean(value, option.choices) or f"{option.name}: {option.help}",
            )
        return value
    word = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}[kind]
    if kind is str and option.choices is not None:
        word = f"one of {', '.join(option.choices)}"
    raise ctx.error(f"must be {word}, got {describe(value)}", path)


def check_presets(
    m: ConfigModel, ctx: Context, serving: Mapping[str, tuple[Serving, ...]] | None = None
) -> tuple[tuple[Axes, ...], dict[str, Any] | None]:
    """One fixed-size grid per preset named under ``presets`` (a published model's: one per mixer below scope model),
    and the section fully resolved. ``serving`` holds the parameter sets of the config's serving questions, which a
    published model's cases cross as the grid's do."""
    p = m.presets
    if p is None:
        return (), None
    check_names(p.names, PRESET_NAMES, "preset", ("presets", "names"), ctx)
    for i, core in enumerate(p.core):
        if core not in PRESET_CORES:
            what = f"{core} cannot build a preset" if core in MODELS else f"unknown model {core!r}"
            raise ctx.error(
                f"{what}; presets.core names the model the presets without a model of their own are built on",
                ctx.item(("presets", "core"), i),
                hint=did_you_mean(core, PRESET_CORES) or f"valid: {', '.join(PRESET_CORES)}",
            )
    check_unique(p.core, "attention model", ("presets", "core"), ctx)
    if _core_chosen(p) and not any(_uses_core(name) for name in p.names):
        raise ctx.error(
            f"presets.core has no effect: every preset listed ({', '.join(p.names)}) is built on its own model",
            ("presets", "core"),
            hint="remove core, or add an attention preset such as bert-base",
        )
    fixed = [name for name in p.names if name in PRESETS]
    if p.scope is not None and p.scope != "model" and fixed:
        raise ctx.error(
            f"{fixed[0]} is a whole model of fixed size: it has no scope {p.scope}",
            ("presets", "scope"),
            hint="give scope: model, or list published models only (`attnbench models` lists them)",
        )
    modes = p.modes or m.modes
    check_names(modes, MODES, "mode", ("presets", "modes"), ctx)
    if STATEFUL_MODES & set(modes):
        for i, name in enumerate(p.names):
            if name in PRESETS and not PRESETS[name].decodes:
                raise ctx.error(
                    f"{name} is an encoder: its attention sees the whole sequence, so it cannot decode one token "
                    "at a time",
                    ctx.item(("presets", "names"), i),
                    hint="give presets.modes without decode (presets inherit the config's modes)",
                )
    batch, seq_lens = inherited_lengths("presets", p.batch, p.seq_len, m.grid, ctx, example_batch=8)
    seq_path: Path_ = ("presets", "seq_len") if p.seq_len is not None else ("grid", "seq_len")
    grids: list[Axes] = []
    for i, name in enumerate(p.names):
        if name in PUBLISHED:
            grids.extend(_published_axes(m, PUBLISHED[name], p, modes, batch, seq_lens, serving or {}, i, ctx))
            continue
        preset = PRESETS[name]
        for j, n in enumerate(seq_lens):
            if preset.max_seq_len is not None and n > preset.max_seq_len:
                raise ctx.error(
                    f"{name} has {preset.max_seq_len} learned positions; seq_len {n} is longer",
                    ctx.item(seq_path, j),
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
    if p.scope is not None:  # only when given, so that configs without it keep the sha256 they always had
        resolved["scope"] = p.scope
    return tuple(grids), resolved


def _core_chosen(p: PresetsModel) -> bool:
    """Whether a presets section chose its core: the default restated is no choice (a resolved config, a stored
    run's, always spells it out, and must read back)."""
    return "core" in p.model_fields_set and list(p.core) != list(PRESET_CORE_DEFAULT)


def _uses_core(name: str) -> bool:
    """Whether preset ``name`` has attention built on presets.core (bert-base; a published model's attention)."""
    if name in PRESETS:
        return PRESETS[name].model is None
    return any(mixer.model is None for mixer in PUBLISHED[name].mixers)


def host_memory_bytes() -> int | None:
    """This machine's physical memory, or None where the platform does not say (stdlib: validation is torch-free
    and imports nothing of the host room)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _published_axes(
    m: ConfigModel,
    preset: Published,
    p: PresetsModel,
    modes: Sequence[str],
    batch: Sequence[int],
    seq_lens: Sequence[int],
    serving: Mapping[str, tuple[Serving, ...]],
    index: int,
    ctx: Context,
) -> list[Axes]:
    """A published model's grids: below scope model one per mixer (one layer of it), at scope model its whole stack
    (a hybrid stack of its mixers where it has several), each refused at validation if its weights alone cannot fit
    this machine's memory."""
    path = ctx.item(("presets", "names"), index)
    problem = published_problem(preset, tuple(p.core))
    if problem is not None:
        raise ctx.error(f"{preset.name} cannot be built: {problem}", path, hint="`attnbench models` lists the models")
    scope = p.scope or "core"
    tag: Options = (("preset", preset.name),)
    grids = []
    if scope != "model":
        for mixer in preset.mixers:
            for model in (mixer.model,) if mixer.model is not None else tuple(p.core):
                options = (*_given(model, mixer.options), *tag, *((("scope", scope),) if scope != "core" else ()))
                grids.append(_axes(m, (model,), modes, batch, seq_lens, preset.d_model, mixer.heads, 1,
                                   tuple(sorted(options)), serving))  # fmt: skip
    elif len(preset.mixers) == 1 and PARALLEL not in preset.pattern[0]:
        mixer = preset.mixers[0]
        for model in (mixer.model,) if mixer.model is not None else tuple(p.core):
            options = (*_given(model, mixer.options), *tag, ("scope", "model"), ("vocab", preset.vocab))
            grids.append(_axes(m, (model,), modes, batch, seq_lens, preset.d_model, mixer.heads, preset.layers,
                               tuple(sorted(options)), serving))  # fmt: skip
    else:  # a stack of its mixers, each a member with its own heads and options, in the published order
        for core in p.core:
            members = [
                {"label": mixer.label, "model": mixer.model or core, "heads": mixer.heads,
                 "options": dict(_given(mixer.model or core, mixer.options))}
                for mixer in preset.mixers
            ]  # fmt: skip
            name = preset.name if len(p.core) == 1 else f"{preset.name}-{core}"
            hybrid = define("hybrid", {"pattern": preset.pattern, "kind": "hybrid", "members": members})
            heads = next((mixer.heads for mixer in preset.mixers if mixer.heads), None)
            options = (("preset", preset.name), ("scope", "model"), ("vocab", preset.vocab))
            axes = _axes(m, (name,), modes, batch, seq_lens, preset.d_model, heads, preset.layers, options, serving)
            grids.append(replace(axes, defined={name: hybrid}))
    _refuse_too_big(m, preset, grids, index, ctx)
    return grids


def _given(model: str, options: Options) -> Options:
    """``options`` without those at ``model``'s default: a case carries only the options it sets (``Case``)."""
    spec = MODELS[model]
    return tuple((name, value) for name, value in options if (o := spec.option(name)) is None or o.default != value)


def _axes(
    m: ConfigModel,
    models: tuple[str, ...],
    modes: Sequence[str],
    batch: Sequence[int],
    seq_lens: Sequence[int],
    d_model: int,
    heads: int | None,
    layers: int,
    options: Options,
    serving: Mapping[str, tuple[Serving, ...]],
) -> Axes:
    return Axes(
        models=models,
        modes=tuple(cast(list[Mode], modes)),
        dtypes=tuple(m.dtype),
        batch=tuple(batch),
        seq_len=tuple(seq_lens),
        d_model=(d_model,),
        heads=(heads or 1,),  # a mixer without heads: expand() records heads=None
        layers=(layers,),
        causal=(True,),  # every published model here is a decoder
        device=m.device,
        model_options={model: (options,) for model in models},
        serving={mode: sets for mode, sets in serving.items() if mode in modes},
    )


def _refuse_too_big(m: ConfigModel, preset: Published, grids: list[Axes], index: int, ctx: Context) -> None:
    """Refuse a preset whose weights alone (parameters × the dtype's bytes) exceed the memory there is: the config's
    memory_budget where given, else this machine's."""
    budget = m.memory_budget if isinstance(m.memory_budget, int) else None
    if isinstance(m.memory_budget, str):
        try:
            budget = parse_bytes(m.memory_budget)
        except ValueError:
            budget = None  # config.serving says what is wrong with it
    available = budget or host_memory_bytes()
    if available is None:
        return
    for axes in grids:
        for model, dtype in itertools.product(axes.models, axes.dtypes):
            defined = axes.defined.get(model)
            case = Case(model, "forward", dtype, axes.device, 1, axes.seq_len[0], axes.d_model[0],
                        axes.heads[0] if defined is not None or has_heads(model) else None, axes.layers[0], True,
                        axes.model_options[model][0], defined)  # fmt: skip
            parameters = family_of(case).parameters(case)
            if parameters is None:
                continue
            weights = parameters * DTYPE_BYTES[dtype]
            if weights > available:
                where = "memory_budget" if budget else "this machine's memory"
                raise ctx.error(
                    f"{preset.name} at scope {dict(case.options).get('scope', 'core')} holds {parameters:,} "
                    f"parameters, {format_bytes(weights)} in {dtype}: more than {where} ({format_bytes(available)})",
                    ctx.item(("presets", "names"), index),
                    hint="give presets.scope: core (one layer of each mixer), a 16-bit dtype, or a larger machine",
                )
