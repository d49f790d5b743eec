"""Models the user brings, in a config: ``{name, factory, kind, options}`` entries of ``models``, and the names of
installed plugins (the ``attnbench.models`` entry-point group; ``attnbench.plugin`` is their interface).

Checked without running the user's code wherever that can be known: the name, the factory's form, and that its
module can be found on the import path (found, not imported: importing a module runs it). Whether the factory
imports, builds and returns the right module is found by the sweep, which refuses to start on an import that fails
and records a build that fails as a row. A plugin's entry point is loaded (its object must be a torch-free
``ModelPlugin``).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata
from importlib.machinery import PathFinder
from typing import Any

from attnbench.config.checks import check_option_value, check_unique
from attnbench.config.hybrids import entry_name_problem
from attnbench.config.messages import Context, Path_, describe, did_you_mean
from attnbench.config.model import ConfigModel, HybridEntry, UserModelEntry
from attnbench.core.cases import Definition, Options
from attnbench.families.catalogue import MODEL_NAMES, ModelSpec, OptionSpec, define, defined_spec
from attnbench.families.plugins import (
    ENTRY_POINT_GROUP,
    FACTORY,
    OPTION_HELP,
    ModelPlugin,
    plugin_options,
    plugin_problem,
)

__all__ = [
    "Plugin",
    "UserEntry",
    "check_models",
    "find_module",
    "installed_plugins",
    "user_option_sets",
    "user_spec",
]

_OPTION_TYPES = (bool, int, float, str)
# How a value is checked against an option's spec (config.options.option_value: type, choices, bounds).
OptionCheck = Callable[[Any, OptionSpec, str, Path_, Context], Any]


@dataclass(frozen=True)
class UserEntry:
    """A user model as the config resolved it: where it comes from, and the options it takes (a plugin's with
    their defaults; a config entry's are its own, given there)."""

    name: str
    definition: Definition  # what its cases carry: factory, kind, source, as the user family writes them
    options: tuple[OptionSpec, ...]
    given: Mapping[str, Any]  # a config entry's options as written (a plugin's are set under model_options)
    where: Path_ = ()  # where a config entry's options were written (models[i].options)

    @property
    def from_config(self) -> bool:
        """Whether it is a config's ``factory:`` entry (else an installed plugin)."""
        return defined_spec(self.name, self.definition).source == "config"

    def record(self) -> dict[str, Any]:
        """What a stored run keeps of it (resolved config ``users``): enough to expand its cases again."""
        return {**self.definition.data, "options": {o.name: o.default for o in self.options}}

    @classmethod
    def recorded(cls, name: str, data: Mapping[str, Any], entry: UserModelEntry | None) -> UserEntry:
        """The entry a stored run recorded (``record``), with the config entry's options as written, if any."""
        user = define("user", data)
        defaults = data.get("options", {})
        options = tuple(OptionSpec(k, type(v), v, OPTION_HELP) for k, v in defaults.items())
        if entry is None:
            return cls(name, user, options, {})
        return cls(name, user, options, dict(entry.options), ())


@dataclass(frozen=True)
class Plugin:
    """One entry point of the ``attnbench.models`` group: its model's name, the distribution that installs it, and
    its ``ModelPlugin`` — or why it could not be loaded."""

    name: str
    distribution: str
    value: str
    plugin: ModelPlugin | None
    problem: str = ""

    @property
    def source(self) -> str:
        return f"plugin {self.distribution}"


@lru_cache(maxsize=1)
def installed_plugins() -> tuple[Plugin, ...]:
    """Every installed plugin, loaded once per process. A plugin that does not load, is not a plugin this
    attnbench can use, or shares its name with another installed one is kept, with the reason: using it is an
    error that says so, and a listing never breaks on it."""
    found = []
    for point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        distribution = point.dist.name if point.dist is not None else "?"
        try:
            loaded = point.load()
        except (Exception, SystemExit) as exc:
            # The plugin's own import failed, or ended the process (sys.exit at import): say so where it is used.
            # A SystemExit let through would end `validate` or `models` with its code, having checked nothing.
            why = f"{type(exc).__name__}: {exc}" + (
                " (its import called sys.exit)" if isinstance(exc, SystemExit) else ""
            )
            found.append(Plugin(point.name, distribution, point.value, None, why))
            continue
        problem = plugin_problem(loaded)
        if problem is not None:
            found.append(Plugin(point.name, distribution, point.value, None, f"{point.value} {problem}"))
        else:
            assert isinstance(loaded, ModelPlugin)
            found.append(Plugin(point.name, distribution, point.value, loaded))
    return _one_per_name(found)


def _one_per_name(found: Sequence[Plugin]) -> tuple[Plugin, ...]:
    """Plugins sorted by name, where two installed packages register one name both refused (neither silently wins)."""
    by_name: dict[str, list[Plugin]] = {}
    for plugin in found:
        by_name.setdefault(plugin.name, []).append(plugin)
    out = []
    for name in sorted(by_name):
        same = by_name[name]
        if len(same) == 1:
            out.append(same[0])
            continue
        sources = ", ".join(f"{p.distribution} ({p.value})" for p in same)
        why = f"{len(same)} installed packages register the model {name!r}: {sources}; uninstall all but one"
        out += [Plugin(p.name, p.distribution, p.value, None, why) for p in same]
    return tuple(out)


def user_spec(name: str, plugin: ModelPlugin) -> ModelSpec:
    """A plugin's model as a ``ModelSpec`` (what ``attnbench models`` lists of a built-in)."""
    return ModelSpec(name, plugin.kind, "user", plugin.summary, options=plugin_options(plugin), heads=True)


def find_module(dotted: str) -> str | None:
    """None if module ``dotted`` can be found on the import path, else why not. Nothing is imported: only the
    finders are asked (for a submodule, inside its parent package's folders)."""
    parts = dotted.split(".")
    search: Sequence[str] | None = None
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        module = sys.modules.get(name)
        if module is not None and module.__spec__ is None and i == len(parts) - 1:
            return None  # imported already, with no finder behind it (a script's or a notebook's __main__)
        if module is not None:
            spec = module.__spec__
        elif search is None:
            try:
                spec = importlib.util.find_spec(name)
            except (ImportError, ValueError) as exc:
                return f"{name} cannot be looked up: {exc}"
        else:
            spec = PathFinder.find_spec(name, list(search))
        if spec is None:
            return f"no module named {name!r} on the import path"
        if i < len(parts) - 1:
            locations = spec.submodule_search_locations
            if locations is None:
                return f"{name} is a module, not a package, so it has no {parts[i + 1]!r}"
            search = list(locations)
    return None


def check_models(
    m: ConfigModel, ctx: Context, known: Mapping[str, Any] | None = None
) -> tuple[list[str], dict[str, UserEntry]]:
    """The models' names in order, and the user models among them by name. ``known``: a stored run's record of
    its user models (resolved config ``users``), taken as it is: neither their modules nor plugins are looked up."""
    names: list[str] = []
    users: dict[str, UserEntry] = {}
    known = known or {}
    # Entry points are looked up only when a name is neither a built-in's nor known: that scans the installed packages.
    wanted = any(isinstance(entry, str) and entry not in MODEL_NAMES and entry not in known for entry in m.models)
    plugins = {p.name: p for p in installed_plugins()} if wanted else {}
    for i, entry in enumerate(m.models):
        path = ctx.item(("models",), i)
        name = entry if isinstance(entry, str) else entry.name
        if name in known and isinstance(known[name], dict):
            users[name] = UserEntry.recorded(name, known[name], entry if isinstance(entry, UserModelEntry) else None)
            names.append(name)
            continue
        if isinstance(entry, UserModelEntry):
            users[entry.name] = _factory_entry(entry, path, ctx)
            names.append(entry.name)
            continue
        if isinstance(entry, HybridEntry):  # a stack of built-ins: config.hybrids checks it
            names.append(entry.name)
            continue
        if entry in MODEL_NAMES:
            names.append(entry)
            continue
        plugin = plugins.get(entry)
        if plugin is None:
            valid = [*MODEL_NAMES, *plugins]
            raise ctx.error(
                f"unknown model {entry!r}; valid: {', '.join(valid)}",
                path,
                hint=did_you_mean(entry, valid)
                or "a model of your own: {name: …, factory: module.path:function, kind: recurrent|attention}",
            )
        if plugin.plugin is None:
            raise ctx.error(
                f"plugin {entry!r} (from {plugin.distribution}, {plugin.value}) does not load: {plugin.problem}",
                path,
                hint="fix or reinstall the plugin's package; `attnbench models` lists every plugin and its state",
            )
        user = define("user", {"factory": plugin.plugin.factory, "kind": plugin.plugin.kind, "source": plugin.source})
        users[entry] = UserEntry(entry, user, plugin_options(plugin.plugin), {})
        names.append(entry)
    check_unique(names, "model", ("models",), ctx)
    return names, users


def _factory_entry(entry: UserModelEntry, path: Path_, ctx: Context) -> UserEntry:
    problem = entry_name_problem(entry.name)
    if problem is not None:
        raise ctx.error(problem[0], (*path, "name"), hint=problem[1])
    if not FACTORY.fullmatch(entry.factory):
        raise ctx.error(
            f"factory {entry.factory!r} is not of the form module.path:function",
            (*path, "factory"),
            hint="e.g. factory: mypkg.layers:build (a function in mypkg/layers.py)",
        )
    module = entry.factory.split(":", 1)[0]
    missing = find_module(module)
    if missing is not None:
        raise ctx.error(
            f"factory {entry.factory!r}: {missing}",
            (*path, "factory"),
            hint="install the package that has it, or run attnbench with its folder on PYTHONPATH",
        )
    options = []
    for name, raw in entry.options.items():
        check_option_value(name, "option name", (*path, "options", name), ctx)
        listed = raw if isinstance(raw, list) else [raw]
        first = listed[0] if listed else None
        if not isinstance(first, _OPTION_TYPES):
            raise ctx.error(
                f"must be a string, number or boolean (or a list of them), got {describe(raw)}",
                (*path, "options", name),
            )
        options.append(OptionSpec(name, type(first), first, OPTION_HELP))
    user = define("user", {"factory": entry.factory, "kind": entry.kind, "source": "config"})
    return UserEntry(entry.name, user, tuple(options), dict(entry.options), (*path, "options"))


def user_option_sets(
    entry: UserEntry, model_options: Mapping[str, Any], path: Path_, ctx: Context, check: OptionCheck
) -> tuple[tuple[Options, ...], dict[str, Any]]:
    """The option sets a user model is crossed with (every option in each, defaults included), and the options as
    written. A config entry's options are its own; a plugin's come from ``model_options`` over its defaults, each
    value checked by ``check`` against the option's type, choices and bounds, as a built-in model's are."""
    if entry.from_config:
        if model_options:
            raise ctx.error(
                f"{entry.name} is a model of your own: give its options in its entry under models, not here",
                path,
                hint=f"models: [{{name: {entry.name}, factory: …, options: {{…}}}}]",
            )
        given, given_path = entry.given, entry.where
    else:
        given, given_path = model_options, path
    names: list[str] = []
    values: list[list[Any]] = []
    specs = {o.name: o for o in entry.options}
    for name, raw in given.items():
        spec = specs.get(name)
        if spec is None:
            known = ", ".join(specs) or "none"
            raise ctx.error(
                f"unknown option {name!r} for {entry.name}; its options: {known}",
                (*given_path, name),
                hint=did_you_mean(name, list(specs)),
            )
        listed = raw if isinstance(raw, list) else [raw]
        if not listed:
            raise ctx.error("must not be empty: give at least one value", (*given_path, name))
        checked = [
            check(v, spec, entry.name, ctx.item((*given_path, name), i), ctx)
            if not entry.from_config
            else _typed(v, spec, ctx.item((*given_path, name), i), ctx)
            for i, v in enumerate(listed)
        ]
        check_unique(checked, f"{name} value", (*given_path, name), ctx)
        names.append(name)
        values.append(checked)
    defaults = {o.name: o.default for o in entry.options if o.name not in names}
    sets = [
        tuple(sorted({**defaults, **dict(zip(names, combination, strict=True))}.items()))
        for combination in itertools.product(*values)
    ]
    written = dict(model_options) if not entry.from_config else {}
    return tuple(dict.fromkeys(sets)), written


def _typed(value: Any, spec: OptionSpec, path: Path_, ctx: Context) -> Any:
    """``value`` as an option of ``spec``'s type takes it (an integer where a number is asked for becomes one)."""
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) != (spec.type is bool) or not isinstance(value, spec.type):
        word = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[spec.type]
        raise ctx.error(f"must be {word} (as its other values are), got {describe(value)}", path)
    check_option_value(value, spec.name, path, ctx)
    return value
