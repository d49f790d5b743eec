"""report.formats: one registry per command that renders stored values (report, history, compare) — the names a
command accepts are its registry's, a file format says it needs a file, and the -o suffix picks the samples'
form."""

from __future__ import annotations

import typing
from typing import Any

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.cli.compare import compare
from attnbench.cli.history import history as history_command
from attnbench.cli.report import report
from attnbench.report import formats
from attnbench.report.formats import COMPARE_FORMATS, HISTORY_FORMATS, REPORT_FORMATS, TELEMETRY_FORMATS
from tests.support import ROOT

runner = CliRunner()


def _choices(command: Any) -> set[str]:
    """The values the command's --format option accepts (its Literal)."""
    hint = typing.get_type_hints(command, include_extras=True)["format"]
    return set(typing.get_args(typing.get_args(hint)[0]) if typing.get_origin(hint) is typing.Annotated else ())


@pytest.mark.parametrize(
    ("command", "registry"),
    [(report, REPORT_FORMATS), (history_command, HISTORY_FORMATS), (compare, COMPARE_FORMATS)],
)
def test_a_commands_formats_are_its_registrys(command: Any, registry: dict[str, Any]) -> None:
    assert _choices(command) == set(registry)
    assert all(fmt.name == name for name, fmt in registry.items())
    assert set(TELEMETRY_FORMATS) <= set(REPORT_FORMATS)


def test_a_file_format_needs_a_file_and_the_suffix_picks_the_samples_form() -> None:
    parquet = REPORT_FORMATS["parquet"]
    assert parquet.needs_file and parquet.binary and parquet.for_output(None) is parquet
    samples = REPORT_FORMATS["samples"]
    assert samples.for_output(None) is samples and samples.for_output("-") is samples and not samples.needs_file
    assert samples.for_output("x.PARQUET").binary and samples.for_output("x.parquet").needs_file
    assert samples.for_output("x.csv").text is formats._samples_csv
    assert samples.for_output("x.jsonl") is samples
    # A table written to a file is the markdown; html embeds the plots.
    assert REPORT_FORMATS["table"].text is REPORT_FORMATS["md"].text and REPORT_FORMATS["html"].figures
    assert HISTORY_FORMATS["table"].text is HISTORY_FORMATS["md"].text and HISTORY_FORMATS["html"].figures
    assert COMPARE_FORMATS["table"].text is COMPARE_FORMATS["md"].text


def test_a_file_format_without_a_file_is_bad_input() -> None:
    run = next((ROOT / "results").glob("*/runs/*/run.json")).parent
    result = runner.invoke(app, ["report", str(run), "-f", "parquet"])
    assert result.exit_code == 2 and result.output.count("error:") == 1
