"""attnbench.config.experiment: YAML → Experiment, and every way a config can be wrong. No torch anywhere here."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench.config.experiment import (
    MAX_CASES,
    Experiment,
    TimingModel,
    builtin_config_text,
    load_experiment,
    load_experiment_text,
    parse_override,
)
from attnbench.core.cases import MODES, TimingPolicy
from attnbench.core.errors import ConfigError
from attnbench.families.catalogue import MODEL_NAMES, has_option, option_of
from tests.support import BAD_CONFIGS, ROOT, heads_kv_of, mentions, numbers, tiny_config

BAD = BAD_CONFIGS
BUILTIN = ROOT / "attnbench" / "config" / "builtin"
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))

BASE = """\
name: test
models: [lstm, vanilla]
modes: [forward, train]
grid:
  batch: [2]
  seq_len: [8, 16, 32]
d_model: 16
heads: 2
"""


def load(text: str = BASE, overrides: tuple[str, ...] = ()) -> Experiment:
    return load_experiment_text(text, "test.yaml", overrides)


def fields(cases: list[Any], *names: str) -> list[tuple[Any, ...]]:
    return [tuple(getattr(c, n) for n in names) for c in cases]


# ------------------------------------------------------------------------------------------------ grid
def test_cross_product_is_model_major_with_seq_len_innermost() -> None:
    cases = load().cases("cpu")
    assert len(cases) == 2 * 2 * 3
    assert fields(cases, "model", "mode", "seq_len") == [
        (m, mode, n) for m in ("lstm", "vanilla") for mode in ("forward", "train") for n in (8, 16, 32)
    ]
    assert {c.device for c in cases} == {"cpu"}
    assert all(c.heads is None for c in cases if c.model == "lstm")
    assert all(c.heads == 2 for c in cases if c.model == "vanilla")


def test_recurrent_models_are_not_repeated_over_causal_or_heads() -> None:
    text = BASE.replace("modes: [forward, train]", "modes: [forward]").replace("heads: 2", "heads: [2, 4]")
    cases = load(text + "causal: [false, true]\n").cases("cpu")
    lstm = [c for c in cases if c.model == "lstm"]
    vanilla = [c for c in cases if c.model == "vanilla"]
    assert len(lstm) == 3 and all(c.causal for c in lstm)  # unidirectional ⇒ causal, once per length
    assert len(vanilla) == 2 * 2 * 3
    assert len(set(cases)) == len(cases)


def test_scalars_become_one_element_lists() -> None:
    text = (
        BASE.replace("[lstm, vanilla]", "gru")
        .replace("[forward, train]", "train")
        .replace("[8, 16, 32]", "64")
        .replace("[2]", "3")
    )
    experiment = load(text)
    assert experiment.axes.models == ("gru",)
    assert experiment.axes.modes == ("train",)
    assert experiment.axes.seq_len == (64,)
    assert experiment.axes.batch == (3,)
    assert experiment.axes.dtypes == ("float32",)
    assert experiment.resolved["grid"]["seq_len"] == [64]


def test_axes_may_sit_under_grid_as_lists() -> None:
    text = BASE.replace("d_model: 16\nheads: 2\n", "").replace(
        "  seq_len: [8, 16, 32]", "  seq_len: [8]\n  d_model: [16, 32]\n  heads: [2, 4]\n  layers: [1, 2]"
    )
    cases = load(text).cases("cpu")
    vanilla = [c for c in cases if c.model == "vanilla"]
    assert {(c.d_model, c.heads, c.layers) for c in vanilla} == {
        (d, h, n) for d in (16, 32) for h in (2, 4) for n in (1, 2)
    }
    assert len([c for c in cases if c.model == "lstm"]) == 2 * 2 * 2  # modes × d_model × layers


def test_defaults_fill_in_what_is_left_out() -> None:
    experiment = load("name: tiny\nmodels: [gru]\ngrid: {batch: 1, seq_len: 8}\n")
    assert experiment.device == "auto"
    assert experiment.axes.modes == ("forward", "train")  # backward is opt-in: it exists to check train
    assert experiment.axes.d_model == (512,) and experiment.axes.layers == (1,)
    # forward and train are both timed warm by default: the experiment and its resolved config say so, as they did
    assert experiment.timing == TimingPolicy(cache="warm")
    assert experiment.threads is None and experiment.seed == 0
    # Every field (to_dict, the stored form, leaves out the defaults that runs from before them lack), but rounds:
    # added after configs were pinned by their sha256, it is resolved only off its default.
    assert experiment.resolved["timing"] == {
        k: v for k, v in asdict(TimingPolicy(cache="warm")).items() if k != "rounds"
    }


def test_grid_tokens_ties_batch_to_seq_len_in_model_major_order() -> None:
    text = BASE.replace("  batch: [2]", "  tokens: 64").replace("modes: [forward, train]", "modes: [forward]")
    experiment = load(text + "causal: [false, true]\n")
    cases = experiment.cases("cuda:0")
    assert fields(cases, "model", "causal", "seq_len", "batch") == [
        ("lstm", True, 8, 8),
        ("lstm", True, 16, 4),
        ("lstm", True, 32, 2),
        ("vanilla", False, 8, 8),
        ("vanilla", False, 16, 4),
        ("vanilla", False, 32, 2),
        ("vanilla", True, 8, 8),
        ("vanilla", True, 16, 4),
        ("vanilla", True, 32, 2),
    ]
    assert all(c.tokens == 64 for c in cases)
    assert experiment.tokens == 64 and experiment.axes.batch == (8, 4, 2)
    assert experiment.resolved["grid"]["tokens"] == 64 and "batch" not in experiment.resolved["grid"]


def test_cases_take_the_resolved_device() -> None:
    experiment = load(BASE + "device: cuda\n")
    assert experiment.device == "cuda" and experiment.axes.device == "cuda"
    assert {c.device for c in experiment.cases("cuda:1")} == {"cuda:1"}


def test_model_options_reach_the_cases_and_defaults_do_not_change_keys() -> None:
    on = load(BASE + "model_options:\n  lstm: {bidirectional: true}\n").cases("cpu")
    explicit_default = load(BASE + "model_options:\n  lstm: {bidirectional: false}\n").cases("cpu")
    plain = load().cases("cpu")
    lstm = [c for c in on if c.model == "lstm"]
    assert all(option_of(c, "bidirectional") is True and c.causal is False for c in lstm)
    assert all(c.options == () for c in on if c.model == "vanilla")
    assert [c.key for c in explicit_default] == [c.key for c in plain]


# ------------------------------------------------------------------------------------------- overrides
def test_parse_override_reads_yaml_values() -> None:
    assert parse_override("grid.seq_len=[64,128]") == (["grid", "seq_len"], [64, 128])
    assert parse_override("timing.target_ci=0.02") == (["timing", "target_ci"], 0.02)
    assert parse_override("device=cuda:1") == (["device"], "cuda:1")
    assert parse_override("causal=true") == (["causal"], True)
    assert parse_override("threads=null") == (["threads"], None)
    assert parse_override("description=a=b") == (["description"], "a=b")


def test_overrides_replace_nested_keys_and_create_sections() -> None:
    experiment = load(
        overrides=(
            "grid.seq_len=[64,128]",
            "timing.max_case_s=2",
            "name=other",
            "model_options.lstm.bidirectional=true",
        )
    )
    assert experiment.axes.seq_len == (64, 128)
    assert experiment.timing.max_case_s == 2.0
    assert experiment.name == "other"
    assert experiment.resolved["model_options"] == {"lstm": {"bidirectional": True}}


@pytest.mark.parametrize(
    ("override", "expected", "key"),
    [
        ("grid.seq_len", "expected key.path=value", ""),
        ("grid..seq_len=1", "bad key path", ""),
        ("grid.seq_lenn=[1]", "unknown key 'seq_lenn'", "grid.seq_lenn"),
        ("colour=red", "unknown key 'colour'", "colour"),
        ("timing.bogus.deep=1", "unknown key 'bogus'", "timing.bogus"),
        ("grid.seq_len=[1, 0]", "must be a positive integer", "grid.seq_len[1]"),
        ("name.first=x", "not a mapping", "name"),
        ("grid.seq_len=[1", "invalid YAML", "grid.seq_len"),
        ("grid.seq_len={a: 1}", "must be an integer, got a mapping", "grid.seq_len"),
        ("models=&a [*a]", "must be a string, got a list", "models[0]"),
        (
            "models=!!python/object/apply:os.system [ls]",
            "tags that construct objects are not allowed",
            "models",
        ),
    ],
)
def test_bad_overrides_name_the_flag(override: str, expected: str, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        load(overrides=(override,))
    assert expected in info.value.message
    assert info.value.where == "--set"
    assert info.value.key == key


# -------------------------------------------------------------------------------------------- identity
def test_resolved_and_sha256_are_stable_and_track_values() -> None:
    a, b = load(), load()
    assert a.resolved == b.resolved and a.sha256 == b.sha256
    assert re.fullmatch(r"[0-9a-f]{64}", a.sha256)
    assert load(overrides=("grid.seq_len=[8,16,64]",)).sha256 != a.sha256
    assert load(overrides=("timing.target_ci=0.02",)).sha256 != a.sha256
    under_grid = "  seq_len: [8, 16, 32]\n  d_model: 16"
    moved = BASE.replace("d_model: 16\n", "").replace("  seq_len: [8, 16, 32]", under_grid)
    assert load(moved).sha256 == a.sha256  # where an axis is written does not matter
    assert load(BASE + "# a comment\ntiming: {}\n").sha256 == a.sha256


def test_resolved_is_itself_a_valid_config() -> None:
    for path in CONFIGS:
        experiment = load_experiment(path)
        again = load(yaml.safe_dump(experiment.resolved))
        assert again.sha256 == experiment.sha256
        assert again.cases("cpu") == experiment.cases("cpu")


def test_timing_model_matches_timing_policy() -> None:
    assert list(TimingModel.model_fields) == list(TimingPolicy.__dataclass_fields__)
    assert TimingPolicy(**TimingModel().model_dump()) == TimingPolicy()


# --------------------------------------------------------------------------------------------- shipped
@pytest.mark.parametrize("device_type", ["cpu", "cuda", "cuda:1"])
def test_builtin_defaults_load(device_type: str) -> None:
    experiment = load_experiment(None, device_type=device_type)
    kind = device_type.split(":")[0]
    assert experiment.source == f"builtin:default-{kind}"
    assert set(experiment.axes.modes) == {"forward", "train"}
    assert {"lstm", "vanilla", "sdpa-flash"} <= set(experiment.axes.models)
    assert len(experiment.cases(kind)) == (36 if kind == "cpu" else 96)


def test_builtin_default_takes_overrides_and_refuses_unknown_device_types() -> None:
    experiment = load_experiment(None, ["grid.seq_len=[64]"], device_type="cpu")
    assert experiment.axes.seq_len == (64,)
    with pytest.raises(ValueError, match="mps"):
        builtin_config_text("mps")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_validate(path: Path) -> None:
    experiment = load_experiment(path)
    assert 0 < len(experiment.cases("cuda:0")) <= 10_000
    assert experiment.name == path.stem or path.stem.startswith("default")


def test_shipped_defaults_are_copies_of_the_builtins() -> None:
    """Byte for byte, but for the editor's schema line the copy in configs/ starts with (config.schema)."""
    from attnbench.config.schema import MODELINE

    for copy, builtin in (("default.yaml", "default-cpu.yaml"), ("default-cuda.yaml", "default-cuda.yaml")):
        text = (ROOT / "configs" / copy).read_text(encoding="utf-8")
        assert text == f"{MODELINE}\n" + (BUILTIN / builtin).read_text(encoding="utf-8")
    assert builtin_config_text("cpu") == (BUILTIN / "default-cpu.yaml").read_text(encoding="utf-8")


@pytest.mark.parametrize("path", [*CONFIGS, *sorted(BUILTIN.glob("*.yaml"))], ids=lambda p: p.name)
def test_every_key_in_a_shipped_config_has_a_comment(path: Path) -> None:
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if re.match(r"\s*(- )?[a-z_]+(:|$)", line):
            assert "#" in line, f"{path.name}:{number} has no comment: {line!r}"


def test_gpu_seq_sweep_moves_16k_tokens_per_call() -> None:
    cases = load_experiment(ROOT / "configs" / "gpu-seq-sweep.yaml").cases("cuda")
    assert {c.tokens for c in cases} == {16384}
    assert {c.head_dim for c in cases if c.heads} == {64, 128}


def test_config_does_not_import_torch() -> None:
    code = (
        "import sys, attnbench.config.experiment as c; c.load_experiment(None); "
        "sys.exit('torch' in sys.modules or 'pynvml' in sys.modules)"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    assert subprocess.run([sys.executable, "-c", code], env=env, check=False).returncode == 0


# ------------------------------------------------------------------------------------------- bad input
# file → (text the message must hold, key path, line or None when the error names the file alone)
BAD_CASES: dict[str, tuple[str, str, int | None]] = {
    "syntax-unclosed-list.yaml": ("invalid YAML", "", 3),
    "syntax-tab.yaml": ("invalid YAML", "", 4),
    "two-documents.yaml": ("another document", "", 2),
    "python-tag.yaml": ("tags that construct objects are not allowed", "", 2),
    "bad-scalar-tag.yaml": ("invalid YAML value", "", None),
    "not-utf8.yaml": ("not UTF-8", "", None),
    "empty.yaml": ("top level is empty", "", None),
    "top-level-list.yaml": ("not a mapping", "", None),
    "duplicate-key.yaml": ("appears twice (lines 6 and 7)", "grid.seq_len", 7),
    "cyclic-alias.yaml": ("nests deeper than", "grid.seq_len[0]…", None),
    "alias-bomb.yaml": ("more than 100000 values", "", None),
    "unknown-key-top.yaml": ("unknown key 'modells'; allowed keys here: name, description", "modells", 2),
    "unknown-key-grid.yaml": (
        "unknown key 'seq_lenn'; allowed keys here: batch, tokens, seq_len",
        "grid.seq_lenn",
        6,
    ),
    "unknown-key-timing.yaml": ("unknown key 'target_cl'", "timing.target_cl", 10),
    "missing-name.yaml": ("required key 'name' is missing", "name", None),
    "missing-seq-len.yaml": ("required key 'seq_len' is missing", "grid.seq_len", 4),
    "missing-batch.yaml": ("grid needs batch", "grid", 4),
    "wrong-type-string.yaml": ("must be an integer, got the string '128'", "grid.seq_len[1]", 6),
    "wrong-type-bool.yaml": ("must be an integer, got true (a boolean)", "grid.batch", 5),
    "wrong-type-float.yaml": ("must be an integer, got 64.0", "d_model", 7),
    "wrong-type-grid.yaml": ("must be a mapping, got a list", "grid", 4),
    "seed-float.yaml": ("must be an integer", "seed", 9),
    "zero-seq-len.yaml": ("must be a positive integer", "grid.seq_len[2]", 6),
    "negative-batch.yaml": ("must be a positive integer", "grid.batch", 5),
    "threads-zero.yaml": ("must be a positive integer", "threads", 9),
    "seq-len-over-cap.yaml": ("at most 4194304", "grid.seq_len[1]", 6),
    "too-many-cases.yaml": ("expands to 12800 cases; the cap is 10000", "grid", 5),
    "empty-seq-len.yaml": ("must not be empty", "grid.seq_len", 6),
    "empty-models.yaml": ("must not be empty", "models", 2),
    "heads-not-dividing.yaml": ("heads 6 does not divide d_model 64", "heads", 8),
    "unknown-model.yaml": ("unknown model 'lsmt'; valid: lstm, gru", "models[0]", 2),
    "duplicate-model.yaml": ("model 'lstm' is listed twice", "models[2]", 2),
    "unknown-mode.yaml": ("unknown mode 'inference'; valid: forward, train, backward", "modes[1]", 3),
    "unknown-dtype.yaml": ("unknown dtype 'fp16'; valid: float32", "dtype", 9),
    "bad-device.yaml": ("device 'gpu' is not one of auto, cpu, cuda, cuda:N", "device", 9),
    "bad-name.yaml": ("name 'My Sweep!' is not allowed", "name", 1),
    "axis-given-twice.yaml": ("layers is given both at the top level and under grid", "grid.layers", 7),
    "batch-and-tokens.yaml": ("grid.batch and grid.tokens exclude each other", "grid.tokens", 6),
    "tokens-not-divisible.yaml": ("seq_len 64 does not divide grid.tokens 1000", "grid.seq_len[0]", 6),
    "bidirectional-odd.yaml": ("d_model must be even; 63 is odd", "model_options.lstm.bidirectional", 10),
    "option-unknown.yaml": (
        "unknown option 'bidirectonal' for lstm; its options: bidirectional",
        "model_options.lstm.bidirectonal",
        10,
    ),
    "option-wrong-type.yaml": (
        "must be true or false, got the string 'yes'",
        "model_options.lstm.bidirectional",
        10,
    ),
    "option-model-not-listed.yaml": ("'gru', which is not in models", "model_options.gru", 10),
    "timing-out-of-range.yaml": ("strictly between 0 and 1", "timing.target_ci", 10),
    "timing-max-below-min.yaml": ("max_samples 20 is below min_samples 50", "timing.max_samples", 11),
    "timing-min-time-above-budget.yaml": ("min_time_s 5.0 is above max_case_s 1.0", "timing.min_time_s", 10),
    "timing-cache-unknown.yaml": ("'warm' or 'cold'", "timing.cache", 8),
    "timing-processes-zero.yaml": ("must be at least 1, got 0", "timing.processes", 8),
    "decode-not-causal.yaml": ("sdpa cannot decode: causal is false", "causal", 9),
    "decode-bidirectional.yaml": (
        "a bidirectional lstm reads the sequence backwards",
        "model_options.lstm.bidirectional",
        11,
    ),
    "decode-mode-and-section.yaml": ("decode is listed under modes and has a decode: section too", "decode", 10),
    "decode-model-not-listed.yaml": ("'gru' is not in models (lstm, sdpa)", "decode.models[1]", 10),
    "decode-learned-max-len.yaml": ("max_len 512 does not reach position 512", "model_options.sdpa.max_len", 11),
    "decode-preset-encoder.yaml": ("bert-base is an encoder", "presets.names", 8),
    "heads-kv-not-dividing.yaml": ("heads_kv 3 does not divide heads 4", "heads_kv[0]", 9),
    "heads-kv-option-not-dividing.yaml": ("heads_kv 8 does not divide heads 4", "model_options.sdpa.heads_kv", 10),
    "heads-kv-no-taker.yaml": ("heads_kv has no effect: no model listed (lstm)", "grid.heads_kv", 7),
    "window-covers-every-seq-len.yaml": ("window 128 covers every seq_len", "model_options.sdpa.window", 10),
    "window-negative.yaml": ("must be an integer from 0 to 4194304, got -4", "model_options.sdpa.window", 10),
    "window-on-recurrent.yaml": ("unknown option 'window' for lstm", "model_options.lstm.window", 10),
    "linear-form-unknown.yaml": ("form 'quadratic' is not one of: chunked", "model_options.linear-attn.form", 10),
    "compile-unknown.yaml": ("compile 'fast' is not one of: none, default", "model_options.sdpa.compile[1]", 10),
    "linear-chunk-without-chunked.yaml": (
        "chunk sizes the chunks of form chunked only",
        "model_options.linear-attn.chunk",
        10,
    ),
}

HINTS = {
    "unknown-model.yaml": "did you mean 'lstm'?",
    "unknown-key-top.yaml": "did you mean 'models'?",
    "unknown-key-grid.yaml": "did you mean 'seq_len'?",
    "option-unknown.yaml": "did you mean 'bidirectional'?",
    "bad-name.yaml": "'my-sweep'",
    "decode-not-causal.yaml": "set causal: true",
    "decode-bidirectional.yaml": "set bidirectional: false",
    "decode-learned-max-len.yaml": "at least 513",
    "heads-kv-not-dividing.yaml": "heads_kv values that divide 4: 1, 2, 4",
    "heads-kv-no-taker.yaml": "sdpa",
    "window-covers-every-seq-len.yaml": "give a window below 128",
    "window-on-recurrent.yaml": "window is an option of vanilla",
    "compile-unknown.yaml": "torch.compile the model",
}


def test_every_bad_config_file_is_in_the_table() -> None:
    assert sorted(p.name for p in BAD.iterdir()) == sorted(BAD_CASES)


@pytest.mark.parametrize("name", sorted(BAD_CASES))
def test_bad_config_is_refused_with_where_what_and_key(name: str) -> None:
    expected, key, line = BAD_CASES[name]
    path = BAD / name
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    error = info.value
    assert expected in error.message
    assert error.key == key
    assert error.where == (str(path) if line is None else f"{path}:{line}")
    assert str(error).startswith(error.where)
    if name in HINTS:
        assert HINTS[name] in error.hint


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (lambda tmp: tmp / "nope.yaml", "no such file"),
        (lambda tmp: tmp, "is a directory"),
    ],
)
def test_unusable_paths(tmp_path: Path, make: Any, expected: str) -> None:
    path = make(tmp_path)
    with pytest.raises(ConfigError, match=expected) as info:
        load_experiment(path)
    assert info.value.where == str(path)


def test_unreadable_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "secret.yaml"
    path.write_text(BASE)

    def refuse(self: Path) -> bytes:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "read_bytes", refuse)  # chmod 000 does not bind root, so fake the refusal
    with pytest.raises(ConfigError) as info:
        load_experiment(path)
    assert "permission denied" in info.value.message.lower()
    assert info.value.where == str(path)


# ------------------------------------------------------------------------------------------------ decode
DECODE = BASE.replace("[lstm, vanilla]", "[lstm, mingru, vanilla]").replace(
    "modes: [forward, train]", "modes: [forward, decode]"
)


def test_decode_crosses_the_grid_causal_only_and_without_the_scan() -> None:
    text = DECODE + "causal: [false, true]\nmodel_options:\n  mingru: {scan: [parallel, sequential]}\n"
    cases = load(text).cases("cpu")
    decode = [c for c in cases if c.mode == "decode"]
    assert all(c.causal for c in decode)  # vanilla's causal=false combinations cannot decode: left out
    assert [(c.model, c.seq_len) for c in decode if c.model == "vanilla"] == [("vanilla", n) for n in (8, 16, 32)]
    mingru = [c for c in decode if c.model == "mingru"]
    assert len(mingru) == 3 and all(c.options == () for c in mingru)  # one step is one step, whatever the scan
    assert len([c for c in cases if c.model == "vanilla" and c.mode == "forward"]) == 6
    assert all(c.tokens == c.batch for c in decode) and all(c.span == c.seq_len + 1 for c in decode)


def test_decode_section_has_its_own_lengths_batches_and_models() -> None:
    text = BASE + "decode:\n  models: [vanilla]\n  seq_len: [1024, 4096]\n  batch: [1, 4]\n"
    experiment = load(text)
    decode = [c for c in experiment.cases("cpu") if c.mode == "decode"]
    assert [(c.model, c.batch, c.seq_len, c.causal) for c in decode] == [
        ("vanilla", b, n, True) for b in (1, 4) for n in (1024, 4096)
    ]
    assert experiment.resolved["decode"] == {"models": ["vanilla"], "seq_len": [1024, 4096], "batch": [1, 4]}
    assert "decode" not in load().resolved  # a config without one keeps the sha256 it always had
    inherited = [c for c in load(BASE + "decode: {}\n").cases("cpu") if c.mode == "decode"]
    assert {(c.model, c.batch, c.seq_len) for c in inherited} == {
        (m, 2, n) for m in ("lstm", "vanilla") for n in (8, 16, 32)
    }


def test_decode_keeps_the_unidirectional_variant_of_a_recurrence() -> None:
    text = DECODE + "causal: true\nmodel_options:\n  lstm: {bidirectional: [false, true]}\n"
    lstm = [c for c in load(text).cases("cpu") if c.model == "lstm"]
    assert {(c.mode, c.causal) for c in lstm} == {("forward", True), ("forward", False), ("decode", True)}


def test_decode_with_tied_batches_needs_its_own_batch() -> None:
    text = BASE.replace("  batch: [2]", "  tokens: 64") + "decode: {seq_len: [128]}\n"
    with pytest.raises(ConfigError, match="decode needs batch sizes") as info:
        load(text)
    assert info.value.key == "decode"


def test_heads_need_not_divide_when_only_recurrent_models_run() -> None:
    text = BASE.replace("[lstm, vanilla]", "[lstm, gru]").replace("heads: 2", "heads: 5")
    assert len(load(text).cases("cpu")) == 2 * 2 * 3


# ------------------------------------------------------------------------------------------ properties
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=12),
    st.sampled_from([*MODEL_NAMES, *MODES, "float32", "bfloat16", "cuda:0", "auto", "grid", "seq_len"]),
)
documents = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.one_of(
                st.text(max_size=10),
                st.integers(),
                st.sampled_from(["name", "models", "grid", "seq_len", "batch", "timing", "model_options"]),
            ),
            inner,
            max_size=5,
        ),
    ),
    max_leaves=25,
)
plausible = st.one_of(
    st.integers(1, 64),
    st.booleans(),
    st.sampled_from([*MODEL_NAMES, *MODES, "bfloat16", "cpu", "cuda:1"]),
    st.lists(st.integers(1, 64), min_size=1, max_size=3, unique=True),
    st.floats(0.001, 0.5),
)
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def loads_or_refuses(text: str, overrides: tuple[str, ...] = ()) -> Experiment | None:
    try:
        experiment = load(text, overrides)
    except ConfigError as error:
        assert error.message and error.where
        return None
    assert isinstance(experiment.cases("cpu"), list)
    return experiment


@SETTINGS
@given(documents)
@pytest.mark.slow
def test_any_yaml_document_loads_or_raises_config_error(document: Any) -> None:
    loads_or_refuses(yaml.safe_dump(document))


@SETTINGS
@given(st.text(alphabet=st.sampled_from(list("abcdefgns_:-[]{},&*!|>#'\"\n\t 0123456789.")), max_size=80))
def test_any_text_loads_or_raises_config_error(text: str) -> None:
    loads_or_refuses(text)


def valid_document() -> dict[str, Any]:
    return {
        "name": "prop",
        "models": ["lstm", "vanilla"],
        "modes": ["forward"],
        "dtype": "float32",
        "grid": {"batch": [2], "seq_len": [8, 16], "heads": [2]},
        "d_model": 16,
        "causal": [False, True],
        "model_options": {"lstm": {"bidirectional": True}},
        "timing": {"target_ci": 0.05, "min_samples": 3},
    }


def key_paths(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [path] if path else []
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for key, child in children:
        paths += key_paths(child, (*path, key))
    return paths


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    document = valid_document()
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(key_paths(document)))
        parent = document
        for key in path[:-1]:
            parent = parent[key]
        action = draw(st.sampled_from(["delete", "replace", "tweak", "add"]))
        if action == "delete":
            del parent[path[-1]]
        elif action == "replace":
            parent[path[-1]] = draw(documents)
        elif action == "tweak":  # a plausible value, so that many mutants still load
            parent[path[-1]] = draw(plausible)
        elif isinstance(parent, dict):
            parent[draw(st.text(max_size=8))] = draw(scalars)
        else:
            parent.append(draw(scalars))
    return document


@SETTINGS
@given(
    mutated(),
    st.lists(
        st.sampled_from(
            [
                "grid.seq_len=[4]",
                "heads=3",
                "timing.min_samples=2",
                "grid.tokens=32",
                "models=gru",
                "x.y=1",
                "model_options.gru.bidirectional=true",
                "causal",
            ]
        ),
        max_size=2,
    ),
)
@pytest.mark.slow
def test_mutated_configs_load_or_raise_config_error(document: dict[str, Any], overrides: list[str]) -> None:
    experiment = loads_or_refuses(yaml.safe_dump(document), tuple(overrides))
    if experiment is not None:  # what loads, round-trips through its resolved form
        again = load(yaml.safe_dump(experiment.resolved))
        assert again.sha256 == experiment.sha256
        assert dataclasses.replace(again, source="x") == dataclasses.replace(experiment, source="x")


def test_the_valid_document_behind_the_mutations_is_valid() -> None:
    assert len(load(yaml.safe_dump(valid_document())).cases("cpu")) == 2 + 2 * 2


@pytest.mark.slow
def test_override_too_deep_or_too_long_is_a_config_error() -> None:
    from attnbench.core.errors import ConfigError

    with pytest.raises(ConfigError, match="cap is 10000"):
        load_experiment(None, ["grid.seq_len=" + "[" * 6000 + "]" * 6000])
    with pytest.raises(ConfigError):
        load_experiment(None, ["grid.seq_len=" + "[" * 2000 + "]" * 2000])


@pytest.mark.parametrize(
    ("value", "spelled"),
    [("1e-2", "1.0e-2"), ("5e0", "5.0e+0"), ("2.5E-1", None), ("1.5e-1", None), ("25e-1", "25.0e-1")],
)
def test_a_number_yaml_reads_as_text_gets_a_hint_with_its_yaml_spelling(value: str, spelled: str | None) -> None:
    """PyYAML follows YAML 1.1: 1e-2 (no dot) and 5e0 (no sign) are strings. Say so, and how to write them."""
    source = builtin_config_text("cpu")
    if spelled is None:  # YAML 1.1 reads these as numbers already
        assert load_experiment_text(source, "b", [f"telemetry_interval_s={value}"]).telemetry_interval_s == float(value)
        return
    with pytest.raises(ConfigError) as caught:
        load_experiment_text(source, "builtin", [f"telemetry_interval_s={value}"])
    assert f"got the string '{value}'" in caught.value.message
    assert mentions(caught.value.hint, str(value), spelled)  # what YAML read, and how to write it
    fixed = load_experiment_text(source, "builtin", [f"telemetry_interval_s={spelled}"])
    assert fixed.telemetry_interval_s == pytest.approx(float(value))


# ------------------------------------------------------------------------------------------ issue 14 variants
VARIANTS = """\
name: variants
models: [lstm, sdpa, vanilla, linear-attn]
modes: [forward]
grid:
  batch: [1]
  seq_len: [64, 128]
  heads_kv: [4, 2, 1]
d_model: 32
heads: 4
model_options:
  vanilla: {heads_kv: 1, window: 16}
"""


def test_grid_heads_kv_crosses_every_model_with_kv_heads_and_mha_keeps_its_key() -> None:
    cases = load(VARIANTS).cases("cpu")
    by_model: dict[str, set[Any]] = {}
    for case in cases:
        by_model.setdefault(case.model, set()).add(heads_kv_of(case))
    assert by_model == {"lstm": {None}, "sdpa": {4, 2, 1}, "vanilla": {1}, "linear-attn": {4, 2, 1}}
    mha = next(c for c in cases if c.model == "sdpa" and heads_kv_of(c) == 4)
    assert "heads_kv" not in mha.key  # heads_kv = heads is multi-head attention: the key it always had
    windowed = [c for c in cases if c.model == "vanilla"]
    assert {option_of(c, "window") for c in windowed} == {16} and len(windowed) == 2  # the model's own heads_kv wins


def test_a_config_without_heads_kv_resolves_as_it_always_did() -> None:
    assert "heads_kv" not in load().resolved["grid"]
    assert load(VARIANTS).resolved["grid"]["heads_kv"] == [4, 2, 1]


def test_linear_attention_cases_carry_heads_and_decode_without_their_form() -> None:
    text = VARIANTS.replace("modes: [forward]", "modes: [forward, decode]\ncausal: true").replace(
        "  vanilla: {heads_kv: 1, window: 16}", "  linear-attn: {form: [chunked, recurrent]}"
    )
    cases = [c for c in load(text).cases("cpu") if c.model == "linear-attn"]
    assert all(c.heads == 4 for c in cases)
    decode = [c for c in cases if c.mode == "decode"]
    assert all(option_of(c, "form") == "chunked" for c in decode)  # the default: a step is the same in every form
    assert len(decode) == 2 * 3  # seq_len × heads_kv, not × form


def test_order_runs_the_named_sections_first_and_the_rest_after() -> None:
    text = tiny_config(decode={"seq_len": [32]}, presets={"names": ["lstm-110m"], "seq_len": [8]})
    plain = load_experiment_text(text, "t.yaml")
    assert plain.cases("cpu")[0].mode == "forward" and "order" not in plain.resolved
    first = load_experiment_text(text, "t.yaml", ["order=[decode, presets]"])
    modes = [(c.mode, option_of(c, "preset") if has_option(c, "preset") else "") for c in first.cases("cpu")]
    assert modes[0][0] == "decode" and modes[-1] == ("forward", "none")  # the grid last
    preset_at = next(i for i, (_, p) in enumerate(modes) if p == "lstm-110m")
    assert preset_at < modes.index(("forward", "none"))  # decode, then the presets, then the grid
    assert first.resolved["order"] == ["decode", "presets", "grid"] and first.sha256 != plain.sha256
    assert sorted(c.key for c in first.cases("cpu")) == sorted(c.key for c in plain.cases("cpu"))
    with pytest.raises(ConfigError, match="order"):
        load_experiment_text(text, "t.yaml", ["order=[decode, decode]"])
    with pytest.raises(ConfigError, match="order"):
        load_experiment_text(text, "t.yaml", ["order=[warmup]"])


# ---------------------------------------------------------------------------- issue 38: an option grid's size
def huge_option_grid(values: int = 100, names: str = "abcdef") -> str:
    options = {name: list(range(values)) for name in names}
    entry = {"name": "my-x", "factory": "tests.measure.hostile_models:fine", "kind": "attention", "options": options}
    return tiny_config("huge", models=[entry], grid={"batch": [1], "seq_len": [8]})


def test_an_option_grid_past_the_cap_is_refused_before_any_option_set_is_built(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Six options of a hundred values cross into 10**12 sets: counted, not built (before, validate spent ~45 s
    building them and died of a MemoryError)."""
    import attnbench.config.experiment as experiment

    def built(*args: Any) -> Any:
        raise AssertionError("option sets were built before the count refused them")

    monkeypatch.setattr(experiment, "check_model_options", built)
    for force in (False, True):
        with pytest.raises(ConfigError) as caught:
            load_experiment_text(huge_option_grid(), "huge.yaml", force=force)
        assert "cap is" in caught.value.message and caught.value.key == "grid"


@pytest.mark.slow
def test_option_sets_count_toward_the_cap() -> None:
    assert len(load_experiment_text(huge_option_grid(21, "abc"), "x.yaml").cases("cpu")) == 21**3
    with pytest.raises(ConfigError) as caught:
        load_experiment_text(huge_option_grid(22, "abc"), "x.yaml")
    assert caught.value.key == "grid" and {22**3, MAX_CASES} <= set(numbers(caught.value.message))

    assert len(load_experiment_text(huge_option_grid(22, "abc"), "x.yaml", force=True).cases("cpu")) == 22**3


# ------------------------------------------------------------------------------------------ issue 40: cache
TINY_CACHE = "name: tiny\nmodels: [gru]\ngrid: {batch: 1, seq_len: 8}\n"


def test_cache_left_out_is_each_modes_default_decode_cold() -> None:
    mixed = load(TINY_CACHE + "modes: [forward, decode]\n")
    assert mixed.timing.cache is None and mixed.resolved["timing"]["cache"] is None
    assert (mixed.timing.cache_for("forward"), mixed.timing.cache_for("decode")) == ("warm", "cold")
    decode_only = load(TINY_CACHE + "modes: [decode]\n")
    assert decode_only.timing.cache == "cold"  # one default for every mode it runs: said as that value


@pytest.mark.parametrize("where", ["cache: cold\n", "timing: {cache: cold}\n"])
def test_cache_sits_at_the_top_level_or_under_timing_and_hashes_the_same(where: str) -> None:
    experiment = load(TINY_CACHE + "modes: [forward, decode]\n" + where)
    assert experiment.timing.cache == "cold" and experiment.timing.cache_for("forward") == "cold"
    assert experiment.sha256 == load(TINY_CACHE + "modes: [forward, decode]\ncache: cold\n").sha256


def test_cache_in_both_places_is_refused_unless_the_top_level_one_is_an_override() -> None:
    with pytest.raises(ConfigError, match="both at the top level and under timing"):
        load(TINY_CACHE + "cache: cold\ntiming: {cache: warm}\n")
    assert load(TINY_CACHE + "timing: {cache: warm}\n", ("cache=cold",)).timing.cache == "cold"  # sweep --cache


def test_sweep_cache_flag_sets_the_config(tmp_path: Path, fake_executors: Any) -> None:
    from typer.testing import CliRunner

    from attnbench.cli import app

    config = tmp_path / "c.yaml"
    config.write_text(TINY_CACHE + "device: cpu\nd_model: 16\nmodes: [forward, decode]\n")
    result = CliRunner().invoke(app, ["sweep", str(config), "--cache", "warm", "--out", str(tmp_path / "o"), "-q"])
    assert result.exit_code == 0, result.output
    assert {e.settings.timing.cache for e in fake_executors.built} == {"warm"}
