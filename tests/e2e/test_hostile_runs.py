"""A stored run written to attack whoever reads it: control sequences in a reason, a run id, an environment field, a
telemetry note and a folder name; spreadsheet formulas in reasons and ids; numbers at the edge of what a row may hold.
Every command that reads it prints no control character, every CSV cell is inert, and nothing overflows."""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.report.run_files import write_run_files
from attnbench.results.fields import MAX_INTEGER, MAX_SECONDS, MIN_SECONDS
from tests.support import FIXTURE

runner = CliRunner()
# OSC 0 sets the window title, CSI 2J clears the screen, BEL rings; 0x9b is CSI in one byte, U+202E reverses text.
ATTACK = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"
CONTROL = ("\x1b", "\x07", "\x9b", "\u202e")
FORMULAS = ['=HYPERLINK("http://evil.example","click")', "+cmd|' /C calc'!A0", "@SUM(1+1)", "-2+3+cmd|' /C calc'!A0"]
TELEMETRY = {
    "source": "psutil",
    "level": "basic",
    "interval_s": 0.1,
    "window_s": 0.2,
    "samples": 4,
    "reliable": False,
    "note": f"window too short {ATTACK}",
    "metrics": {"cpu_util_pct": 50.0},
    "unavailable": {"gpu_util_pct": f"CPU run {ATTACK}"},
}


def rows_of(folder: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]


def write(folder: Path, run: dict[str, Any], rows: list[dict[str, Any]]) -> Path:
    (folder / "run.json").write_text(json.dumps(run, indent=2))
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture
def hostile(tmp_path: Path) -> Path:
    folder = Path(shutil.copytree(FIXTURE, tmp_path / "hostile"))
    run = json.loads((folder / "run.json").read_text())
    run["run_id"] = f"run{ATTACK}"
    run["environment"]["cpu_model"] = f"EPYC{ATTACK}"
    rows = rows_of(folder)
    rows[0]["telemetry"] = TELEMETRY
    failed = [r for r in rows if r["status"] != "ok"]
    failed[0]["reason"] = f"needs CUDA{ATTACK}<script>alert(1)</script>"
    for row, formula in zip(failed[1:], FORMULAS, strict=False):
        row["reason"] = formula
    return write(folder, run, rows)


def no_control(text: str) -> None:
    found = [repr(c) for c in CONTROL if c in text]
    assert not found, f"{found} reached the output"


COMMANDS = [
    ["report", "{run}"],
    ["report", "{run}", "-f", "md", "-o", "-"],
    ["report", "{run}", "-f", "csv"],
    ["report", "{run}", "-f", "json"],
    ["report", "{run}", "-f", "html", "-o", "-"],
    ["report", "{run}", "-f", "samples", "-o", "-"],
    ["report", "{run}", "--telemetry"],
    ["report", "{run}", "--telemetry", "-f", "md"],
    ["claims", "{run}"],
    ["claims", "{run}", "-f", "md"],
    ["compare", "{run}", "{run}"],
    ["compare", "{run}", "{run}", "-f", "md"],
    ["compare", "{run}", "{run}", "-f", "json"],
]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c[2:]) or c[0] for c in COMMANDS])
@pytest.mark.slow
def test_no_control_character_reaches_the_terminal(hostile: Path, command: list[str]) -> None:
    out = runner.invoke(app, [part.format(run=hostile) for part in command])
    assert out.exit_code == 0, out.output
    no_control(out.stdout)
    no_control(out.stderr)


def test_what_was_there_is_shown_escaped(hostile: Path) -> None:
    out = runner.invoke(app, ["report", str(hostile), "-f", "md", "-o", "-"])
    assert "EPYC\\u001b]0;owned\\u0007\\u001b[2J\\u009b31m\\u202e" in out.stdout
    telemetry = runner.invoke(app, ["report", str(hostile), "--telemetry", "-f", "md"])
    assert "window too short \\u001b]0;owned" in telemetry.stdout


def test_json_output_still_reads_back_to_the_stored_text(hostile: Path) -> None:
    out = runner.invoke(app, ["report", str(hostile), "-f", "json"])
    assert json.loads(out.stdout)["run"]["run_id"] == f"run{ATTACK}"


def test_a_warning_about_a_hostile_folder_name_is_escaped(hostile: Path, tmp_path: Path) -> None:
    folder = Path(shutil.copytree(hostile, tmp_path / f"run{ATTACK}dir"))
    with (folder / "results.jsonl").open("a") as handle:
        handle.write('{"case": ')  # a torn last line: a warning naming the folder
    out = runner.invoke(app, ["report", str(folder), "-f", "md"])
    assert out.exit_code == 0 and out.stderr.startswith("warning: ")
    no_control(out.stderr)
    missing = runner.invoke(app, ["report", str(tmp_path / f"gone{ATTACK}")])
    assert missing.exit_code == 2
    no_control(missing.stderr)


@pytest.mark.slow
def test_the_html_page_escapes_markup(hostile: Path) -> None:
    out = runner.invoke(app, ["report", str(hostile), "-f", "html", "-o", "-"])
    assert "<script>alert(1)</script>" not in out.stdout
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out.stdout


def csv_cells(text: str) -> list[str]:
    return [cell for row in csv.reader(io.StringIO(text)) for cell in row]


@pytest.mark.parametrize("source", ["report", "summary"])
@pytest.mark.slow
def test_no_csv_cell_is_a_formula(hostile: Path, source: str) -> None:
    if source == "report":
        text = runner.invoke(app, ["report", str(hostile), "-f", "csv"]).stdout
    else:
        write_run_files(hostile)
        text = (hostile / "summary.csv").read_text()
        no_control((hostile / "summary.md").read_text())
    cells = csv_cells(text)
    for formula in FORMULAS:
        assert formula not in cells and f"'{formula}" in cells
    assert not [c for c in cells if c.startswith(("=", "+", "@")) or (c.startswith("-") and not is_number(c))]
    no_control(text)


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def test_numbers_stay_numbers_in_the_csv(hostile: Path) -> None:
    text = runner.invoke(app, ["report", str(hostile), "-f", "csv"]).stdout
    row = next(csv.DictReader(io.StringIO(text)))
    assert float(row["median_ms"]) > 0 and not row["median_ms"].startswith("'")


def test_no_samples_csv_cell_is_a_formula(hostile: Path, tmp_path: Path) -> None:
    run = json.loads((hostile / "run.json").read_text())
    run["run_id"] = FORMULAS[3]
    write(hostile, run, rows_of(hostile))
    target = tmp_path / "samples.csv"
    out = runner.invoke(app, ["report", str(hostile), "-f", "samples", "-o", str(target)])
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(target.open()))
    assert {r["run_id"] for r in rows} == {f"'{FORMULAS[3]}"}
    assert all(float(r["seconds"]) > 0 for r in rows)


# ----------------------------------------------------------------------------- numbers at the edge of the bounds
@pytest.fixture
def extreme(tmp_path: Path) -> Path:
    """Rows that pass every check at its limit: a call of a picosecond, one of 115 days, int64 peaks and counts."""
    folder = Path(shutil.copytree(FIXTURE, tmp_path / "extreme"))
    rows = rows_of(folder)
    timed = [r for r in rows if r["status"] == "ok"]
    for row, seconds in zip(timed, [MIN_SECONDS, MAX_SECONDS] * len(timed), strict=False):
        m = row["measurement"]
        m["samples_s"] = [seconds] * len(m["samples_s"])
        m["warmup_s"] = MAX_SECONDS
        row["memory"]["peak_bytes"] = MAX_INTEGER
        row["parameters"] = MAX_INTEGER
        row["extra"]["flops"] = MAX_INTEGER
        row["extra"]["flops_formula"] = "x"
        row["duration_s"] = MAX_SECONDS
    return write(folder, json.loads((folder / "run.json").read_text()), rows)


EVERY_READING = [
    ["report", "{run}"],
    *(["report", "{run}", "-f", fmt, "-o", "-"] for fmt in ("md", "csv", "json", "html", "samples", "gab", "bmf")),
    ["claims", "{run}", "-f", "md"],
    ["compare", "{run}", "{run}"],
    ["compare", "{run}", "{run}", "-f", "json"],
]


@pytest.mark.parametrize("command", EVERY_READING, ids=[" ".join(c[2:]) or c[0] for c in EVERY_READING])
@pytest.mark.slow
def test_arithmetic_on_values_at_the_bounds_stays_finite(extreme: Path, command: list[str]) -> None:
    out = runner.invoke(app, [part.format(run=extreme) for part in command])
    assert out.exit_code == 0 and out.exception is None, out.output
    assert "Traceback" not in out.output
    if "html" not in command:  # a page's embedded PNGs are base64, where any word can appear
        assert not re.search(r"\b(inf|nan|Infinity|NaN)\b", out.stdout), out.stdout


# ----------------------------------------------------------------------------------- -o never replaces an input
@pytest.fixture
def copied(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURE, tmp_path / "runs" / "run"))


def files_under(folder: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}


OUTPUTS_INTO_INPUT = [
    (["report", "{run}", "-f", "json", "-o", "{run}/results.jsonl"], "results.jsonl"),
    (["report", "{run}", "-f", "md", "-o", "{run}/notes/new.md"], "notes/new.md"),
    (["claims", "{run}", "-f", "md", "-o", "{run}/run.json"], "run.json"),
    (["compare", "{run}", "{run}", "-f", "md", "-o", "{run}/summary.md"], "summary.md"),
    (["history", "{runs}", "-f", "md", "-o", "{run}/run.json"], "run.json"),
    (["history", "{run}", "-f", "md", "-o", "{link}/run.json"], "run.json"),  # through a link to the run folder
]


@pytest.mark.parametrize(
    ("command", "target"), OUTPUTS_INTO_INPUT, ids=[" ".join(c[0][:1] + c[0][-1:]) for c in OUTPUTS_INTO_INPUT]
)
def test_an_output_inside_an_input_run_folder_is_refused(
    copied: Path, tmp_path: Path, command: list[str], target: str
) -> None:
    (tmp_path / "link").symlink_to(copied)
    before = files_under(tmp_path / "runs")
    values = {"run": copied, "runs": copied.parent, "link": tmp_path / "link"}
    out = runner.invoke(app, [part.format(**values) for part in command])
    assert out.exit_code == 2, out.output
    assert out.output.count("error:") == 1 and "Traceback" not in out.output
    assert files_under(tmp_path / "runs") == before and not (copied / "notes").exists()


def test_an_output_is_never_written_through_a_link(copied: Path, tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "out.md").symlink_to(victim)
    out = runner.invoke(app, ["report", str(copied), "-f", "md", "-o", str(tmp_path / "out.md")])
    assert out.exit_code == 2 and out.output.count("error:") == 1, out.output
    assert victim.read_text() == "keep me\n" and (tmp_path / "out.md").is_symlink()
    fine = runner.invoke(app, ["report", str(copied), "-f", "md", "-o", str(tmp_path / "report.md")])
    assert fine.exit_code == 0 and (tmp_path / "report.md").read_text().startswith("# attnbench run")


# ------------------------------------------------------------------------------ markup in a stored model's name
MARKUP = "evil<script>alert(1)</script>[click](https://evil.example)|`x"


@pytest.fixture
def marked_up(tmp_path: Path) -> Path:
    """A stored run whose lstm rows are a user model's named ``MARKUP`` (a row may name any model its user brought,
    and a plugin's name is its entry point's), with a reason, a label and a telemetry note of the same."""
    folder = Path(shutil.copytree(FIXTURE, tmp_path / "marked"))
    run = json.loads((folder / "run.json").read_text())
    run["label"] = f"nightly {MARKUP}"
    rows = rows_of(folder)
    for row in rows:
        if row["case"]["model"] == "lstm":
            row["case"]["model"] = MARKUP
            row["case"]["user"] = {"factory": "pkg.mod:build", "kind": "recurrent"}
            row["key"] = "x"
            row["telemetry"] = {**TELEMETRY, "note": MARKUP}
    failed = next(r for r in rows if r["status"] != "ok")
    failed["reason"] = f"broke {MARKUP}"
    return write(folder, run, rows)


def outside_code(line: str) -> str:
    """``line`` without its code spans (CommonMark: a run of backticks, not escaped, up to the next run of the same
    length), where markup is text."""
    kept, i = [], 0
    while (opener := re.compile(r"(?<!\\)`+").search(line, i)) is not None:
        kept.append(line[i : opener.start()])
        closer = re.compile(rf"(?<!`){opener.group()}(?!`)").search(line, opener.end())
        if closer is None:
            kept.append(opener.group())
            i = opener.end()
        else:
            i = closer.end()
    return "".join(kept) + line[i:]


def live_markup(text: str) -> list[str]:
    """What a markdown renderer would read as a tag or a link: outside a code span, a < or a ]( not escaped."""
    pattern = r"(?<!\\)<(?:script|/script)|(?<!\\)\]\(https?:"
    return [line for line in text.splitlines() if re.search(pattern, outside_code(line))]


MARKDOWN_OUTPUTS = [
    ["report", "{run}", "-f", "md", "-o", "-"],
    ["report", "{run}", "--telemetry", "-f", "md"],
    ["claims", "{run}", "-f", "md"],
    ["compare", "{run}", "{run}", "-f", "md"],
    ["history", "{run}", "-f", "md"],
]


@pytest.mark.parametrize("command", MARKDOWN_OUTPUTS, ids=[" ".join(c[:1] + c[2:]) for c in MARKDOWN_OUTPUTS])
@pytest.mark.slow
def test_a_model_name_holding_markup_is_plain_text_in_every_markdown_output(
    marked_up: Path, command: list[str]
) -> None:
    out = runner.invoke(app, [part.format(run=marked_up) for part in command])
    assert out.exit_code in (0, 1), out.output
    assert not live_markup(out.stdout), live_markup(out.stdout)
    # Every table row still has as many cells as its header: no stored pipe split one.
    for table in re.findall(r"((?:^\|.*\|$\n?)+)", out.stdout, re.M):
        counts = {len(re.findall(r"(?<!\\)\|", line)) for line in table.splitlines()}
        assert len(counts) == 1, table


@pytest.mark.slow
def test_summary_md_shows_markup_as_text(marked_up: Path) -> None:
    write_run_files(marked_up)
    summary = (marked_up / "summary.md").read_text()
    assert not live_markup(summary)
    assert "evil\\<script>alert(1)\\</script>[click]\\(https://evil.example)" in summary


@pytest.mark.parametrize("name", [f"evil{ATTACK}", "evil $\\nosuch$"], ids=["control", "mathtext"])
@pytest.mark.slow
def test_a_model_name_with_control_characters_or_mathtext_is_drawn_as_text(tmp_path: Path, name: str) -> None:
    """matplotlib handed ESC and BEL of a stored model name to its missing-glyph warning, raw to the terminal, and
    read $…$ as mathtext, where an unknown command stopped the drawing (issue 38)."""
    pytest.importorskip("matplotlib")
    folder = Path(shutil.copytree(FIXTURE, tmp_path / "drawn"))
    rows = rows_of(folder)
    for row in rows:
        if row["case"]["model"] == "lstm":
            row["case"]["model"] = name
            row["case"]["user"] = {"factory": "pkg.mod:build", "kind": "recurrent"}
            row["key"] = "x"
    write(folder, json.loads((folder / "run.json").read_text()), rows)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = runner.invoke(app, ["report", str(folder), "--plots", "-f", "md", "-o", str(tmp_path / "r.md")])
    assert out.exit_code == 0, out.output
    assert len(list((folder / "plots").glob("*.png"))) >= 3
    for warning in caught:
        no_control(str(warning.message))
    no_control(out.stderr)
