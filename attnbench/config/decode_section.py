"""Decode cases in a config: ``decode`` listed under ``modes`` (crossing the grid), or a ``decode:`` section of
their own (its own context lengths, batches and models, always causal). Both are checked here.

A decode case produces one new token after a context of n tokens, which only a model that looks backwards can do:
attention must be causal and a recurrence unidirectional. ``config.grid.expand`` leaves the combinations that
cannot decode out (``causal: [false, true]`` decodes the causal ones); a model left with none is refused here, with
the key that made it so. That learned positions cover the new token's position n is the family's rule
(``catalogue.cannot_build``), checked on every case by ``config.options.check_buildable``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attnbench.config.checks import check_unique, inherited_lengths
from attnbench.config.grid import Axes
from attnbench.config.messages import Context, Path_
from attnbench.config.model import ConfigModel
from attnbench.core.cases import Case, Definition, Options
from attnbench.families.catalogue import family_of

# The models a config defines, by name (a user's model, a hybrid stack): what their cases carry.
Defined = Mapping[str, Definition]

__all__ = ["Defined", "check_decode", "decode_section"]

_CAUSAL_HINT = (
    "set causal: true (or [false, true]: forward runs both, decode the causal ones), or move decode into a "
    "decode: section, whose cases are causal"
)


def _decodes(model: str, options: Options, causal: Sequence[bool], defined: Defined) -> bool:
    """Whether ``model`` with ``options`` is causal for some value of the grid's ``causal`` (its family says)."""
    probe = _probe(model, options, True, defined)
    family = family_of(probe)
    spec = family.spec(probe)
    return any(family.causal(spec, dict(options), requested) for requested in causal)


def _probe(model: str, options: Options, causal: bool, defined: Defined) -> Case:
    """A decode case of ``model`` as the family judges one (only its model, options and causality matter)."""
    return Case(model, "decode", "float32", "cpu", 1, 1, 1, 1, 1, causal, options, defined.get(model))


def check_decode(
    models: Sequence[str],
    causal: Sequence[bool],
    causal_path: Path_,
    options: Mapping[str, tuple[Options, ...]],
    defined: Defined,
    ctx: Context,
) -> None:
    """Every model asked to decode has a variant that can. ``causal_path`` is where causal was written, or
    ``("modes",)`` where it was left at its default. The family says which option (a recurrence's direction) or
    grid key (attention's causal) stands in the way. ``defined``: the models the config defines (a user's, a
    hybrid stack), by name."""
    for model in models:
        sets = options.get(model, ((),))
        if any(_decodes(model, s, causal, defined) for s in sets):
            continue
        probe = _probe(model, sets[0], False, defined)
        problem = family_of(probe).decode_problem(probe)
        if problem is not None and problem.option is not None:
            raise ctx.error(problem.message, ("model_options", model, problem.option), hint=problem.hint)
        given = "causal is false" + (" (its default)" if causal_path == ("modes",) else "")
        raise ctx.error(
            f"{model} cannot decode: {given}, which lets every position see the whole sequence; a new token "
            "may see only the tokens before it",
            causal_path,
            hint=_CAUSAL_HINT,
        )


def decode_section(
    m: ConfigModel,
    names: Sequence[str],
    axes: Mapping[str, list[Any]],
    options: Mapping[str, tuple[Options, ...]],
    defined: Defined,
    option_axes: Mapping[str, tuple[Any, ...]],
    ctx: Context,
) -> tuple[Axes | None, dict[str, Any] | None]:
    """The ``decode:`` section as one grid of causal decode cases, and the section resolved (None: not given)."""
    d = m.decode
    if d is None:
        return None, None
    if "decode" in m.modes:
        raise ctx.error(
            "decode is listed under modes and has a decode: section too; keep one",
            ("decode",),
            hint="modes: [decode] crosses the grid; the section gives decode cases their own lengths and models",
        )
    models = d.models or list(names)
    for i, model in enumerate(models):
        if model not in names:
            raise ctx.error(
                f"{model!r} is not in models ({', '.join(names)}); decode.models picks from them",
                ctx.item(("decode", "models"), i),
                hint=f"add {model} to models, or remove it here",
            )
    check_unique(models, "model", ("decode", "models"), ctx)
    batch, seq_lens = inherited_lengths("decode", d.batch, d.seq_len, m.grid, ctx, example_batch=1)
    check_decode(models, [True], ("decode",), options, defined, ctx)
    grid = Axes(
        models=tuple(models),
        modes=("decode",),
        dtypes=tuple(m.dtype),
        batch=tuple(batch),
        seq_len=tuple(seq_lens),
        d_model=tuple(axes["d_model"]),
        heads=tuple(axes["heads"]),
        layers=tuple(axes["layers"]),
        causal=(True,),
        device=m.device,
        model_options={model: options[model] for model in models if model in options},
        option_axes=option_axes,
        defined={model: defined[model] for model in models if model in defined},
    )
    return grid, {"models": models, "seq_len": seq_lens, "batch": batch}
