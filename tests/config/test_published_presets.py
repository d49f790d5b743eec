"""Published models' token mixers as presets (issue 49): cited data, cased at each scope, counted as their
config.json's arithmetic says, refused at validation when they cannot fit. No torch here: validation is torch-free.

A preset whose mixers need a model or option of a family this release lacks (kda, mla, sinks) is skipped with the
reason; its test runs once that family is in the catalogue."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import yaml

from attnbench.config import options as config_options
from attnbench.config.experiment import load_experiment_text
from attnbench.core.errors import ConfigError
from attnbench.families.catalogue import PRESET_NAMES, PUBLISHED, family_of, published_layer, published_problem
from attnbench.families.flops import count_parameters
from attnbench.families.hybrid.spec import stack_of
from attnbench.families.state_bytes import state_bytes

NAMES = tuple(PUBLISHED)


def config(presets: dict[str, Any], **top: Any) -> str:
    base: dict[str, Any] = {
        "name": "published",
        "device": "cpu",
        "models": ["lstm"],
        "modes": ["forward"],
        "grid": {"batch": [1], "seq_len": [512, 1024]},
        "d_model": 16,
        "presets": presets,
    }
    return yaml.safe_dump({**base, **top})


def available(name: str) -> None:
    problem = published_problem(PUBLISHED[name], ("sdpa",))
    if problem is not None:
        pytest.skip(f"{name}: {problem} (runs once that family is merged)")


def layer_parameters(name: str, label: str) -> int:
    layer = published_layer(PUBLISHED[name], label, "sdpa")
    count = family_of(layer).parameters(layer)
    assert count is not None
    return count


def test_every_named_model_of_the_issue_is_a_preset_with_its_source() -> None:
    wanted = {"llama3.1-8b", "qwen3-next-80b-a3b", "kimi-linear-48b-a3b", "nemotron-h-8b", "falcon-h1-7b"}
    wanted |= {"gpt-oss-20b", "mamba2-2.7b", "deepseek-v3"}
    assert wanted <= set(PRESET_NAMES) and any(n.startswith("rwkv7-") for n in PRESET_NAMES)
    for preset in PUBLISHED.values():
        assert preset.source.startswith("huggingface.co/") and "config.json" in preset.source
        assert str(preset.d_model) in preset.fields
        assert sum(preset.count(m.label) for m in preset.mixers) >= preset.layers  # every layer runs a mixer
        assert all(preset.count(m.label) for m in preset.mixers)


def test_llama_attention_is_its_q_k_v_o_projections() -> None:
    """Llama-3.1-8B: hidden 4096, 32 heads of 128, 8 key/value heads, no biases: q and o 4096·4096, k and v
    4096·1024 each."""
    assert layer_parameters("llama3.1-8b", "attention") == 4096 * 4096 * 2 + 2 * 4096 * 8 * 128 == 41_943_040


def test_the_other_layers_are_their_configs_arithmetic() -> None:
    # Qwen3-Next's gated attention: q_proj 2048 → 2·16·256 (query and gate), k and v 2048 → 2·256, o 4096 → 2048,
    # q_norm and k_norm 256 each.
    assert layer_parameters("qwen3-next-80b-a3b", "full_attention") == (
        2048 * 2 * 16 * 256 + 2 * 2048 * 2 * 256 + 16 * 256 * 2048 + 2 * 256
    )
    # Qwen3-Next's Gated DeltaNet: in_proj_qkvz 2048 → 2·16·128 + 2·32·128, in_proj_ba 2048 → 2·32, the conv over
    # q, k and v (2·2048 + 4096 channels × 4 taps, no bias), A_log and dt_bias (32 each), the norm's 128,
    # out_proj 4096 → 2048.
    assert layer_parameters("qwen3-next-80b-a3b", "linear_attention") == (
        2048 * (2 * 16 * 128 + 2 * 32 * 128) + 2048 * 64 + 8192 * 4 + 2 * 32 + 128 + 4096 * 2048
    )
    # Mamba-2 2.7B (mamba_ssm's layout): in_proj 2560 → 2·5120 + 2·128 + 80, conv (5120 + 256)·4 + bias, dt_bias,
    # A_log, D (80 each), the gated norm's 5120, out_proj 5120 → 2560.
    assert layer_parameters("mamba2-2.7b", "Mamba2") == (
        2560 * (2 * 5120 + 2 * 128 + 80) + (5120 + 256) * 5 + 3 * 80 + 5120 + 5120 * 2560
    )
    # Nemotron-H-8B's Mamba-2: in_proj 4096 → 18560 (2·8192 + 2·8·128 + 128), as its published weights are shaped.
    assert layer_parameters("nemotron-h-8b", "M") == (4096 * 18560 + (8192 + 2048) * 5 + 3 * 128 + 8192 + 8192 * 4096)
    assert layer_parameters("nemotron-h-8b", "*") == 4096 * 4096 * 2 + 2 * 4096 * 1024
    # Falcon-H1-7B: attention 12 heads of 128 (q 3072 → 1536), 2 key/value heads, no biases.
    assert layer_parameters("falcon-h1-7b", "attention") == 3072 * 1536 * 2 + 2 * 3072 * 256
    # RWKV-7 2.9B, its first layer (fla's layout): r, k, v, o 2560², the decay and a LoRAs of 96, the gate's of 320.
    assert layer_parameters("rwkv7-2.9b", "time_mix") == 4 * 2560**2 + 2 * 2560 * (96 + 96 + 320) + 13 * 2560


@pytest.mark.parametrize("name", NAMES)
def test_each_preset_cases_one_layer_of_each_mixer_at_scope_core(name: str) -> None:
    available(name)
    experiment = load_experiment_text(config({"names": [name]}, causal=True), "t.yaml")
    cases = [c for c in experiment.cases("cpu") if ("preset", name) in c.options]
    preset = PUBLISHED[name]
    assert len({(c.model, c.options) for c in cases}) == len(preset.mixers)
    assert all(c.layers == 1 and c.d_model == preset.d_model and c.causal for c in cases)
    assert {c.seq_len for c in cases} == {512, 1024}


@pytest.mark.parametrize("name", NAMES)
def test_each_preset_decodes_and_asks_the_serving_questions(name: str) -> None:
    available(name)
    text = config({"names": [name]}, causal=True, modes=["forward", "decode", "capacity"], memory_budget="4GiB")
    cases = [c for c in load_experiment_text(text, "t.yaml").cases("cpu") if ("preset", name) in c.options]
    assert {c.mode for c in cases} == {"forward", "decode", "capacity"}
    assert all(state_bytes(c) is not None for c in cases if c.mode == "decode")


@pytest.fixture
def roomy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine with memory enough for any published model's weights, whatever the one running the tests has."""
    monkeypatch.setattr(config_options, "host_memory_bytes", lambda: 2**50)


@pytest.mark.usefixtures("roomy")
def test_a_single_mixer_model_runs_whole_at_scope_model() -> None:
    text = config({"names": ["mamba2-2.7b"], "scope": "model", "seq_len": [16]}, dtype="bfloat16")
    (case,) = load_experiment_text(text, "t.yaml").cases("cpu")[-1:]
    assert case.layers == 64 and dict(case.options)["scope"] == "model" and dict(case.options)["vocab"] == 50277
    # 64 layers and their LayerNorms, the 50277-row embedding and the final LayerNorm
    assert count_parameters(case) == 64 * (layer_parameters("mamba2-2.7b", "Mamba2") + 2 * 2560) + 50277 * 2560 + 5120


def test_a_model_too_big_for_the_memory_there_is_is_refused_with_its_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_options, "host_memory_bytes", lambda: 8 * 2**30)
    text = config({"names": ["llama3.1-8b"], "scope": "model", "seq_len": [16]}, causal=True)
    with pytest.raises(ConfigError) as refused:
        load_experiment_text(text, "t.yaml")
    assert refused.value.key == "presets.names[0]"
    assert "GiB" in refused.value.problem and "parameters" in refused.value.problem
    monkeypatch.setattr(config_options, "host_memory_bytes", lambda: 64 * 2**40)
    assert load_experiment_text(text, "t.yaml").cases("cpu")
    # memory_budget, where given, is the memory there is
    budgeted = config({"names": ["llama3.1-8b"], "scope": "model", "seq_len": [16]}, causal=True, memory_budget="1GiB")
    with pytest.raises(ConfigError):
        load_experiment_text(budgeted, "t.yaml")


def test_a_fixed_size_preset_has_no_other_scope() -> None:
    with pytest.raises(ConfigError) as fixed:
        load_experiment_text(config({"names": ["lstm-110m"], "scope": "core"}), "t.yaml")
    assert fixed.value.key == "presets.scope"


@pytest.mark.usefixtures("roomy")
@pytest.mark.parametrize("name", [n for n in NAMES if len(PUBLISHED[n].mixers) > 1])
def test_a_mixed_model_at_scope_model_is_a_hybrid_stack_of_its_mixers_in_the_published_order(name: str) -> None:
    available(name)
    text = config({"names": [name], "scope": "model", "seq_len": [16]}, causal=True, dtype="bfloat16")
    (case,) = [c for c in load_experiment_text(text, "t.yaml").cases("cpu") if c.model == name and c.mode == "forward"]
    preset = PUBLISHED[name]
    stack = stack_of(case)
    assert case.layers == preset.layers and stack.pattern == preset.pattern
    assert {m.label for m in stack.members} == {m.label for m in preset.mixers}
    # the decode state of the whole stack: each mixer's layer state times how many layers it is
    decode = replace(case, mode="decode", seq_len=1000)
    expected = 0
    for mixer in preset.mixers:
        layer = replace(published_layer(preset, mixer.label, "sdpa"), mode="decode", seq_len=1000, dtype="bfloat16")
        layers = sum(
            preset.pattern[i % len(preset.pattern)].split("+").count(mixer.label) for i in range(preset.layers)
        )
        expected += layers * (state_bytes(layer) or 0)
    assert state_bytes(decode) == expected


def test_a_preset_needing_a_family_this_release_lacks_is_refused_at_its_name() -> None:
    missing = [name for name in NAMES if published_problem(PUBLISHED[name], ("sdpa",)) is not None]
    if not missing:
        pytest.skip("every preset's families are in this release")
    with pytest.raises(ConfigError) as refused:
        load_experiment_text(config({"names": ["llama3.1-8b", missing[0]]}, causal=True), "t.yaml")
    assert refused.value.key == "presets.names[1]"


def test_a_serving_question_only_the_presets_ask_is_refused() -> None:
    text = config({"names": ["llama3.1-8b"], "modes": ["capacity"]}, causal=True)
    with pytest.raises(ConfigError) as refused:
        load_experiment_text(text, "t.yaml")
    assert refused.value.key == "presets.modes"


@pytest.mark.parametrize("name", NAMES)
def test_scope_block_puts_each_mixer_in_its_block(name: str) -> None:
    available(name)
    text = config({"names": [name], "scope": "block"}, causal=True)
    cases = [c for c in load_experiment_text(text, "t.yaml").cases("cpu") if ("preset", name) in c.options]
    assert cases and all(dict(c.options)["scope"] == "block" and c.layers == 1 for c in cases)
    assert len({(c.model, c.options) for c in cases}) == len(PUBLISHED[name].mixers)
