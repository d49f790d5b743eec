"""``--format html``: one self-contained page (inline CSS, plots as data URIs) to open, mail or attach to a CI run.

Torch-free. The tables are the run's reading's (``Reading.tables``), the same the markdown and terminal draw, with
the run header, every table's crossover and scaling lines, the plots of each table under it (when matplotlib
drew them) and the cases without a timing. Nothing is fetched from anywhere: no scripts, fonts or stylesheets.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Sequence
from html import escape

from attnbench.analysis.capacity import CapacityPoint, CapacityTable
from attnbench.analysis.pivot import Cell, PivotTable
from attnbench.analysis.prefix import PrefixTable
from attnbench.analysis.reading import Reading
from attnbench.core.units import format_bytes, format_seconds, plural
from attnbench.report.capacity_md import CROSSINGS, PER_SEQUENCE, bytes_text, point_text
from attnbench.report.capacity_md import LEGEND as CAPACITY_LEGEND
from attnbench.report.cells import (
    BELOW_ROOFLINE,
    BELOW_ROOFLINE_NOTE,
    CONTENDED_MARK,
    CROSSOVER_LEGEND,
    LEGEND,
    SCALING_LEGEND,
    column_headers,
    contention_lines,
    environment_line,
    run_checks,
    state_legend,
    state_text,
    status_text,
    time_legend,
)
from attnbench.report.plots import Plot
from attnbench.report.prefix_md import HEADERS as PREFIX_HEADERS
from attnbench.report.prefix_md import LEGEND as PREFIX_LEGEND
from attnbench.report.prefix_md import cells as prefix_cells
from attnbench.results.records import Run

_CSS = """
:root { color-scheme: light; --fg: #1d2329; --muted: #5b6670; --line: #d8dde2; --head: #f3f5f7;
  --base: #eaf2fb; --noisy: #fff6df; --fail: #f6f6f6; --good: #1a7f37; --bad: #b42318; }
* { box-sizing: border-box; }
body { margin: 0; font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; }
h1 { font-size: 1.6rem; margin: 0 0 4px; } h2 { font-size: 1.25rem; margin: 40px 0 8px;
  padding-top: 12px; border-top: 2px solid var(--line); } h3 { font-size: 1rem; margin: 20px 0 6px; }
code, pre { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 0.88em; }
pre { background: var(--head); padding: 12px; overflow-x: auto; border-radius: 6px; }
.muted, .legend { color: var(--muted); } .legend { font-size: 0.9rem; max-width: 70em; }
nav ul { margin: 6px 0; padding-left: 1.2em; columns: 2; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 6px 0 10px; font-variant-numeric: tabular-nums; }
th, td { border: 1px solid var(--line); padding: 4px 10px; white-space: nowrap; }
thead th { background: var(--head); font-weight: 600; }
td.num { text-align: right; } th.row { text-align: left; font-weight: 600; }
tr.baseline th, tr.baseline td { background: var(--base); }
td.noisy { background: var(--noisy); } td.fail { background: var(--fail); color: var(--muted); font-style: italic; }
.speedup { font-size: 0.85em; margin-left: 4px; } .faster { color: var(--good); } .slower { color: var(--bad); }
table.kv th { text-align: left; background: var(--head); font-weight: 500; } table.kv td { white-space: normal; }
ul.lines { margin: 4px 0 10px; padding-left: 1.3em; } ul.lines li { margin: 2px 0; }
.plots { display: grid; grid-template-columns: repeat(auto-fill, minmax(520px, 1fr)); gap: 16px; margin-top: 12px; }
figure { margin: 0; } figure img { width: 100%; height: auto; border: 1px solid var(--line); border-radius: 4px; }
figcaption { font-size: 0.85rem; color: var(--muted); }
details { margin: 8px 0; } summary { cursor: pointer; font-weight: 600; }
footer { margin-top: 48px; font-size: 0.85rem; color: var(--muted); }
@media print { .plots { grid-template-columns: 1fr; } main { max-width: none; } }
""".strip()


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _device_text(run: Run) -> str:
    return environment_line(run, code=lambda v: f"<code>{_e(v)}</code>", text=_e)


def _cell_title(cell: Cell) -> str:
    """The tooltip: the numbers behind the cell, or why there are none."""
    r = cell.result
    if not r.ok or r.measurement is None:
        return f"{r.status}: {r.reason}" if r.reason else r.status
    m = r.measurement
    s = m.summary
    parts = [f"median {format_seconds(s.median)}"]
    if s.ci_low > float("-inf") and s.ci_high < float("inf"):
        parts.append(f"95% CI {format_seconds(s.ci_low)} to {format_seconds(s.ci_high)}")
    samples = f"{s.n} sample{'s' if s.n != 1 else ''}"
    parts.append(f"{samples} of {m.calls_per_sample} call{'s' if m.calls_per_sample != 1 else ''}")
    parts.append(f"IQR {s.iqr_rel:.1%} of the median")
    if not m.converged:
        parts.append(f"CI target not reached ({m.stop_reason})")
    if r.contention is not None and r.contention.contended:
        parts.append(f"busy machine: {'; '.join(r.contention.reasons)}")
    return "; ".join(parts)


def _time_cell(cell: Cell | None) -> str:
    if cell is None:
        return '<td class="num"></td>'
    if cell.median_s is None:
        return f'<td class="num fail" title="{_e(_cell_title(cell))}">{_e(status_text(cell))}</td>'
    mark = CONTENDED_MARK if cell.result.contended else ""
    text = mark + ("~" if cell.noisy else "") + format_seconds(cell.median_s)
    if cell.speedup is not None:
        side = "faster" if cell.speedup > 1 else "slower" if cell.speedup < 1 else ""
        mark = "?" if cell.estimate else ""
        text = f'{_e(text)}<span class="speedup {side}">({cell.speedup:.2f}×{mark})</span>'
    else:
        text = _e(text)
    classes = "num noisy" if cell.noisy else "num"
    return f'<td class="{classes}" title="{_e(_cell_title(cell))}">{text}</td>'


def _no_reading(cell: Cell | None) -> str | None:
    """The cell of a length that did not run or did not end ok; None for an ok row."""
    if cell is None:
        return '<td class="num"></td>'
    if not cell.result.ok:
        return f'<td class="num fail" title="{_e(_cell_title(cell))}">{_e(status_text(cell))}</td>'
    return None


def _memory_cell(cell: Cell | None) -> str:
    empty = _no_reading(cell)
    if empty is not None or cell is None:
        return empty or ""
    r = cell.result
    if r.memory is None or r.memory.peak_bytes is None:
        reason = r.memory.note if r.memory is not None and r.memory.note else "not measured"
        return f'<td class="num" title="{_e(reason)}">?</td>'
    title = f"{r.memory.peak_bytes} bytes ({r.memory.method})"
    return f'<td class="num" title="{_e(title)}">{_e(format_bytes(r.memory.peak_bytes))}</td>'


def _state_cell(cell: Cell | None) -> str:
    empty = _no_reading(cell)
    if empty is not None or cell is None:
        return empty or ""
    r = cell.result
    title = f"computed {r.state_bytes} bytes; measured {r.state_mem_bytes} bytes ({r.extra.get('state_mem_method')})"
    return f'<td class="num" title="{_e(title)}">{_e(state_text(cell))}</td>'


def _pivot(table: PivotTable, render: Callable[[Cell | None], str]) -> list[str]:
    headers = "".join(f'<th scope="col">{_e(h)}</th>' for h in ["model", *column_headers(table)])
    out = ['<div class="scroll"><table class="pivot">', f"<thead><tr>{headers}</tr></thead>", "<tbody>"]
    for label, cells in table.rows:
        is_baseline = table.is_baseline(label)
        row = "".join(render(cells.get(n)) for n in table.seq_lens)
        attrs = ' class="baseline"' if is_baseline else ""
        out.append(f'<tr{attrs}><th scope="row" class="row">{_e(label)}</th>{row}</tr>')
    out += ["</tbody></table></div>"]
    return out


def _lines(legend: str, lines: Sequence[str]) -> list[str]:
    if not lines:
        return []
    items = "".join(f"<li>{_e(line)}</li>" for line in lines)
    return [f'<p class="legend">{_e(legend)}</p>', f'<ul class="lines">{items}</ul>']


def _figure(plot: Plot) -> str:
    data = base64.b64encode(plot.png).decode("ascii")
    return (
        f'<figure><img alt="{_e(plot.title)}" src="data:image/png;base64,{data}">'
        f"<figcaption>{_e(plot.title)}</figcaption></figure>"
    )


def _table_section(index: int, table: PivotTable, plots: Sequence[Plot]) -> list[str]:
    out = [f'<section id="table-{index}">', f"<h2>{_e(table.title)}</h2>"]
    if table.baseline and not table.decode:
        out.append(f'<p class="legend">{_e(LEGEND.format(baseline=table.baseline))}</p>')
    elif table.decode:
        out.append(
            f'<p class="legend">{_e(time_legend(table, table.baseline or ""))} Hover a cell for its numbers.</p>'
        )
    else:
        out.append('<p class="legend">Median time per call; ~ marks a noisy cell. Hover a cell for its numbers.</p>')
    out += _pivot(table, _time_cell)
    out += _lines(CROSSOVER_LEGEND, table.crossovers)
    if table.decode:
        out.append(f"<h3>{_e(state_legend(table).rstrip(':'))}</h3>")
        out += _pivot(table, _state_cell)
    else:
        out.append("<h3>Peak memory of one call above the post-setup baseline</h3>")
        out += _pivot(table, _memory_cell)
    out += _lines(SCALING_LEGEND, [line.text for line in table.scaling])
    mine = [p for p in plots if p.group == table.title]
    if mine:
        out += ['<div class="plots">', *(_figure(p) for p in mine), "</div>"]
    out.append("</section>")
    return out


def _text_table(headers: Sequence[str], rows: Iterable[tuple[str, Sequence[str]]]) -> list[str]:
    """A table of text cells, each row headed by its label, styled as the pivot tables are."""
    head = "".join(f'<th scope="col">{_e(h)}</th>' for h in headers)
    out = ['<div class="scroll"><table class="pivot">', f"<thead><tr>{head}</tr></thead>", "<tbody>"]
    for label, cells in rows:
        row = "".join(f'<td class="num">{_e(cell)}</td>' for cell in cells)
        out.append(f'<tr><th scope="row" class="row">{_e(label)}</th>{row}</tr>')
    return [*out, "</tbody></table></div>"]


def _capacity_table(table: CapacityTable, render: Callable[[CapacityPoint | None], str]) -> list[str]:
    rows = []
    for curve in table.curves:
        points = {p.n: p for p in curve.points}
        rows.append((curve.label, [render(points.get(n)) for n in table.seq_lens]))
    return _text_table(["model", *(f"n={n}" for n in table.seq_lens)], rows)


def _capacity_section(index: int, table: CapacityTable, plots: Sequence[Plot]) -> list[str]:
    """summary.md's capacity section for one table: batch · tokens/s, the crossings, the bytes per sequence, and
    the table's figure."""
    out = [f'<section id="capacity-{index}">', f"<h2>{_e(table.title)}</h2>"]
    out += [f'<p class="legend">{_e(CAPACITY_LEGEND)}</p>', *_capacity_table(table, point_text)]
    out += _lines(CROSSINGS, table.crossovers)
    out += [f"<h3>{_e(PER_SEQUENCE.rstrip(':'))}</h3>", *_capacity_table(table, bytes_text)]
    mine = [p for p in plots if p.metric == "capacity" and p.group == table.title]
    if mine:
        out += ['<div class="plots">', *(_figure(p) for p in mine), "</div>"]
    return [*out, "</section>"]


def _prefix_section(index: int, table: PrefixTable) -> list[str]:
    """The shared-prefix table, as summary.md has it."""
    out = [
        f'<section id="prefix-{index}">',
        f"<h2>{_e(table.title)}</h2>",
        f'<p class="legend">{_e(PREFIX_LEGEND)}</p>',
    ]
    rows = [(cells[0], cells[1:]) for cells in map(prefix_cells, table.points)]
    return [*out, *_text_table(PREFIX_HEADERS, rows), "</section>"]


def _checks_section(reading: Reading) -> list[str]:
    """The run's self-consistency checks, as the markdown has them; nothing when there is nothing to check."""
    checks = run_checks(reading)
    if not checks:
        return []
    out = ['<section id="checks">', "<h2>Checks</h2>"]
    if checks.summary:
        out.append(f"<p>{_e(checks.summary)}</p>")
    if checks.flagged:
        items = "".join(
            f"<li><code>{_e(c.train.case.label)}</code>: {c.ratio:.2f} ({_e(c.parts_text)}) — {_e(c.reason)}</li>"
            for c in checks.flagged
        )
        out.append(f'<ul class="lines">{items}</ul>')
    if checks.over_peak:
        items = "".join(f"<li>{_e(line)}</li>" for line in checks.over_peak)
        out += ["<p><strong>Above 100 % of peak</strong> (impossible; do not trust these rows):</p>"]
        out.append(f'<ul class="lines">{items}</ul>')
    if checks.below_roofline:
        items = "".join(f"<li>{_e(line)}</li>" for line in checks.below_roofline)
        out += [f"<p><strong>{_e(BELOW_ROOFLINE)}</strong> {_e(BELOW_ROOFLINE_NOTE)}:</p>"]
        out.append(f'<ul class="lines">{items}</ul>')
    return [*out, "</section>"]


def _key_values(rows: Sequence[tuple[str, object]]) -> str:
    body = "".join(f"<tr><th>{_e(k)}</th><td>{_e('' if v is None else v)}</td></tr>" for k, v in rows)
    return f'<table class="kv"><tbody>{body}</tbody></table>'


def render_html(reading: Reading, plots: Sequence[Plot] = (), plots_note: str = "") -> str:
    """The page. ``plots`` (from ``render_plots``) are placed under their table; ``plots_note`` says why there
    are none (matplotlib missing), and is shown instead."""
    run, results, tables = reading.run, reading.results, reading.tables
    ok = sum(r.ok for r in results)
    body = [
        "<header>",
        f"<h1>attnbench run <code>{_e(run.run_id)}</code></h1>",
        f"<p>{_device_text(run)}</p>",
        f'<p class="muted">Config <code>{_e(run.config_source)}</code> (sha256 <code>{_e(run.config_sha256[:12])}'
        f"</code>), created {_e(run.created_utc)}, state: {_e(run.state)}. "
        f"{plural(len(results), 'case')}, {ok} ok.</p>",
        "</header>",
    ]
    headline, busy = contention_lines(results)
    if headline:
        items = "".join(f"<li>{_e(line)}</li>" for line in busy)
        body += [f'<p class="slower"><strong>{_e(headline)}</strong></p>', f'<ul class="lines">{items}</ul>']
    if plots_note:
        body.append(f'<p class="muted">{_e(plots_note)}</p>')
    failed = [r for r in results if not r.ok]
    if len(tables) + len(reading.capacity) > 1 or failed:
        links = [f'<li><a href="#table-{i}">{_e(t.title)}</a></li>' for i, t in enumerate(tables, start=1)]
        links += [f'<li><a href="#capacity-{i}">{_e(t.title)}</a></li>' for i, t in enumerate(reading.capacity, 1)]
        if failed:
            links.append(f'<li><a href="#failed">Cases without a timing ({len(failed)})</a></li>')
        body += ["<nav><strong>Contents</strong><ul>", *links, "</ul></nav>"]
    for i, table in enumerate(tables, start=1):
        body += _table_section(i, table, plots)
    for i, capacity in enumerate(reading.capacity, start=1):
        body += _capacity_section(i, capacity, plots)
    for i, prefix in enumerate(reading.prefix, start=1):
        body += _prefix_section(i, prefix)
    body += _checks_section(reading)
    if failed:
        items = "".join(
            f"<li><code>{_e(r.case.label)}</code>: <strong>{_e(r.status)}</strong> — {_e(r.reason)}</li>"
            for r in failed
        )
        body += [
            '<section id="failed">',
            "<h2>Cases without a timing</h2>",
            f'<ul class="lines">{items}</ul>',
            "</section>",
        ]
    env = run.environment
    body += [
        "<h2>Run details</h2>",
        f"<details><summary>Environment</summary>{_key_values(sorted(env.items()))}</details>",
        f"<details><summary>Timing policy</summary>{_key_values(list(run.timing.to_dict().items()))}</details>",
        f"<details><summary>Resolved config</summary><pre>{_e(json.dumps(dict(run.config), indent=2))}</pre></details>",
        f"<details><summary>Command</summary><pre>{_e(' '.join(run.command))}</pre></details>",
        "<footer>Rendered by attnbench from <code>run.json</code> and <code>results.jsonl</code>; "
        "<code>attnbench report RUN --format csv</code> gives every number here and more.</footer>",
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            '<meta name="viewport" content="width=device-width, initial-scale=1">',
            f"<title>attnbench · {_e(run.run_id)}</title>",
            f"<style>\n{_CSS}\n</style>",
            "</head>",
            "<body><main>",
            *body,
            "</main></body>",
            "</html>",
            "",
        ]
    )
