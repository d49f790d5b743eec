"""mkdocs hook: the reference pages, generated from the code at every build, so they cannot drift from it.

``mkdocs.yml`` lists this file under ``hooks:``. ``on_files`` adds pages that exist only in the build:

* ``reference/cli.md``: mkdocs-click renders the click object of the typer app (``cli`` below) — every command, its
  arguments and options with their help, as ``attnbench COMMAND --help`` has them;
* ``reference/config.md``: every key of ``configs/attnbench.schema.json`` (the schema ``attnbench schema`` writes
  and editors check configs against), with its type, default and description;
* ``reference/models.md``: every model family, model, option and preset of ``attnbench.families.catalogue``;
* ``reference/exit-codes.md``: ``attnbench.core.errors.EXIT_CODES``;
* ``reference/summary-csv.md``: ``attnbench.report.rows.COLUMNS`` with their types and meanings;
* ``explanation/architecture.md``, ``measurements.md`` and ``changelog.md``: ARCHITECTURE.md, results/README.md and
  CHANGELOG.md as they are in the repository (one text, two places to read it).

Nothing here imports torch: the catalogue, the schema, the CLI's definitions and the column table are torch-free.
``tests/e2e/test_docs_site.py`` calls the ``*_page`` functions and holds them to the app, the schema and the tables.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import typer

from attnbench.cli import app
from attnbench.core.errors import EXIT_CODES, EXIT_SIGNAL
from attnbench.families.base import ModelSpec
from attnbench.families.catalogue import FAMILIES, PRESETS
from attnbench.families.extras import declared
from attnbench.report.rows import COLUMN_MEANINGS, COLUMN_TYPES, COLUMNS

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "configs" / "attnbench.schema.json"

# The click command mkdocs-click documents (`::: mkdocs-click` with `:module: attnbench_docs`, `:command: cli`).
cli = typer.main.get_command(app)
# mkdocs loads a hook under the name mkdocs.yml gives it (a path); mkdocs-click imports its module by name.
if __name__ in sys.modules:
    sys.modules.setdefault("attnbench_docs", sys.modules[__name__])

GENERATED_NOTE = (
    '!!! note "Generated"\n    This page is generated from {source} at every build of the docs '
    "(`docs/hooks/attnbench_docs.py`): it says what the code says.\n"
)


def _cell(text: object) -> str:
    """Text safe inside a markdown table cell: one line, no bare pipe, reStructuredText's ``code`` as markdown's."""
    return " ".join(str(text).split()).replace("|", "&#124;").replace("``", "`")


def _code(value: object) -> str:
    return f"`{json.dumps(value) if not isinstance(value, str) or not value else value}`"


# -------------------------------------------------------------------------------------------------------- the CLI
def cli_page() -> str:
    return "\n".join(
        [
            "# Command line",
            "",
            GENERATED_NOTE.format(source="the typer app (`attnbench.cli.app`), through mkdocs-click"),
            "Every command and flag, as `attnbench COMMAND --help` prints them. Conventions shared by all of them "
            "(`latest`, `-o -`, `--format json`, colour, exit codes) are in [Conventions](conventions.md).",
            "",
            "::: mkdocs-click",
            "    :module: attnbench_docs",
            "    :command: cli",
            "    :prog_name: attnbench",
            "    :depth: 1",
            "    :style: plain",
            "    :list_subcommands: true",
            "",
        ]
    )


# ----------------------------------------------------------------------------------------------------- the config
def _resolve(node: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = node.get("$ref")
    return defs[ref.rsplit("/", 1)[-1]] if isinstance(ref, str) else node


def _bounds(node: Mapping[str, Any]) -> str:
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum", node.get("exclusiveMaximum"))
    if low is None and high is None:
        return ""
    left = "≥" if "minimum" in node else ">"
    right = "≤" if "maximum" in node else "<"
    parts = [f"{left} {low}" if low is not None else "", f"{right} {high}" if high is not None else ""]
    return " (" + ", ".join(p for p in parts if p) + ")"


def type_text(node: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    """A schema node's type in words: `a | b` for an enum, 'list of …', 'mapping (below)' for a nested object."""
    if "$ref" in node:
        return "mapping (below)"
    if "const" in node:
        return _code(node["const"])
    if "enum" in node:
        return " / ".join(_code(v) for v in node["enum"])
    for key in ("anyOf", "oneOf"):
        if key in node:
            parts = [type_text(n, defs) for n in node[key] if n.get("type") != "null"]
            unique = list(dict.fromkeys(p for p in parts if p))
            # "a value, or a list of them" rather than the value's type spelled out twice
            listed = [p for p in unique if p.startswith("list of ") and p.removeprefix("list of ") in unique]
            text = " or ".join(p for p in unique if p not in listed)
            return f"{text}, or a list of them" if listed else text
    kind = node.get("type")
    if kind == "array":
        return "list of " + type_text(node.get("items", {}), defs)
    if kind == "object":
        return "mapping"
    if kind == "string" and "pattern" in node:
        return f"string matching `{node['pattern']}`"
    return f"{kind}{_bounds(node)}" if kind else "any"


def _default(node: Mapping[str, Any], required: bool) -> str:
    if required:
        return "required"
    return _code(node["default"]) if "default" in node else "—"


def _objects_in(node: Mapping[str, Any], defs: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    """The object schemas a key's value may be (through anyOf/oneOf, list items and $refs)."""
    node = _resolve(node, defs)
    if "properties" in node:
        yield node
    for key in ("anyOf", "oneOf"):
        for branch in node.get(key, ()):
            yield from _objects_in(branch, defs)
    if "items" in node:
        yield from _objects_in(node["items"], defs)


def _key_table(obj: Mapping[str, Any], prefix: str, defs: Mapping[str, Any]) -> list[str]:
    required = set(obj.get("required", ()))
    rows = ["| key | type | default | what it does |", "| --- | --- | --- | --- |"]
    for name, node in obj["properties"].items():
        description = node.get("description") or _resolve(node, defs).get("description", "")
        rows.append(
            f"| `{prefix}{name}` | {_cell(type_text(node, defs))} | {_cell(_default(node, name in required))} "
            f"| {_cell(description)} |"
        )
    return [*rows, ""]


def _nested(obj: Mapping[str, Any], prefix: str, defs: Mapping[str, Any]) -> list[str]:
    """The mappings inside a section's keys (``packing.lognormal``), each a table of its own, to any depth."""
    lines: list[str] = []
    for name, node in obj["properties"].items():
        for inner in _objects_in(node, defs):
            lines += [f"### `{prefix}{name}`", "", _cell(inner.get("description", "")), ""]
            lines += [*_key_table(inner, f"{prefix}{name}.", defs), *_nested(inner, f"{prefix}{name}.", defs)]
    return lines


def config_page(schema: Mapping[str, Any] | None = None) -> str:
    """Every key of a config, from the JSON Schema: the top level, then each mapping a key holds, then the options
    of each model under ``model_options``."""
    schema = schema if schema is not None else json.loads(SCHEMA.read_text(encoding="utf-8"))
    defs = schema.get("$defs", {})
    lines = [
        "# Config keys",
        "",
        GENERATED_NOTE.format(source="`configs/attnbench.schema.json` (what `attnbench schema` writes)"),
        f"{schema.get('description', '')} A config is YAML; every key below is checked by `attnbench validate` "
        "(which also checks what spans keys, such as heads dividing d_model), and any key can be overridden on the "
        "command line: `--set timing.max_case_s=2`. How to write one: [Write a config](../how-to/configs.md).",
        "",
        "## Top level",
        "",
        *_key_table(schema, "", defs),
    ]
    for name, node in schema["properties"].items():
        if name == "model_options":
            continue
        seen: set[str] = set()
        for obj in _objects_in(node, defs):
            title = obj.get("title", name)
            if title in seen:
                continue
            seen.add(title)
            listed = "items" in node or any("items" in branch for branch in node.get("anyOf", ()))
            prefix = f"{name}[]." if listed and name == "models" else f"{name}."
            heading = "A model you bring (an entry of `models`)" if name == "models" else f"`{name}`"
            lines += [f"## {heading}", "", _cell(obj.get("description", "")), "", *_key_table(obj, prefix, defs)]
            lines += _nested(obj, prefix, defs)
    options = schema["properties"].get("model_options", {})
    lines += [
        "## `model_options`",
        "",
        _cell(options.get("description", "")) + " `attnbench models NAME` lists the same options for one model; "
        "[Models](models.md) says what each model is.",
        "",
    ]
    for model, node in options.get("properties", {}).items():
        lines += [f"### `model_options.{model}`", "", *_key_table(node, f"model_options.{model}.", defs)]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------- the models
def _options_table(spec: ModelSpec) -> list[str]:
    rows = ["| option | default | values | what it does |", "| --- | --- | --- | --- |"]
    for option in spec.options:
        if option.name == "preset":
            continue  # set by a config's presets key, never by hand
        default = str(option.default).lower() if isinstance(option.default, bool) else option.default
        rows.append(f"| `{option.name}` | `{default}` | {_cell(option.allowed())} | {_cell(option.help)} |")
    return [*rows, ""] if len(rows) > 2 else []


def models_page() -> str:
    lines = [
        "# Models",
        "",
        GENERATED_NOTE.format(source="the model catalogue (`attnbench.families.catalogue`)"),
        "Every built-in model, family by family, with its options (set them under `model_options.<model>` in a "
        "config; a list of values crosses them). `attnbench models NAME` shows the same list and whether the model "
        "runs on this machine. What the variants mean (GQA, windows, scopes, compile) is explained in "
        "[Models and their variants](../explanation/models.md); models you bring are in "
        "[Benchmark your own model](../how-to/your-own-model.md).",
        "",
        "| model | kind | family | devices | what it is |",
        "| --- | --- | --- | --- | --- |",
    ]
    for family in FAMILIES:
        for spec in family.models:
            lines.append(
                f"| [`{spec.name}`](#{spec.name}) | {spec.kind} | {family.name} | {', '.join(spec.devices)} "
                f"| {_cell(spec.summary)} |"
            )
    lines.append("")
    for family in FAMILIES:
        if not family.models:
            continue
        lines += [f"## The {family.name} family", ""]
        for spec in family.models:
            needs = f" Needs the `{spec.package}` package." if spec.package else ""
            lines += [
                f"### {spec.name}",
                "",
                f"{_cell(spec.summary)} ({spec.kind}; runs on {', '.join(spec.devices)}).{needs}",
                "",
                *_options_table(spec),
            ]
        if family.extras:
            lines += [
                f"Rows of the {family.name} family also record:",
                "",
                *(f"- `{extra.name}`: {_cell(extra.help)}" for extra in family.extras),
                "",
            ]
    lines += [
        "## Presets",
        "",
        "Published sizes, run beside the grid by a config's `presets` key; every row records its preset and "
        "parameter count.",
        "",
        "| preset | kind | built from | d_model | heads | layers | what it is |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for preset in PRESETS.values():
        lines.append(
            f"| `{preset.name}` | {preset.kind} | {preset.model or 'presets.core'} | {preset.d_model} "
            f"| {preset.heads or '—'} | {preset.layers} | {_cell(preset.summary)} |"
        )
    return "\n".join([*lines, ""])


# -------------------------------------------------------------------------------------------- exit codes, columns
def exit_codes_page() -> str:
    lines = [
        "# Exit codes",
        "",
        GENERATED_NOTE.format(source="`attnbench.core.errors.EXIT_CODES`"),
        "Every command exits with one of these; a CI step can branch on them (`compare` exits 1 on a regression, "
        "3 when the runs cannot be compared, 4 without a baseline).",
        "",
        "| code | meaning |",
        "| --- | --- |",
        *(f"| `{code}` | {_cell(meaning)} |" for code, meaning in sorted(EXIT_CODES.items())),
        f"| `128 + N` | {_cell(EXIT_SIGNAL)} |",
        "",
    ]
    return "\n".join(lines)


_SUFFIX_UNITS = (
    ("_ms", "ms"),
    ("_mib", "MiB"),
    ("_bytes", "bytes"),
    ("_pct", "%"),
    ("_mhz", "MHz"),
    ("_w", "W"),
    ("_j", "J"),
    ("_c", "°C"),
    ("_s", "s"),
)
_NAMED_UNITS = {
    "tokens_per_s": "tokens/s",
    "joules_per_token": "J/token",
    "tflops": "TFLOP/s",
    "gbps": "GB/s",
    "pct_of_peak_bw": "%",
    "arithmetic_intensity": "FLOP/byte",
}


def column_unit(column: str) -> str:
    """A column's unit: named in its suffix (the house rule), or declared with the row extra it comes from."""
    if column in _NAMED_UNITS or column.endswith("_tflops"):
        return _NAMED_UNITS.get(column, "TFLOP/s")
    if column.endswith("pct_of_peak"):
        return "%"
    for suffix, unit in _SUFFIX_UNITS:
        if column.endswith(suffix):
            return unit
    extra = declared().get(column)
    return extra.unit if extra is not None else ""


def column_meaning(column: str) -> str:
    extra = declared().get(column)
    return COLUMN_MEANINGS.get(column) or (extra.help if extra is not None else "")


def columns_page() -> str:
    lines = [
        "# summary.csv columns",
        "",
        GENERATED_NOTE.format(source="`attnbench.report.rows.COLUMNS` and the types and meanings declared with it"),
        "One row per case, in this column order; `attnbench report RUN -f csv` prints the same. Columns are only "
        "ever added at the end, never renamed or removed, so a script that reads columns by name keeps working. An "
        "empty cell is a value that does not apply or could not be measured (the row's `reason` or "
        "`telemetry_note` says which). The Python API's `frame()` has the same columns, typed.",
        "",
        "| # | column | type | unit | what it says |",
        "| --- | --- | --- | --- | --- |",
    ]
    for number, column in enumerate(COLUMNS, start=1):
        kind = COLUMN_TYPES[column].__name__
        lines.append(f"| {number} | `{column}` | {kind} | {column_unit(column)} | {_cell(column_meaning(column))} |")
    return "\n".join([*lines, ""])


# ---------------------------------------------------------------------------------------------- the hook itself
def included(path: str, title: str) -> Callable[[], str]:
    """A repository file shown as a page: its text, under a note saying where it lives."""

    def page() -> str:
        text = (ROOT / path).read_text(encoding="utf-8")
        body = text.split("\n", 1)[1] if text.startswith("# ") else text
        return f'# {title}\n\n!!! note "From the repository"\n    This page is `{path}` as committed.\n{body}'

    return page


PAGES: dict[str, Callable[[], str]] = {
    "reference/cli.md": cli_page,
    "reference/config.md": config_page,
    "reference/models.md": models_page,
    "reference/exit-codes.md": exit_codes_page,
    "reference/summary-csv.md": columns_page,
    "explanation/architecture.md": included("ARCHITECTURE.md", "Architecture"),
    "measurements.md": included("results/README.md", "Measurements"),
    "changelog.md": included("CHANGELOG.md", "Changelog"),
}


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    for uri, render in PAGES.items():
        # The committed stub at this path (what a reader browsing the repository on GitHub finds, instead of a
        # 404) gives way to the generated page.
        stub = files.get_file_from_path(uri)
        if stub is not None:
            files.remove(stub)
        files.append(File.generated(config, uri, content=render()))
    return files
