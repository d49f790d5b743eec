"""The published presets through the CLI (issue 49): listed with their source and per-layer parameters, refused
at validate with their size when they cannot fit, and the committed presets-cpu config dry-runs with an estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.config import options as config_options
from attnbench.families.catalogue import PUBLISHED
from tests.support import ROOT

runner = CliRunner()


def test_models_lists_every_preset_with_its_source_and_parameters_per_layer() -> None:
    result = runner.invoke(app, ["models", "--format", "json"])
    assert result.exit_code == 0, result.output
    listed = {entry["name"]: entry for entry in json.loads(result.output)["presets"]}
    assert set(listed) == set(PUBLISHED)
    llama = listed["llama3.1-8b"]
    assert "config.json" in llama["source"] and llama["available"] is True
    (attention,) = llama["mixers"]
    assert attention["layers"] == 32 and attention["parameters_per_layer"] == 41_943_040
    qwen = {m["label"]: m["layers"] for m in listed["qwen3-next-80b-a3b"]["mixers"]}
    assert qwen == {"linear_attention": 36, "full_attention": 12}
    assert {m["layers"] for m in listed["falcon-h1-7b"]["mixers"]} == {44}  # side by side in every layer
    for entry in listed.values():
        assert entry["available"] == (entry["reason"] is None)


def test_validate_refuses_a_preset_too_big_for_the_machine_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(config_options, "host_memory_bytes", lambda: 4 * 2**30)
    path = tmp_path / "big.yaml"
    path.write_text(
        "name: big\ndevice: cpu\nmodels: [lstm]\ncausal: true\ngrid: {batch: [1], seq_len: [16]}\nd_model: 16\n"
        "presets: {names: [mamba2-2.7b], scope: model}\n"
    )
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "presets.names[0]" in errors[0]
    assert "Traceback" not in result.output


def test_the_presets_cpu_config_dry_runs_with_an_estimate() -> None:
    result = runner.invoke(app, ["sweep", str(ROOT / "configs" / "presets-cpu.yaml"), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "dry run" in result.output and "estimate" in result.output
