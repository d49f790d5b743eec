"""The docs, the commands' --help and the shipped configs' comments say what the code does.

A number the code uses (a default, a cap, a threshold) is stated on a page in one form, which a person reads as
plain text and this file reads as data: the key it belongs to in a code span, and the value in the parenthesis right
after it — `timing.warmup_audit` (10), `--noise-floor` (default 100 %), `grid.seq_len` (at most 2²²). The words
around a statement are free (rewording a sentence costs no test edit); a value that changes while a page still
states the old one fails here, wherever the page states it, and so does dropping the statement. The reference
pages (every command, flag, config key, model, exit code and column) are generated from the code and checked by
test_docs_site.py.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
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
from attnbench.instrument.agreement import MAX_ROUNDS_FACTOR
from attnbench.results.measurement import MODIFIED_Z_CUT
from attnbench.sweeps.interleaved import DEFAULT_PAIR_ROUNDS
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


def _help(*command: str) -> str:
    out = runner.invoke(app, [*command, "--help"])
    assert out.exit_code == 0, out.output
    return " ".join(out.output.replace("│", " ").split())


def _flag(command: str, flag: str) -> Any:
    return next(p for p in COMMANDS[command].params if flag in p.opts)


# ------------------------------------------------------------------------------------- the numbers the docs state
def documented_values() -> dict[str, tuple[float, ...]]:
    """Each key a page states a value for, and the code's value(s), in SI units (a fraction, seconds, a count):
    the parenthesis after the key states them in this order."""
    policy = TimingPolicy()
    # One interval is documented for both device types.
    assert default_interval_s("cuda:0") == default_interval_s("cpu")

    def timing(config: str) -> tuple[float, ...]:
        said = yaml.safe_load((ROOT / "configs" / config).read_text(encoding="utf-8"))["timing"]
        return (said["target_ci"], said["max_case_s"])

    return {
        "timing.target_ci": (policy.target_ci,),
        "timing.min_sample_s": (policy.min_sample_s,),
        "timing.warmup_settle": (policy.warmup_settle,),
        "timing.warmup_audit": (policy.warmup_audit,),
        "timing.warmup_agree": (policy.warmup_agree,),
        "timing.process_warmup_s": (policy.process_warmup_s,),
        "timing.rounds": (policy.rounds,),
        "warmup_moved": (_MAX_AUDIT_MOVES,),
        "first_sample_mz": (MODIFIED_Z_CUT,),
        "launch_bound": (LAUNCH_BOUND_RATIO,),
        "telemetry_interval_s": (default_interval_s("cpu"),),
        "configs/default.yaml": timing("default.yaml"),
        "configs/default-cuda.yaml": timing("default-cuda.yaml"),
        "grid.seq_len": (MAX_SEQ_LEN,),
        "grid": (MAX_CASES,),
        "--noise-floor": (DEFAULT_NOISE_FLOOR,),
        "--fail-on": (DEFAULT_THRESHOLD,),
        "--max-rounds": (MAX_ROUNDS_FACTOR,),
        "--budget-s": (_flag("selfcheck", "--budget-s").default,),
        "--rounds": (_flag("ab", "--rounds").default,),
        "--block": (_flag("ab", "--block").default,),
        "--pair-rounds": (DEFAULT_PAIR_ROUNDS,),
    }


# `key` (…): the parenthesis right after a code span; nested parentheses end it, so a statement keeps to one.
STATEMENT = re.compile(r"`(?P<key>[^`]+)` \((?P<said>[^()]*)\)")
# A number as the pages write one: 100, 2.5, 10 000 (grouped by spaces), 2²² (a power), with its unit if any.
NUMBER = re.compile(
    r"(?<![\w.])(?P<digits>\d{1,3}(?:[ \u2009\u202f]\d{3})+(?![\d.])|\d+(?:\.\d+)?)"
    r"(?P<power>[⁰¹²³⁴⁵⁶⁷⁸⁹]*)\s*(?P<unit>%|µs\b|ms\b|s\b)?"
)
SCALE = {"%": 1e-2, "µs": 1e-6, "ms": 1e-3, "s": 1.0, None: 1.0}
SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹", "0123456789")


def stated_numbers(said: str) -> list[float]:
    """The numbers a statement gives, in SI units: '±2 %, 2.5 s per case' → [0.02, 2.5]."""
    found = []
    for number in NUMBER.finditer(said):
        value = float(re.sub(r"\s", "", number["digits"]))
        if number["power"]:
            value **= int(number["power"].translate(SUPERSCRIPTS))
        found.append(value * SCALE[number["unit"]])
    return found


def statements(text: str) -> Iterator[tuple[str, list[float]]]:
    """Every `key` (…) of a text that states a number, with the numbers it states."""
    for match in STATEMENT.finditer(" ".join(text.split())):
        numbers = stated_numbers(match["said"])
        if numbers:
            yield match["key"], numbers


@pytest.mark.parametrize(
    ("said", "numbers"),
    [
        ("10", [10.0]),
        ("default ±1 %", [0.01]),
        ("±2 %, 2.5 s per case", [0.02, 2.5]),
        ("100 µs", [1e-4]),
        ("default 100 ms", [0.1]),
        ("at most 2²²", [2.0**22]),
        ("at most 10 000 cases, counted first", [10_000.0]),
        ("default `median:5%`", [0.05]),
        ("1.15 × that busy time", [1.15]),
        ("at most 5 blocks, within `timing.warmup_max_s`", [5.0]),
        ("float32 on an H200", []),
    ],
)
def test_a_stated_value_is_read_as_a_person_reads_it(said: str, numbers: list[float]) -> None:
    assert stated_numbers(said) == pytest.approx(numbers)


def test_every_value_the_docs_state_by_its_key_is_the_codes() -> None:
    """Every statement of a documented key on every page (and README), not just the first: none may be stale."""
    values = documented_values()
    wrong = []
    for path in [*PAGES, ROOT / "README.md"]:
        for key, numbers in statements(path.read_text(encoding="utf-8")):
            expected = values.get(key)
            if expected is not None and numbers[: len(expected)] != pytest.approx(expected, rel=1e-9):
                wrong.append(f"{path.relative_to(ROOT)}: `{key}` ({numbers}), the code has {list(expected)}")
    assert not wrong, "\n".join(wrong)


def test_the_docs_state_every_documented_value() -> None:
    said = {key for page in [DOCS, README] for key, _ in statements(page)}
    missing = sorted(set(documented_values()) - said)
    assert not missing, f"no page states these values as `key` (value): {missing}"


def test_a_flags_shown_default_states_the_codes_value() -> None:
    """--help shows a computed default in words; its number is the code's."""
    assert stated_numbers(str(_flag("selfcheck", "--max-rounds").show_default)) == [MAX_ROUNDS_FACTOR]
    assert stated_numbers(str(_flag("ab", "--pair-rounds").show_default))[0] == DEFAULT_PAIR_ROUNDS


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
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# How long the default sweep takes: a number of seconds stated next to the machine it was timed on.
ON_TWO_CORES = re.compile(r"(\d+) s\b[^.;:]{0,20}\b2-core CPU")


def _header(path: Path) -> str:
    return " ".join(line.lstrip("# ") for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#"))


def test_readme_the_tutorial_and_the_default_config_give_one_time_for_the_default_sweep() -> None:
    said = {
        name: {int(n) for n in ON_TWO_CORES.findall(" ".join(text.split()))}
        for name, text in (
            ("README.md", README),
            ("the tutorial", (ROOT / "docs" / "tutorial" / "first-sweep.md").read_text(encoding="utf-8")),
            ("configs/default.yaml", _header(ROOT / "configs" / "default.yaml")),
        )
    }
    assert all(len(times) == 1 for times in said.values()), said
    assert len(set.union(*said.values())) == 1, f"they disagree on the time: {said}"


# "4 models x 2 modes x 3 lengths = 24 cases": a factor named by its axis is that axis's length.
AXIS_OF = {"model": "models", "mode": "modes", "length": "seq_len", "batch": "batch"}
AXIS_OF |= {"models": "models", "modes": "modes", "lengths": "seq_len", "batches": "batch"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_numbers_in_a_configs_header_are_its_grids(path: Path) -> None:
    """'… = N cases' counts the grid (a preset's and the decode section's are counted beside it); the factors before
    it that name an axis are that axis's length; 'M models x K context lengths … (N cases)' counts the decode section;
    'X s budget' is the config's timing.max_case_s."""
    header = _header(path)
    grid = load_experiment(path, ("presets=null", "decode=null"))
    counted = re.search(r"([^.:;]*) = (\d+) cases", header)
    if counted is not None:
        assert int(counted[2]) == len(grid.cases("cuda:0")), f"{path.name} says {counted[2]} cases"
        for size, noun in re.findall(r"(\d+) ([A-Za-z ]+?)(?= x |$)", counted[1] if "+" not in counted[1] else ""):
            axis = AXIS_OF.get(noun.split()[-1])
            if axis is not None:
                assert int(size) == len(getattr(grid.axes, axis)), f"{path.name}: {size} {noun}"
    whole = load_experiment(path, ("presets=null",))
    decoding = len(whole.cases("cuda:0")) - len(grid.cases("cuda:0"))
    for models, contexts, cases in re.findall(
        r"(\d+) [a-z ]+? x (\d+) context lengths[^()]{0,12}\((\d+) cases\)", header
    ):
        assert int(models) * int(contexts) == int(cases) == decoding, f"{path.name}: {cases} decode cases"
    for budget in re.findall(r"([\d.]+) s budget", header):
        assert float(budget) == whole.timing.max_case_s, f"{path.name}: a {budget} s budget"
    if not re.search(r"\d+ cases", header):
        pytest.skip("the header states no case count")


def test_ci_runs_readmes_test_command_as_written() -> None:
    """CI must run the test command a newcomer copies from README, not a near copy of it."""
    (command,) = [block for block in re.findall(r"```bash\n(.+?)\n```", README, re.DOTALL) if "pytest" in block]
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert any(line.startswith(command + " ") or line == command for line in ci), command


# ----------------------------------------------------------------------- every snippet does what its page promises
# Each README and docs snippet is run here, or validated where running it is a long sweep (issue 51): a config is
# validated (a fragment on top of a small base), each `attnbench sweep` an sh block shows is planned with --dry-run,
# the factory your-own-model.md shows is built from the options its config gives, python.md's code runs on a
# committed run, and every relative link opens a committed file (browsing the repository on GitHub too).
from tests.e2e.test_docs_site import FENCE, _commands, _pages  # noqa: E402

# A fragment's page shows it inside a config such as configs/serving-cpu.yaml: small, causal (serving asks decode).
SNIPPET_BASE = {"name": "snippet", "device": "cpu", "models": ["lstm", "sdpa-flash"], "d_model": 16,
                "causal": True, "grid": {"batch": [1], "seq_len": [16, 64]}}  # fmt: skip


def _snippets(lang: str) -> list[tuple[Path, str]]:
    return [
        (page, m["body"]) for page in _pages() for m in FENCE.finditer(page.read_text("utf-8")) if m["lang"] == lang
    ]


def _python_block(page: str, starts: str) -> str:
    (body,) = [body for path, body in _snippets("python") if path.name == page and body.startswith(starts)]
    return body


@pytest.fixture
def mylayers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """your-own-model.md's mylayers.py, on the path as the page says (README's `mylayers:build` is the same)."""
    (tmp_path / "mylayers.py").write_text(_python_block("your-own-model.md", "# mylayers.py"), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(__import__("sys").modules, "mylayers", raising=False)
    return tmp_path


def _snippet_config(body: str) -> dict[str, Any]:
    said = yaml.safe_load(body)
    assert isinstance(said, dict)
    return said if "models" in said and "grid" in said else {**SNIPPET_BASE, **said}


@pytest.mark.parametrize(
    "page, body", _snippets("yaml"), ids=lambda v: v.name if isinstance(v, Path) else str(v).split("\n")[0][:40]
)
def test_every_config_snippet_validates(page: Path, body: str, mylayers: Path) -> None:
    said = yaml.safe_load(body)
    if isinstance(said, dict) and "jobs" in said:  # a CI workflow (ci-regression-gate.md), not a config: it parses,
        assert said["jobs"] and (
            True in said or "on" in said
        )  # with its jobs and its trigger (YAML 1.1 reads on: as true)
        return
    path = mylayers / "snippet.yaml"
    path.write_text(yaml.safe_dump(_snippet_config(body)), encoding="utf-8")
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 0, f"{page.name}: {body}\n{result.output}"


def test_readmes_own_model_config_names_its_run_and_asks_for_decode(mylayers: Path) -> None:
    """The README promises decode steps for your layer: its config asks for decode, of every model it names."""
    (body,) = [body for page, body in _snippets("yaml") if page.name == "README.md"]
    said = yaml.safe_load(body)
    assert said["name"] and "decode" in said["modes"]
    path = mylayers / "my.yaml"
    path.write_text(body, encoding="utf-8")
    cases = load_experiment(path).cases("cpu")
    assert {c.model for c in cases if c.mode == "decode"} == {"lstm", "sdpa-flash", "my-layer"}


def test_the_factory_on_your_own_model_gets_and_uses_its_options(mylayers: Path) -> None:
    """`options: {width: [1, 2]}` is two cases of each size; the page's factory must build two different models."""
    import torch

    from attnbench.families.user.layers import load_factory, request
    from attnbench.families.user.spec import user_of

    (body,) = [b for page, b in _snippets("yaml") if page.name == "your-own-model.md" and "width" in b]
    path = mylayers / "mine.yaml"
    path.write_text(yaml.safe_dump(_snippet_config(body)), encoding="utf-8")
    cases = load_experiment(path).cases("cpu")
    mine = [c for c in cases if c.model == "my-layer" and c.seq_len == 16 and c.mode == "forward"]
    assert sorted(dict(c.options)["width"] for c in mine) == [1, 2]
    build = load_factory(user_of(mine[0]).factory)
    sizes = {sum(p.numel() for p in build(request(c, "cpu", torch.float32)).parameters()) for c in mine}
    assert len(sizes) == 2, "the factory ignored the option its config crosses"


def test_every_sweep_an_sh_block_shows_plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweeps the pages show take minutes; each is planned (--dry-run: its config read, its cases expanded)."""
    from importlib.metadata import entry_points

    plugins = {e.name for e in entry_points(group="attnbench.models")}
    monkeypatch.chdir(ROOT)
    planned = 0
    for page, command in _commands("sh"):
        args = __import__("shlex").split(command, comments=True)
        if args[1] != "sweep" or any("$" in a for a in args):
            continue
        if "byo-cpu" in command and "example-gru" not in plugins:
            continue  # the page installs the example plugin first (pip install -e examples/plugin)
        if "--out" in args:
            del args[args.index("--out") : args.index("--out") + 2]
        result = runner.invoke(app, [*args[1:], "--dry-run", "--out", str(tmp_path)])
        assert result.exit_code == 0, f"{page.name}: `{command}`\n{result.output}"
        planned += 1
    assert planned >= 10


def test_readmes_ci_recipe_reports_the_run_it_just_swept() -> None:
    """`report latest` after `sweep --out runs/head` read results/runs: the recipe names the folder it swept into."""
    (recipe,) = [body for _, body in [(p, b) for p, b in _snippets("sh") if p.name == "README.md"] if "compare" in body]
    lines = [line.split("#")[0].split() for line in recipe.splitlines() if line.startswith("attnbench")]
    last_out = [words[words.index("--out") + 1] for words in lines if words[1] == "sweep" and "--out" in words][-1]
    (report,) = [words for words in lines if words[1] == "report"]
    assert report[2] == f"{last_out}/latest"


def test_pythons_page_code_runs_and_pivots_one_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pivot over every row mixed forward, train and decode times in one cell (issue 51)."""
    pytest.importorskip("matplotlib")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    from tests.support import FIXTURE

    code = _python_block("python.md", "import attnbench as ab\n\nruns")  # the reading block, not measure's
    code = code.replace('["results/runs/base", "results/runs/head"]', f"[{str(FIXTURE)!r}]")
    scope: dict[str, Any] = {}
    exec(compile(code, "python.md", "exec"), scope)
    table, df = scope["table"], scope["df"]
    forward = df[df["mode"] == "forward"]
    assert set(df["mode"]) > {"forward"}  # the run has other modes the pivot must leave out
    for model, row in table.iterrows():
        for n, value in row.dropna().items():
            (median,) = forward[(forward["model"] == model) & (forward["seq_len"] == n)]["median_ms"]
            assert value == pytest.approx(median)


def test_every_relative_link_opens_a_committed_file() -> None:
    """The reference pages are generated at build; on GitHub a link to one was a 404 (eight of them, issue 51):
    each generated path has a committed stub the build replaces."""
    broken = []
    for page in _pages():
        for target in re.findall(r"\]\(((?!https?:|mailto:|#)[^)\s]+)\)", page.read_text(encoding="utf-8")):
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).resolve().is_file():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken
