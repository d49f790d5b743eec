"""Hybrid stacks: blocks of built-in models cycling through a pattern. Every count is its members' sum, the stack
decodes as its members do, its state grows with n only through its attention members, and a config that asks for
a stack its members cannot make is refused with one error line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.config.experiment import load_experiment_text
from attnbench.core.cases import Case
from attnbench.core.errors import EXIT_BAD_INPUT, ConfigError
from attnbench.families.catalogue import HYBRID, cannot_build, family_of, kind_of
from attnbench.families.flops import count_flops
from attnbench.families.hybrid.spec import HybridModel, stack_of
from attnbench.families.registry import build_model, parameter_count, probe
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import decodable, prefill, tensor_bytes
from attnbench.results.records import Result

runner = CliRunner()
PATTERNS = {
    "3to1": ("mamba2", "mamba2", "mamba2", "sdpa-flash"),
    "mixed": ("lstm", "vanilla", "linear-attn"),
}


def hybrid_case(pattern: tuple[str, ...], *, mode: str = "forward", layers: int | None = None, **kw: object) -> Case:
    sizes: dict[str, object] = {"dtype": "float64", "batch": 2, "seq_len": 12, "d_model": 32, "heads": 4}
    sizes.update(kw)
    return Case(
        "stack", mode, str(sizes["dtype"]), "cpu", int(sizes["batch"]), int(sizes["seq_len"]),  # type: ignore[arg-type]
        int(sizes["d_model"]), int(sizes["heads"]), layers or len(pattern), True,  # type: ignore[arg-type]
        (), HybridModel(pattern).definition(),
    )  # fmt: skip


@pytest.mark.parametrize("name", list(PATTERNS))
def test_the_counts_are_the_members_sums(name: str) -> None:
    case = hybrid_case(PATTERNS[name], layers=2 * len(PATTERNS[name]))
    members = HYBRID.members(case)
    assert [m.model for m in members] == list(PATTERNS[name]) * 2
    total = sum(count_flops(m).flops for m in members)
    assert count_flops(case).flops == total and count_flops(case).formula == "hybrid-v1"
    model = build_model(case, "cpu", torch.float64)
    assert parameter_count(model) == family_of(case).parameters(case)
    assert kind_of(case) == "hybrid" and cannot_build(case) is None and probe(case, "cpu") is None


@pytest.mark.parametrize("name", list(PATTERNS))
def test_a_step_after_a_prefill_is_the_whole_sequence_at_every_position(name: str) -> None:
    case = hybrid_case(PATTERNS[name])
    torch.manual_seed(0)
    model = build_model(case, "cpu", torch.float64).eval()
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    with torch.no_grad():
        whole = model(x)
        for n in (1, 5, 11):
            state = prefill(model, x[:, :n], n + 1)
            step = decodable(model).step(x[:, n : n + 1], state)
            torch.testing.assert_close(step, whole[:, n : n + 1], rtol=1e-9, atol=1e-9)
            decode = replace(case, mode="decode", seq_len=n)
            assert tensor_bytes(state) == state_bytes(decode)  # the formula is the allocated state


def test_the_state_grows_with_n_only_through_the_attention_members() -> None:
    case = hybrid_case(PATTERNS["3to1"], mode="decode", layers=8)
    short, long = state_bytes(replace(case, seq_len=64)), state_bytes(replace(case, seq_len=4096))
    attention = [m for m in HYBRID.members(case) if m.model == "sdpa-flash"]
    growth = sum(
        state_bytes(replace(m, seq_len=4096)) - state_bytes(replace(m, seq_len=64))  # type: ignore[operator]
        for m in attention
    )
    assert short is not None and long is not None and long - short == growth > 0
    recurrent_only = hybrid_case(("mamba2", "lstm"), mode="decode")
    assert state_bytes(replace(recurrent_only, seq_len=64)) == state_bytes(replace(recurrent_only, seq_len=4096))


def test_a_stored_hybrid_row_reads_back_without_the_config() -> None:
    case = hybrid_case(PATTERNS["3to1"])
    row = Result(case, "unsupported", reason="why")
    back = Result.from_dict(json.loads(json.dumps(row.to_dict())))
    assert back.case == case and back.case.definition == case.definition and kind_of(back.case) == "hybrid"
    data = row.to_dict()
    data["case"]["hybrid"]["pattern"] = ["mamba2", "no-such-model"]
    with pytest.raises(Exception, match="pattern"):
        Result.from_dict(data)


CONFIG = """\
name: hybrid
models: [lstm, {{name: m2-3to1, hybrid: [mamba2, mamba2, mamba2, sdpa-flash]{kind}}}, sdpa-flash]
modes: {modes}
grid: {{batch: [2], seq_len: [16, 32]}}
d_model: 32
heads: 4
layers: {layers}
causal: {causal}
"""


def config(*, layers: int = 4, causal: str = "true", modes: str = "[forward, decode]", kind: str = "") -> str:
    return CONFIG.format(layers=layers, causal=causal, modes=modes, kind=kind)


def test_a_config_crosses_a_hybrid_like_a_model() -> None:
    experiment = load_experiment_text(config(), "hybrid.yaml")
    stacks = [c for c in experiment.cases("cpu") if c.model == "m2-3to1"]
    assert len(stacks) == 4 and all(stack_of(c) == HybridModel(PATTERNS["3to1"]) and c.heads == 4 for c in stacks)
    sided = load_experiment_text(config(kind=", kind: recurrent"), "hybrid.yaml").cases("cpu")
    assert {kind_of(c) for c in sided if c.model == "m2-3to1"} == {"recurrent"}


@pytest.mark.parametrize(
    ("text", "key"),
    [
        (config(layers=2), "models[1]"),  # two layers leave a member out
        (config(causal="false", modes="[decode]"), "causal"),  # an attention member cannot decode non-causally
        (config().replace("mamba2, mamba2, mamba2", "mamba2, mambaa2, mamba2"), "models[1].hybrid[1]"),
        (config().replace("name: m2-3to1", "name: lstm"), "models[1].name"),
    ],
    ids=["short", "non-causal-decode", "unknown-member", "built-in-name"],
)
def test_a_hybrid_its_members_cannot_make_is_refused_at_its_key(text: str, key: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_experiment_text(text, "hybrid.yaml")
    assert info.value.key == key
    path = tmp_path / "hybrid.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["validate", str(path)])
    assert (
        result.exit_code == EXIT_BAD_INPUT
        and sum(line.startswith("error:") for line in result.output.splitlines()) == 1
    )


def test_models_lists_a_configs_hybrid_with_its_pattern(tmp_path: Path) -> None:
    path = tmp_path / "hybrid.yaml"
    path.write_text(config())
    result = runner.invoke(app, ["models", str(path), "--device", "cpu", "--format", "json"])
    assert result.exit_code == 0, result.output
    stack = next(m for m in json.loads(result.stdout)["models"] if m["name"] == "m2-3to1")
    assert stack["family"] == "hybrid" and stack["kind"] == "hybrid" and stack["available"] is True
    assert stack["pattern"] == list(PATTERNS["3to1"]) and "scope" in stack["options"]


def test_a_hybrid_is_bounded_by_its_members_launch_limits() -> None:
    """Every block runs at the stack's batch: the tightest member's grid cap bounds a capacity search (issue 48)."""
    from attnbench.families.registry import launch_limit

    limit = launch_limit(hybrid_case(PATTERNS["3to1"], heads=16), "cuda")
    assert limit is not None and limit.batch == 65_535 // 16
    assert launch_limit(hybrid_case(PATTERNS["mixed"]), "cuda") is None  # vanilla's matmuls: no grid cap
    assert launch_limit(hybrid_case(PATTERNS["3to1"]), "cpu") is None
