"""Models you bring: a ``factory:`` entry from a package outside the repository, an entry-point plugin installed
with pip, and every way such a model can be wrong. Real sweeps of real (tiny) torch modules, in-process."""

from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.config.experiment import load_experiment_text, stored_experiment
from attnbench.config.users import installed_plugins
from attnbench.core.errors import ConfigError
from attnbench.families.catalogue import option_of, source_of
from attnbench.families.user.spec import user_of
from attnbench.results.store import load_run
from tests.support import QUICK_TIMING, ROOT, mentions

runner = CliRunner()
PLUGIN = ROOT / "examples" / "plugin"

LAYERS = '''
import torch
from torch import nn


class Gated(nn.Module):
    """y = σ(a) ⊙ b from one Linear(d, 2d): (B, T, d) -> (B, T, d)."""

    def __init__(self, d, width, device, dtype):
        super().__init__()
        self.lin = nn.Linear(d, 2 * width, device=device, dtype=dtype)
        self.out = nn.Linear(width, d, device=device, dtype=dtype)

    def forward(self, x):
        a, b = self.lin(x).chunk(2, dim=-1)
        return self.out(torch.sigmoid(a) * b)


SEEN = []


def build(request):
    SEEN.append(request)
    return Gated(request.d_model, int(request.options.get("width", 1)) * request.d_model, request.device,
                 request.torch_dtype)


def raises(request):
    raise RuntimeError("the factory broke")


def not_a_module(request):
    return "a string"


def wrong_dtype(request):
    return Gated(request.d_model, request.d_model, request.device, torch.float64)


class Shrinks(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, 1)

    def forward(self, x):
        return self.lin(x)


def wrong_shape(request):
    return Shrinks(request.d_model)


def exits(request):
    import sys

    sys.exit(int(request.options.get("code", 0)))
'''


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A package ``byo_layers`` in a temporary folder on the import path, as PYTHONPATH would put it."""
    root = tmp_path / "site"
    (root / "byo_layers").mkdir(parents=True)
    (root / "byo_layers" / "__init__.py").write_text("")
    (root / "byo_layers" / "layers.py").write_text(textwrap.dedent(LAYERS))
    monkeypatch.syspath_prepend(str(root))
    yield root
    for name in [m for m in sys.modules if m.startswith("byo_layers")]:
        del sys.modules[name]


def config(tmp_path: Path, models: list[object], **changes: object) -> Path:
    data: dict[str, object] = {
        "name": "byo",
        "device": "cpu",
        "threads": 1,
        "models": models,
        "modes": ["forward", "train"],
        "causal": True,
        "grid": {"batch": [2], "seq_len": [8, 16]},
        "d_model": 16,
        "heads": 2,
        "timing": dict(QUICK_TIMING),
    }
    data.update(changes)
    path = tmp_path / "byo.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def sweep(path: Path, out: Path, *extra: str) -> tuple[int, Path, str]:
    result = runner.invoke(app, ["sweep", str(path), "--out", str(out), *extra])
    folders = sorted(out.iterdir()) if out.exists() else []
    return result.exit_code, folders[-1] if folders else out, result.output


def entry(name: str, factory: str, kind: str = "attention", **options: object) -> dict[str, object]:
    return {"name": name, "factory": factory, "kind": kind, **({"options": options} if options else {})}


@pytest.mark.slow
def test_a_factory_model_runs_beside_built_ins_with_counted_flops(user_package: Path, tmp_path: Path) -> None:
    models = ["lstm", entry("my-gate", "byo_layers.layers:build", width=[1, 2])]
    code, folder, output = sweep(config(tmp_path, models), tmp_path / "out", "--plots")
    assert code == 0, output
    stored = load_run(folder)
    rows = [r for r in stored.results if r.case.model == "my-gate"]
    assert len(rows) == 8 and all(r.ok for r in rows)  # 2 widths × 2 modes × 2 lengths
    for r in rows:
        width = option_of(r.case, "width")
        assert user_of(r.case).kind == "attention" and user_of(r.case).source == "config"
        # Linear(16, 2·16w) then Linear(16w, 16) on 2 × n tokens: 2 FLOPs a multiply-add, train 3× forward.
        forward = 2 * 2 * r.case.seq_len * (16 * 32 * width + 16 * width * 16)
        assert r.extra["flops"] == forward * (3 if r.case.mode == "train" else 1)
        assert r.extra["flops_formula"] == "counted-v1"
        assert r.parameters == (16 * 32 * width + 32 * width) + (16 * width * 16 + 16)
    assert f"width={2}" in rows[-1].case.key
    summary = (folder / "summary.md").read_text()
    assert "my-gate width=1" in summary and "my-gate width=2" in summary
    assert any("latency-forward" in p.name for p in (folder / "plots").iterdir())
    table = list(csv.DictReader((folder / "summary.csv").open()))
    gate = [row for row in table if row["model"] == "my-gate"]
    assert {(row["kind"], row["source"]) for row in gate} == {("attention", "config")}
    # The factory saw what the case says, its own options included.
    seen = sys.modules["byo_layers.layers"].SEEN  # type: ignore[attr-defined]
    assert {(r.d_model, r.heads, r.causal, r.device, r.dtype, dict(r.options)["width"]) for r in seen} >= {
        (16, 2, True, "cpu", "float32", 1),
        (16, 2, True, "cpu", "float32", 2),
    }
    # Stored rows read back without the user's code: the report, a comparison of the run with itself, and the
    # stored config, which expands to the same cases (what merge and resume need) with the package gone.
    for name in [m for m in sys.modules if m.startswith("byo_layers")]:
        del sys.modules[name]
    sys.path.remove(str(user_package))
    again = stored_experiment(stored.run.config, stored.run.config_source)
    assert [c.key for c in again.cases("cpu")] == [r.case.key for r in stored.results]
    assert again.sha256 == stored.run.config_sha256
    assert runner.invoke(app, ["report", str(folder), "--format", "csv"]).exit_code == 0
    same = runner.invoke(app, ["compare", str(folder), str(folder)])
    assert same.exit_code == 0, same.output
    assert "my-gate" in same.output


@pytest.mark.slow
def test_what_a_user_model_gets_wrong_becomes_a_row_and_the_sweep_goes_on(user_package: Path, tmp_path: Path) -> None:
    models = [
        "lstm",
        entry("raises", "byo_layers.layers:raises"),
        entry("not-a-module", "byo_layers.layers:not_a_module"),
        entry("wrong-dtype", "byo_layers.layers:wrong_dtype"),
        entry("wrong-shape", "byo_layers.layers:wrong_shape"),
        entry("no-decode", "byo_layers.layers:build", kind="recurrent"),
    ]
    code, folder, output = sweep(config(tmp_path, models, modes=["forward", "decode"]), tmp_path / "out")
    assert code == 1, output  # error rows fail the sweep; every other row is kept
    rows = {(r.case.model, r.case.mode): r for r in load_run(folder).results if r.case.seq_len == 8}
    assert rows[("lstm", "forward")].ok and rows[("lstm", "decode")].ok
    reasons = {model: rows[(model, "forward")].reason for model in ("raises", "not-a-module", "wrong-dtype")}
    # Each reason names the factory or what it returned, against what a model must be.
    assert mentions(reasons["raises"], "byo_layers.layers:raises", "RuntimeError", "the factory broke")
    assert mentions(reasons["not-a-module"], "str", "torch.nn.Module")
    assert mentions(reasons["wrong-dtype"], "torch.float64", "torch.float32")
    assert mentions(rows[("wrong-shape", "forward")].reason, "(2, 8, 16)", "(2, 8, 1)")
    assert all(rows[(m, "forward")].status == "error" for m in ("raises", "not-a-module", "wrong-dtype", "wrong-shape"))
    assert rows[("no-decode", "forward")].ok
    decode = rows[("no-decode", "decode")]
    assert decode.status == "unsupported" and "has no decode protocol" in decode.reason


@pytest.mark.parametrize("code", [0, 3])
@pytest.mark.slow
def test_a_user_model_calling_sys_exit_is_its_rows_error_not_the_sweeps_exit_code(
    user_package: Path, tmp_path: Path, code: int
) -> None:
    models = [entry("my-exit", "byo_layers.layers:exits", code=code), "lstm"]
    status, folder, output = sweep(config(tmp_path, models, modes=["forward"]), tmp_path / "out")
    assert status == 1, output  # the error rows, not the model's exit code; and every case has its row
    stored = load_run(folder)
    assert stored.run.state == "complete" and len(stored.results) == 4
    assert all(r.ok for r in stored.results if r.case.model == "lstm")
    exited = [r for r in stored.results if r.case.model == "my-exit"]
    assert [r.status for r in exited] == ["error", "error"]
    assert all(f"sys.exit({code})" in r.reason for r in exited)


@pytest.mark.parametrize(
    ("models", "message", "where"),
    [
        ([entry("my-x", "no_such_package.layers:build")], "no module named 'no_such_package'", "models[0].factory"),
        ([entry("my-x", "byo_layers.nothing:build")], "no module named 'byo_layers.nothing'", "models[0].factory"),
        ([entry("my-x", "byo_layers/layers.py")], "is not of the form module.path:function", "models[0].factory"),
        ([entry("lstm", "byo_layers.layers:build")], "a built-in model's name", "models[0].name"),
        ([entry("My X", "byo_layers.layers:build")], "is not allowed", "models[0].name"),
        ([{"name": "my-x", "factory": "byo_layers.layers:build"}], "kind", "models[0]"),
        (["lstmm"], "unknown model 'lstmm'", "models[0]"),
        # Values a stored row could not hold or read back (issue 38): readers cap numbers at 2**62, JSON has no
        # infinity, and a case's key is joined with | and =.
        ([entry("my-x", "byo_layers.layers:build", width=1e308)], "at most 2**62", "models[0].options.width"),
        ([entry("my-x", "byo_layers.layers:build", width=10**30)], "at most 2**62", "models[0].options.width"),
        ([entry("my-x", "byo_layers.layers:build", width=float("inf"))], "finite", "models[0].options.width"),
        ([entry("my-x", "byo_layers.layers:build", width=[1.0, float("nan")])], "finite", "models[0].options.width"),
        ([entry("my-x", "byo_layers.layers:build", tag="a|width=2")], "key", "models[0].options.tag"),
        ([entry("my-x", "byo_layers.layers:build", tag=["a", "b=c"])], "key", "models[0].options.tag[1]"),
        ([entry("my-x", "byo_layers.layers:build", **{"a|b": 1})], "key", "models[0].options.a|b"),
    ],
)
def test_bad_user_models_are_refused_at_validate(
    user_package: Path, tmp_path: Path, models: list[object], message: str, where: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_experiment_text(config(tmp_path, models).read_text(), "byo.yaml")
    assert message in caught.value.message and where in caught.value.message
    out = runner.invoke(app, ["validate", str(config(tmp_path, models))])
    assert out.exit_code == 2 and "Traceback" not in out.output and "error:" in out.output


def test_a_factory_models_options_belong_in_its_entry(user_package: Path, tmp_path: Path) -> None:
    models = [entry("my-x", "byo_layers.layers:build")]
    text = config(tmp_path, models, model_options={"my-x": {"width": 2}}).read_text()
    with pytest.raises(ConfigError) as caught:
        load_experiment_text(text, "byo.yaml")
    assert caught.value.key == "model_options.my-x" and "models" in caught.value.hint


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """examples/plugin installed with pip into a folder on the import path: its entry points become visible."""
    if shutil.which("pip", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("no pip beside this Python")
    pytest.importorskip("setuptools", reason="building the example plugin needs setuptools")
    target, source = tmp_path / "plugins", tmp_path / "plugin-source"
    # From a copy: setuptools builds in the source tree, which must stay as the repository has it.
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        cwd=tmp_path,  # pip's build folder, not the repository's
    )
    monkeypatch.syspath_prepend(str(target))
    installed_plugins.cache_clear()
    yield target
    installed_plugins.cache_clear()
    for name in [m for m in sys.modules if m.startswith("attnbench_example")]:
        del sys.modules[name]


@pytest.mark.slow
def test_an_installed_plugin_is_listed_and_swept(installed_plugin: Path, tmp_path: Path) -> None:
    example = runner.invoke(app, ["validate", str(PLUGIN / "byo-cpu.yaml")])
    assert example.exit_code == 0 and "example-gru" in example.output, example.output
    listed = {p.name: p for p in installed_plugins()}
    assert {"example-gru", "example-alibi"} <= set(listed)
    assert listed["example-gru"].source == "plugin attnbench-example-plugin"
    models = runner.invoke(app, ["models", "--device", "cpu"], env={"COLUMNS": "250"})
    assert models.exit_code == 0 and "example-gru" in models.output and "attnbench-example-plugin" in models.output
    path = config(
        tmp_path,
        ["sdpa-flash", "example-gru", "example-alibi"],
        modes=["forward", "train", "decode"],
        model_options={"example-gru": {"expand": [1, 2]}},
    )
    code, folder, output = sweep(path, tmp_path / "out")
    assert code == 0, output
    rows = [r for r in load_run(folder).results if r.case.model.startswith("example-")]
    assert len(rows) == 3 * 2 * 3  # gru at 2 expansions, alibi once; 3 modes; 2 lengths
    assert all(r.ok for r in rows), [(r.case.label, r.reason) for r in rows if not r.ok]
    gru = [r for r in rows if r.case.model == "example-gru"]
    assert {source_of(r.case) for r in gru if r.case.definition} == {"plugin attnbench-example-plugin"}
    assert {dict(r.case.options)["expand"] for r in gru} == {1, 2}  # a plugin's defaults are in every key
    decode = [r for r in rows if r.case.mode == "decode"]
    # The recurrence's state is constant in n; ALiBi's KV cache grows with it (measured from the state's tensors).
    by = {(r.case.model, dict(r.case.options).get("expand"), r.case.seq_len): r.state_bytes for r in decode}
    assert by[("example-gru", 1, 8)] == by[("example-gru", 1, 16)] == 2 * 16 * 4
    assert by[("example-alibi", None, 16)] > by[("example-alibi", None, 8)]
    claims = runner.invoke(app, ["claims", str(folder), "--format", "json"])
    assert claims.exit_code in (0, 1), claims.output
    json.loads(claims.stdout)


@pytest.mark.slow
def test_shards_of_a_user_model_merge_without_its_code(user_package: Path, tmp_path: Path) -> None:
    path = config(tmp_path, ["lstm", entry("my-gate", "byo_layers.layers:build")], grid={"batch": [2], "seq_len": [8]})
    shards = []
    for i in range(2):
        out = tmp_path / f"shard{i}"
        result = runner.invoke(app, ["sweep", str(path), "--out", str(out), "--shard", f"{i}/2", "--no-plots"])
        assert result.exit_code == 0, result.output
        shards.append(str(next(out.iterdir())))
    sys.path.remove(str(user_package))
    for name in [m for m in sys.modules if m.startswith("byo_layers")]:
        del sys.modules[name]
    merged = tmp_path / "merged"
    result = runner.invoke(app, ["merge", *shards, "--output", str(merged)])
    assert result.exit_code == 0, result.output
    rows = load_run(merged)
    assert {(r.case.model, r.case.mode) for r in rows.results} == {
        (model, mode) for model in ("lstm", "my-gate") for mode in ("forward", "train")
    }
