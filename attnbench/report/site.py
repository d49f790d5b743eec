"""``attnbench publish``'s pages: a static site over a history, as ``{path: bytes}`` (the CLI writes the files that
changed). Values in, bytes out; every page is a pure function of the site, with no clock in it, so a page whose
numbers did not change comes out byte for byte the same and publishing again leaves it alone.

- ``index.html``: a section per config (each config is its own history: ``analysis.site.Board``), its cases
  grouped by model, mode and dtype, each with a sparkline of its median time, its newest
  value and its latest verdict.
- ``cases/<slug>.html``: one per case, the interactive graph (``report.site_figures``) with a button per metric the
  case has (latency, tokens/s, peak memory, GB/s), and its steps.
- ``regressions.html``: every confirmed step, newest first, with links to the first bad and last good run and their
  commits.
- ``runs.html``: each config's runs in history order, their environments per segment and what differs in one.
- ``capacity/<run id>.html``: for a run with capacity rows only (``mode: capacity``), summary.md's capacity section:
  per model and context n the batch that fits the memory budget and the aggregate tokens/s at it, where those cross,
  the bytes a sequence adds, and the two as graphs against n; the runs page and the index link it.
- ``data/runs/<run id>.json``: the digests (``analysis.site``) a later publish adds to; ``data/site.json``.
- ``assets/``: site.css, site.js and plotly.min.js (``report.site_assets``), shared by every page; capacity.js
  for a site with a capacity page.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any

from attnbench.analysis.alerts import StepEvent
from attnbench.analysis.capacity import CapacityCurve, CapacityPoint
from attnbench.analysis.history import Metric, run_name
from attnbench.analysis.site import Board, CapacityDigest, CaseView, RunDigest, Site
from attnbench.analysis.steps import MIN_RUNS_PER_LEVEL
from attnbench.core.text import safe_text
from attnbench.core.units import format_bytes, format_change, format_change_interval, plural
from attnbench.report.alerts_md import event_label
from attnbench.report.capacity_md import CROSSINGS, LEGEND, PER_SEQUENCE, bytes_text, point_text
from attnbench.report.history_md import METRIC_WORDS, step_verdict, value_text
from attnbench.report.site_assets import CAPACITY_JS, SITE_CSS, SITE_JS
from attnbench.report.site_figures import WORSE, capacity_figure, case_figure, spark_ratio, sparkline
from attnbench.results.store import StoredRun

SITE_SCHEMA = "attnbench.site/1"
METRIC_BUTTONS: Mapping[Metric, str] = {
    "median": "latency",
    "tokens_per_s": "tokens/s",
    "peak_mem": "peak memory",
    "gbps": "GB/s",
}
ENV_SHOWN = (
    "gpu_name", "driver", "torch_cuda", "cudnn", "cpu_model", "cpu_logical", "torch", "torch_threads", "python",
    "platform", "hostname", "attnbench", "packages", "memory_bytes", "gpu_power_limit_w", "gpu_app_sm_clock_mhz",
)  # fmt: skip


def esc(text: object) -> str:
    """Stored text made safe twice: control characters escaped (``safe_text``), then HTML-escaped."""
    return html.escape(safe_text(str(text)), quote=True)


def _json_script(data: object) -> str:
    """JSON to embed in a <script> element: ``<`` written as an escape, so no stored text can close the element."""
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")


def _page(title: str, body: str, *, depth: int = 0, scripts: Sequence[str] = (), site_title: str) -> bytes:
    up = "../" * depth
    nav = (
        f'<a class="brand" href="{up}index.html">{esc(site_title)}</a><a href="{up}index.html">cases</a>'
        f'<a href="{up}regressions.html">regressions</a><a href="{up}runs.html">runs</a>'
    )
    tags = "".join(f'<script src="{up}assets/{name}"></script>' for name in scripts)
    return (
        "<!doctype html>\n<html lang='en'><head><meta charset='utf-8'>"
        "<meta name='viewport' content='width=device-width, initial-scale=1'>"
        f"<title>{esc(title)} · {esc(site_title)}</title><link rel='stylesheet' href='{up}assets/site.css'>"
        f"</head><body><header>{nav}</header><main>\n{body}\n"
        "<footer>Made by <code>attnbench publish</code>: static files, nothing fetched from a network.</footer>"
        f"</main>{tags}</body></html>\n"
    ).encode()


def _commit(commit: str | None, url: str | None) -> str:
    if not commit:
        return "—"
    short = f"<code>{esc(commit[:12])}</code>"
    return f'<a href="{esc(url.replace("{commit}", commit))}">{short}</a>' if url else short


def _run_link(stored: StoredRun, position: int, depth: int = 0) -> str:
    anchor = f"{'../' * depth}runs.html#run-{esc(stored.run.run_id)}"
    return f'<a href="{anchor}">{position}. {esc(run_name(stored))}</a>'


def _newest(view: CaseView) -> str:
    parts = view.series.get("median", ())
    if not parts:
        return "—"
    p = parts[-1].points[-1]
    return esc(value_text(p.value, "median")) if p.value is not None else esc(p.status)


# ------------------------------------------------------------------------------------------------------ pages
def _capacity_links(board: Board, capacity: Collection[str]) -> str:
    """The board's runs with a capacity page, linked; "" when none has one (the index stays as it was)."""
    links = [
        f"<a href='capacity/{esc(stored.run.run_id)}.html'>{position}. {esc(run_name(stored))}</a>"
        for position, stored in enumerate(board.runs, start=1)
        if stored.run.run_id in capacity
    ]
    if not links:
        return ""
    return (
        "<p class='capacity'>Capacity under a memory budget (the batch that fits and the aggregate tokens/s at it, "
        f"against n per model): {', '.join(links)}.</p>"
    )


def _index(site: Site, title: str, capacity: Collection[str] = ()) -> bytes:
    worse = [e for _, e in site.events if e.worse]
    lead = (
        f"{plural(len(site.runs), 'run')} of {plural(len(site.boards), 'config')}, "
        f"{plural(len(site.cases), 'case')}; "
        f"{plural(len(site.events), 'confirmed step')} (<a href='regressions.html'>{len(worse)} that made things "
        "worse</a>). Each row: the median time per call of every run, the newest, and the latest step that moved it."
    )
    body = [f"<h1>{esc(title)}</h1>", f"<p class='lead'>{lead}</p>"]
    for board in site.boards:
        history = board.history
        newest = board.runs[-1]
        body.append(f"<h2 id='config-{esc(board.config)}'>{esc(board.config)}</h2>")
        body.append(
            f"<p>{plural(len(board.runs), 'run')}, newest {_run_link(newest, len(board.runs))}; runs "
            f"{esc(history.order_note)}.</p>"
        )
        if links := _capacity_links(board, capacity):
            body.append(links)
        groups: dict[tuple[str, str, str], list[CaseView]] = {}
        for view in board.cases:
            groups.setdefault(view.group, []).append(view)
        # One scale for the board's sparklines: the same height is the same relative move on every row.
        ratio = spark_ratio([view.series.get("median", ()) for view in board.cases])
        rows = []
        for (model, mode, dtype), views in groups.items():
            rows.append(f"<tr class='group'><th colspan='4'>{esc(model)} · {esc(mode)} · {esc(dtype)}</th></tr>")
            for view in views:
                colour = WORSE if view.latest.kind == "worse" else "#333"
                spark = sparkline(history, view.series.get("median", ()), colour, ratio=ratio)
                rows.append(
                    f"<tr><td><a class='case' href='cases/{esc(view.slug)}.html'>{esc(view.case.label)}</a></td>"
                    f"<td>{spark}</td><td class='num'>{_newest(view)}</td>"
                    f"<td class='{view.latest.kind}'>{esc(view.latest.text)}</td></tr>"
                )
        body.append(
            "<table class='cases'><thead><tr><th>case</th><th>median time, every run "
            f"(<span class='spark-scale' data-ratio='{ratio:.4g}'>full height ×{ratio:.3g}, every row</span>)</th>"
            "<th>newest</th>"
            "<th>latest verdict</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        )
    return _page("cases", "\n".join(body), site_title=title)


def _steps_table(pairs: Sequence[tuple[Board, StepEvent]], commit_url: str | None, depth: int = 0) -> str:
    up = "../" * depth
    rows = []
    for board, e in pairs:
        slugs = {v.case.key: v.slug for v in board.cases}
        if e.case is not None and e.case.key in slugs:
            case = f"<a href='{up}cases/{esc(slugs[e.case.key])}.html#{e.metric}'>{esc(e.case.label)}</a>"
        else:
            case = f"<span class='shift'>{esc(event_label(e))}</span>"
        verdict = step_verdict(e.step, e.metric)
        kind = "worse" if e.worse else "better"
        rows.append(
            f"<tr><td>{_run_link(e.first_bad, e.position, depth)} {_commit(e.first_bad.run.commit, commit_url)}</td>"
            f"<td>{_run_link(e.last_good, e.good_position, depth)} {_commit(e.last_good.run.commit, commit_url)}</td>"
            f"<td>{esc(board.config)}</td><td>{esc(METRIC_BUTTONS[e.metric])}</td><td>{case}</td>"
            f"<td class='num {kind}'>{esc(format_change(e.step.change))}</td>"
            f"<td class='num'>{esc(format_change_interval(e.step.low, e.step.high))}</td>"
            f"<td class='{kind}'>{esc(verdict)}</td></tr>"
        )
    head = (
        "<tr><th>first bad run</th><th>last good run</th><th>config</th><th>metric</th><th>case</th><th>change</th>"
        "<th>95 % CI</th><th>verdict</th></tr>"
    )
    return f"<table class='steps'><thead>{head}</thead><tbody>{''.join(rows)}</tbody></table>"


def _regressions(site: Site, title: str, commit_url: str | None) -> bytes:
    worse = [(b, e) for b, e in site.events if e.worse]
    better = [(b, e) for b, e in site.events if not e.worse]
    body = [
        "<h1>Regressions</h1>",
        "<p class='lead'>Confirmed steps, newest first: a level that moved by more than the noise between runs, "
        "with two runs at the new level (family-wise 5 % per case). A run-level step moved every case of its "
        "segment together: a machine, its load or its software as often as the code.</p>",
    ]
    short = [b for b in site.boards if len(b.runs) < 2 * MIN_RUNS_PER_LEVEL]
    if worse:
        body.append(_steps_table(worse, commit_url))
    elif short:  # no step can be found in fewer runs: "none" would read as a clean bill
        names = ", ".join(f"{esc(b.config)} ({plural(len(b.runs), 'run')})" for b in short)
        body.append(
            f"<p class='too-few' data-runs-needed='{2 * MIN_RUNS_PER_LEVEL}'>Too few runs to tell: a step needs "
            f"{MIN_RUNS_PER_LEVEL} runs before it and {MIN_RUNS_PER_LEVEL} after, and {names} "
            f"{'has' if len(short) == 1 else 'have'} fewer. <code>attnbench compare</code> judges two runs.</p>"
        )
    else:
        body.append("<p class='none'>None: no level got worse.</p>")
    if better:
        body += ["<h2>Improvements</h2>", _steps_table(better, commit_url)]
    return _page("regressions", "\n".join(body), site_title=title)


def cudnn_text(version: int) -> str:
    """cuDNN's version as torch reports it, an int (8902, 90100), as its release (8.9.2, 9.1.0)."""
    if version >= 90000:  # cuDNN 9: major·10000 + minor·100 + patch
        return f"{version // 10000}.{version % 10000 // 100}.{version % 100}"
    return f"{version // 1000}.{version % 1000 // 100}.{version % 100}"  # cuDNN 8 and before: major·1000 + …


def env_text(key: str, value: object) -> str | None:
    """An environment field as a person reads it (bytes in GiB, cuDNN as a release, the kernel packages as
    name version); None for a field with nothing to show (unset, empty)."""
    if value is None or value == "" or value == {} or value == []:
        return None
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if key == "cudnn" and isinstance(value, int) and not isinstance(value, bool):
        return cudnn_text(value)
    if key.endswith("_bytes") and number:
        return format_bytes(float(value))  # type: ignore[arg-type]
    if key.endswith("_w") and number:
        return f"{value:g} W"
    if key.endswith("_mhz") and number:
        return f"{value:g} MHz"
    if isinstance(value, dict):
        return ", ".join(f"{k} {v}" if v not in (None, "") else str(k) for k, v in sorted(value.items()))
    return str(value)


def _env_list(env: Mapping[str, Any], keys: Sequence[str]) -> str:
    shown = [(k, env_text(k, env.get(k))) for k in keys]
    items = "".join(f"<dt>{esc(k)}</dt><dd>{esc(text)}</dd>" for k, text in shown if text is not None)
    return f"<dl class='env'>{items}</dl>"


def _runs(site: Site, title: str, commit_url: str | None, capacity: Collection[str] = ()) -> bytes:
    body = ["<h1>Runs</h1>", f"<p class='lead'>{plural(len(site.runs), 'run')}, each config in history order.</p>"]
    for board in site.boards:
        history = board.history
        body.append(f"<h2>{esc(board.config)}</h2><p>{esc(history.order_note)}.</p>")
        position = 0
        for segment in history.segments:
            first = segment.runs[0].run.environment
            body.append(f"<h3>Segment {segment.index + 1}</h3>")
            if segment.changed:
                changed = esc("; ".join(segment.changed))
                body.append(f"<p>A new environment: {changed}. Steps are not looked for across it.</p>")
            body.append(_env_list(first, ENV_SHOWN))
            rows = []
            for stored in segment.runs:
                position += 1
                run = stored.run
                differs = [k for k in ENV_SHOWN if run.environment.get(k) != first.get(k)]
                note = "; ".join(f"{k}: {env_text(k, run.environment.get(k)) or '—'}" for k in differs)
                name = esc(run_name(stored))
                if run.run_id in capacity:
                    name += f" · <a class='capacity' href='capacity/{esc(run.run_id)}.html'>capacity</a>"
                rows.append(
                    f"<tr id='run-{esc(run.run_id)}'><td class='num'>{position}</td><td>{name}</td>"
                    f"<td><code>{esc(run.run_id)}</code></td><td>{_commit(run.commit, commit_url)}</td>"
                    f"<td>{esc(run.label or '—')}</td><td>{esc(run.created_utc[:19].replace('T', ' '))}</td>"
                    f"<td>{esc(run.state)}</td><td>{esc(note)}</td></tr>"
                )
            body.append(
                "<table><thead><tr><th>#</th><th>run</th><th>id</th><th>commit</th><th>label</th>"
                "<th>started (UTC)</th><th>state</th><th>differs from the segment's first run</th></tr></thead>"
                "<tbody>" + "".join(rows) + "</tbody></table>"
            )
    return _page("runs", "\n".join(body), site_title=title)


def _case(board: Board, view: CaseView, title: str, commit_url: str | None) -> bytes:
    figures = {m: case_figure(board.histories[m], parts) for m, parts in view.series.items()}
    buttons = "".join(
        f"<button type='button' data-metric='{m}' aria-pressed='false'>{esc(METRIC_BUTTONS[m])}</button>"
        for m in figures
    )
    tables = []
    for metric in figures:
        segments = {part.segment for part in view.series[metric]}
        pairs = [
            (board, e)
            for e in board.events
            if e.metric == metric and (e.case is None or e.case.key == view.case.key) and e.segment in segments
        ]
        text = _steps_table(pairs, commit_url, depth=1) if pairs else "<p>No confirmed step.</p>"
        tables.append(f"<section data-steps='{metric}'><h2>Steps: {esc(METRIC_WORDS[metric])}</h2>{text}</section>")
    if not figures:  # never timed in any run (unsupported here, say): no graph to draw
        body = [
            f"<h1>{esc(view.case.label)}</h1>",
            f"<p class='lead'>Config {esc(board.config)}. No run timed this case: {esc(view.latest.text)}.</p>",
            f"<p><code>{esc(view.case.key)}</code></p>",
        ]
        return _page(view.case.label, "\n".join(body), depth=1, site_title=title)
    body = [
        f"<h1>{esc(view.case.label)}</h1>",
        f"<p class='lead'>Config {esc(board.config)}. Latest verdict: <span class='{view.latest.kind}'>"
        f"{esc(view.latest.text)}</span>. Each point is one run (its 95 % interval as a bar); hover for the run "
        "and its commit, drag to zoom, double-click to zoom out.</p>",
        f"<div class='metrics'>{buttons}</div>",
        "<div id='graph'></div>",
        *tables,
        f"<p><code>{esc(view.case.key)}</code></p>",
        f"<script type='application/json' id='figures'>{_json_script(figures)}</script>",
    ]
    return _page(view.case.label, "\n".join(body), depth=1, scripts=("plotly.min.js", "site.js"), site_title=title)


def _inline_code(text: str) -> str:
    """A markdown legend as HTML: escaped, its `code` spans as <code>."""
    return re.sub(r"`([^`]*)`", r"<code>\1</code>", esc(text))


def _capacity_table(table: CapacityDigest, cell: str) -> str:
    """One of summary.md's two capacity tables: ``cell`` "point" (batch · tokens/s, each cell carrying the exact
    numbers as data-batch and data-tokens-per-s) or "bytes" (what one more sequence adds)."""

    def point(curve: CapacityCurve, n: int) -> CapacityPoint | None:
        return next((p for p in curve.points if p.n == n), None)

    def td(p: CapacityPoint | None) -> str:
        if cell == "bytes":
            held = "" if p is None or p.bytes_per_sequence is None else f" data-bytes='{p.bytes_per_sequence}'"
            return f"<td class='num'{held}>{esc(bytes_text(p))}</td>"
        data = "" if p is None or p.batch is None else f" data-batch='{p.batch}'"
        if p is not None and p.tokens_per_s is not None:
            data += f" data-tokens-per-s='{p.tokens_per_s!r}'"
        return f"<td class='num'{data}>{esc(point_text(p))}</td>"

    head = "".join(f"<th>n={n}</th>" for n in table.seq_lens)
    rows = "".join(
        f"<tr data-model='{esc(c.model)}'><th>{esc(c.label)}</th>{''.join(td(point(c, n)) for n in table.seq_lens)}"
        "</tr>"
        for c in table.curves
    )
    return f"<table class='capacity' data-cells='{cell}'><thead><tr><th>model</th>{head}</tr></thead>" \
        f"<tbody>{rows}</tbody></table>"  # fmt: skip


def _capacity(board: Board, digest: RunDigest, title: str) -> bytes:
    """A run's capacity page: summary.md's capacity section, each table with its graphs."""
    run_id = digest.run.run_id
    position, stored = next((i, s) for i, s in enumerate(board.runs, start=1) if s.run.run_id == run_id)
    body = [
        f"<h1>Capacity · {esc(run_name(stored))}</h1>",
        f"<p class='lead'>Config {esc(board.config)}, run {_run_link(stored, position, depth=1)}. "
        f"{_inline_code(LEGEND)}</p>",
    ]
    figures: list[dict[str, Any]] = []
    for index, table in enumerate(digest.capacity):
        body += [f"<section id='capacity-{index}'>", f"<h2>{esc(table.title)}</h2>", _capacity_table(table, "point")]
        if table.crossovers:
            items = "".join(f"<li>{esc(line)}</li>" for line in table.crossovers)
            body += [f"<p>{esc(CROSSINGS)}</p>", f"<ul class='crossings'>{items}</ul>"]
        body += [f"<h3>{esc(PER_SEQUENCE.rstrip(':'))}</h3>", _capacity_table(table, "bytes")]
        if any(p.batch is not None for c in table.curves for p in c.points):  # as capacity_plots: a point to draw
            body.append(
                f"<div class='capacity-graph' id='capacity-graph-{len(figures)}' style='min-height:440px'></div>"
            )
            figures.append(capacity_figure(table))
        body.append("</section>")
    body.append(f"<script type='application/json' id='capacity-figures'>{_json_script(figures)}</script>")
    return _page(f"capacity · {run_name(stored)}", "\n".join(body), depth=1, scripts=("plotly.min.js", "capacity.js"),
                 site_title=title)  # fmt: skip


def render_site(
    site: Site,
    digests: Sequence[RunDigest],
    *,
    plotly: bytes,
    plotly_version: str,
    title: str = "attnbench",
    commit_url: str | None = None,
) -> dict[str, bytes]:
    """Every file of the site, by path relative to its root."""
    capacity = {d.run.run_id: d for d in digests if d.capacity}
    files: dict[str, bytes] = {
        "index.html": _index(site, title, capacity),
        "regressions.html": _regressions(site, title, commit_url),
        "runs.html": _runs(site, title, commit_url, capacity),
        "assets/site.css": SITE_CSS.encode(),
        "assets/site.js": SITE_JS.encode(),
        "assets/plotly.min.js": plotly,
    }
    for board in site.boards:
        for view in board.cases:
            files[f"cases/{view.slug}.html"] = _case(board, view, title, commit_url)
        for stored in board.runs:
            if stored.run.run_id in capacity:
                files[f"capacity/{stored.run.run_id}.html"] = _capacity(board, capacity[stored.run.run_id], title)
    if capacity:
        files["assets/capacity.js"] = CAPACITY_JS.encode()
    for digest in digests:
        text = json.dumps(digest.to_dict(), indent=1, sort_keys=True, allow_nan=False)
        files[f"data/runs/{digest.run.run_id}.json"] = (text + "\n").encode()
    manifest = {
        "schema": SITE_SCHEMA,
        "title": title,
        "configs": {b.config: [s.run.run_id for s in b.runs] for b in site.boards},
        "cases": {v.slug: v.case.key for v in site.cases},
        "plotly_js": plotly_version,
    }
    files["data/site.json"] = (json.dumps(manifest, indent=1) + "\n").encode()
    return files
