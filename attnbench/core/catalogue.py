"""Every model attnbench knows, as plain data: a loop over the families of ``attnbench.core.families``.

Torch-free on purpose: ``validate``, ``report`` and ``compare`` must know every model and option without importing
torch. Each family module that defines ``FAMILY`` is found here (``FAMILIES``); nothing in this module names a
model. ``attnbench.measure.models`` holds each family's torch half, under the same module name; a test holds the
two in step. A user model (``factory:`` in a config, or an installed plugin) is known by its case alone
(``Case.user``), so stored rows of one read back without the user's code.
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING

from attnbench.core import families
from attnbench.core.families.base import (
    KINDS,
    ExtraSpec,
    Family,
    Kind,
    ModelSpec,
    OptionSpec,
    OptionValue,
    Preset,
    Problem,
)
from attnbench.core.families.shared import BERT_VOCAB, COMPILE_MODES, MATCH_TOLERANCE, POSITIONAL, SCOPES
from attnbench.core.families.user import USER, UserModel

if TYPE_CHECKING:
    from attnbench.core.cases import Case

__all__ = [
    "BERT_VOCAB",
    "COMPILE_MODES",
    "DEVICE_REQUEST",
    "DTYPES",
    "FAMILIES",
    "KINDS",
    "MATCH_TOLERANCE",
    "MODELS",
    "MODEL_NAMES",
    "MODES",
    "POSITIONAL",
    "PRESETS",
    "PRESET_NAMES",
    "RESOLVED_DEVICE",
    "SCOPES",
    "ExtraSpec",
    "Family",
    "Kind",
    "ModelSpec",
    "OptionSpec",
    "Preset",
    "Problem",
    "UserModel",
    "cannot_build",
    "decode_inert",
    "decode_problem",
    "family_of",
    "has_heads",
    "is_recurrent",
    "no_effect",
    "option_summary",
    "spec_of",
]


def _discover() -> tuple[Family, ...]:
    """Every module of ``attnbench.core.families`` that defines ``FAMILY``, in their declared order."""
    found = []
    for info in pkgutil.iter_modules(families.__path__):
        module = importlib.import_module(f"{families.__name__}.{info.name}")
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
PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)
# What a config or --device may ask for, and what a resolved case records.
DEVICE_REQUEST = re.compile(r"auto|cpu|cuda|cuda:\d+")
RESOLVED_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")
# backward = the backward pass alone (graph kept, grads cleared), so train can be checked against forward + backward.
# decode = one new token per sequence with a context of seq_len tokens already in the KV cache or recurrent state.
MODES: tuple[str, ...] = ("forward", "train", "backward", "decode")


def family_of(case: Case) -> Family:
    """The family that builds ``case``'s model: a built-in one, or the user family for a user model."""
    if case.user is not None:
        return USER
    return _BY_NAME[MODELS[case.model].family]


def spec_of(case: Case) -> ModelSpec:
    """``case``'s model spec, a user model's read off the case itself."""
    return USER.spec(case) if case.user is not None else MODELS[case.model]


def is_recurrent(case: Case) -> bool:
    """Whether ``case`` joins the recurrent side (its model's kind; a user model's entry says)."""
    return case.kind == "recurrent"


def has_heads(model: str) -> bool:
    """Whether a built-in ``model``'s cases carry ``heads`` (attention and linear attention)."""
    return MODELS[model].heads


def decode_inert(model: str) -> frozenset[str]:
    """Options of a built-in ``model`` that a decode case leaves out (they change only the whole-sequence form)."""
    spec = MODELS.get(model)
    return _BY_NAME[spec.family].decode_inert if spec is not None else frozenset()


def decode_problem(model: str, kind: Kind, causal: bool) -> str | None:
    """Why a ``model`` case of this ``kind`` and ``causal`` cannot decode, or None. A new token may see only the
    tokens before it: attention must be causal, a recurrence unidirectional (``causal`` is False when
    bidirectional)."""
    if causal:
        return None
    if kind == "recurrent":
        return (
            f"a bidirectional {model} reads the sequence backwards too, so it cannot produce one token at a time "
            "(decode needs bidirectional: false)"
        )
    return (
        f"{model} with causal=false lets every position see the whole sequence, so it cannot produce one token "
        "at a time (decode needs causal attention)"
    )


def no_effect(model: str, name: str, options: Mapping[str, OptionValue]) -> Problem | None:
    """Why option ``name`` of built-in ``model`` changes nothing given its other ``options``, or None (the
    family's rule). Config validation drops such an option from a case, and refuses one that has no effect
    anywhere it is given."""
    spec = MODELS[model]

    def value(key: str) -> OptionValue:
        option = spec.option(key)
        return options.get(key, option.default if option is not None else "")

    return _BY_NAME[spec.family].no_effect(model, name, value)


def cannot_build(case: Case) -> Problem | None:
    """Why ``case`` describes no model that can be built, or None: what every family shares (a decode case must be
    causal; an option's value must be one it takes), then the family's own rule. Config validation refuses such a
    case at the key the problem names; a case made by hand becomes an ``unsupported`` row."""
    if case.mode == "decode":
        problem = decode_problem(case.model, case.kind, case.causal)
        if problem is not None:
            return Problem(problem, "bidirectional" if case.kind == "recurrent" else None)
    spec = spec_of(case)
    for name, value in case.options:
        option = spec.option(name)
        if option is None:
            return Problem(f"{case.model} has no option {name!r}", name, "`attnbench models` lists every option")
        refused = option.refusal(value)
        if refused is not None:
            return Problem(refused[0], name, refused[1])
    return family_of(case).cannot_build(case)


def option_summary(spec: ModelSpec) -> str:
    """``spec``'s options as one line: ``name=default`` and what else it takes (``attnbench models``)."""
    parts = []
    for option in spec.options:
        if option.name == "preset":
            continue  # set by the config's presets key, never by hand
        default = str(option.default).lower() if isinstance(option.default, bool) else str(option.default)
        parts.append(f"{option.name}={default} ({option.allowed()})")
    return ", ".join(parts)
