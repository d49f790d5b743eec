"""The editor schema (``attnbench schema``, committed as configs/attnbench.schema.json): in step with the code,
named by every shipped config, accepting what the loader accepts and refusing what it can state."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from attnbench.config.experiment import load_experiment_text
from attnbench.config.schema import MODELINE, REGENERATE, SCHEMA_FILE, config_schema, render_schema
from attnbench.core.cases import TimingPolicy
from attnbench.core.errors import ConfigError
from attnbench.families.catalogue import MODEL_NAMES, MODELS
from tests.support import ROOT, tiny_config

CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
BUILTINS = sorted((ROOT / "attnbench" / "config" / "builtin").glob("*.yaml"))
COMMITTED = ROOT / "configs" / SCHEMA_FILE


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = config_schema()
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def test_the_committed_schema_is_the_codes() -> None:
    # Config keys are added on several branches at once: whoever merges regenerates the file, so say how.
    assert COMMITTED.is_file(), f"configs/{SCHEMA_FILE} is missing; create it with: {REGENERATE}"
    assert COMMITTED.read_text(encoding="utf-8") == render_schema(), (
        f"configs/{SCHEMA_FILE} differs from the config model in attnbench/config; regenerate it with: {REGENERATE}"
    )


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_config_names_the_schema_on_its_first_line(path: Path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first == MODELINE, f"{path.name} must start with: {MODELINE}"
    assert (path.parent / first.split("$schema=", 1)[1]).resolve() == COMMITTED.resolve()


@pytest.mark.parametrize("path", [*CONFIGS, *BUILTINS], ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_schema_accepts_every_shipped_config(path: Path, validator: Draft202012Validator) -> None:
    problems = [f"{e.json_path}: {e.message}" for e in validator.iter_errors(yaml.safe_load(path.read_text()))]
    assert not problems, problems


def _tiny(**changes: Any) -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(tiny_config(**changes))
    return config


ACCEPTED = {
    "one value where a list is allowed": _tiny(models="lstm", dtype="float32", grid={"batch": 2, "seq_len": 16}),
    "tokens instead of batch": _tiny(grid={"tokens": 64, "seq_len": [8, 16]}),
    "telemetry off, read by YAML 1.1 as false": _tiny(telemetry=False),
    "a device index": _tiny(device="cuda:1"),
    "presets as a list": _tiny(presets=["bert-base"]),
    "presets as a mapping": _tiny(presets={"names": ["lstm-110m"], "batch": [1]}),
    "crossed model options": _tiny(model_options={"sdpa-flash": {"scope": "block", "positional": ["none", "rope"]}}),
    "a model you bring": _tiny(
        models=["lstm", {"name": "my-rnn", "factory": "json:loads", "kind": "recurrent", "options": {"width": [1, 2]}}]
    ),
}

REFUSED = {
    "unknown key": _tiny(modells=["lstm"]),
    # A plugin may name its model anything a name can be, so the schema refuses only what no name can be.
    "a name no model can have": _tiny(models=["LSTM model"]),
    "a model you bring without its kind": _tiny(models=[{"name": "my-rnn", "factory": "json:loads"}]),
    "unknown mode": _tiny(modes=["inference"]),
    "unknown dtype": _tiny(dtype=["fp16"]),
    "bad device": _tiny(device="gpu"),
    "bad name": _tiny(name="My Sweep!"),
    "a model listed twice": _tiny(models=["lstm", "lstm"]),
    "batch and tokens": _tiny(grid={"batch": [2], "tokens": 64, "seq_len": [8]}),
    "neither batch nor tokens": _tiny(grid={"seq_len": [8]}),
    "a string for a number": _tiny(grid={"batch": [2], "seq_len": ["16"]}),
    "seq_len above the cap": _tiny(grid={"batch": [2], "seq_len": [2**23]}),
    "an unknown timing key": _tiny(timing={"target_cl": 0.01}),
    "an unknown cache policy": _tiny(timing={"cache": "lukewarm"}),
    "an unknown option": _tiny(model_options={"lstm": {"bidirectonal": True}}),
    "an option's unknown choice": _tiny(model_options={"lstm": {"scope": "layer"}}),
    "an option of the wrong type": _tiny(model_options={"lstm": {"bidirectional": "yes"}}),
    "an unknown preset": _tiny(presets=["gpt-2"]),
}


@pytest.mark.parametrize("config", ACCEPTED.values(), ids=ACCEPTED.keys())
def test_what_the_loader_accepts_the_schema_accepts(config: dict[str, Any], validator: Draft202012Validator) -> None:
    load_experiment_text(yaml.safe_dump(config), "test.yaml")  # the authority says yes
    assert not [e.message for e in validator.iter_errors(config)]


@pytest.mark.parametrize("config", REFUSED.values(), ids=REFUSED.keys())
def test_the_schema_refuses_what_it_can_state(config: dict[str, Any], validator: Draft202012Validator) -> None:
    with pytest.raises(ConfigError):
        load_experiment_text(yaml.safe_dump(config), "test.yaml")  # the authority says no
    assert list(validator.iter_errors(config)), "the schema let it through"


def _keys(schema: dict[str, Any], node: dict[str, Any], path: str) -> list[tuple[str, dict[str, Any]]]:
    found = []
    for key, child in node.get("properties", {}).items():
        found.append((f"{path}{key}", child))
        for option in [child, *child.get("anyOf", [])]:
            ref = option.get("$ref", "")
            if ref.startswith("#/$defs/"):
                found += _keys(schema, schema["$defs"][ref.rsplit("/", 1)[1]], f"{path}{key}.")
    return found


def test_every_key_has_a_description_an_editor_can_show() -> None:
    schema = config_schema()
    missing = [path for path, node in _keys(schema, schema, "") if not node.get("description")]
    assert not missing, (
        f"no description for {', '.join(missing)}: write a docstring under the field in attnbench/config/"
        f"experiment.py (it becomes the description), then regenerate: {REGENERATE}"
    )
    options = schema["properties"]["model_options"]["properties"]
    assert list(options) == list(MODEL_NAMES)
    for name, spec in MODELS.items():
        assert set(options[name]["properties"]) == {o.name for o in spec.options} - {"preset"}


def test_closed_sets_are_enums_and_defaults_are_the_models() -> None:
    schema = config_schema()
    top = schema["properties"]
    one, many = top["models"]["anyOf"]
    for entry in (one, many["items"]):
        name, bring, hybrid = entry["oneOf"]
        assert name["anyOf"][0]["enum"] == list(MODEL_NAMES)  # and any name an installed plugin gives its model
        assert bring == {"$ref": "#/$defs/UserModelEntry"} and hybrid == {"$ref": "#/$defs/HybridEntry"}
    members = schema["$defs"]["HybridEntry"]["properties"]["hybrid"]["items"]
    assert members["enum"] == list(MODEL_NAMES)  # a hybrid's blocks are built-in models
    assert {"auto", "cpu", "cuda"} <= set(top["device"]["anyOf"][0]["enum"])
    timing = schema["$defs"]["TimingModel"]["properties"]
    assert {k: v["default"] for k, v in timing.items()} == asdict(TimingPolicy())  # every field, stored or not
    assert json.loads(render_schema()) == schema
