"""Text that came from a file, made safe for where it goes: a terminal or a file someone will ``cat``
(``safe_text``), a spreadsheet (``csv_cell``), a markdown document (``md_text``, ``md_code``). Stdlib only.

A run folder is data anyone can hand us. A failure reason, a run id, an environment field or a folder name that
holds ESC or BEL would, printed raw, move the cursor, clear the screen or set the window title (ECMA-48 control
functions); a bidirectional override would make the text read differently from what it is ("Trojan Source",
CVE-2021-42574); and a lone UTF-16 surrogate cannot be encoded at all, so printing it raises. Every string read
from a file passes ``safe_text`` before it is printed (the CLI's consoles and ``write_or_print`` apply it to all
they write), and every text cell of a CSV passes ``csv_cell``.
"""

from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls; the Unicode bidirectional embeddings, overrides and isolates;
# and lone surrogates (a str holds one only when it was decoded from broken UTF-16 or surrogateescape'd bytes).
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_UNSAFE_LINES = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    # JSON's escape, which reads the same in any text: JSON output stays valid and means exactly what it meant.
    return f"\\u{ord(match.group()):04x}"


def safe_text(text: str, *, lines: bool = True) -> str:
    """``text`` with every control character, bidirectional control and lone surrogate written out as a visible
    ``\\uXXXX`` escape (ESC → ``\\u001b``). Newlines and tabs stay when ``lines`` (a rendered table, page or JSON
    document); with ``lines=False`` they are escaped too (one line of a message)."""
    pattern = _UNSAFE if lines else _UNSAFE_LINES
    return pattern.sub(_escape, text) if pattern.search(text) else text


# OWASP's "CSV Injection" rule: a cell a spreadsheet would read as a formula or a command starts with one of these.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: object) -> object:
    """A CSV cell that no spreadsheet runs: text starting with = + - @ tab or CR gets a leading single quote
    (OWASP's rule), so ``=HYPERLINK(…)`` in a stored reason stays text. Numbers, booleans and None pass unchanged:
    a negative number is a number, not a formula. Control characters are escaped as ``safe_text`` does."""
    if not isinstance(value, str):
        return value
    text = safe_text(value)
    return "'" + text if text.startswith(_FORMULA_START) else text


# What turns plain markdown text into markup that could do harm: a backslash (it escapes what follows), a backtick
# (it opens a code span), < (raw HTML: <script>, <img onerror>; an autolink), and the ( of ]( (an inline link, an
# image that loads). Emphasis (* and _) only restyles the text, and escaping it would clutter every option name
# (heads_kv); a link by reference needs a definition at the start of a line, where stored text never is.
_MARKDOWN = re.compile(r"[\\`<]|(?<=\])\(")


def _one_line(text: str) -> str:
    return re.sub(r"\s*[\r\n]+\s*", " ", text)  # control characters stay, for safe_text to show


def md_text(text: str) -> str:
    """Stored text (a model name, a label, a reason) as plain text in GitHub-flavoured markdown: every character
    that would make it a tag, a link or a code span backslash-escaped, and its line breaks spaces, so that it stays
    in the paragraph, list item or table row it was put in. A table cell is ``md_cell``."""
    return _MARKDOWN.sub(lambda m: "\\" + m.group(), _one_line(text))


def md_cell(text: str) -> str:
    """Stored text as plain text in a markdown table cell: ``md_text``, and its ``|`` escaped so that it cannot
    split the row."""
    return md_text(text).replace("|", "\\|")


def md_code(text: str) -> str:
    """Stored text as a markdown code span, shown as it is: fenced by more backticks than any run of them inside
    (CommonMark), so no backtick in it can end the span early and let what follows be read as markup."""
    text = _one_line(text)
    longest = max((len(run) for run in re.findall("`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
