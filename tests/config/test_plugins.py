"""Installed plugins as a stranger's package may bring them: loaded without ever ending or breaking a listing, their
API version checked, their options typed and bounded like a built-in model's, one name from one package only.

The packages are real distributions on the import path (a ``.dist-info`` folder with ``entry_points.txt`` beside
the module), which ``importlib.metadata`` finds as it finds pip's: no install needed.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.config.users import installed_plugins
from attnbench.core.errors import EXIT_BAD_INPUT

runner = CliRunner()

Install = Callable[[str, dict[str, str]], None]


@pytest.fixture
def install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """``install(distribution, {model: module source defining PLUGIN})``: one distribution per call."""
    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.syspath_prepend(str(site))
    modules: list[str] = []

    def make(distribution: str, plugins: dict[str, str]) -> None:
        info = site / f"{distribution.replace('-', '_')}-1.0.dist-info"  # as pip names it
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 1.0\n")
        points = []
        for i, (model, source) in enumerate(plugins.items()):
            module = f"{distribution.replace('-', '_')}_{i}"
            (site / f"{module}.py").write_text(textwrap.dedent(source))
            points.append(f"{model} = {module}:PLUGIN")
            modules.append(module)
        (info / "entry_points.txt").write_text("[attnbench.models]\n" + "\n".join(points) + "\n")
        installed_plugins.cache_clear()

    yield make
    installed_plugins.cache_clear()
    for name in modules:
        sys.modules.pop(name, None)


GOOD = """
from attnbench.plugin import ModelPlugin, Option
PLUGIN = ModelPlugin(
    factory="pkg.layers:build",
    kind="recurrent",
    summary="a scaled recurrence",
    options=(Option("scale", float, 1.0, "how much to scale by", minimum=0.0, maximum=10.0),),
    api_version=2,
)
"""


def config(tmp_path: Path, model: str, options: str = "") -> Path:
    path = tmp_path / "plugged.yaml"
    path.write_text(
        f"name: plugged\nmodels: [lstm, {model}]\nmodes: [forward]\ngrid: {{batch: [1], seq_len: [8]}}\n"
        f"d_model: 8\nheads: 2\n{options}"
    )
    return path


def lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.strip()]


@pytest.mark.parametrize(
    "source",
    [
        "import sys\nsys.exit(0)\n",
        "import sys\nsys.exit(3)\n",
        "raise RuntimeError('broken at import')\n",
        "from attnbench.plugin import ModelPlugin\nPLUGIN = ModelPlugin('pkg.m:f', 'recurrent', api_version='2')\n",
        "from attnbench.plugin import ModelPlugin\nPLUGIN = ModelPlugin('pkg.m:f', 'recurrent', options='abc')\n",
        "from attnbench.plugin import ModelPlugin\nPLUGIN = ModelPlugin('pkg.m:f', 'sideways')\n",
        "PLUGIN = 42\n",
    ],
    ids=["exit-0", "exit-3", "raises", "version-text", "options-text", "kind", "not-a-plugin"],
)
def test_a_plugin_that_cannot_be_used_never_silences_or_breaks_a_command(
    install: Install, tmp_path: Path, source: str
) -> None:
    install("hostile-plugin", {"bad-model": source})
    listed = runner.invoke(app, ["models", "--device", "cpu", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    bad = next(m for m in json.loads(listed.stdout)["models"] if m["name"] == "bad-model")
    assert bad["reason"] and bad["kind"] is None  # listed, with why it cannot be used
    named = runner.invoke(app, ["validate", str(config(tmp_path, "bad-model"))])
    assert named.exit_code == EXIT_BAD_INPUT
    assert [line for line in lines(named.output) if line.startswith("error:")] and "Traceback" not in named.output
    other = runner.invoke(app, ["validate", str(config(tmp_path, "gru"))])
    assert other.exit_code == 0 and "gru" in other.output  # a config not naming it is checked as ever


def test_a_plugin_written_for_a_newer_api_is_refused_with_both_versions(install: Install, tmp_path: Path) -> None:
    from attnbench.plugin import API_VERSION

    newer = GOOD.replace("api_version=2", f"api_version={API_VERSION + 1}")
    install("future-plugin", {"future-model": newer})
    (plugin,) = [p for p in installed_plugins() if p.name == "future-model"]
    assert plugin.plugin is None and str(API_VERSION + 1) in plugin.problem and str(API_VERSION) in plugin.problem
    result = runner.invoke(app, ["validate", str(config(tmp_path, "future-model"))])
    assert result.exit_code == EXIT_BAD_INPUT


def test_a_plugin_without_a_version_was_written_for_api_1_and_still_runs(install: Install, tmp_path: Path) -> None:
    old = "from attnbench.plugin import ModelPlugin\nPLUGIN = ModelPlugin('pkg.m:f', 'attention', options={'k': 2})\n"
    install("old-plugin", {"old-model": old})
    (plugin,) = [p for p in installed_plugins() if p.name == "old-model"]
    assert plugin.plugin is not None and plugin.plugin.api_version == 1
    assert runner.invoke(app, ["validate", str(config(tmp_path, "old-model"))]).exit_code == 0


def test_two_packages_registering_one_name_are_both_refused(install: Install, tmp_path: Path) -> None:
    install("first-plugin", {"twin": GOOD})
    install("second-plugin", {"twin": GOOD})
    twins = [p for p in installed_plugins() if p.name == "twin"]
    assert len(twins) == 2 and all(p.plugin is None for p in twins)
    assert all("first-plugin" in p.problem and "second-plugin" in p.problem for p in twins)
    assert runner.invoke(app, ["validate", str(config(tmp_path, "twin"))]).exit_code == EXIT_BAD_INPUT


def test_plugin_options_are_typed_and_bounded_like_a_built_in_models(install: Install, tmp_path: Path) -> None:
    install("scaled-plugin", {"scaled": GOOD})
    half = runner.invoke(app, ["validate", str(config(tmp_path, "scaled", "model_options: {scaled: {scale: 0.5}}"))])
    assert half.exit_code == 0, half.output  # typed by its declaration, not by the default's 1.0 … or 1
    for bad in ("20.0", "'big'", "true"):
        refused = runner.invoke(
            app, ["validate", str(config(tmp_path, "scaled", f"model_options: {{scaled: {{scale: {bad}}}}}"))]
        )
        assert refused.exit_code == EXIT_BAD_INPUT, (bad, refused.output)
    listed = runner.invoke(app, ["models", "--device", "cpu", "--format", "json"])
    scaled = next(m for m in json.loads(listed.stdout)["models"] if m["name"] == "scaled")
    assert scaled["options"]["scale"] == {"default": 1.0, "allowed": "0.0…10.0", "help": "how much to scale by"}


def test_the_decode_protocol_is_typed_in_the_plugin_interface() -> None:
    """A plugin author can check a module against the protocol the executor uses, scratch drop included."""
    import torch

    from attnbench.families.registry import build_model
    from attnbench.families.states import State, drop_scratch
    from attnbench.plugin import Decodable, DropsScratch
    from tests.support import tiny_case

    model = build_model(tiny_case("lstm"), "cpu", torch.float32)
    assert isinstance(model, Decodable) and not isinstance(torch.nn.Linear(2, 2), Decodable)
    state = model.init_state(2, 4)
    assert isinstance(state, DropsScratch) and issubclass(State, DropsScratch)

    class Plain:  # a user's state without the optional method
        def tensors(self) -> Iterator[torch.Tensor]:
            yield torch.zeros(1)

        def advance(self) -> None: ...

    assert not isinstance(Plain(), DropsScratch)
    drop_scratch(Plain())  # optional: nothing to drop, nothing raised


def test_the_serving_protocols_are_in_the_plugin_interface() -> None:
    """API 3's optional protocols are importable where a plugin author looks, and built-ins satisfy them."""
    import torch

    import attnbench.plugin as plugin
    from attnbench.families import plugins
    from attnbench.families.registry import build_model
    from tests.support import tiny_case

    assert set(plugin.__all__) == set(plugins.__all__) - {"plugin_options", "plugin_problem"}
    model = build_model(tiny_case("sdpa-flash", causal=True), "cpu", torch.float32)
    assert isinstance(model, plugin.Verifiable) and isinstance(model, plugin.Packable)
    state = model.init_state(1, 8)
    assert isinstance(state, plugin.Resettable) and isinstance(state, plugin.Fillable)
