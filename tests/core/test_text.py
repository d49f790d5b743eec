"""core.text: stored strings made safe for a terminal (safe_text), a spreadsheet (csv_cell) and markdown (md_text,
md_code)."""

from __future__ import annotations

import json

import pytest

from attnbench.core.text import csv_cell, md_code, md_text, safe_text

# What the issue found reaching a terminal: set the window title, clear the screen, ring the bell.
HOSTILE = "ok\x1b]0;owned\x07\x1b[2J\x9b31m done"


def test_control_characters_become_visible_escapes() -> None:
    assert safe_text(HOSTILE) == "ok\\u001b]0;owned\\u0007\\u001b[2J\\u009b31m done"


@pytest.mark.parametrize("char", ["\x00", "\x07", "\x08", "\x0b", "\x0c", "\r", "\x1b", "\x7f", "\x85", "\x9b"])
def test_every_c0_c1_and_del_is_escaped(char: str) -> None:
    assert safe_text(f"a{char}b") == f"a\\u{ord(char):04x}b"


@pytest.mark.parametrize("char", ["\u202e", "\u2066", "\u2069", "\u202a"])
def test_bidirectional_overrides_are_escaped(char: str) -> None:
    assert char not in safe_text(f"sure{char}eruS")


def test_a_lone_surrogate_is_escaped_and_the_text_encodes() -> None:
    text = safe_text("bad \ud800 name")
    assert text == "bad \\ud800 name"
    text.encode("utf-8")  # would raise UnicodeEncodeError on the surrogate itself


def test_lines_and_tabs_stay_in_a_page_and_go_in_a_message() -> None:
    assert safe_text("a\n\tb") == "a\n\tb"
    assert safe_text("a\n\tb", lines=False) == "a\\u000a\\u0009b"


def test_ordinary_text_is_untouched() -> None:
    text = "lstm forward n=64: 1.2 ms ±3 % · µs — ✓ 日本語 😀"
    assert safe_text(text) is text


def test_json_stays_valid_and_means_the_same() -> None:
    value = {"reason": HOSTILE, "c1": "\x85\u202e", "surrogate": "\ud800"}
    text = json.dumps(value, ensure_ascii=False)
    assert json.loads(safe_text(text)) == value


@pytest.mark.parametrize(
    "cell",
    ['=HYPERLINK("http://evil","x")', "+cmd|' /C calc'!A0", "@SUM(1+1)", "-2+3+cmd|' /C calc'!A0", "\tx"],
)
def test_formula_cells_are_neutralised(cell: str) -> None:
    assert csv_cell(cell) == "'" + safe_text(cell)


@pytest.mark.parametrize("value", [-2.5, -3, 0, 1.5e-3, True, None, "lstm", "model=lstm|mode=forward", "a-b"])
def test_numbers_and_plain_text_pass_unchanged(value: object) -> None:
    assert csv_cell(value) == value


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("lstm heads_kv=2 (a) [b]", "lstm heads_kv=2 (a) [b]"),  # nothing harmful: unchanged
        ("<script>alert(1)</script>", "\\<script>alert(1)\\</script>"),
        ("[click](https://evil.example)", "[click]\\(https://evil.example)"),
        ("![pixel](https://evil.example/p.png)", "![pixel]\\(https://evil.example/p.png)"),
        ("a `code` span", "a \\`code\\` span"),
        ("C:\\path", "C:\\\\path"),
        ("two\nlines\r\n# heading", "two lines # heading"),
    ],
)
def test_md_text_leaves_no_tag_link_or_code_span(text: str, shown: str) -> None:
    assert md_text(text) == shown


@pytest.mark.parametrize(
    ("text", "span"),
    [("lstm forward", "`lstm forward`"), ("a`b", "``a`b``"), ("`x", "`` `x ``"), ("a``b`", "``` a``b` ```")],
)
def test_md_code_is_never_ended_early_by_a_backtick_inside(text: str, span: str) -> None:
    assert md_code(text) == span
