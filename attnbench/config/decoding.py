"""Decode cases in a config: ``decode`` listed under ``modes`` (crossing the grid), or a ``decode:`` section of
their own (its own context lengths, batches and models, always causal). Both are checked here.

A decode case produces one new token after a context of n tokens, which only a model that looks backwards can do:
attention must be causal and a recurrence unidirectional. ``core.cases.expand`` leaves the combinations that
cannot decode out (``causal: [false, true]`` decodes the causal ones); a model left with none is refused here, with
the key that made it so. Learned positions must also cover the new token's position n.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attnbench.config.messages import Context, Path_
from attnbench.config.options import check_unique, inherited_lengths
from attnbench.core.cases import Axes, Options
from attnbench.core.catalogue import MODELS, decode_problem, is_recurrent

if TYPE_CHECKING:  # only for the hints: the schema lives in config.experiment, which imports this module
    from attnbench.config.experiment import ConfigModel

__all__ = ["check_decode", "decode_section"]

_CAUSAL_HINT = (
    "set causal: true (or [false, true]: forward runs both, decode the causal ones), or move decode into a "
    "decode: section, whose cases are causal"
)


def _value(options: Options, model: str, name: str) -> Any:
    spec = MODELS[model].option(name)
    return dict(options).get(name, spec.default if spec is not None else None)


def check_decode(
    models: Sequence[str],
    causal: Sequence[bool],
    causal_path: Path_,
    options: Mapping[str, tuple[Options, ...]],
    seq_lens: Sequence[int],
    ctx: Context,
) -> None:
    """Every model asked to decode has a variant that can, and its learned positions reach position n.
    ``causal_path`` is where causal was written, or ``("modes",)`` where it was left at its default."""
    for model in models:
        sets = options.get(model, ((),))
        if is_recurrent(model):
            if all(_value(s, model, "bidirectional") for s in sets):
                raise ctx.error(
                    str(decode_problem(model, causal=False)),
                    ("model_options", model, "bidirectional"),
                    hint="set bidirectional: false (or [false, true]: decode runs the unidirectional one), or leave "
                    f"{model} out of decode",
                )
        elif True not in causal:
            given = "causal is false" + (" (its default)" if causal_path == ("modes",) else "")
            raise ctx.error(
                f"{model} cannot decode: {given}, which lets every position see the whole sequence; a new token "
                "may see only the tokens before it",
                causal_path,
                hint=_CAUSAL_HINT,
            )
        for s in sets:
            max_len = _value(s, model, "max_len")
            if _value(s, model, "positional") == "learned" and max_len and max_len <= max(seq_lens):
                raise ctx.error(
                    f"max_len {max_len} does not reach position {max(seq_lens)}: a decode step at n={max(seq_lens)} "
                    "adds the token after the context, at position n",
                    ("model_options", model, "max_len"),
                    hint=f"raise max_len to at least {max(seq_lens) + 1}, or set 0 (= each case's n + 1)",
                )


def decode_section(
    m: ConfigModel, axes: Mapping[str, list[Any]], options: Mapping[str, tuple[Options, ...]], ctx: Context
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
    models = d.models or m.models
    for i, model in enumerate(models):
        if model not in m.models:
            raise ctx.error(
                f"{model!r} is not in models ({', '.join(m.models)}); decode.models picks from them",
                ctx.item(("decode", "models"), i),
                hint=f"add {model} to models, or remove it here",
            )
    check_unique(models, "model", ("decode", "models"), ctx)
    batch, seq_lens = inherited_lengths("decode", d.batch, d.seq_len, m.grid, ctx, example_batch=1)
    check_decode(models, [True], ("decode",), options, seq_lens, ctx)
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
        heads_kv=tuple(axes.get("heads_kv", (0,))),
    )
    return grid, {"models": models, "seq_len": seq_lens, "batch": batch}
