"""Models the user brings: a ``factory:`` entry in a config's ``models`` list, or a family an installed package
registers under the ``attnbench.models`` entry-point group (``attnbench.plugin`` is the interface, versioned).

A user model's case carries its own ``UserModel`` (factory, kind, source), so every reader of a stored row knows
it without importing the user's code; its options are the entry's own, all of them in the case's key (there are no
defaults to drop). Nothing here is known before the model is built: FLOPs are counted on the device by torch's
``FlopCounterMode`` over one call (formula ``counted-v1``), parameters counted on the built module, and a decode
state's bytes measured, not computed. The torch half is ``attnbench.families.user.layers``.
"""

from __future__ import annotations

from collections.abc import Mapping

from attnbench.core.cases import Case, UserModel
from attnbench.families import shared
from attnbench.families.base import ExtraValue, Family, ModelSpec, OptionSpec, Problem
from attnbench.families.plugins import FACTORY, OPTION_HELP

__all__ = ["FACTORY", "OPTION_HELP", "USER", "UserFamily", "UserModel"]


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

    # A user model has heads; its key/value heads are its business, and the column says the query heads.
    case_columns = (shared.HEADS_KV_COLUMN,)

    def case_column_values(self, case: Case) -> Mapping[str, ExtraValue]:
        return {"heads_kv": case.heads}

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
