"""The published site's own style and script (small, written here), and plotly.js, vendored from the installed
``plotly`` package: the site fetches nothing from a network, so it works from the file system and GitHub Pages.

plotly draws the graphs because a figure is plain JSON (``report.site_figures`` writes it without importing plotly,
so ``publish`` pays no import), every point is an SVG element a browser test can count and hover, and zoom, pan,
hover labels, error bars and shapes all come in its one file. Its cost is that file: plotly.min.js is about 4.8 MB
(1.5 MB gzipped, as GitHub Pages serves it), written once per site under ``assets/`` and shared by every page.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from attnbench.core.errors import AttnbenchError

PLOTLY_HINT = "plotly is installed with attnbench (pip install .); reinstall it: pip install 'plotly>=5'"


def plotly_js() -> tuple[bytes, str]:
    """plotly.min.js as the installed ``plotly`` package ships it, and its version; found without importing plotly."""
    spec = importlib.util.find_spec("plotly")
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        path = Path(folder) / "package_data" / "plotly.min.js"
        if path.is_file():
            data = path.read_bytes()
            match = re.search(rb"plotly\.js v(\d+\.\d+\.\d+)", data[:400])
            return data, match.group(1).decode() if match else "?"
    raise AttnbenchError("publish: the plotly package (which ships plotly.js) is not installed", hint=PLOTLY_HINT)


SITE_CSS = """\
:root { --fg: #1d2330; --muted: #5b6475; --line: #d9dde5; --worse: #c62828; --better: #2e7d32; --shift: #7b4fb0; }
* { box-sizing: border-box; }
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; color: var(--fg); margin: 0; line-height: 1.45; }
header { background: #1d2330; color: #fff; padding: .7em 1.5em; display: flex; gap: 1.5em; align-items: baseline; }
header a { color: #cfd8ff; text-decoration: none; } header a:hover { text-decoration: underline; }
header .brand { font-weight: 700; color: #fff; }
main { max-width: 78em; margin: 0 auto; padding: 1em 1.5em 3em; }
h1 { font-size: 1.45em; margin: .4em 0 .2em; } h2 { font-size: 1.15em; margin: 1.6em 0 .4em; }
p.lead { color: var(--muted); margin-top: 0; }
table { border-collapse: collapse; width: 100%; margin: .5em 0 1em; font-size: .93em; }
th, td { border-bottom: 1px solid var(--line); padding: .35em .6em; text-align: left; vertical-align: middle; }
th { color: var(--muted); font-weight: 600; background: #f6f7f9; }
tr.group th { background: #fff; color: var(--fg); font-size: 1.02em; padding-top: 1.1em; }
h3 { font-size: 1em; margin: 1.2em 0 .3em; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.worse { color: var(--worse); font-weight: 600; } .better { color: var(--better); font-weight: 600; }
.failed { color: var(--worse); } .steady, .short, .missing { color: var(--muted); }
.shift { color: var(--shift); }
code { font-size: .92em; background: #f1f3f6; padding: .05em .3em; border-radius: 3px; }
.metrics { display: flex; gap: .4em; margin: .6em 0; flex-wrap: wrap; }
.metrics button { border: 1px solid var(--line); background: #fff; padding: .35em .8em; border-radius: 4px;
  cursor: pointer; font: inherit; }
.metrics button[aria-pressed="true"] { background: #1d2330; color: #fff; border-color: #1d2330; }
#graph { width: 100%; min-height: 440px; border: 1px solid var(--line); border-radius: 4px; }
.spark { display: block; }
dl.env { display: grid; grid-template-columns: max-content 1fr; gap: .15em 1em; font-size: .9em; }
dl.env dt { color: var(--muted); } dl.env dd { margin: 0; word-break: break-all; }
footer { color: var(--muted); font-size: .85em; margin-top: 3em; }
"""

SITE_JS = """\
// attnbench publish: draws the case page's graph for the metric chosen (the buttons, or #metric in the address).
(function () {
  "use strict";
  var figures = JSON.parse(document.getElementById("figures").textContent);
  var graph = document.getElementById("graph");
  var buttons = Array.prototype.slice.call(document.querySelectorAll("button[data-metric]"));
  var config = { responsive: true, displaylogo: false, scrollZoom: false };
  function show(metric) {
    var figure = figures[metric];
    if (!figure) { return; }
    Plotly.react(graph, figure.data, figure.layout, config).then(function () {
      graph.setAttribute("data-metric", metric);
      graph.setAttribute("data-ready", "true");
    });
    buttons.forEach(function (b) { b.setAttribute("aria-pressed", String(b.dataset.metric === metric)); });
    Array.prototype.forEach.call(document.querySelectorAll("[data-steps]"), function (t) {
      t.hidden = t.dataset.steps !== metric;
    });
  }
  buttons.forEach(function (b) {
    b.addEventListener("click", function () {
      window.history.replaceState(null, "", "#" + b.dataset.metric);
      show(b.dataset.metric);
    });
  });
  var wanted = window.location.hash.slice(1);
  show(figures[wanted] ? wanted : Object.keys(figures)[0]);
})();
"""
CAPACITY_JS = """\
// attnbench publish: draws a capacity page's figures, one per capacity table (written only for a site with one).
(function () {
  "use strict";
  var figures = JSON.parse(document.getElementById("capacity-figures").textContent);
  var config = { responsive: true, displaylogo: false, scrollZoom: false };
  figures.forEach(function (figure, i) {
    var graph = document.getElementById("capacity-graph-" + i);
    Plotly.newPlot(graph, figure.data, figure.layout, config).then(function () {
      graph.setAttribute("data-ready", "true");
    });
  });
})();
"""
