"""The ``model_options:`` and ``presets:`` sections, checked against the catalogue.

Between ``experiment`` (the schema, ``_build`` and the checks on the grid and timing) and
``config.messages``: stdlib, the torch-free core and the catalogue only. ``check_model_options`` gives the
option sets per model that ``Axes.model_options`` crosses; ``check_presets`` gives one fixed-size grid per
preset. Both also return the section as written, resolved, for the experiment's sha256. ``check_names`` and
``check_unique`` sit here because these checks need them and ``experiment`` imports this module, not the other
way round; ``experiment`` uses them for the rest of the config.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from attnbench.config.messages import Context, Path_, describe, did_you_mean
from attnbench.core.cases import Axes, Mode, Options
from attnbench.core.catalogue import (
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
from attnbench.core.flops import match_error

if TYPE_CHECKING:  # only for the hints: the schema lives in config, which imports this module
    from attnbench.config.experiment import ConfigModel, GridModel

__all__ = ["check_model_options", "check_names", "check_presets", "check_unique", "inherited_lengths", "preset_names"]


def preset_names(value: Any) -> Any:
    """``presets: [bert-base, lstm-110m]`` (or one name) means ``presets: {names: [...]}``."""
    return {"names": value} if isinstance(value, list | str) else value


def check_names(values: list[str], allowed: Sequence[str], what: str, path: Path_, ctx: Context) -> None:
    """Every name in ``values`` is one of ``allowed``, and none is listed twice."""
    for i, value in enumerate(values):
        if value not in allowed:
            raise ctx.error(
                f"unknown {what} {value!r}; valid: {', '.join(allowed)}",
                ctx.item(path, i),
                hint=did_you_mean(value, allowed),
            )
    check_unique(values, what, path, ctx)


def check_unique(values: Sequence[Any], what: str, path: Path_ | None, ctx: Context) -> None:
    """No value is listed twice (``1`` and ``true`` differ); ``path=None`` (an axis left at its default) passes."""
    seen: set[Any] = set()
    for i, value in enumerate(values):
        if (type(value), value) in seen and path is not None:
            shown = repr(value) if isinstance(value, str) else json.dumps(value)
            raise ctx.error(f"{what} {shown} is listed twice", ctx.item(path, i))
        seen.add((type(value), value))


def check_model_options(
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
            checked = [_option_value(v, option, model, ctx.item((*path, name), i), ctx) for i, v in enumerate(listed)]
            check_unique(checked, f"{name} value", (*path, name), ctx)
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
    if MODELS[model].option("bidirectional") is not None or MODELS[model].option("match") is not None:
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
    if value("heads_kv"):
        kv = value("heads_kv")
        for h in axes["heads"]:
            if kv > h or h % kv:
                raise ctx.error(
                    f"heads_kv {kv} does not divide heads {h}: each key/value head serves heads / heads_kv query "
                    "heads, which must be whole",
                    (*path, "heads_kv"),
                    hint=f"heads_kv values that divide {h}: {', '.join(str(k) for k in range(1, h + 1) if h % k == 0)}",
                )
    if MODELS[model].option("window") is not None and value("window"):
        window, longest = value("window"), max(axes["seq_len"])
        if window >= longest:
            raise ctx.error(
                f"window {window} covers every seq_len (the longest is {longest}), so it changes nothing",
                (*path, "window"),
                hint=f"give a window below {longest}, or remove window (0 = the whole sequence)",
            )
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
            raise ctx.error(
                f"must be an integer from {low} to {high}, got {value}", path, hint=f"{option.name}: {option.help}"
            )
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
                hint=did_you_mean(value, option.choices) or f"{option.name}: {option.help}",
            )
        return value
    word = {bool: "true or false", int: "an integer", float: "a finite number", str: "a string"}[kind]
    if kind is str and option.choices is not None:
        word = f"one of {', '.join(option.choices)}"
    raise ctx.error(f"must be {word}, got {describe(value)}", path)


def check_presets(m: ConfigModel, ctx: Context) -> tuple[tuple[Axes, ...], dict[str, Any] | None]:
    """One fixed-size grid per preset named under ``presets``, and the section fully resolved."""
    p = m.presets
    if p is None:
        return (), None
    check_names(p.names, PRESET_NAMES, "preset", ("presets", "names"), ctx)
    attention = [name for name in MODEL_NAMES if not is_recurrent(name)]
    for i, core in enumerate(p.core):
        if core not in attention:
            what = f"{core} is recurrent" if core in MODELS else f"unknown attention model {core!r}"
            raise ctx.error(
                f"{what}; presets.core names the attention model attention presets are built on",
                ctx.item(("presets", "core"), i),
                hint=did_you_mean(core, attention) or f"valid: {', '.join(attention)}",
            )
    check_unique(p.core, "attention model", ("presets", "core"), ctx)
    if "core" in p.model_fields_set and all(PRESETS[name].model is not None for name in p.names):
        raise ctx.error(
            f"presets.core has no effect: every preset listed ({', '.join(p.names)}) is built on its own model",
            ("presets", "core"),
            hint="remove core, or add an attention preset such as bert-base",
        )
    modes = p.modes or m.modes
    check_names(modes, MODES, "mode", ("presets", "modes"), ctx)
    if "decode" in modes:
        for i, name in enumerate(p.names):
            if PRESETS[name].family == "attention":
                raise ctx.error(
                    f"{name} is an encoder: its attention sees the whole sequence, so it cannot decode one token "
                    "at a time",
                    ctx.item(("presets", "names"), i),
                    hint="give presets.modes without decode (presets inherit the config's modes)",
                )
    batch, seq_lens = inherited_lengths("presets", p.batch, p.seq_len, m.grid, ctx, example_batch=8)
    seq_path: Path_ = ("presets", "seq_len") if p.seq_len is not None else ("grid", "seq_len")
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


def inherited_lengths(
    section: str,
    batch: list[int] | None,
    seq_len: list[int] | None,
    grid: GridModel,
    ctx: Context,
    *,
    example_batch: int,
) -> tuple[list[int], list[int]]:
    """A section's batch sizes and lengths (presets, decode), each the grid's where the section leaves it out;
    checked for repeats at whichever key they came from."""
    batches = batch or grid.batch
    if batches is None:
        raise ctx.error(
            f"{section} need{'s' * (section == 'decode')} batch sizes: the grid has tokens, not batch, to inherit",
            (section,),
            hint=f"add {section}.batch, e.g. batch: [{example_batch}]",
        )
    lengths = seq_len or grid.seq_len
    check_unique(batches, "batch", (section, "batch") if batch is not None else ("grid", "batch"), ctx)
    check_unique(lengths, "seq_len", (section, "seq_len") if seq_len is not None else ("grid", "seq_len"), ctx)
    return batches, lengths
