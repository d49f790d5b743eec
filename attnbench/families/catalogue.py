"""Every model attnbench knows, as plain data: a loop over the families of ``attnbench.families``.

Torch-free on purpose: ``validate``, ``report`` and ``compare`` must know every model and option without importing
torch. Each folder of ``attnbench.families`` whose ``spec`` module defines ``FAMILY`` is found here (``FAMILIES``);
nothing in this module names a model. The folder's ``layers`` module is the family's torch half, which
``families.registry`` finds the same way. A user model (``factory:`` in a config, or an installed plugin) is known
by its case alone (``Case.definition``), so stored rows of one read back without the user's code; so is a hybrid
stack. Such a family says which definitions are its (``Family.defines``), and only it reads them.

Everything outside the families asks through here what only a family knows: a case's side (``kind_of``), an
option's value or default (``option_of``), whether it can decode or be built, the peak its matmuls run at, its
role in the article's claims, the columns it fills.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

from attnbench import families
from attnbench.core.cases import SERVING_PARAMS, STATEFUL_MODES, Case, Definition, OptionValue, Side
from attnbench.families.base import (
    ClaimRole,
    ExtraSpec,
    ExtraValue,
    Family,
    ModelSpec,
    OptionSpec,
    Package,
    Preset,
    Problem,
)
from attnbench.families.hybrid.spec import HybridFamily
from attnbench.families.published import PUBLISHED, Published
from attnbench.families.user.spec import USER

__all__ = [
    "FAMILIES",
    "HYBRID",
    "MODELS",
    "MODEL_NAMES",
    "PRESETS",
    "PRESET_CORES",
    "PRESET_CORE_DEFAULT",
    "PRESET_NAMES",
    "PUBLISHED",
    "SIDE_ORDER",
    "USER",
    "ModelSpec",
    "OptionSpec",
    "Preset",
    "Problem",
    "Published",
    "cannot_build",
    "case_column_specs",
    "case_column_values",
    "causal_from_grid",
    "claim_role",
    "config_entry",
    "decode_inert",
    "define",
    "defined_spec",
    "family_named",
    "family_of",
    "has_heads",
    "has_option",
    "is_recurrent",
    "kind_of",
    "known",
    "no_effect",
    "option_axes",
    "option_of",
    "option_summary",
    "packages",
    "peak_dtype",
    "published_layer",
    "published_problem",
    "source_of",
    "spec_of",
    "state_noun",
]


def _discover() -> tuple[Family, ...]:
    """Every folder of ``attnbench.families`` whose ``spec`` module defines ``FAMILY``, in their declared order."""
    found = []
    for info in pkgutil.iter_modules(families.__path__):
        if not info.ispkg:
            continue
        try:
            module = importlib.import_module(f"{families.__name__}.{info.name}.spec")
        except ModuleNotFoundError as exc:
            if exc.name == f"{families.__name__}.{info.name}.spec":
                continue  # a folder that is not a family
            raise
        family = getattr(module, "FAMILY", None)
        if isinstance(family, Family):
            found.append(family)
    return tuple(sorted(found, key=lambda f: (f.order, f.name)))


FAMILIES: tuple[Family, ...] = _discover()
_BY_NAME: dict[str, Family] = {family.name: family for family in FAMILIES}
MODELS: dict[str, ModelSpec] = {spec.name: spec for family in FAMILIES for spec in family.models}
MODEL_NAMES: tuple[str, ...] = tuple(MODELS)
# The attention presets first: each recurrent one stands in for an attention model of its size.
PRESETS: dict[str, Preset] = {
    preset.name: preset
    for preset in sorted((p for family in FAMILIES for p in family.presets), key=lambda p: p.kind != "attention")
}
# The published models' token mixers at their real dimensions (``families.published``) after the families' own.
PRESET_NAMES: tuple[str, ...] = (*PRESETS, *PUBLISHED)
# Known by its case, as the user family is: a hybrid stack's members are built-in models, looked up here.
HYBRID = HybridFamily(lambda case: family_of(case), MODELS)
# The models a preset without a model of its own (``Preset.model`` None: bert-base) may be built on: those of the
# family that declares it (a config's presets.core picks among them).
PRESET_CORES: tuple[str, ...] = tuple(
    spec.name for family in FAMILIES if any(p.model is None for p in family.presets) for spec in family.models
)
PRESET_CORE_DEFAULT: tuple[str, ...] = tuple(f.preset_core for f in FAMILIES if f.preset_core is not None)[:1]


# The families whose models their cases define, by the key of the definitions they read.
_DEFINING: dict[str, Family] = {family.defines: family for family in (USER, HYBRID) if family.defines is not None}


def known(case: Case) -> bool:
    """Whether this catalogue knows ``case``'s model (a user model and a hybrid stack always; a built-in one a newer
    release wrote may not be)."""
    if case.definition is not None:
        return case.definition.key in _DEFINING
    return case.model in MODELS


def family_of(case: Case) -> Family:
    """The family that builds ``case``'s model: a built-in one, or the family whose definition the case carries
    (the user family for a user model, the hybrid family for a hybrid stack)."""
    if case.definition is not None:
        return _DEFINING[case.definition.key]
    return _BY_NAME[MODELS[case.model].family]


def define(key: str, data: Mapping[str, Any]) -> Definition:
    """The definition of a model a config or a stored run gives under ``key`` (``user``, ``hybrid``), written down
    by the family it belongs to; ValueError where no family defines models under ``key`` or ``data`` is not one."""
    family = _DEFINING.get(key)
    if family is None:
        raise ValueError(f"no family defines models under {key!r}")
    return family.define(data)


def defined_spec(name: str, definition: Definition) -> ModelSpec:
    """The spec of model ``name`` as ``definition`` defines it (its side, whether it has heads)."""
    case = Case(name, "forward", "float32", "cpu", 1, 1, 1, 1, 1, True, definition=definition)
    return family_of(case).spec(case)


def source_of(case: Case) -> str:
    """Where ``case``'s model comes from (``Family.source``): built-in, ``config``, ``plugin <distribution>``."""
    return family_of(case).source(case) if known(case) else "built-in"


def config_entry(case: Case) -> dict[str, object] | None:
    """The ``models`` entry a config writes for ``case``'s model where its name alone does not say it, or None."""
    return family_of(case).config_entry(case) if known(case) else None


def family_named(name: str) -> Family:
    """The family called ``name`` (a ``ModelSpec.family``): a built-in one, or the user or hybrid family."""
    return {USER.name: USER, HYBRID.name: HYBRID}.get(name) or _BY_NAME[name]


def spec_of(case: Case) -> ModelSpec:
    """``case``'s model spec, a user model's read off the case itself."""
    return family_of(case).spec(case)


def kind_of(case: Case) -> Side:
    """Which side of the comparison ``case``'s model joins: recurrent, attention (a user model's entry says), or a
    hybrid stack's own (its entry's ``kind``, hybrid unless it names a side)."""
    if case.definition is not None:
        return spec_of(case).kind
    return MODELS[case.model].kind


# The sides as they stand between attention and a recurrence: which curve of a crossover comes first.
SIDE_ORDER: tuple[Side, ...] = ("attention", "hybrid", "recurrent")


def is_recurrent(case: Case) -> bool:
    """Whether ``case`` joins the recurrent side of the comparison (a report's baseline, a crossover's pairs): its
    model's kind, or a user model's entry. A question about the side, never about what the model does."""
    return known(case) and kind_of(case) == "recurrent"


def causal_from_grid(case: Case) -> bool:
    """Whether ``case``'s ``causal`` is the grid's choice (attention's mask) rather than the architecture's (a
    recurrence is causal by construction, unless its family makes it bidirectional): a label names it, a command
    that narrows a config to the case sets it."""
    if not known(case):
        return True
    family, spec = family_of(case), spec_of(case)
    options = dict(case.options)
    return family.causal(spec, options, True) != family.causal(spec, options, False)


def state_noun(case: Case) -> str:
    """What ``case``'s decode state is called: "KV cache", "recurrent state", …"""
    return family_of(case).state_noun if known(case) else "state"


def option_of(case: Case, name: str) -> OptionValue:
    """``case``'s value for a model option, else the option's default; KeyError where the model has no such
    option."""
    return family_of(case).option(case, name)


def has_option(case: Case, name: str) -> bool:
    """Whether ``case``'s model has option ``name`` at all (set in the case or left at its default)."""
    return known(case) and family_of(case).has_option(case, name)


def has_heads(model: str) -> bool:
    """Whether a built-in ``model``'s cases carry ``heads`` (attention and linear attention)."""
    return MODELS[model].heads


def decode_inert(model: str) -> frozenset[str]:
    """Options of a built-in ``model`` that a decode case leaves out (they change only the whole-sequence form)."""
    spec = MODELS.get(model)
    return _BY_NAME[spec.family].decode_inert if spec is not None else frozenset()


def option_axes() -> dict[str, OptionSpec]:
    """The options a grid axis of the same name sets for every model that has them (``OptionSpec.axis``)."""
    return {o.name: o for spec in MODELS.values() for o in spec.options if o.axis}


def no_effect(
    model: str, name: str, options: Mapping[str, OptionValue], spec: ModelSpec | None = None
) -> Problem | None:
    """Why option ``name`` of ``model`` (a built-in's, or the given ``spec``'s: a hybrid stack's) changes nothing
    given its other ``options``, or None (the family's rule). Config validation drops such an option from a case,
    and refuses one that has no effect anywhere it is given."""
    spec = spec if spec is not None else MODELS[model]

    def value(key: str) -> OptionValue:
        option = spec.option(key)
        return options.get(key, option.default if option is not None else "")

    return family_named(spec.family).no_effect(model, name, value)


def cannot_build(case: Case) -> Problem | None:
    """Why ``case`` describes no model that can be built, or None: what every family shares (a decode case must be
    able to produce one token at a time; an option's value must be one it takes), then the family's own rule, then
    (for a serving mode or packed lengths) the family's ``serving_problem``. Config validation refuses such a case at
    the key the problem names (a serving problem it leaves to the row); a case made by hand becomes an
    ``unsupported`` row."""
    family = family_of(case)
    if case.mode in STATEFUL_MODES:  # a capacity search, a prefill and a verify carry a decoder's state too
        problem = family.decode_problem(case)
        if problem is not None:
            return problem
    spec = family.spec(case)
    for name, value in case.options:
        option = spec.option(name)
        if option is None:
            return Problem(f"{case.model} has no option {name!r}", name, "`attnbench models` lists every option")
        refused = option.refusal(value)
        if refused is not None:
            return Problem(refused[0], name, refused[1])
    problem = family.cannot_build(case)
    if problem is None and (case.mode in SERVING_PARAMS or case.packing):
        problem = family.serving_problem(case)
    return problem


def packages() -> tuple[Package, ...]:
    """Every package a family's kernels may run on, once each, in family order."""
    found: dict[str, Package] = {}
    for family in FAMILIES:
        for package in family.packages:
            found.setdefault(package.distribution, package)
    return tuple(found.values())


def peak_dtype(case: Case) -> str:
    """Which peak ``case``'s matmuls are held against (the family says; ``tf32`` for cuDNN's float32 RNNs)."""
    return family_of(case).peak_dtype(case) if known(case) else case.dtype


def claim_role(case: Case) -> ClaimRole | None:
    """Where ``case`` stands in the article's claims (the family says), or None: not a model those claims are
    about, or one this catalogue does not know (a user model stands on the side its entry names)."""
    return family_of(case).claim_role(case) if known(case) else None


def case_column_specs() -> tuple[ExtraSpec, ...]:
    """The case columns every family declares, once each, in family order."""
    found: dict[str, ExtraSpec] = {}
    for family in FAMILIES:
        for spec in family.case_columns:
            found.setdefault(spec.name, spec)
    return tuple(found.values())


def case_column_values(case: Case) -> Mapping[str, ExtraValue]:
    """The values of the family's case columns for ``case`` (none for a model this catalogue does not know)."""
    return family_of(case).case_column_values(case) if known(case) else {}


def option_summary(spec: ModelSpec) -> str:
    """``spec``'s options as one line: ``name=default`` and what else it takes (``attnbench models``)."""
    parts = []
    for option in spec.options:
        if option.name == "preset":
            continue  # set by the config's presets key, never by hand
        default = str(option.default).lower() if isinstance(option.default, bool) else str(option.default)
        parts.append(f"{option.name}={default} ({option.allowed()})")
    return ", ".join(parts)


def published_problem(preset: Published, cores: tuple[str, ...]) -> str | None:
    """Why ``preset`` cannot be built by this release (a mixer's model, or one of its options, is not in the
    catalogue: ``kda``, ``mla`` and ``sinks`` come with their families), or None. ``cores`` are the attention models
    a mixer without a model of its own is built on."""
    for mixer in preset.mixers:
        for model in (mixer.model,) if mixer.model is not None else cores:
            spec = MODELS.get(model)
            if spec is None:
                return f"its {mixer.label} layers need model {model}, which this release does not have"
            missing = [name for name, _ in mixer.options if spec.option(name) is None]
            if missing:
                return f"its {mixer.label} layers need {model}'s option {', '.join(missing)}, which it does not have"
    return None


def published_layer(preset: Published, label: str, core: str) -> Case:
    """One layer of ``preset``'s mixer ``label`` at scope core (an attention mixer on ``core``), as the presets
    section cases it: what ``attnbench models`` counts a layer's parameters on."""
    mixer = preset.mixer(label)
    model = mixer.model if mixer.model is not None else core
    heads = mixer.heads if MODELS[model].heads else None
    options = tuple(sorted((*mixer.options, ("preset", preset.name))))
    return Case(model, "forward", "float32", "cpu", 1, 1, preset.d_model, heads, 1, True, options)
