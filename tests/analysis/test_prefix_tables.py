"""The shared-prefix section (``mode: prefix``): every row of a committed run in its table with both strategies'
time and bytes as stored, in summary.md and the HTML page alike; rows that differ only in what they keep (pages of 16
or none) are rows of their own."""

from __future__ import annotations

import re
from html import unescape

from attnbench.analysis.reading import Reading
from attnbench.report.html import render_html
from attnbench.report.prefix_md import cells, prefix_markdown
from attnbench.results.store import load_run
from tests.support import ROOT

RUN = ROOT / "results" / "20261207-091052-serving-prefix-cpu-cpu"  # every decoding family, P 256 and 512, M 8
WIDE = ROOT / "results" / "20261207-091451-serving-prefix-4096-cpu-cpu"  # sdpa-flash and mla at P = 4096


def test_every_prefix_row_is_in_its_table_with_both_strategies_numbers() -> None:
    stored = load_run(RUN)
    points = [p for t in Reading.of(stored).prefix for p in t.points]
    assert len(points) == len(stored.results) == 54  # page_tokens 0 and 16 of one model are two rows
    stored_numbers = sorted(
        (r.median_s, r.extra["independent_s"], r.extra["prefix_held_bytes"], r.extra["independent_held_bytes"])
        for r in stored.results
    )
    shown = sorted((p.shared_s, p.independent_s, p.shared_bytes, p.independent_bytes) for p in points)
    assert shown == stored_numbers
    for p in points:
        assert p.speedup == p.independent_s / p.shared_s  # type: ignore[operator]
        assert p.held_over_one == p.shared_bytes / (p.independent_bytes / 8)  # type: ignore[operator]


def test_attention_sharing_a_4096_token_prefix_among_8_holds_less_than_twice_one_requests_cache() -> None:
    reading = Reading.of(load_run(WIDE))
    attention = [p for t in reading.prefix for p in t.points]
    assert {p.label.split()[0] for p in attention} == {"sdpa-flash", "mla"}
    for p in attention:
        assert p.reused == 4096 and p.held_over_one is not None and p.held_over_one < 2


def test_markdown_and_html_show_the_same_cells() -> None:
    reading = Reading.of(load_run(RUN))
    markdown = "\n".join(prefix_markdown(reading.prefix)).splitlines()
    rows = [line for line in markdown if line.startswith("| ") and "---" not in line][1:]  # the header left out
    points = [p for t in reading.prefix for p in t.points]
    assert [[c.strip() for c in row.strip("|").split("|")] for row in rows] == [cells(p) for p in points]
    page = render_html(reading)
    section = page.split('<section id="prefix-1">', 1)[1].split("</section>", 1)[0]
    shown = [unescape(c) for c in re.findall(r'<td class="num">([^<]*)</td>', section)]
    assert shown == [c for p in points for c in cells(p)[1:]]
