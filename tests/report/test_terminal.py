"""The comparison tables in a terminal: at any width, a cell's median and its speed-up stay on one line."""

from __future__ import annotations

import re

import pytest
from rich.console import Console

from attnbench.analysis.reading import Reading
from attnbench.report.terminal import comparison_tables
from attnbench.results.records import Result
from attnbench.results.store import load_run
from tests.report.test_report import fake
from tests.support import FIXTURE

# A row folded onto a second line starts with an empty model cell.
CONTINUATION = re.compile(r"^│ +│")


def _grid(models: list[str], lengths: list[int]) -> list[Result]:
    return [fake(m, n, 1e-4 * (i + 1) * n / lengths[0]) for i, m in enumerate(models) for n in lengths]


def _render(results: list[Result], width: int) -> str:
    console = Console(width=width, record=True, color_system=None)
    console.print(comparison_tables(Reading(load_run(FIXTURE).run, results), memory=True))
    return console.export_text()


DEFAULT_CPU = (["lstm", "gru", "vanilla", "sdpa-flash"], [64, 256, 512, 1024])
DEFAULT_CUDA = (
    ["lstm", "gru", "vanilla", "sdpa-flash", "sdpa", "sdpa-efficient", "sdpa-cudnn", "flash-attn"],
    [256, 512, 1024, 2048, 4096, 8192],
)


@pytest.mark.parametrize("shape", [DEFAULT_CPU, DEFAULT_CUDA], ids=["default-cpu", "default-cuda"])
@pytest.mark.parametrize("width", [80, 60, 40])
def test_no_cell_folds_onto_a_second_line(shape: tuple[list[str], list[int]], width: int) -> None:
    models, lengths = shape
    text = _render(_grid(models, lengths), width)
    table_lines = [line for line in text.splitlines() if line.startswith(("│", "┃", "┏", "└"))]
    assert all(len(line.rstrip()) <= width for line in table_lines), text
    assert not [line for line in table_lines if CONTINUATION.match(line)], text
    for n in lengths:  # every length is still shown, and every speed-up
        assert f"n={n}" in text
    assert text.count("×") >= (len(models) - 1) * len(lengths)


def test_a_wide_terminal_keeps_the_speedup_beside_the_median() -> None:
    text = _render(_grid(*DEFAULT_CPU), 160)
    assert text.count("┏") == _render(_grid(*DEFAULT_CPU), 80).count("┏") - 1  # no table of speed-ups alone
    assert re.search(r"│ gru +│ +200 µs \(0\.50×\) │", text), text


def test_at_80_columns_the_speedups_get_a_table_of_their_own() -> None:
    text = _render(_grid(*DEFAULT_CPU), 80)
    assert "lstm" in text and re.search(r"│ gru +│ +0\.50× │", text), text  # speed-ups against lstm, alone

    assert "(continued)" not in text
