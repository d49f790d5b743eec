"""Models the user brings: a ``factory:`` entry in a config's ``models`` list, or a family an installed package
registers under the ``attnbench.models`` entry-point group (``attnbench.plugin`` is the interface, versioned).

A user model's case carries its own ``UserModel`` (factory, kind, source), so every reader of a stored row knows
it without importing the user's code; its options are the entry's own, all of them in the case's key (there are no
defaults to drop). Nothing here is known before the model is built: FLOPs are counted on the device by torch's
``FlopCounterMode`` over one call (formula ``counted-v1``), parameters counted on the built module, and a decode
state's bytes measured, not computed. The torch half is ``attnbench.measure.models.user``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from attnbench.core.families.base import KINDS, Family, Kind, ModelSpec, OptionSpec

if TYPE_CHECKING:
    from attnbench.core.cases import Case

COUNTED_FORMULA = "counted-v1"
# module.path:attribute — what importlib can import and getattr can reach, nothing else.
_DOTTED = r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*"
FACTORY = re.compile(f"{_DOTTED}:{_DOTTED}")
OPTION_HELP = "the model's own option, passed to its factory"


@dataclass(frozen=True)
class UserModel:
    """Where a user model comes from and which side of the article's claims it joins."""

    factory: str  # "package.module:function", called with an attnbench.plugin.ModelRequest
    kind: Kind
    source: str = "config"  # "config", or "plugin <distribution>" for an entry point

    def to_dict(self) -> dict[str, str]:
        return {"factory": self.factory, "kind": self.kind, "source": self.source}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> UserModel:
        kind = data["kind"]
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        return cls(str(data["factory"]), kind, str(data.get("source", "config")))


class UserFamily(Family):
    name = "user"
    order = 10_000
    analytic = False

    def spec(self, case: Case) -> ModelSpec:
        """The model's spec, read off the case (a user model is known by its case alone)."""
        user = case.user
        if user is None:
            raise ValueError(f"{case.model} is not a user model")
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

    def formula(self, case: Case) -> str:
        return COUNTED_FORMULA


USER = UserFamily()  # not `FAMILY`: it has no models of its own, and the catalogue adds it apart
