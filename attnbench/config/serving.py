"""The serving questions in a config (issue 41): the top-level keys that ask them, checked, and made into axes.

``memory_budget`` (mode capacity), ``prefill_chunk`` (prefill), ``draft`` and ``accept`` (verify), ``prefix_tokens``,
``requests`` and ``checkpoint_every`` (prefix) become each case's
``serving`` parameters, crossed like a grid axis (``Axes.serving``: per mode, the parameter sets its cases take);
``packing`` (forward, train) the lengths that stand in for the grid's batch × seq_len (``Axes.packing``). A key no
mode of the config uses is refused, as an option that changes nothing is: a question the config asks that no row
would answer. A config holding several modes with their keys is one config.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from attnbench.config.checks import check_unique
from attnbench.config.messages import Context
from attnbench.config.model import ConfigModel, PackingModel
from attnbench.core.cases import (
    HOLDABLE,
    KEPT_DTYPES,
    MAX_MEMORY_BUDGET,
    MAX_PACKED,
    MAX_SEQ_LEN,
    PACKING_MODES,
    SERVING_PARAMS,
    Serving,
)
from attnbench.core.errors import ConfigError
from attnbench.core.units import format_bytes, parse_bytes

__all__ = ["KEY_MODES", "ServingAxes", "draw_lengths", "serving_axes"]

STATEFUL: tuple[str, ...] = ("decode", "capacity", "prefill", "verify", "prefix")
# Which modes use each key: a key none of the config's modes uses is refused.
KEY_MODES: dict[str, tuple[str, ...]] = {
    "memory_budget": ("capacity",),
    "prefill_chunk": ("prefill",),
    "draft": ("verify",),
    "accept": ("verify",),
    "prefix_tokens": ("prefix",),
    "requests": ("prefix",),
    "checkpoint_every": ("prefix",),
    "packing": PACKING_MODES,
    "kv_dtype": STATEFUL,
    "state_dtype": STATEFUL,
    "page_tokens": STATEFUL,
    "hybrid_pages": STATEFUL,
}


@dataclass(frozen=True)
class ServingAxes:
    """Per serving mode the parameter sets its cases cross, the packed lengths, and the keys as resolved (only those
    given, so a config without them keeps the sha256 it always had)."""

    serving: Mapping[str, tuple[Serving, ...]] = field(default_factory=dict)
    packing: tuple[int, ...] = ()
    resolved: Mapping[str, Any] = field(default_factory=dict)
    # kv_dtype and state_dtype as given (each a list), crossed into the stateful cases they apply to (``config.grid``).
    kept: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def serving_axes(m: ConfigModel, ctx: Context) -> ServingAxes:
    """The serving keys of ``m``, checked against its modes (``KEY_MODES``) and each other."""
    modes = list(m.modes)
    for key, users in KEY_MODES.items():
        if getattr(m, key) is not None and not set(users) & set(modes):
            raise ctx.error(
                f"{key} has no effect: no mode of this config uses it ({' or '.join(users)} does)",
                (key,),
                hint=f"add {users[0]} to modes, or remove {key}",
            )
    if m.presets is not None:
        # A preset asks a serving question with the config's keys for it, so the config's modes must ask it too.
        asked = [mode for mode in (m.presets.modes or modes) if mode in SERVING_PARAMS and mode not in modes]
        if asked:
            raise ctx.error(
                f"presets ask {', '.join(asked)}, which the config's modes do not: its keys are checked there",
                ("presets", "modes"),
                hint=f"add {asked[0]} to modes too, or leave it out of presets.modes",
            )
    serving: dict[str, tuple[Serving, ...]] = {}
    resolved: dict[str, Any] = {}
    if "capacity" in modes:
        budget = _budget(m, modes, ctx)
        serving["capacity"] = ((("memory_budget", budget),),)
        if m.memory_budget is not None:
            resolved["memory_budget"] = budget
    if "prefill" in modes:
        chunks = m.prefill_chunk or [0]
        check_unique(chunks, "prefill_chunk", ("prefill_chunk",) if m.prefill_chunk else None, ctx)
        serving["prefill"] = tuple((("prefill_chunk", chunk),) for chunk in chunks)
        if m.prefill_chunk is not None:
            resolved["prefill_chunk"] = chunks
    if "verify" in modes:
        serving["verify"] = _verify(m, modes, ctx)
        resolved.update(draft=m.draft, accept=m.accept)
    if "prefix" in modes:
        serving["prefix"] = _prefix(m, modes, ctx)
        resolved.update(prefix_tokens=m.prefix_tokens, requests=m.requests)
        if m.checkpoint_every is not None:
            resolved["checkpoint_every"] = m.checkpoint_every
    packing: tuple[int, ...] = ()
    if m.packing is not None:
        packing = _packing(m.packing, ctx)
        resolved["packing"] = m.packing.model_dump() if isinstance(m.packing, PackingModel) else list(m.packing)
    kept: dict[str, tuple[str, ...]] = {}
    for key in KEPT_DTYPES:
        values = getattr(m, key)
        if values is None:
            continue
        check_unique(values, key, (key,), ctx)
        if key.endswith("_dtype"):  # a layout is held by any device
            _holdable(key, values, m.device, ctx)
        kept[key] = tuple(map(str, values))
        resolved[key] = list(values)
    return ServingAxes(serving, packing, resolved, kept)


def _holdable(key: str, values: list[str], device: str, ctx: Context) -> None:
    """Each dtype one the config's device can hold (``HOLDABLE``), refused here rather than attempted; ``auto``
    resolves at the sweep and is checked against both kinds of device."""
    kinds = ("cpu", "cuda") if device == "auto" else (device.split(":", 1)[0],)
    for i, value in enumerate(values):
        for kind in kinds:
            if value not in HOLDABLE.get(kind, frozenset()):
                allowed = ", ".join(v for v in KEPT_DTYPES[key] if v in HOLDABLE.get(kind, frozenset()))
                raise ctx.error(
                    f"{key} {value} cannot be held on a {kind} device: {allowed or 'none'} can",
                    ctx.item((key,), i),
                    hint=f"give {key} one of {allowed}" if allowed else f"remove {key}",
                )


def _budget(m: ConfigModel, modes: list[str], ctx: Context) -> int:
    """memory_budget in bytes; 0 (the device's default) where it is left out, which a CPU cannot do."""
    value = m.memory_budget
    if value is None:
        if m.device == "cpu":
            raise ctx.error(
                "mode capacity on a CPU needs memory_budget: a CPU has no free memory to default to",
                ctx.item(("modes",), modes.index("capacity")),
                hint="add memory_budget: 4GiB (or any size the machine can spare)",
            )
        return 0
    if isinstance(value, str):
        try:
            value = parse_bytes(value)
        except ValueError as exc:
            raise ctx.error(str(exc), ("memory_budget",), hint="e.g. memory_budget: 4GiB") from None
    if not 0 < value <= MAX_MEMORY_BUDGET:
        raise ctx.error(
            f"memory_budget must be more than 0 bytes and at most {format_bytes(MAX_MEMORY_BUDGET)}, got {value}",
            ("memory_budget",),
            hint="e.g. memory_budget: 4GiB",
        )
    return value


# What a mode's two required keys mean, and an example of them: the refusal when either is missing.
_NEEDED = {
    "verify": (
        "draft tokens per call (k), and how many of them are kept (r ≤ k)",
        "e.g. draft: 4 and accept: [0, 2, 4]",
    ),
    "prefix": (
        "the tokens every prompt shares (P), and how many requests share them (M)",
        "e.g. prefix_tokens: 4096 and requests: 8",
    ),
}


def _missing(m: ConfigModel, keys: tuple[str, str], mode: str, modes: list[str], ctx: Context) -> ConfigError:
    """The refusal of a mode given only one of its two keys, or neither (``_NEEDED``)."""
    missing = " and ".join(key for key in keys if getattr(m, key) is None)
    what, hint = _NEEDED[mode]
    return ctx.error(f"mode {mode} needs {missing}: {what}", ctx.item(("modes",), modes.index(mode)), hint=hint)


def _verify(m: ConfigModel, modes: list[str], ctx: Context) -> tuple[Serving, ...]:
    """Each (draft, accept) pair with accept ≤ draft, as a case's serving parameters."""
    if m.draft is None or m.accept is None:
        raise _missing(m, ("draft", "accept"), "verify", modes, ctx)
    check_unique(m.draft, "draft", ("draft",), ctx)
    check_unique(m.accept, "accept", ("accept",), ctx)
    for i, accept in enumerate(m.accept):
        if accept > max(m.draft):
            raise ctx.error(
                f"accept {accept} is more than every draft ({', '.join(map(str, m.draft))}): a verify keeps at most "
                "the drafts it checked",
                ctx.item(("accept",), i),
                hint=f"give accept values up to {max(m.draft)}",
            )
    return tuple((("accept", accept), ("draft", draft)) for draft in m.draft for accept in m.accept if accept <= draft)


def _prefix(m: ConfigModel, modes: list[str], ctx: Context) -> tuple[Serving, ...]:
    """Each (checkpoint_every, prefix_tokens, requests) as a case's serving parameters; every prefix shorter than
    every prompt (a request differs from the others after its prefix, so it holds at least one token of its own)."""
    if m.prefix_tokens is None or m.requests is None:
        raise _missing(m, ("prefix_tokens", "requests"), "prefix", modes, ctx)
    every = m.checkpoint_every or [0]
    for key, values in (("prefix_tokens", m.prefix_tokens), ("requests", m.requests), ("checkpoint_every", every)):
        check_unique(values, key, (key,) if getattr(m, key) is not None else None, ctx)
    lengths = [*m.grid.seq_len, *((m.presets.seq_len or []) if m.presets is not None else [])]
    for i, prefix in enumerate(m.prefix_tokens):
        if prefix >= min(lengths):
            raise ctx.error(
                f"prefix_tokens {prefix} is not shorter than seq_len {min(lengths)}: a request's prompt of seq_len "
                "tokens begins with the prefix and holds at least one token of its own after it",
                ctx.item(("prefix_tokens",), i),
                hint=f"give prefix_tokens below {min(lengths)}, or longer seq_len",
            )
    return tuple(
        (("checkpoint_every", c), ("prefix_tokens", p), ("requests", r))
        for p in m.prefix_tokens
        for r in m.requests
        for c in every
    )


def _packing(value: list[int] | PackingModel, ctx: Context) -> tuple[int, ...]:
    if isinstance(value, list):
        return tuple(value)
    try:
        return draw_lengths(value.lognormal.mean, value.lognormal.sigma, value.tokens, value.seed)
    except ValueError as exc:
        raise ctx.error(str(exc), ("packing", "tokens"), hint="raise lognormal.mean, or lower tokens") from None


def draw_lengths(mean: float, sigma: float, tokens: int, seed: int) -> tuple[int, ...]:
    """Lengths drawn from a log-normal of the given mean (of the lengths) and sigma (of their logarithm), each at
    least 1, until they hold ``tokens``: the last one cut to fit. ``random.Random(seed)``: the same on every
    machine and Python. ValueError beyond ``MAX_PACKED`` sequences."""
    rng = random.Random(seed)
    mu = math.log(mean) - sigma**2 / 2  # E[e^X] = e^(μ + σ²/2) = mean
    lengths: list[int] = []
    left = tokens
    while left > 0:
        if len(lengths) == MAX_PACKED:
            raise ValueError(
                f"packing draws more than {MAX_PACKED} sequences to fill {tokens} tokens at a mean length of {mean:g}"
            )
        length = min(max(1, round(rng.lognormvariate(mu, sigma))), MAX_SEQ_LEN, left)
        lengths.append(length)
        left -= length
    return tuple(lengths)
