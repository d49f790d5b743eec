"""Hybrid stacks in a config: ``{name, hybrid: [m1, m2, …], kind}`` entries of ``models``, checked here.

A hybrid's members are built-in models (its torch-free family, ``families.hybrid``, counts and builds it from
them). Whether its members can share a case — decode, the heads dividing d_model, a window's length — is the
family's to say, on every case, like any model's (``config.options.check_buildable``); here only what the entry
itself says: its name, and that every member is a built-in (``a+b``: a block running both side by side).
"""

from __future__ import annotations

from attnbench.config.messages import Context, Path_, did_you_mean
from attnbench.config.model import MAX_NAME_LEN, NAME, ConfigModel, HybridEntry
from attnbench.core.cases import PARALLEL, Definition
from attnbench.families.catalogue import MODEL_NAMES, define

__all__ = ["check_hybrids", "entry_name_problem"]


def entry_name_problem(name: str) -> tuple[str, str] | None:
    """Why ``name`` cannot name a model a config defines (a factory entry, a hybrid), and the hint, or None."""
    if not NAME.fullmatch(name) or len(name) > MAX_NAME_LEN:
        return (
            f"name {name!r} is not allowed: lower-case letters, digits, '.', '_' and '-', starting with a letter or "
            f"digit, at most {MAX_NAME_LEN} characters",
            "",
        )
    if name in MODEL_NAMES:
        return f"{name!r} is a built-in model's name; a model you define needs a name of its own", f"e.g. my-{name}"
    return None


def check_hybrids(m: ConfigModel, ctx: Context) -> dict[str, Definition]:
    """The hybrid stacks among ``models``, by name, each member a built-in model, as their family defines them."""
    found: dict[str, Definition] = {}
    for i, entry in enumerate(m.models):
        if not isinstance(entry, HybridEntry):
            continue
        path: Path_ = ctx.item(("models",), i)
        problem = entry_name_problem(entry.name)
        if problem is not None:
            raise ctx.error(problem[0], (*path, "name"), hint=problem[1])
        for j, block in enumerate(entry.hybrid):
            for member in block.split(PARALLEL):  # a+b: a block of both side by side
                if member not in MODEL_NAMES:
                    raise ctx.error(
                        f"{member!r} is not a built-in model; a hybrid's blocks are built-in models' (a+b runs both "
                        "side by side in one block)",
                        ctx.item((*path, "hybrid"), j),
                        hint=did_you_mean(member, MODEL_NAMES) or f"valid: {', '.join(MODEL_NAMES)}",
                    )
        found[entry.name] = define("hybrid", {"pattern": entry.hybrid, "kind": entry.kind})
    return found
