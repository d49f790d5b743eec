"""The JSON Schema of a config, for editors: completion, hover text and marks on a wrong key as one types.

``config_schema()`` is pydantic's schema of ``ConfigModel`` (its field docstrings are the descriptions) with what
pydantic cannot see from the types added: a list key also takes a single value (the ``_as_list`` validator), the
closed sets are enums (models, modes, dtypes, devices, presets, and each model's options from the catalogue),
and YAML 1.1's ``off`` (read as false) is a telemetry level. The loader stays the authority: the schema helps an
editor; ``attnbench validate`` decides, with checks that span keys (heads divide d_model, the case cap) that a
schema cannot state.

``configs/attnbench.schema.json`` is this schema, committed so that the ``# yaml-language-server: $schema=…``
line at the top of every shipped config finds it; ``attnbench schema -o configs/attnbench.schema.json``
regenerates it, and a test fails while it differs from the code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

# The package's own validators, recognised by identity to say what they accept.
from attnbench.config.model import MAX_NAME_LEN, NAME, ConfigModel, as_list, preset_names, yaml_off
from attnbench.core.cases import DTYPES, MODES
from attnbench.families.catalogue import MODEL_NAMES, MODELS, PRESET_CORES, PRESET_NAMES, OptionSpec

DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_FILE = "attnbench.schema.json"  # in configs/, beside the configs that name it
MODELINE = f"# yaml-language-server: $schema=./{SCHEMA_FILE}"
REGENERATE = f"attnbench schema -o configs/{SCHEMA_FILE}"
DEVICES = ("auto", "cpu", "cuda")


class _EditorSchema(GenerateJsonSchema):
    """pydantic's generator, told what the config's before-validators accept."""

    def function_before_schema(self, schema: core_schema.BeforeValidatorFunctionSchema) -> JsonSchemaValue:
        inner = super().function_before_schema(schema)
        function = schema["function"]["function"]
        if function is as_list:
            # One value where a list is allowed means a one-element list; a value listed twice is refused.
            return {"anyOf": [inner["items"], {**inner, "uniqueItems": True}]} if "items" in inner else inner
        if function is yaml_off:
            return {"anyOf": [inner, {"const": False, "description": "a bare YAML off, read as false: off"}]}
        if function is preset_names:
            names = _one_or_many({"type": "string", "enum": list(PRESET_NAMES)})
            return {"anyOf": [names, *inner.get("anyOf", [inner])]}
        return inner

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False  # "Seq Len" beside seq_len says nothing; the description does


def config_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of an attnbench config."""
    schema = ConfigModel.model_json_schema(schema_generator=_EditorSchema)
    top = schema["properties"]
    top["name"].update(pattern=f"^{NAME.pattern}$", maxLength=MAX_NAME_LEN)
    top["device"] = {
        "description": top["device"]["description"],
        "default": top["device"]["default"],
        "anyOf": [{"enum": list(DEVICES)}, {"type": "string", "pattern": r"^cuda:[0-9]+$"}],
    }
    _restrict(top["models"], MODEL_NAMES, plugins=True)
    _restrict(schema["$defs"]["HybridEntry"]["properties"]["hybrid"], MODEL_NAMES)
    _restrict(top["modes"], MODES)
    _restrict(top["dtype"], DTYPES)
    top["model_options"].update(_model_options())
    # grid: batch sizes to cross, or tokens to tie batch to seq_len; exactly one of them.
    schema["$defs"]["GridModel"]["anyOf"] = [
        {"required": [given], "properties": {given: {"not": {"type": "null"}}, other: {"type": "null"}}}
        for given, other in (("batch", "tokens"), ("tokens", "batch"))
    ]
    presets = schema["$defs"]["PresetsModel"]["properties"]
    _restrict(presets["names"], PRESET_NAMES)
    _restrict(presets["core"], PRESET_CORES)
    _restrict(presets["modes"], MODES)
    _tidy(schema)
    return {"$schema": DIALECT, **schema, "title": "attnbench experiment"}


def render_schema() -> str:
    """The schema as the committed file holds it: indented JSON, keys in the models' order, a final newline."""
    return json.dumps(config_schema(), indent=2, ensure_ascii=False) + "\n"


def _one_or_many(item: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [item, {"type": "array", "items": item, "minItems": 1}]}


def _restrict(node: Any, allowed: Sequence[str], *, plugins: bool = False) -> None:
    """Every string the node takes (itself, in its anyOf/oneOf, in its items) becomes one of ``allowed``; with
    ``plugins``, or any name an installed plugin may give its model."""
    if isinstance(node, dict):
        if node.get("type") == "string":
            if plugins:
                node.pop("type")
                node["anyOf"] = [
                    {"enum": list(allowed)},
                    {"type": "string", "pattern": f"^{NAME.pattern}$", "description": "an installed plugin's model"},
                ]
                return
            else:
                node["enum"] = list(allowed)
        for key in ("anyOf", "oneOf", "items"):
            for child in node.get(key, []) if key != "items" else [node.get(key)]:
                _restrict(child, allowed, plugins=plugins)


def _option_schema(option: OptionSpec) -> dict[str, Any]:
    kind = {bool: "boolean", int: "integer", float: "number", str: "string"}[option.type]
    value: dict[str, Any] = {"type": kind}
    if option.choices is not None:
        value["enum"] = list(option.choices)
    if option.minimum is not None:
        value["minimum"] = option.minimum
    if option.maximum is not None:
        value["maximum"] = option.maximum
    return {"description": option.help, "default": option.default, **_one_or_many(value)}


def _model_options() -> dict[str, Any]:
    """model_options from the catalogue: each model's own options, with their types, choices and ranges (an
    installed plugin's model takes the options its plugin declares, which the schema cannot know)."""
    return {
        "type": "object",
        "additionalProperties": {"type": "object", "description": "options of an installed plugin's model"},
        "properties": {
            name: {
                "type": "object",
                "description": f"options of {name}: {spec.summary}",
                "additionalProperties": False,
                # `preset` is set by the top-level presets key, never written here.
                "properties": {o.name: _option_schema(o) for o in spec.options if o.name != "preset"},
            }
            for name, spec in MODELS.items()
        },
    }


def _tidy(node: Any) -> None:
    """Descriptions on one line (a docstring's line breaks are the source's, not the text's); a list's minItems
    moved onto the array it is about; an anyOf nested in an anyOf flattened."""
    if isinstance(node, list):
        for child in node:
            _tidy(child)
        return
    if not isinstance(node, dict):
        return
    for child in node.values():
        _tidy(child)
    if isinstance(node.get("description"), str):
        node["description"] = " ".join(node["description"].split())
    if "anyOf" in node:
        if "minItems" in node:
            least = node.pop("minItems")
            for option in node["anyOf"]:
                if option.get("type") == "array":
                    option["minItems"] = least
        flat: list[Any] = []
        for option in node["anyOf"]:
            flat += option["anyOf"] if set(option) == {"anyOf"} else [option]
        node["anyOf"] = flat
