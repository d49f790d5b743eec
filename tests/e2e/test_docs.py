"""The docs, the commands' --help and the shipped configs' comments say what the code does.

Each test reads a statement where a person reads it (a page of docs/, README.md, `attnbench X --help`, a config's
header) and holds it to the value the code uses, so that changing a default without changing its documentation
fails here. The reference pages (every command, flag, config key, model, exit code and column) are generated from
the code and checked by test_docs_site.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

from attnbench.analysis.compare import DEFAULT_NOISE_FLOOR
from attnbench.analysis.thresholds import DEFAULT_THRESHOLD
from attnbench.cli import app
from attnbench.config.experiment import MAX_CASES, MAX_SEQ_LEN, load_experiment
from attnbench.config.source import builtin_config_text
from attnbench.core.cases import TimingPolicy, default_interval_s
from attnbench.results.measurement import MODIFIED_Z_CUT
from attnbench.timing.adaptive import _MAX_AUDIT_MOVES
from attnbench.timing.gpu_timing import LAUNCH_BOUND_RATIO
from tests.support import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
# The hand-written pages of the docs site, where the methodology and every default are stated.
PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if "hooks" not in p.parts)
DOCS = "\n\n".join(p.read_text(encoding="utf-8") for p in PAGES)
ARCHITECTURE = (ROOT / "ARCHITECTURE.md").read_text(encoding="utf-8")
runner = CliRunner()
COMMANDS: dict[str, Any] = dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def _one(pattern: str, text: str = DOCS) -> re.Match[str]:
    found = list(re.finditer(pattern, " ".join(text.split())))
    assert len(found) == 1, f"the docs should say this once: {pattern!r} (found {len(found)})"
    return found[0]


def _help(*command: str) -> str:
    out = runner.invoke(app, [*command, "--help"])
    assert out.exit_code == 0, out.output
    return " ".join(out.output.replace("│", " ").split())


# ------------------------------------------------------------------------------------------- the stopping rule
def test_the_docs_give_each_defaults_stopping_target_and_budget() -> None:
    policy = TimingPolicy()
    said = _one(r"A config that leaves `target_ci` out gets ±(\d+) %")
    assert float(said[1]) / 100 == pytest.approx(policy.target_ci)
    for device, where in (("cpu", "a CPU"), ("cuda", "a GPU")):
        timing = yaml.safe_load(builtin_config_text(device))["timing"]
        said = _one(rf"±(\d+) % on {where} \(`configs/default[-a-z]*\.yaml`, ([\d.]+) s per case\)")
        assert float(said[1]) / 100 == pytest.approx(timing["target_ci"]), f"{device} target_ci"
        assert float(said[2]) == pytest.approx(timing["max_case_s"]), f"{device} max_case_s"


def test_the_docs_timing_and_telemetry_numbers_are_the_codes() -> None:
    policy = TimingPolicy()
    assert float(_one(r"Calls shorter than (\d+) µs are grouped")[1]) * 1e-6 == pytest.approx(policy.min_sample_s)
    assert float(_one(r"last calls agree within (\d+) %")[1]) / 100 == pytest.approx(policy.warmup_settle)
    assert int(_one(r"`timing\.warmup_audit` \((\d+)\)")[1]) == policy.warmup_audit
    assert float(_one(r"`timing\.warmup_agree` \((\d+) %\)")[1]) / 100 == pytest.approx(policy.warmup_agree)
    assert int(_one(r"at most (\d+) times, within `warmup_max_s`")[1]) == _MAX_AUDIT_MOVES
    assert float(_one(r"modified z-score is above ([\d.]+)")[1]) == MODIFIED_Z_CUT
    assert float(_one(r"event median exceeds ([\d.]+) ×")[1]) == LAUNCH_BOUND_RATIO
    interval = float(_one(r"`telemetry_interval_s` \(default (\d+) ms\)")[1]) / 1e3
    assert interval == default_interval_s("cuda:0") == default_interval_s("cpu")


def test_the_docs_caps_and_compare_defaults_are_the_codes() -> None:
    assert _one(r"seq_len ≤ 2²²") and MAX_SEQ_LEN == 2**22
    assert int(_one(r"a grid ≤ (\d+ \d+) cases")[1].replace(" ", "")) == MAX_CASES
    assert float(_one(r"`--noise-floor` \(default (\d+) %\)")[1]) / 100 == DEFAULT_NOISE_FLOOR
    assert float(_one(r"`--fail-on median:(\d+)%`: the default threshold")[1]) / 100 == DEFAULT_THRESHOLD


# ------------------------------------------------------------------------------------------- the run folder
def test_the_run_folder_path_is_the_same_everywhere() -> None:
    """The docs, `sweep --help` and the defaults' comments name results/runs/<run>, where sweeps write."""
    out_default = next(p for p in COMMANDS["sweep"].params if p.name == "out").default
    assert Path(str(out_default)) == Path("results/runs")
    assert "results/runs/<UTC yyyymmdd-hhmmss>-<config name>-<device>/" in DOCS
    assert "results/runs/<run_id>/" in _help("sweep")
    for device in ("cpu", "cuda"):
        assert "results/runs/<time>-" in builtin_config_text(device)
    # A run folder a sweep wrote is never called results/<run>: only committed runs live there.
    for path in [ROOT / "README.md", *PAGES, *sorted((ROOT / "configs").glob("*.yaml"))]:
        stray = re.findall(r"(?:claims|report|compare|resume) results/<", path.read_text(encoding="utf-8"))
        assert not stray, f"{path.name}: {stray}"


# ------------------------------------------------------------------------------------------- commands and flags
def test_every_command_has_a_row_in_architecture() -> None:
    """README no longer lists the commands: the docs' command-line reference is generated from the app."""
    table = ARCHITECTURE.split("## 6. Commands", 1)[1].split("\n\n", 2)[1]
    documented = {name for row in table.splitlines()[2:] for name in re.findall(r"`([a-z]+)`", row.split("|")[1])}
    assert documented == set(COMMANDS)


@pytest.mark.parametrize("name", ["models", "env", "calibrate", "selfcheck"])
def test_commands_without_a_config_do_not_say_the_config_decides_the_device(name: str) -> None:
    text = _help(name)
    assert "config's" not in text and "[default: (auto)]" in text


def test_sweeps_device_default_is_the_configs() -> None:
    assert "(default: the config's)" in _help("sweep")


# ------------------------------------------------------------------------------------------- the configs' headers
def test_the_default_sweeps_size_and_time_agree_between_readme_and_its_config() -> None:
    text = builtin_config_text("cpu")
    said = re.search(
        r"(\d+) models x (\d+) modes x (\d+) lengths = (\d+) cases, and (\d+) models x (\d+) context lengths "
        r"decoding \((\d+) cases\), each held to a ([\d.]+) s budget",
        " ".join(line.lstrip("# ") for line in text.splitlines()),
    )
    assert said is not None, "default-cpu.yaml's header no longer states its size"
    models, modes, lengths, cases, decoders, contexts, decodes, budget = said.groups()
    experiment = load_experiment(None, device_type="cpu")
    axes = experiment.axes
    assert (int(models), int(modes), int(lengths)) == (len(axes.models), len(axes.modes), len(axes.seq_len))
    every = experiment.cases("cpu")
    decoding = [case for case in every if case.mode == "decode"]
    assert int(decodes) == len(decoding) == int(decoders) * int(contexts)
    assert int(cases) == len(every) - len(decoding) and float(budget) == experiment.timing.max_case_s
    in_config = re.search(r"about (\d+) s on a quiet 2-core CPU", " ".join(text.split()))
    in_readme = _one(r"about (\d+) s on a quiet 2-core CPU", README)
    in_docs = _one(r"about (\d+) s on a quiet 2-core CPU")
    assert in_config is not None and in_config[1] == in_readme[1], "README and default-cpu.yaml disagree on the time"
    assert in_docs[1] == in_readme[1], "README and the tutorial disagree on the time"


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_a_case_count_in_a_configs_header_is_its_grids(path: Path) -> None:
    """'… = N cases' in a header counts the grid (a preset's and the decode section's are counted beside it)."""
    header = " ".join(line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#"))
    said = re.search(r"= (\d+) cases", header)
    if said is None:
        pytest.skip("the header states no case count")
    grid = load_experiment(path, ("presets=null", "decode=null"))
    assert int(said[1]) == len(grid.cases("cuda:0")), f"{path.name} says {said[1]} cases"


def test_ci_runs_readmes_test_command_as_written() -> None:
    """CI must run the test command a newcomer copies from README, not a near copy of it."""
    block = README[README.index("Install and run the tests") :]
    command = re.search(r"```bash\n(.+?)\n```", block, re.DOTALL)
    assert command is not None
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert any(line.startswith(command[1] + " ") or line == command[1] for line in ci), command[1]
