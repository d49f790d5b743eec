"""Block and model scope: shapes, gradients, every core equal on the same weights, parameter counts (analytic =
built; BERT-base against its published decomposition; the 110 M recurrent presets matched to it), presets and
option sets in configs, the probe, and a scope-model case run end to end by the executor."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn

from attnbench.config.experiment import load_experiment_text, stored_experiment
from attnbench.core.cases import Case, Mode
from attnbench.core.errors import ConfigError
from attnbench.families import registry
from attnbench.families.blocks import RecurrentBlock, TransformerBlock
from attnbench.families.catalogue import MODELS, PRESET_CORE_DEFAULT, PRESETS, option_of
from attnbench.families.flops import attention_block_parameters, count_parameters
from attnbench.families.minrnn.spec import FAMILY as MINRNN
from attnbench.families.registry import build_model, make_input, parameter_count, probe
from attnbench.families.rnn.spec import FAMILY as RNN
from tests.support import quick_policy

F64 = torch.float64
CPU_ATTENTION = ("vanilla", "sdpa-math", "sdpa-flash", "sdpa")
RECURRENT = ("lstm", "gru", "mingru", "minlstm")


def case(
    model: str,
    scope: str = "block",
    *,
    mode: Mode = "train",
    dtype: str = "float64",
    seq_len: int = 12,
    d_model: int = 32,
    layers: int = 2,
    causal: bool = False,
    **options: Any,
) -> Case:
    chosen = {"scope": scope, **options}
    if scope == "model":
        chosen.setdefault("vocab", 97)
    recurrent = model in RECURRENT
    heads = None if recurrent else 4
    items = tuple(sorted((k, v) for k, v in chosen.items() if v != MODELS[model].option(k).default))  # type: ignore[union-attr]
    causal = (not options.get("bidirectional", False)) if recurrent else causal
    return Case(model, mode, dtype, "cpu", 2, seq_len, d_model, heads, layers, causal, items)


def seeded(this: Case, dtype: torch.dtype = F64) -> nn.Module:
    torch.manual_seed(0)
    return build_model(this, "cpu", dtype)


# --- shapes and gradients ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("scope", ["block", "model"])
@pytest.mark.parametrize("model", [*RECURRENT, *CPU_ATTENTION])
def test_shapes_and_every_parameter_gets_a_gradient(model: str, scope: str) -> None:
    this = case(model, scope)
    module = seeded(this)
    x = make_input(this, "cpu", F64)
    if scope == "model":
        assert x.dtype == torch.int64 and x.shape == (2, 12) and int(x.min()) >= 0 and int(x.max()) < 97
    else:
        assert x.shape == (2, 12, 32) and x.dtype == F64
    out = module(x)
    assert out.shape == (2, 12, 32) and out.dtype == F64
    out.square().mean().backward()
    for name, parameter in module.named_parameters():
        assert parameter.grad is not None and torch.isfinite(parameter.grad).all(), name


@pytest.mark.parametrize("model", ["vanilla", "lstm"])
def test_scope_model_ends_in_a_layer_norm(model: str) -> None:
    out = seeded(case(model, "model"))(make_input(case(model, "model"), "cpu", F64))
    torch.testing.assert_close(out.mean(-1), torch.zeros(2, 12, dtype=F64), atol=1e-10, rtol=0)
    torch.testing.assert_close(out.var(-1, unbiased=False), torch.ones(2, 12, dtype=F64), atol=1e-3, rtol=0)


def test_blocks_are_residual() -> None:
    """With the mixing layer's output projections zeroed, a pre-norm block passes its input through unchanged."""
    x = torch.randn(2, 12, 32, dtype=F64)
    attention = seeded(case("vanilla", layers=1))
    block = attention[0]
    assert isinstance(block, TransformerBlock)
    with torch.no_grad():
        for linear in (block.attention.out, block.ffn.down):  # type: ignore[union-attr]
            linear.weight.zero_()
            linear.bias.zero_()
    torch.testing.assert_close(attention(x), x)
    recurrent = seeded(case("lstm", layers=1, match="params"))
    rblock = recurrent[0]
    assert isinstance(rblock, RecurrentBlock) and rblock.projection is not None
    with torch.no_grad():
        rblock.projection.weight.zero_()
        rblock.projection.bias.zero_()
    torch.testing.assert_close(recurrent(x), x)


# --- every core is the same function in a block -----------------------------------------------------------------
@pytest.mark.parametrize("positional", ["none", "rope", "learned"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("scope", ["block", "model"])
@pytest.mark.parametrize("model", [m for m in CPU_ATTENTION if m != "vanilla"])
def test_cores_agree_in_blocks(model: str, scope: str, causal: bool, positional: str) -> None:
    reference = case("vanilla", scope, causal=causal, positional=positional)
    candidate = replace(reference, model=model)
    x = make_input(reference, "cpu", F64)
    outputs, grads = [], []
    for this in (reference, candidate):
        module = seeded(this)
        inp = x if scope == "model" else x.clone().requires_grad_(True)
        out = module(inp)
        out.square().sum().backward()
        outputs.append(out.detach())
        grads.append({name: p.grad for name, p in module.named_parameters()})
    torch.testing.assert_close(outputs[1], outputs[0], atol=1e-10, rtol=1e-10)
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-9, rtol=1e-9, msg=name)


# --- parameter counts -------------------------------------------------------------------------------------------
COUNTED = [
    *(
        case(m, scope, **pos)
        for m in CPU_ATTENTION[:1]
        for scope in ("core", "block", "model")
        for pos in ({}, {"positional": "learned"}, {"positional": "rope"}, {"ffn_mult": 2})
        if not (scope == "core" and "ffn_mult" in pos)
    ),
    *(
        case(m, scope, **extra)
        for m in RECURRENT
        for scope in ("core", "block", "model")
        for extra in ({}, {"match": "params"}, {"positional": "learned", "max_len": 40})
        if not (scope == "core" and "match" in extra)
    ),
    *(
        case(m, scope, bidirectional=True, d_model=64, **extra)
        for m in ("lstm", "gru")
        for scope in ("core", "block")
        for extra in ({}, {"match": "params"})
        if not (scope == "core" and extra)
    ),
    case("lstm", "core", layers=3, bidirectional=True),
]


@pytest.mark.parametrize(
    "this", COUNTED, ids=[c.key.split("|", 1)[0] + "|" + ",".join(f"{k}={v}" for k, v in c.options) for c in COUNTED]
)
def test_analytic_parameter_count_is_the_built_one(this: Case) -> None:
    assert parameter_count(build_model(this, "meta", torch.float32)) == count_parameters(this)


def bert_model_published() -> int:
    """bert-base-uncased's BertModel, tensor by tensor (its config: vocab 30522, 512 positions, 2 token types,
    hidden 768, 12 layers, intermediate 3072): 109,482,240, which the paper's "110M" rounds."""
    d, ffn, vocab, positions, types, layers = 768, 3072, 30522, 512, 2, 12
    embeddings = (vocab + positions + types) * d + 2 * d  # word, position, token-type tables, LayerNorm
    layer = 4 * (d * d + d) + 2 * d + (d * ffn + ffn) + (ffn * d + d) + 2 * d  # Q K V O, LN, FFN, LN
    pooler = d * d + d
    return embeddings + layers * layer + pooler


def preset_case(name: str, seq_len: int = 128) -> Case:
    preset = PRESETS[name]
    return Case(
        preset.model or "sdpa",
        "train",
        "float32",
        "cpu",
        1,
        seq_len,
        preset.d_model,
        preset.heads,
        preset.layers,
        preset.kind == "recurrent",
        preset.options,
    )


def test_bert_base_is_bert_base_less_pooler_and_segment_embeddings(capsys: pytest.CaptureFixture[str]) -> None:
    published = bert_model_published()
    assert published == 109_482_240
    bert = preset_case("bert-base")
    ours = parameter_count(build_model(bert, "meta", torch.float32))
    assert ours == count_parameters(bert)
    # What we leave out: the pooler (a Linear on [CLS], used by the classification heads, not by the encoder's
    # hidden states) and the 2 token-type rows (a constant added to every token of a one-segment input).
    assert ours == published - (768 * 768 + 768) - 2 * 768 == 108_890_112
    assert abs(ours - published) / published < 0.01  # 0.54 % below; 1.01 % below the rounded 110 M
    # The table has BERT's 512 positions at any seq_len up to 512.
    assert count_parameters(replace(bert, seq_len=512)) == ours
    with capsys.disabled():
        print(f"\nbert-base: {ours:,} parameters (BertModel {published:,} less pooler and segment embeddings)")


@pytest.mark.parametrize(("name", "hidden"), [("lstm-110m", 936), ("mingru-110m", 3072)])
def test_recurrent_presets_match_bert_base(name: str, hidden: int, capsys: pytest.CaptureFixture[str]) -> None:
    bert = count_parameters(preset_case("bert-base"))
    this = preset_case(name)
    ours = parameter_count(build_model(this, "meta", torch.float32))
    assert ours == count_parameters(this)
    assert (RNN if this.model in ("lstm", "gru") else MINRNN).matched_hidden(this.model, 768, 1, 4) == hidden
    assert abs(ours - bert) / bert < 0.01
    with capsys.disabled():
        print(f"\n{name}: {ours:,} parameters vs bert-base {bert:,} ({(ours - bert) / bert:+.2%})")


@pytest.mark.parametrize(("model", "bidirectional"), [*((m, False) for m in RECURRENT), ("lstm", True), ("gru", True)])
def test_matched_blocks_are_within_one_percent(model: str, bidirectional: bool) -> None:
    for d_model in (64, 256, 768, 1024):
        extra = {"bidirectional": True} if bidirectional else {}
        this = case(model, "block", d_model=d_model, layers=1, match="params", **extra)
        target = attention_block_parameters(d_model, 4)
        assert abs(count_parameters(this) - target) <= 0.01 * target, d_model


# --- the probe --------------------------------------------------------------------------------------------------
def test_probe_builds_a_small_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether bert-base's kernels run does not need 110 M parameters: one layer, a 64-token vocabulary."""
    built: list[Case] = []
    real = registry.build_model

    def spy(this: Case, device: str, dtype: torch.dtype) -> nn.Module:
        built.append(this)
        return real(this, device, dtype)

    monkeypatch.setattr(registry, "build_model", spy)
    assert probe(preset_case("bert-base", 512), "cpu") is None
    (tiny,) = built
    assert (tiny.layers, tiny.seq_len, tiny.d_model, tiny.heads) == (1, 16, 768, 12)
    assert option_of(tiny, "vocab") == 64 and option_of(tiny, "max_len") == 16 and option_of(tiny, "scope") == "model"


@pytest.mark.parametrize("mode", ["forward", "train", "backward"])
def test_probe_passes_token_id_models(mode: Mode) -> None:
    assert probe(case("sdpa-flash", "model", mode=mode, dtype="float32"), "cpu") is None
    assert probe(case("gru", "model", mode=mode, dtype="float32"), "cpu") is None


def test_probe_refuses_an_unreachable_match() -> None:
    reason = probe(case("lstm", "block", d_model=4, match="params"), "cpu")
    assert reason is not None and "within 1%" in reason


# --- the executor runs a scope-model case -----------------------------------------------------------------------
@pytest.mark.parametrize("model", ["sdpa-flash", "lstm"])
@pytest.mark.parametrize("mode", ["forward", "train"])
@pytest.mark.slow
def test_executor_runs_token_id_models(model: str, mode: Mode) -> None:
    from attnbench.timing.executor import ExecutorSettings
    from attnbench.timing.torch_executor import TorchExecutor

    policy = quick_policy(min_samples=3, max_samples=5, min_time_s=0.001, max_case_s=0.5, warmup_max_s=0.05)
    this = replace(case(model, "model", mode=mode, dtype="float32", layers=1), batch=1, seq_len=8)
    result = TorchExecutor(ExecutorSettings("cpu", policy, telemetry="off")).run(this)
    assert result.status == "ok", result.reason
    assert result.parameters == count_parameters(this)
    assert result.extra["flops_formula"] == ("transformer-model-v1" if model == "sdpa-flash" else "lstm-model-v1")


# --- config: presets and option sets ----------------------------------------------------------------------------
CONFIG = """\
name: test
models: [lstm, vanilla]
modes: [forward]
grid:
  batch: [2]
  seq_len: [8, 16]
d_model: 64
heads: 4
"""


def load(extra: str, text: str = CONFIG) -> Any:
    return load_experiment_text(text + extra, "test.yaml")


def test_presets_add_fixed_size_cases_after_the_grid() -> None:
    experiment = load(
        "presets:\n  names: [bert-base, lstm-110m]\n  core: [sdpa-flash, vanilla]\n  modes: [train]\n"
        "  batch: 1\n  seq_len: [64, 128]\n"
    )
    cases = experiment.cases("cpu")
    grid, presets = cases[:4], cases[4:]
    assert {c.d_model for c in grid} == {64} and all(option_of(c, "preset") == "none" for c in grid)
    assert [(c.model, option_of(c, "preset"), c.seq_len) for c in presets] == [
        ("sdpa-flash", "bert-base", 64),
        ("sdpa-flash", "bert-base", 128),
        ("vanilla", "bert-base", 64),
        ("vanilla", "bert-base", 128),
        ("lstm", "lstm-110m", 64),
        ("lstm", "lstm-110m", 128),
    ]
    bert, lstm = presets[0], presets[-1]
    assert (bert.mode, bert.batch, bert.d_model, bert.heads, bert.layers, bert.causal) == (
        "train",
        1,
        768,
        12,
        12,
        False,
    )
    assert dict(bert.options) == {"max_len": 512, "positional": "learned", "preset": "bert-base", "scope": "model"}
    assert (lstm.heads, lstm.layers, lstm.causal) == (None, 12, True)
    assert dict(lstm.options) == {"match": "params", "preset": "lstm-110m", "scope": "model"}
    again = load("", text=__import__("yaml").safe_dump(experiment.resolved))
    assert again.sha256 == experiment.sha256 and again.cases("cpu") == cases


def test_presets_inherit_the_grid_and_do_not_change_other_configs() -> None:
    plain = load("")
    assert "presets" not in plain.resolved  # so every config written before presets keeps its sha256
    cases = load("presets: {names: [mingru-110m]}\n").cases("cpu")
    assert [(c.model, c.mode, c.batch, c.seq_len) for c in cases[-2:]] == [
        ("mingru", "forward", 2, 8),
        ("mingru", "forward", 2, 16),
    ]


def test_a_list_of_names_is_short_for_presets_names() -> None:
    short, full = load("presets: [bert-base, lstm-110m]\n"), load("presets: {names: [bert-base, lstm-110m]}\n")
    assert short.cases("cpu") == full.cases("cpu") and short.sha256 == full.sha256
    assert option_of(load("presets: bert-base\n").cases("cpu")[-1], "preset") == "bert-base"
    with pytest.raises(ConfigError, match="unknown preset 'bert'") as info:
        load("presets: [bert]\n")
    assert info.value.where == "test.yaml:9" and "'bert-base'" in info.value.hint  # the preset it meant


def test_option_lists_cross_and_drop_what_has_no_effect() -> None:
    experiment = load(
        "model_options:\n  vanilla: {scope: [core, block, model], vocab: 1000}\n"
        "  lstm: {scope: [core, block], match: params}\n"
    )
    variants = list(dict.fromkeys((c.model, c.options) for c in experiment.cases("cpu")))
    assert variants == [
        ("lstm", ()),
        ("lstm", (("match", "params"), ("scope", "block"))),
        ("vanilla", ()),
        ("vanilla", (("scope", "block"),)),
        ("vanilla", (("scope", "model"), ("vocab", 1000))),
    ]
    assert experiment.resolved["model_options"]["vanilla"] == {"scope": ["core", "block", "model"], "vocab": 1000}


BAD = [
    (
        "model_options:\n  vanilla: {scope: layer}",
        "scope 'layer' is not one of: core, block, model",
        "model_options.vanilla.scope",
        "",
    ),
    (
        "model_options:\n  vanilla: {scope: [core, core]}",
        "scope value 'core' is listed twice",
        "model_options.vanilla.scope[1]",
        "",
    ),
    ("model_options:\n  vanilla: {scope: []}", "must not be empty", "model_options.vanilla.scope", ""),
    (
        "model_options:\n  vanilla: {vocab: 1000}",
        "vocab has no effect on vanilla here",
        "model_options.vanilla.vocab",
        "scope: model",
    ),
    (
        "model_options:\n  lstm: {ffn_mult: 2, scope: block}",
        "ffn_mult has no effect on lstm",
        "model_options.lstm.ffn_mult",
        "match: params",
    ),
    (
        "model_options:\n  vanilla: {ffn_mult: 0, scope: block}",
        "must be an integer from 1 to 64, got 0",
        "model_options.vanilla.ffn_mult",
        "",
    ),
    ("model_options:\n  vanilla: {scope: 2}", "must be one of core, block, model", "model_options.vanilla.scope", ""),
    (
        "model_options:\n  vanilla: {preset: bert-base}",
        "not a model option",
        "model_options.vanilla.preset",
        "presets: {names: [bert-base",
    ),
    (
        "model_options:\n  lstm: {scope: block, match: params}\nd_model: 8",
        "no hidden width for lstm at d_model 8",
        "model_options.lstm.match",
        "match: hidden",
    ),
    ("presets: {names: [bert-large]}", "unknown preset 'bert-large'", "presets.names[0]", "did you mean 'bert-base'?"),
    ("presets: {names: [bert-base], core: lstm}", "lstm cannot build a preset", "presets.core", "sdpa-flash"),
    (
        "presets: {names: [bert-base], core: flash-atn}",
        "unknown model 'flash-atn'",
        "presets.core",
        "did you mean 'flash-attn'?",
    ),
    ("presets: {names: [lstm-110m], core: vanilla}", "presets.core has no effect", "presets.core", "bert-base"),
    (
        "presets: {names: [bert-base], seq_len: [256, 1024]}",
        "bert-base has 512 learned positions; seq_len 1024",
        "presets.seq_len[1]",
        "up to 512",
    ),
    ("presets: {names: [bert-base], modes: [infer]}", "unknown mode 'infer'", "presets.modes[0]", ""),
    ("presets: {names: [bert-base], batch: 0}", "must be a positive integer", "presets.batch", ""),
    ("presets: {name: [bert-base]}", "unknown key 'name'", "presets.name", "did you mean 'names'?"),
]


@pytest.mark.parametrize(("extra", "message", "key", "hint"), BAD, ids=[b[2] + ":" + b[1][:20] for b in BAD])
def test_config_errors_say_where_and_what(extra: str, message: str, key: str, hint: str) -> None:
    text = CONFIG.replace("d_model: 64\n", "") if "d_model" in extra else CONFIG
    with pytest.raises(ConfigError) as info:
        load(extra + "\n", text)
    assert message in info.value.message
    assert info.value.key == key
    assert info.value.where.startswith("test.yaml:")
    assert hint in info.value.hint


def test_a_resolved_presets_section_reads_back_when_no_preset_uses_its_core() -> None:
    """A resolved config spells the default core out: a stored run of own-model presets must read back."""
    experiment = load("presets: {names: [lstm-110m]}\n")
    assert experiment.resolved["presets"]["core"] == list(PRESET_CORE_DEFAULT)
    again = stored_experiment(experiment.resolved, "again")
    assert again.sha256 == experiment.sha256


def test_presets_need_a_batch_when_the_grid_has_tokens() -> None:
    text = CONFIG.replace("  batch: [2]\n", "  tokens: 64\n")
    with pytest.raises(ConfigError, match="presets need batch sizes") as info:
        load("presets: {names: [bert-base]}\n", text)
    assert info.value.key == "presets"
    assert len(load("presets: {names: [bert-base], batch: 1}\n", text).cases("cpu")) == 4 + 2


# --- CUDA (skipped without one) ---------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
class TestCudaBlocks:
    """The fused kernels agree with vanilla inside a block, cuDNN runs the recurrent blocks, the presets train."""

    @pytest.mark.parametrize("positional", ["none", "rope"])
    @pytest.mark.parametrize("model", ["sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flash-attn", "sdpa"])
    def test_cores_agree_in_a_block(self, model: str, positional: str) -> None:
        this = replace(
            case(model, "block", dtype="float16", d_model=128, seq_len=64, positional=positional), device="cuda"
        )
        reason = probe(this, "cuda")
        if reason is not None:
            pytest.skip(reason)
        x = torch.randn(2, 64, 128, device="cuda", dtype=torch.float16)
        torch.manual_seed(0)
        reference = build_model(replace(this, model="vanilla"), "cuda", torch.float16).float()
        torch.manual_seed(0)
        fused = build_model(this, "cuda", torch.float16)
        torch.testing.assert_close(fused(x).float(), reference(x.float()), atol=2e-2, rtol=2e-2)

    @pytest.mark.parametrize("model", RECURRENT)
    @pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
    def test_recurrent_blocks_train(self, model: str, dtype: str) -> None:
        this = replace(case(model, "block", dtype=dtype, d_model=256, match="params"), device="cuda")
        assert probe(this, "cuda") is None
        module = build_model(this, "cuda", getattr(torch, dtype))
        module(make_input(this, "cuda", getattr(torch, dtype))).float().square().mean().backward()
        assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in module.parameters())

    @pytest.mark.parametrize("name", sorted(PRESETS))
    def test_presets_train_a_step(self, name: str) -> None:
        this = replace(preset_case(name, 128), device="cuda", dtype="float16")
        if PRESETS[name].model is None:
            this = replace(this, model="sdpa-flash")
        assert probe(this, "cuda") is None
        module = build_model(this, "cuda", torch.float16)
        assert parameter_count(module) == count_parameters(this)
        out = module(make_input(this, "cuda", torch.float16))
        out.float().square().mean().backward()
        assert torch.isfinite(out).all()
