"""A config's axes (``Axes``) and their expansion into cases (``expand``): every combination is a case, after the
model's family has said what a combination means (whether it is causal, which options it carries).

The grid knows no model: each question about one goes to the model's family through the catalogue (``causal``: a
recurrence is causal by construction, attention follows the grid; ``canonical``: an option value that is the
default in effect, such as heads_kv = heads, is left out of the key; ``decode_inert``: options a decode step does
not depend on). A grid axis named after an option (``option_axes``: heads_kv) sets that option for every model that
has it and leaves it unset.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from attnbench.core.cases import (
    PACKING_MODES,
    STATEFUL_MODES,
    Case,
    Definition,
    Mode,
    Options,
    OptionValue,
    Serving,
)
from attnbench.families.catalogue import MODELS, ModelSpec, decode_inert, family_named, family_of, has_heads

__all__ = ["Axes", "expand"]


@dataclass(frozen=True)
class Axes:
    """The value lists one experiment crosses. Every combination is a case (after de-duplication)."""

    models: tuple[str, ...]
    modes: tuple[Mode, ...]
    dtypes: tuple[str, ...]
    batch: tuple[int, ...]
    seq_len: tuple[int, ...]
    d_model: tuple[int, ...]
    heads: tuple[int, ...]
    layers: tuple[int, ...]
    causal: tuple[bool, ...]
    device: str
    # Per model, the option sets to cross it with (a config may list several values for an option); a model
    # left out runs once, with every option at its default.
    model_options: Mapping[str, tuple[Options, ...]] = field(default_factory=dict)
    # Grid axes named after an option (catalogue.option_axes: heads_kv), crossed into every model that has the
    # option where its own options leave it at the default; an option's default value sets nothing.
    option_axes: Mapping[str, tuple[OptionValue, ...]] = field(default_factory=dict)
    # The models of ``models`` their cases define, by name (``Case.definition``): those the user brings (config
    # ``factory:`` entries and installed plugins) and hybrid stacks (config ``{name, hybrid: […]}`` entries).
    defined: Mapping[str, Definition] = field(default_factory=dict)
    # Per serving mode (capacity, prefill, verify, prefix), the parameter sets its cases cross (``Case.serving``).
    serving: Mapping[str, tuple[Serving, ...]] = field(default_factory=dict)
    # Packed lengths (``Case.packing``): they stand in for batch × seq_len in the forward and train cases.
    packing: tuple[int, ...] = ()
    # kv_dtype and state_dtype as a config lists them (``Case.kept``): crossed into each stateful case they apply to.
    kept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def expand(axes: Axes) -> list[Case]:
    """Cross every axis into cases, in a stable order, dropping combinations that do not apply.

    The order is model-major (then the model's option sets) with seq_len innermost, so a sweep walks each
    model's length curve in turn and a progress line reads naturally. Decode cases are causal only (a non-causal
    combination does not apply: config validation refuses a model left with none) and carry no option that is
    decode-inert for their family. A user model always carries ``heads``. The serving modes are causal only too,
    and cross their parameter sets (``Axes.serving``) as an axis just outside seq_len; a capacity case's batch is
    found, so it is 1 whatever the grid's. Packed lengths (``Axes.packing``) replace batch and seq_len in the forward
    and train cases (batch: how many, seq_len: the longest), so those de-duplicate to one case per model.
    """
    seen: set[Case] = set()
    cases: list[Case] = []
    variants = [(model, options) for model in axes.models for options in axes.model_options.get(model, ((),))]
    axis_names = tuple(axes.option_axes)
    serving_sets: list[Serving] = list(dict.fromkeys([(), *(s for sets in axes.serving.values() for s in sets)]))
    for (
        (model, options),
        axis_values,
        mode,
        dtype,
        batch,
        d_model,
        heads,
        layers,
        causal,
        (serving, seq_len),
    ) in itertools.product(
        variants,
        itertools.product(*axes.option_axes.values()),
        axes.modes,
        axes.dtypes,
        axes.batch,
        axes.d_model,
        axes.heads,
        axes.layers,
        axes.causal,
        itertools.product(serving_sets, axes.seq_len),  # seq_len innermost, each serving set's lengths in turn
    ):
        if serving not in axes.serving.get(mode, ((),)):
            continue
        if mode in ("decode", "capacity"):  # one decode step: what only the whole sequence uses is inert
            options = tuple(o for o in options if o[0] not in decode_inert(model))
        definition = axes.defined.get(model)
        if definition is not None:  # a model the config defines: the case itself says what it is
            probe = Case(model, mode, dtype, axes.device, batch, seq_len, d_model, heads, layers, causal, options)
            probe = replace(probe, definition=definition)
            family = family_of(probe)
            spec = family.spec(probe)
            # A user model always carries heads; a stack has them where a member has.
            case = replace(
                probe, heads=heads if spec.heads else None, causal=family.causal(spec, dict(options), causal)
            )
        else:
            spec = MODELS[model]
            family = family_named(spec.family)
            options = family.canonical(spec, _with_axes(spec, options, axis_names, axis_values), heads)
            causal = family.causal(spec, dict(options), causal)
            case_heads = heads if has_heads(model) else None
            case = Case(model, mode, dtype, axes.device, batch, seq_len, d_model, case_heads, layers, causal, options)
        if mode in STATEFUL_MODES and not case.causal:
            continue
        if serving:  # a capacity case's batch is the one it finds; a prefix case's requests are its sequences
            case = replace(case, serving=serving, batch=1 if mode in ("capacity", "prefix") else case.batch)
        if mode == "prefix":
            case = _checkpoints(case)
        if mode in PACKING_MODES and axes.packing:
            case = replace(case, batch=len(axes.packing), seq_len=max(axes.packing), packing=axes.packing)
        for variant in _kept(case, axes.kept) if mode in STATEFUL_MODES else (case,):
            if variant not in seen:
                seen.add(variant)
                cases.append(variant)
    return cases


def _checkpoints(case: Case) -> Case:
    """A prefix case without ``checkpoint_every`` where checkpoints change nothing for its model (no recurrent state
    to checkpoint: attention shares its cache however often a recurrent one would be), so it is one case, not one
    per value."""
    serving = dict(case.serving)
    if not serving.get("checkpoint_every"):
        return case
    family = family_of(case)
    never = replace(case, serving=tuple(sorted({**serving, "checkpoint_every": 0}.items())))
    return never if family.prefix_step(never) == family.prefix_step(replace(never, serving=case.serving)) else case


def _kept(case: Case, given: Mapping[str, tuple[str, ...]]) -> list[Case]:
    """``case`` once per combination of the kept dtypes that apply to its model (``catalogue.kept_keys``); a value
    that is the model's default keeps nothing (the case as it is, so the key stays the one it always was)."""
    family = family_of(case)
    keys = [key for key in given if key in family.kept_keys(case)]
    # Left out, a KV cache is kept in the case's dtype, a recurrent state in its family's (float32 for some 16-bit);
    # where no one value is the default (a stack's members each keep their own), every value it is given is kept.
    default = {key: family.kept_default(case, key) for key in keys}
    variants = []
    paged = any(value != "0" for value in given.get("page_tokens", ()))
    for values in itertools.product(*(given[key] for key in keys)):
        kept = tuple(sorted((key, value) for key, value in zip(keys, values, strict=True) if value != default[key]))
        if ("hybrid_pages", "aligned") in kept and not dict(kept).get("page_tokens") and paged:
            continue  # aligned pages are pages: crossed with the page sizes given, not with contiguous too
        variants.append(replace(case, kept=kept))
    return variants


def _with_axes(spec: ModelSpec, options: Options, names: tuple[str, ...], values: tuple[OptionValue, ...]) -> Options:
    """``options`` with each option axis's value where the model has that option and its own options leave it at
    the default (an axis value equal to the option's default sets nothing)."""
    chosen = dict(options)
    for name, value in zip(names, values, strict=True):
        option = spec.option(name)
        if option is not None and name not in chosen and value != option.default:
            chosen[name] = value
    return tuple(sorted(chosen.items()))
