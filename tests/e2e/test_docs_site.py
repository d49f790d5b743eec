"""The docs site (docs/, mkdocs.yml): it builds strictly, its reference pages hold every command, flag, config key,
model, exit code and column the code has, and every command it shows is run here or marked illustrative.

The convention for code blocks (docs/contributing.md): a `console` block is run by this file (each `$ attnbench …`
line, from the repository's root; `# exit N` at its end when it should fail), an `sh` block is illustrative (not
run, but its attnbench commands and flags must exist), `text` is output; other shells' blocks and blocks without a
language are refused (`bash` reads as `sh`: README's two commands are `bash` blocks, which test_workflows reads).
"""

from __future__ import annotations

import html
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core import errors
from attnbench.families.catalogue import FAMILIES, MODELS, PRESETS
from attnbench.report.rows import COLUMN_TYPES, COLUMNS
from tests.support import ROOT

DOCS = ROOT / "docs"
README = ROOT / "README.md"
CLI = typer.main.get_command(app)
COMMANDS: dict[str, Any] = dict(CLI.commands)  # type: ignore[attr-defined]
runner = CliRunner()


def _hook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("attnbench_docs", DOCS / "hooks" / "attnbench_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["attnbench_docs"] = module
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    """The hand-written pages, and the README that links into them."""
    return [*sorted(p for p in DOCS.rglob("*.md") if "hooks" not in p.parts), README]


def _text(page: Path) -> str:
    """A built page's words: tags dropped, entities decoded, whitespace collapsed."""
    body = re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8"))
    return " ".join(html.unescape(body).split())


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as CI builds it: `mkdocs build --strict` (a warning — a broken link or anchor, a page left out of
    the nav, a reference that does not generate — fails it)."""
    pytest.importorskip("mkdocs")
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin", "HOME": str(out)},
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return out


# ------------------------------------------------------------------------------------------ the generated reference
@pytest.mark.slow  # the site fixture runs mkdocs build --strict (over a second)
def test_the_cli_page_has_every_command_and_every_flag(site: Path) -> None:
    text = _text(site / "reference" / "cli.html")
    for option in ("--version", "--debug", "--install-completion", "--show-completion"):
        assert option in text
    for name, command in COMMANDS.items():
        assert f"attnbench {name} [OPTIONS]" in text, name
        for param in command.params:
            if getattr(param, "hidden", False):
                continue
            for flag in [*param.opts, *param.secondary_opts]:
                assert flag in text, f"{name}: {flag}"
            if param.help:
                assert " ".join(param.help.split()[:4]) in text, f"{name} {param.name}: its help"


def _schema_keys(node: dict[str, Any], defs: dict[str, Any], path: str = "") -> Iterator[str]:
    """Every key path of the schema, read independently of the page's generator."""
    if "$ref" in node:
        node = defs[node["$ref"].rsplit("/", 1)[-1]]
    for name, child in node.get("properties", {}).items():
        key = f"{path}{name}"
        yield key
        yield from _schema_keys(child, defs, key + ".")
    for branch in (*node.get("anyOf", ()), *node.get("oneOf", ())):
        yield from _schema_keys(branch, defs, path)
    if "items" in node:
        yield from _schema_keys(node["items"], defs, path)


@pytest.mark.slow  # the site fixture runs mkdocs build --strict (over a second)
def test_the_config_page_has_every_key_of_the_schema(site: Path) -> None:
    schema = json.loads((ROOT / "configs" / "attnbench.schema.json").read_text(encoding="utf-8"))
    keys = set(_schema_keys(schema, schema["$defs"]))
    assert {"timing.target_ci", "grid.seq_len", "model_options.sdpa.scope", "decode.models"} <= keys
    text = _text(site / "reference" / "config.html").replace("[]", "")
    missing = sorted(key for key in keys if f"{key} " not in text + " ")
    assert not missing, f"config reference lacks {missing}"


@pytest.mark.slow  # the site fixture runs mkdocs build --strict (over a second)
def test_the_models_page_has_every_model_option_and_preset(site: Path) -> None:
    text = _text(site / "reference" / "models.html")
    for family in FAMILIES:
        if family.models:
            assert f"The {family.name} family" in text
    for name, spec in MODELS.items():
        section = text.split(f" {name} ¶", 1)
        assert len(section) == 2, f"no section for {name}"
        for option in spec.options:
            if option.name != "preset":
                assert option.name in section[1].split(" ¶", 1)[0], f"{name}: {option.name}"
    for preset in PRESETS:
        assert preset in text


@pytest.mark.slow  # the site fixture runs mkdocs build --strict (over a second)
def test_the_exit_code_page_has_every_code(site: Path) -> None:
    codes = {value for name, value in vars(errors).items() if name.startswith("EXIT_") and isinstance(value, int)}
    assert codes == set(errors.EXIT_CODES), "a new exit code needs its meaning in EXIT_CODES"
    text = _text(site / "reference" / "exit-codes.html")
    for code, meaning in errors.EXIT_CODES.items():
        assert f"{code} {' '.join(meaning.split())}" in text
    assert "130 for SIGINT" in text


@pytest.mark.slow  # the site fixture runs mkdocs build --strict (over a second)
def test_the_columns_page_has_every_column_with_its_type_and_meaning(site: Path) -> None:
    hook = _hook()
    for column in COLUMNS:
        assert hook.column_meaning(column), f"summary.csv column {column!r} has no meaning (rows.COLUMN_MEANINGS)"
    text = _text(site / "reference" / "summary-csv.html")
    for number, column in enumerate(COLUMNS, start=1):
        assert f"{number} {column} {COLUMN_TYPES[column].__name__}" in text, column


def test_units_come_from_the_names() -> None:
    hook = _hook()
    units = {c: hook.column_unit(c) for c in ("median_ms", "peak_mem_mib", "power_w", "state_bytes", "tflops")}
    assert units == {
        "median_ms": "ms",
        "peak_mem_mib": "MiB",
        "power_w": "W",
        "state_bytes": "bytes",
        "tflops": "TFLOP/s",
    }
    assert hook.column_unit("pct_of_peak") == "%" and hook.column_unit("contended") == ""


@pytest.mark.slow  # the site fixture runs mkdocs build --strict (over a second)
def test_the_repository_pages_are_shown_as_committed(site: Path) -> None:
    for page, source in (
        ("explanation/architecture.html", "ARCHITECTURE.md"),
        ("measurements.html", "results/README.md"),
        ("changelog.html", "CHANGELOG.md"),
    ):
        text = _text(site / page)
        second = next(line for line in (ROOT / source).read_text().splitlines()[1:] if line.strip())
        assert " ".join(re.sub(r"[`*]", "", second).split()[:6]) in text, page


@pytest.mark.slow  # the site fixture runs mkdocs build --strict (over a second)
def test_the_site_needs_no_web_fonts(site: Path) -> None:
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "fonts.googleapis" not in index and "fonts.gstatic" not in index


# ------------------------------------------------------------------------------------------------------ the README
def test_the_readme_is_short_shows_a_real_run_and_links_into_the_docs() -> None:
    """README ≤ 12 KB (issue 28): what the first command prints, one committed figure, and links that resolve."""
    text = README.read_text(encoding="utf-8")
    assert len(text.encode("utf-8")) <= 12 * 1024
    assert "<!--" not in text, "a placeholder is left in README"
    assert re.search(r"```text\nattnbench: \d+ cases from builtin:default-cpu", text), "the sweep's output"
    for target in re.findall(r"\]\(((?!https?:)[^)#]+)", text):
        assert (ROOT / target).exists(), f"README links to {target}, which is not there"
    assert re.search(r"!\[[^]]+\]\(docs/assets/[\w-]+\.png\)", text)


# ------------------------------------------------------------------------------------------------- the code blocks
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[^\s`]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```", re.M | re.S)
ALLOWED = {"console", "sh", "bash", "text", "yaml", "python", "json"}


def _blocks() -> Iterator[tuple[Path, str, str]]:
    for page in _pages():
        for match in FENCE.finditer(page.read_text(encoding="utf-8")):
            yield page, match["lang"], match["body"]


def _commands(lang: str) -> list[tuple[Path, str]]:
    """The `$ attnbench …` lines of console blocks, or the attnbench commands anywhere in sh blocks."""
    found = []
    for page, block_lang, body in _blocks():
        if block_lang != lang and not (lang == "sh" and block_lang == "bash"):
            continue
        for line in body.splitlines():
            if lang == "console" and line.startswith("$ "):
                found.append((page, line[2:]))
            elif lang == "sh":
                found += [(page, "attnbench " + m) for m in re.findall(r"(?:^|[\s;&|(/])attnbench ([^;&|)\n]*)", line)]
    return found


def test_every_code_block_says_what_it_is() -> None:
    for page, lang, body in _blocks():
        where = page.relative_to(ROOT)
        assert lang in ALLOWED, (
            f"{where}: a ```{lang or '(no language)'} block; use console (run by the tests), sh or bash (illustrative) "
            "or text (output)"
        )
        if lang == "console":
            assert body.startswith("$ "), f"{where}: a console block starts with a '$ ' command"


def test_there_are_commands_of_both_kinds() -> None:
    assert len(_commands("console")) >= 8 and len(_commands("sh")) >= 10


def _parse(command: str) -> tuple[list[str], int]:
    said = re.search(r"#\s*exit\s+(\d+)\s*$", command)
    return shlex.split(command, comments=True), int(said[1]) if said else 0


@pytest.mark.parametrize("page, command", _commands("console") + _commands("sh"), ids=lambda v: str(v)[-60:])
def test_every_attnbench_command_shown_exists_with_its_flags(page: Path, command: str) -> None:
    args, _ = _parse(command)
    assert args[0] == "attnbench", f"{page.name}: `{command}`: console blocks run attnbench only"
    options = [a.split("=", 1)[0] for a in args[1:] if a.startswith("-") and a != "-"]
    words = [a for a in args[1:] if not a.startswith("-")]
    global_opts = {o for p in CLI.params for o in [*p.opts, *p.secondary_opts]}
    if not words:  # `attnbench --version`
        assert set(options) <= global_opts, f"{page.name}: {command}"
        return
    name = words[0]
    assert name in COMMANDS, f"{page.name}: `{command}`: no command {name!r}"
    real = global_opts | {o for p in COMMANDS[name].params for o in [*p.opts, *p.secondary_opts]}
    assert set(options) <= real, f"{page.name}: `{command}` uses {sorted(set(options) - real)}"


def _console_params() -> list[Any]:
    """The console commands; `history` reads a dozen runs and fits their steps (over a second): marked slow."""
    return [
        pytest.param(page, command, marks=[pytest.mark.slow] if command.startswith("attnbench history") else [])
        for page, command in _commands("console")
    ]


@pytest.mark.parametrize("page, command", _console_params(), ids=lambda v: str(v)[-60:])
def test_every_console_command_runs(page: Path, command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    args, expected = _parse(command)
    monkeypatch.chdir(ROOT)
    result = runner.invoke(app, args[1:], prog_name="attnbench")
    assert result.exit_code == expected, f"{page.name}: `{command}` exited {result.exit_code}:\n{result.output}"
    assert "Traceback" not in result.output
