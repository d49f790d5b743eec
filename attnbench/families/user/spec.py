"""Models the user brings: a ``factory:`` entry in a config's ``models`` list, or a family an installed package
registers under the ``attnbench.models`` entry-point group (``attnbench.plugin`` is the interface, versioned).

A user model's case carries its own ``UserModel`` (factory, kind, source; ``Case.definition`` under ``user``), so
every reader of a stored row knows
it without importing the user's code; its options are the entry's own, all of them in the case's key (there are no
defaults to drop). Nothing here is known before the model is built: FLOPs are counted on the device by torch's
``FlopCounterMode`` over one call (formula ``counted-v1``), parameters counted on the built module, and a decode
state's bytes measured, not computed. The torch half is ``attnbench.families.user.layers``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from attnbench.core.cases import KINDS, Case, Definition, Kind
from attnbench.families import shared
from attnbench.families.base import ClaimRole, ExtraValue, Family, ModelSpec, OptionSpec, Problem
from attnbench.families.plugins import FACTORY, OPTION_HELP

__all__ = ["FACTORY", "OPTION_HELP", "USER", "UserFamily", "UserModel", "user_of"]


@dataclass(frozen=True)
class UserModel:
    """Where a model the user brings comes from and which side of the article's claims it joins: a config's
    ``factory:`` entry or an installed plugin. It travels in the case (``definition``), so a stored row says so
    without the user's code."""

    factory: str  # "package.module:function", called with an attnbench.plugin.ModelRequest
    kind: Kind
    source: str = "config"  # "config", or "plugin <distribution>" for an entry point

    def definition(self) -> Definition:
        """What a case of this model carries (``Case.definition``)."""
        return Definition.of(UserFamily.defines, self.to_dict())

    def to_dict(self) -> dict[str, str]:
        return {"factory": self.factory, "kind": self.kind, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UserModel:
        kind = data["kind"]
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        return cls(str(data["factory"]), kind, str(data.get("source", "config")))


@lru_cache(maxsize=1024)
def _read(definition: Definition) -> UserModel:
    return UserModel.from_dict(definition.data)


def user_of(case: Case) -> UserModel:
    """The user model ``case`` defines; ValueError where it defines none."""
    if case.definition is None or case.definition.key != UserFamily.defines:
        raise ValueError(f"{case.model} is not a user model")
    return _read(case.definition)


class UserFamily(Family):
    name = "user"
    defines = "user"
    order = 10_000
    analytic = False

    def define(self, data: Mapping[str, Any]) -> Definition:
        return UserModel.from_dict(data).definition()

    def spec(self, case: Case) -> ModelSpec:
        """The model's spec, read off the case (a user model is known by its case alone)."""
        user = user_of(case)
        options = tuple(OptionSpec(name, type(value), value, OPTION_HELP) for name, value in case.options)
        return ModelSpec(
            case.model,
            user.kind,
            self.name,
            f"{user.factory} ({user.source})",
            options=options,
            heads=True,
            source=user.source,
        )

    # A user model has heads; its key/value heads are its business, and the column says the query heads.
    case_columns = (shared.HEADS_KV_COLUMN,)

    def case_column_values(self, case: Case) -> Mapping[str, ExtraValue]:
        return {"heads_kv": case.heads}

    def source(self, case: Case) -> str:
        return user_of(case).source

    def config_entry(self, case: Case) -> dict[str, object] | None:
        user = user_of(case)
        if user.source != "config":
            return None  # a plugin is known by its name
        entry: dict[str, object] = {"name": case.model, "factory": user.factory, "kind": user.kind}
        if case.options:  # a factory entry's options go inside it
            entry["options"] = dict(case.options)
        return entry

    def claim_role(self, case: Case) -> ClaimRole | None:
        return ClaimRole("rnn" if user_of(case).kind == "recurrent" else "attention")  # the side its entry names

    def formula(self, case: Case) -> str:
        return shared.COUNTED_FORMULA

    def kept_keys(self, case: Case) -> tuple[str, ...]:
        return ()  # a user's state is the user's: it is never converted

    def serving_problem(self, case: Case) -> Problem | None:
        if case.mode == "prefix":
            return Problem(
                f"{case.model}: the plugin interface has no way to share a prefix's state between requests (a KV "
                "cache by reference, a recurrent state restored), so mode prefix cannot be asked of a model you bring",
                hint="ask mode prefix of the built-in models",
            )
        return super().serving_problem(case)


USER = UserFamily()  # not `FAMILY`: it has no models of its own, and the catalogue adds it apart
