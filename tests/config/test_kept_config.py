"""kv_dtype and state_dtype in a config (issue 52): crossed like a grid axis into the stateful cases of the models
they apply to, a value that is the model's default keeping the case's key as it was, and every bad value refused
with one error line. No torch here."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.config.experiment import Experiment, load_experiment_text
from attnbench.core import cases as core_cases
from attnbench.core.errors import ConfigError
from tests.support import mentions, tiny_config

runner = CliRunner()
KEPT = {
    "models": ["lstm", "mamba2", "sdpa-flash", "mla", {"name": "hy", "hybrid": ["mamba2", "mamba2", "mamba2", "sdpa"]}],
    "modes": ["decode", "prefill", "forward"],
    "causal": True,
    "kv_dtype": ["float32", "int8", "bfloat16"],
    "state_dtype": ["float32", "bfloat16"],
    "grid": {"batch": [1], "seq_len": [8]},
    "d_model": 64,
    "heads": 4,
    "layers": 4,
}


def kept(**changes: object) -> str:
    return tiny_config("kept", **{**KEPT, **changes})


def load(text: str) -> Experiment:
    return load_experiment_text(text, "kept.yaml")


def test_each_key_crosses_only_the_stateful_cases_of_the_models_it_applies_to() -> None:
    cases = load(kept()).cases("cpu")
    by = {(c.model, c.mode): sorted(c.kept for c in cases if (c.model, c.mode) == (m, mode)) for c in cases
          for m, mode in [(c.model, c.mode)]}  # fmt: skip
    # float32 is the case's own dtype: the case as it always was, its key unchanged
    assert by["sdpa-flash", "decode"] == [(), (("kv_dtype", "bfloat16"),), (("kv_dtype", "int8"),)]
    assert by["lstm", "prefill"] == [(), (("state_dtype", "bfloat16"),)]  # kv_dtype is not crossed into it
    assert by["mla", "decode"] == [()]  # a latent cache keeps no kv_dtype of its own: neither key is crossed
    # A hybrid's members keep their own states: no value is its default, so each is kept by name.
    assert by["hy", "decode"] == sorted(
        (*kv, ("state_dtype", state)) for kv in [(), (("kv_dtype", "bfloat16"),), (("kv_dtype", "int8"),)]
        for state in ("bfloat16", "float32")
    )  # fmt: skip
    assert all(c.kept == () for c in cases if c.mode == "forward")
    key = next(c.key for c in cases if c.model == "sdpa-flash" and c.kept == (("kv_dtype", "int8"),))
    assert key.endswith("|kv_dtype=int8")


def test_a_16_bit_models_float32_state_is_its_default_and_keeps_its_key() -> None:
    """Mamba-2 keeps a bfloat16 model's scan state in float32: state_dtype float32 is that default, bfloat16 not."""
    cases = load(kept(dtype=["bfloat16"], models=["mamba2"], state_dtype=["float32", "bfloat16"])).cases("cpu")
    assert sorted(c.kept for c in cases if c.mode == "decode") == [(), (("state_dtype", "bfloat16"),)]


def test_the_keys_resolve_into_the_config_and_a_config_without_them_keeps_its_sha256() -> None:
    plain = load(tiny_config())
    assert not {"kv_dtype", "state_dtype"} & set(plain.resolved)
    resolved = load(kept()).resolved
    assert resolved["kv_dtype"] == ["float32", "int8", "bfloat16"] and resolved["state_dtype"] == [
        "float32",
        "bfloat16",
    ]
    again = load(yaml.safe_dump(resolved))
    assert again.sha256 == load(kept()).sha256 and again.cases("cpu") == load(kept()).cases("cpu")
    assert load(kept(kv_dtype="int8")).resolved["kv_dtype"] == ["int8"]  # a scalar is a list of one


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"kv_dtype": ["int4"]}, "kv_dtype"),
        ({"state_dtype": ["float8_e4m3fn"]}, "state_dtype"),
        ({"kv_dtype": ["int8", "int8"]}, "kv_dtype"),
        ({"modes": ["forward"]}, "kv_dtype"),
        ({"page_tokens": [24]}, "page_tokens"),
        ({"page_tokens": [-16]}, "page_tokens"),
        ({"page_tokens": ["sixteen"]}, "page_tokens"),
        ({"page_tokens": [16, 16]}, "page_tokens"),
        ({"hybrid_pages": ["vllm"]}, "hybrid_pages"),
        ({"page_tokens": [16], "modes": ["forward"], "kv_dtype": None, "state_dtype": None}, "page_tokens"),
    ],
)
def test_a_bad_value_or_an_unused_key_is_one_error_line_with_exit_2(
    tmp_path: Path, changes: dict[str, object], key: str
) -> None:
    config = tmp_path / "kept.yaml"
    config.write_text(kept(**changes))
    result = runner.invoke(app, ["validate", str(config)])
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and mentions(errors, key), result.output
    assert any(line.startswith("hint:") for line in result.output.splitlines())


def test_page_tokens_cross_only_the_models_that_keep_a_kv_cache() -> None:
    cases = load(kept(kv_dtype=["float32", "int8"], state_dtype=None, page_tokens=[0, 16])).cases("cpu")
    by = {m: sorted({c.kept for c in cases if c.model == m and c.mode == "decode"}) for m in ("sdpa-flash", "hy")}
    assert (
        by["sdpa-flash"]
        == by["hy"]
        == [
            (),
            (("kv_dtype", "int8"),),
            (("kv_dtype", "int8"), ("page_tokens", "16")),
            (("page_tokens", "16"),),
        ]
    )  # 0 is the default: contiguous, the case's key as it was
    assert {c.kept for c in cases if c.model in ("lstm", "mamba2", "mla") or c.mode == "forward"} == {()}
    assert next(c for c in cases if c.kept == (("page_tokens", "16"),)).page_tokens == 16
    assert load(kept(page_tokens=16)).resolved["page_tokens"] == [16]


def test_hybrid_pages_cross_only_a_hybrid_of_a_cache_and_a_state() -> None:
    cases = load(kept(kv_dtype=None, state_dtype=None, page_tokens=16, hybrid_pages=["separate", "aligned"])).cases(
        "cpu"
    )
    assert sorted({c.kept for c in cases if c.model == "hy" and c.mode == "decode"}) == [
        (("hybrid_pages", "aligned"), ("page_tokens", "16")),
        (("page_tokens", "16"),),
    ]
    assert {c.kept for c in cases if c.model == "sdpa-flash" and c.mode == "decode"} == {(("page_tokens", "16"),)}
    assert {c.kept for c in cases if c.model in ("lstm", "mamba2", "mla")} == {()}


def test_a_dtype_the_device_cannot_hold_is_refused_at_validate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every dtype torch names here is held by a CPU and a CUDA device (float8's storage and casts need no sm_89):
    the table is what a device that could not would be refused by, before anything is allocated."""
    assert all(
        set(core_cases.KV_DTYPES) | set(core_cases.STATE_DTYPES) <= held for held in core_cases.HOLDABLE.values()
    )
    monkeypatch.setitem(core_cases.HOLDABLE, "cpu", frozenset({"float32", "bfloat16", "int8"}))
    with pytest.raises(ConfigError) as caught:
        load(kept(kv_dtype=["int8", "float8_e5m2"]))
    assert caught.value.key == "kv_dtype[1]"
    assert load(kept(kv_dtype=["int8"])).cases("cpu")


def test_the_engines_config_validates_and_crosses_every_dtype_into_its_models() -> None:
    """configs/serving-engines-cpu.yaml, as `attnbench validate` reads it (exit 0), with the cases it promises."""
    config = Path(__file__).parents[2] / "configs" / "serving-engines-cpu.yaml"
    result = runner.invoke(app, ["validate", str(config)])
    assert result.exit_code == 0, result.output
    cases = load_experiment_text(config.read_text(encoding="utf-8"), config.name).cases("cpu")
    assert len(cases) == 120
    hybrid = {c.kept for c in cases if c.model == "mamba2-3to1" and c.kept_dtype("kv_dtype") is None}
    assert {tuple(i for i in kept if i[0] in ("page_tokens", "hybrid_pages")) for kept in hybrid} == {
        (),
        (("page_tokens", "16"),),
        (("hybrid_pages", "aligned"), ("page_tokens", "16")),
    }  # aligned pages are crossed with the page size given, not with contiguous too
    assert {c.kept for c in cases if c.model == "sdpa-flash"} == {
        *((), (("kv_dtype", "float8_e4m3fn"),), (("kv_dtype", "int8"),)),
        *((("page_tokens", "16"),), (("kv_dtype", "float8_e4m3fn"), ("page_tokens", "16"))),
        (("kv_dtype", "int8"), ("page_tokens", "16")),
    }
    assert {c.kept for c in cases if c.model == "mamba2"} == {(), (("state_dtype", "bfloat16"),)}
    assert {c.param("memory_budget") for c in cases if c.mode == "capacity"} == {2**30}


def test_a_rows_page_and_layout_are_summary_columns() -> None:
    from attnbench.report.rows import serving_columns
    from attnbench.results.records import Result

    cases = load(kept(kv_dtype=None, state_dtype=None, page_tokens=[0, 16], hybrid_pages="aligned")).cases("cpu")
    columns = {c.kept: serving_columns(Result(c, "oom", "planted")) for c in cases if c.model == "hy"}
    assert columns[(("hybrid_pages", "aligned"), ("page_tokens", "16"))]["page_tokens"] == 16
    assert columns[(("hybrid_pages", "aligned"), ("page_tokens", "16"))]["hybrid_pages"] == "aligned"
    assert {k: v for k, v in columns[()].items() if k in ("page_tokens", "hybrid_pages")} == {
        "page_tokens": None,
        "hybrid_pages": None,
    }
