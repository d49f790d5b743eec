"""attnbench publish: the static site's files and numbers, publishing into an existing site (new runs added, pages
that did not change left alone), the committed example kept true, and bad input. The browser's view of the site is
tests/e2e/test_site_browser.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from tests.support import ROOT, mentions, numbers, synthetic_runs

runner = CliRunner()
EXAMPLE_RUNS = ROOT / "results" / "history-example-cpu" / "runs"
EXAMPLE_SITE = ROOT / "results" / "site-example-cpu"
STEPPED = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"


def publish(*args: str) -> str:
    result = runner.invoke(app, ["publish", *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def figures(page: Path) -> dict[str, dict[str, object]]:
    found = re.search(r"<script type='application/json' id='figures'>(.*?)</script>", page.read_text(), re.S)
    assert found is not None
    return json.loads(found.group(1))


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> Path:
    site = tmp_path_factory.mktemp("example") / "site"
    publish(str(EXAMPLE_RUNS), "-o", str(site), "--commit-url", "https://example.org/c/{commit}")
    return site


def test_the_site_has_a_page_per_case_with_a_point_per_run_and_metric(example: Path) -> None:
    pages = sorted((example / "cases").glob("*.html"))
    assert len(pages) == 8
    index = (example / "index.html").read_text()
    assert index.count("class='case'") == 8 and index.count('<svg class="spark"') == 8
    for heading in ("gru · forward · float32", "vanilla · train · float32"):
        assert heading in index
    figs = figures(next(p for p in pages if p.name.startswith("aa-cpu-lstm-forward")))
    assert list(figs) == ["median", "tokens_per_s", "peak_mem"]
    (trace,) = figs["median"]["data"]  # type: ignore[misc]
    assert trace["x"] == list(range(1, 13)) and len(trace["y"]) == 12 and None not in trace["y"]
    assert trace["customdata"][8][:3] == ["run-09-slow25", "c696c51ed8fd", "run-09-slow25"]
    layout = figs["median"]["layout"]
    assert mentions(layout["yaxis"]["title"]["text"], "median", "(ms)")  # type: ignore[index]  # the metric, its unit
    assert any("+23.0 %" in note["text"] for note in layout["annotations"])  # type: ignore[index]  # the step, marked
    assert 13.0 < trace["y"][0] < 14.5  # run-01's 13.8 ms, as history.md has it


def test_the_regressions_page_lists_the_step_with_links_to_both_runs(example: Path) -> None:
    page = (example / "regressions.html").read_text()
    (row,) = re.findall(r"<tbody>(.*?)</tbody>", page, re.S)[0].split("</tr>")[:-1]
    assert "runs.html#run-20261203-103257-aa-cpu-cpu" in row and "runs.html#run-20261203-103217-aa-cpu-cpu" in row
    assert row.count("https://example.org/c/c696c51ed8fd9b3490a01e7028e82b0955122436") == 2
    assert mentions(row, "slower", values=(23.0, 11.6, 35.5))  # the step, with its interval
    runs = (example / "runs.html").read_text()
    assert runs.count("<tr id='run-") == 12 and "AMD EPYC" in runs and "2.13.0+cpu" in runs


def test_nothing_is_fetched_from_a_network(example: Path) -> None:
    for page in example.rglob("*.html"):
        text = page.read_text()
        assert not re.search(r"src=['\"](https?:)?//|<link[^>]+href=['\"](https?:)?//", text), page
    assert (example / "assets" / "plotly.min.js").read_bytes().startswith(b"/**\n* plotly.js v")


def _two_configs(tmp_path: Path) -> tuple[Path, Path]:
    tiny, other = tmp_path / "tiny", tmp_path / "other"
    synthetic_runs(tiny, [1.0] * 6, only=STEPPED, seed=1)
    synthetic_runs(other, [1.0] * 6, seed=2)
    for folder in other.iterdir():
        run = json.loads((folder / "run.json").read_text())
        run["run_id"] = "other-" + run["run_id"]
        run["config"] = {**run["config"], "name": "other"}
        (folder / "run.json").write_text(json.dumps(run))
    return tiny, other


def test_publishing_again_adds_the_new_runs_and_rewrites_only_what_changed(tmp_path: Path) -> None:
    tiny, other = _two_configs(tmp_path)
    site = tmp_path / "site"
    first = publish(str(tiny), str(other), "-o", str(site))
    assert mentions(first.splitlines(), "new", values=(12, 2))  # 12 runs, all new, of 2 configs
    other_pages = sorted((site / "cases").glob("other-*.html"))
    tiny_pages = sorted(p for p in (site / "cases").glob("tiny-*.html") if "id='figures'" in p.read_text())
    assert other_pages and tiny_pages
    before = {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in site.rglob("*") if p.is_file()}
    again = publish(str(tiny), "-o", str(site))  # nothing new: nothing written
    assert "12 runs (0 new)" in again and "wrote 0 files" in again
    assert {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in site.rglob("*") if p.is_file()} == before

    newer = tmp_path / "newer"
    (run,) = synthetic_runs(newer, [1.3], only=STEPPED, seed=9)
    data = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps({**data, "run_id": "synthetic-006", "created_utc": "2026-12-01T07:00Z"}))
    added = publish(str(run), "-o", str(site))  # only the new run: the site keeps the others' digests
    assert mentions(added.splitlines(), "new", values=(13, 1, 2))
    for page in other_pages:  # another config's history did not change: its pages were not touched
        assert (page.stat().st_mtime_ns, page.read_bytes()) == before[page]
    for page in tiny_pages:
        assert page.read_bytes() != before[page][1]
    (trace,) = figures(tiny_pages[0])["median"]["data"]  # type: ignore[misc]
    assert trace["x"] == list(range(1, 8))
    # The same site as publishing every run at once, byte for byte.
    whole = tmp_path / "whole"
    publish(str(tiny), str(other), str(run), "-o", str(whole))
    assert {p.relative_to(whole): p.read_bytes() for p in whole.rglob("*") if p.is_file()} == {
        p.relative_to(site): p.read_bytes() for p in site.rglob("*") if p.is_file()
    }


def test_a_run_with_a_zero_peak_publishes_again_and_again(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    first, second = synthetic_runs(runs, [1.0, 1.0], only=STEPPED)
    rows = [json.loads(line) for line in (first / "results.jsonl").read_text().splitlines()]
    rows[0]["memory"]["peak_bytes"] = 0  # a tiny case below what resident pages resolve
    (first / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    site = tmp_path / "site"
    publish(str(first), "-o", str(site))
    assert "1 run (0 new)" in publish(str(first), "-o", str(site))  # it read its own digest back
    assert "2 runs (1 new)" in publish(str(second), "-o", str(site))


@pytest.mark.parametrize("linked", ["assets", "data/runs", "cases"])
def test_a_linked_folder_inside_a_site_is_refused_and_nothing_is_written(tmp_path: Path, linked: str) -> None:
    """Before issue 38 only a file's own name was checked: a site whose assets/ had become a link to another folder
    had that folder's site.css overwritten and new files made in it."""
    site = tmp_path / "site"
    first, second = synthetic_runs(tmp_path / "runs", [1.0, 1.0], only=STEPPED)
    publish(str(first), "-o", str(site))
    victim = tmp_path / "victim"
    (site / linked).rename(victim)
    (site / linked).symlink_to(victim)
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()}
    result = runner.invoke(app, ["publish", str(second), "-o", str(site)])
    assert result.exit_code == 2, result.output
    assert result.output.count("error:") == 1 and "Traceback" not in result.output
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()} == before


def test_stored_text_never_renders_as_markup_in_a_graph(tmp_path: Path) -> None:
    """plotly renders <a href>, <b>, … in hover and annotation text: a run's label and an environment field reach
    both, so they go in escaped (plotly decodes the entities after it has looked for tags)."""
    link = '<a href="javascript:alert(1)">click</a>'
    runs = tmp_path / "runs"
    folders = synthetic_runs(runs, [1.0] * 4, environment={i: {"cpu_model": f"EPYC {link}"} for i in (2, 3)})
    data = json.loads((folders[0] / "run.json").read_text())
    (folders[0] / "run.json").write_text(json.dumps({**data, "label": f"nightly {link}"}))
    site = tmp_path / "site"
    publish(str(runs), "-o", str(site))
    page = next((site / "cases").glob("tiny-*lstm-forward-float32-b-2-n-64-*.html"))
    figure = figures(page)["median"]
    texts = [str(cell) for trace in figure["data"] for row in trace["customdata"] for cell in row]  # type: ignore[attr-defined]
    texts += [note["text"] for note in figure["layout"]["annotations"]]  # type: ignore[index]
    assert not [t for t in texts if "<" in t or ">" in t]
    assert 'nightly &lt;a href="javascript:alert(1)"&gt;click&lt;/a&gt;' in texts
    assert any("EPYC &lt;a href=" in t for t in texts)


def test_the_committed_example_is_what_publish_makes(tmp_path: Path) -> None:
    """results/site-example-cpu/ was made by publish from the example runs; a change to the pages shows here
    (regenerate it with the command in results/README.md)."""
    made_site = tmp_path / "site"
    publish(str(EXAMPLE_RUNS), "-o", str(made_site))
    made = {p.relative_to(made_site) for p in made_site.rglob("*") if p.is_file()}
    committed = {p.relative_to(EXAMPLE_SITE) for p in EXAMPLE_SITE.rglob("*") if p.is_file()}
    assert made <= committed and committed - made == {Path("screenshot.png")}
    for name in sorted(made):
        if name.parts[0] != "assets":  # plotly.js is the installed package's, whatever version that is
            assert (EXAMPLE_SITE / name).read_bytes() == (made_site / name).read_bytes(), name


@pytest.mark.parametrize(
    ("setup", "args", "says"),
    [
        ("foreign", [], "holds files but no data/site.json"),
        ("none", [], "no runs to publish"),
        ("none", ["--commit-url", "https://x/"], "--commit-url: 'https://x/' has no {commit}"),
        ("none", ["--commit-url", "javascript:alert('{commit}')"], "not an http(s) address"),  # issue 38
        ("none", ["--commit-url", "{commit}"], "not an http(s) address"),
        ("none", ["--commit-url", "data:text/html,{commit}"], "not an http(s) address"),
        ("digest", [], "data/runs/bad.json: schema"),
    ],
)
def test_bad_input_is_one_error_line(tmp_path: Path, setup: str, args: list[str], says: str) -> None:
    site = tmp_path / "site"
    site.mkdir()
    if setup == "foreign":
        (site / "notes.txt").write_text("mine")
        args = [str(EXAMPLE_RUNS), *args]
    if setup == "digest":
        publish(str(EXAMPLE_RUNS / "20261203-102756-aa-cpu-cpu"), "-o", str(site))
        (site / "data" / "runs" / "bad.json").write_text('{"schema": "something else"}')
    result = runner.invoke(app, ["publish", *args, "-o", str(site)])
    assert result.exit_code == 2, result.output
    assert says in result.output and "Traceback" not in result.output
    assert result.output.count("error:") == 1


def test_a_new_environment_is_a_break_in_the_graph_not_a_line_across_it(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    synthetic_runs(runs, [1.0] * 10, environment={i: {"torch": "2.14.1"} for i in range(5, 10)})
    site = tmp_path / "site"
    publish(str(runs), "-o", str(site))
    page = next(p for p in (site / "cases").glob("tiny-*lstm-forward-float32-b-2-n-64-*.html"))
    figure = figures(page)["median"]
    first, second = figure["data"]  # type: ignore[misc]
    assert (first["x"], second["x"]) == ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert first["name"] == "segment 1" and figure["layout"]["showlegend"] is True  # type: ignore[index]
    notes = [n["text"] for n in figure["layout"]["annotations"]]  # type: ignore[index]
    (note,) = notes  # the key that changed, from and to
    assert mentions(note, "torch", "'2.13.0+cpu'", "'2.14.1'")
    runs_page = (site / "runs.html").read_text()
    assert "Segment 2" in runs_page and mentions(runs_page, "torch", "&#x27;2.13.0+cpu&#x27;", "&#x27;2.14.1&#x27;")


# ------------------------------------------------------------------------------ what the site misread (issue 51)
def test_cases_are_listed_by_their_sizes_as_numbers(tmp_path: Path) -> None:
    """As text, n=1024 came before n=256 and 16384 before 256."""
    from attnbench.analysis.site import RunDigest, build_site
    from attnbench.api import load_runs
    from tests.support import FIXTURE

    (board,) = build_site([RunDigest.of(s) for s in load_runs([FIXTURE])]).boards
    groups: dict[tuple[str, str, str], list[int]] = {}
    for view in board.cases:
        groups.setdefault(view.group, []).append(view.case.seq_len)
    assert any(len(set(ns)) > 1 and sorted(map(str, ns)) != sorted(ns) for ns in groups.values())  # text would differ
    assert all(ns == sorted(ns) for ns in groups.values())


def test_sparklines_share_one_scale_so_a_small_move_draws_short() -> None:
    """Each scaled to its own row, a 3 % and a 50 % move drew alike."""
    from dataclasses import replace

    from attnbench.analysis.history import Point, build_history
    from attnbench.api import load_runs
    from attnbench.report.site_figures import spark_ratio, sparkline
    from tests.support import FIXTURE

    def height(svg: str) -> float:
        ys = [float(xy.split(",")[1]) for xy in re.findall(r'points="([^"]*)"', svg)[0].split()]
        return max(ys) - min(ys)

    history = build_history(load_runs([FIXTURE]), metric="median")
    runs = tuple(history.runs[0] for _ in range(4))
    history = replace(history, segments=(replace(history.segments[0], runs=runs),))
    small, large = (
        (replace(history.cases[i], points=tuple(Point(v, status="ok") for v in values)),)
        for i, values in ((0, [1.0, 1.0, 1.03, 1.03]), (1, [1.0, 1.0, 1.5, 1.5]))
    )
    ratio = spark_ratio([small, large])
    assert ratio == pytest.approx(1.5)
    assert (
        height(sparkline(history, small, "#333", ratio=ratio))
        < height(sparkline(history, large, "#333", ratio=ratio)) / 5
    )
    assert height(sparkline(history, small, "#333")) == pytest.approx(height(sparkline(history, large, "#333")))


def test_the_environment_reads_in_units_and_releases() -> None:
    from attnbench.report.site import env_text

    assert env_text("cudnn", 90100) == "9.1.0" and env_text("cudnn", 8902) == "8.9.2"
    assert env_text("packages", {}) is None and env_text("packages", {"fla": "0.2.1"}) == "fla 0.2.1"
    assert numbers(env_text("memory_bytes", 25275973632) or "") == [23.5]  # GiB, not 25275973632
    assert env_text("gpu_power_limit_w", 700.0) == "700 W"


def test_the_runs_page_shows_no_raw_bytes_or_empty_packages(example: Path) -> None:
    runs = (example / "runs.html").read_text()
    assert "25275973632" not in runs and "<dt>packages</dt><dd>{}</dd>" not in runs
    assert "<dt>memory_bytes</dt><dd>23.5 GiB</dd>" in runs


def test_a_case_page_ticks_each_run_once(example: Path) -> None:
    page = next((example / "cases").glob("aa-cpu-lstm-forward*.html"))
    xaxis = figures(page)["median"]["layout"]["xaxis"]  # type: ignore[index]
    assert xaxis["tickmode"] == "linear" and xaxis["tick0"] == 1 and xaxis["dtick"] == 1  # type: ignore[index]


def test_a_contended_run_is_drawn_apart_on_the_case_page(tmp_path: Path) -> None:
    paths = synthetic_runs(tmp_path / "runs", [1.0, 1.0, 1.0])
    rows = [json.loads(line) for line in (paths[1] / "results.jsonl").read_text().splitlines() if line.strip()]
    for row in rows:
        if row.get("measurement") is not None:
            row["contention"] = {"contended": True, "reasons": ["another process used the CPU"], "window_s": 1.0}
    (paths[1] / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    site = tmp_path / "site"
    publish(str(tmp_path / "runs"), "-o", str(site))
    page = next(p for p in sorted((site / "cases").glob("*lstm-forward*.html")) if "id='figures'" in p.read_text())
    (trace,) = figures(page)["median"]["data"]  # type: ignore[misc]
    assert trace["marker"]["symbol"] == ["circle", "circle-open", "circle"]
    digest = json.loads(next((site / "data" / "runs").glob("synthetic-001.json")).read_text())
    assert any(r.get("contended") is True for r in digest["rows"])


def test_the_regressions_page_says_when_there_are_too_few_runs_to_tell(tmp_path: Path) -> None:
    """Two runs cannot show a step (2 before, 2 after): "None: no level got worse" read as a clean bill."""
    synthetic_runs(tmp_path / "runs", [1.0, 1.5])
    publish(str(tmp_path / "runs"), "-o", str(tmp_path / "site"))
    page = (tmp_path / "site" / "regressions.html").read_text()
    assert "class='too-few' data-runs-needed='4'" in page and "class='none'" not in page


def test_a_serving_case_names_its_memory_budget_in_binary_units() -> None:
    from attnbench.core.cases import Case

    case = Case("lstm", "capacity", "float32", "cpu", 1, 16, 64, None, 1, True, serving=(("memory_budget", 2**30),))
    assert "memory_budget=1GiB" in case.label and "1073741824" not in case.label


SERVING_RUN = ROOT / "tests" / "data" / "runs" / "tiny-serving-cpu"  # has capacity rows (mode: capacity)


def _capacity_cells(page: str, kind: str) -> dict[tuple[str, int], dict[str, str]]:
    """(model, n) → the data-* attributes of a cell of the capacity table ``kind`` ("point" or "bytes")."""
    table = re.search(rf"<table class='capacity' data-cells='{kind}'>(.*?)</table>", page, re.S)
    assert table is not None
    ns = [int(n) for n in re.findall(r"<th>n=(\d+)</th>", table.group(1))]
    cells = {}
    for model, row in re.findall(r"<tr data-model='([^']+)'>(.*?)</tr>", table.group(1), re.S):
        tds = re.findall(r"<td class='num'([^>]*)>([^<]*)</td>", row)
        for n, (attrs, text) in zip(ns, tds, strict=True):
            cells[(model, n)] = {**dict(re.findall(r"data-([a-z-]+)='([^']*)'", attrs)), "text": text}
    return cells


def test_a_run_with_capacity_rows_has_a_capacity_page_with_its_numbers(tmp_path: Path) -> None:
    """summary.md's capacity section on the site: per model and n the batch and aggregate tokens/s the run's
    reading found (``Reading.capacity``), its crossing, the bytes per sequence, and the graphs of both against n;
    the runs page and the index link it."""
    from attnbench.analysis.reading import Reading
    from attnbench.api import load_runs
    from attnbench.report.capacity_md import point_text

    site = tmp_path / "site"
    publish(str(SERVING_RUN), "-o", str(site))
    (stored,) = load_runs([SERVING_RUN])
    (table,) = Reading.of(stored).capacity
    path = site / "capacity" / f"{stored.run.run_id}.html"
    page = path.read_text()
    cells, sizes = _capacity_cells(page, "point"), _capacity_cells(page, "bytes")
    points = [(c, p) for c in table.curves for p in c.points]
    assert len(cells) == len(points) == 6 and all(p.batch and p.tokens_per_s for _, p in points)
    for curve, p in points:
        cell = cells[(curve.model, p.n)]
        assert int(cell["batch"]) == p.batch and float(cell["tokens-per-s"]) == p.tokens_per_s
        assert cell["text"] == point_text(p)  # the cell summary.md has, escaped
        assert int(sizes[(curve.model, p.n)]["bytes"]) == p.bytes_per_sequence
    assert table.crossovers and all(f"<li>{line}</li>" in page for line in table.crossovers)
    # The graphs: drawn by assets/capacity.js (written beside plotly.min.js) from the figure the page holds.
    assert all((site / "assets" / name).is_file() for name in ("capacity.js", "plotly.min.js"))
    assert '<script src="../assets/capacity.js"></script>' in page and "id='capacity-graph-0'" in page
    found = re.search(r"<script type='application/json' id='capacity-figures'>(.*?)</script>", page, re.S)
    assert found is not None
    (figure,) = json.loads(found.group(1))
    drawn = {(t["name"], t["yaxis"]): dict(zip(t["x"], t["y"], strict=True)) for t in figure["data"]}
    for curve in table.curves:
        assert drawn[(curve.label, "y")] == {p.n: p.batch for p in curve.points}
        assert drawn[(curve.label, "y2")] == {p.n: p.tokens_per_s for p in curve.points}
    ((n, _, _),) = table.crossing_points()
    assert [shape["x0"] for shape in figure["layout"]["shapes"]] == [n]
    link = f"capacity/{stored.run.run_id}.html"
    assert (
        f"href='{link}'" in (site / "runs.html").read_text() and f"href='{link}'" in (site / "index.html").read_text()
    )
    # The site keeps the section in the run's digest: publishing again without the run folder writes it the same.
    before = path.read_bytes()
    assert "wrote 0 files" in publish("-o", str(site)) and path.read_bytes() == before


def test_a_run_without_capacity_rows_has_no_capacity_section(tmp_path: Path) -> None:
    site = tmp_path / "site"
    publish(str(ROOT / "tests" / "data" / "runs" / "tiny-cpu"), "-o", str(site))
    assert not (site / "capacity").exists() and not (site / "assets" / "capacity.js").exists()
    for name in ("index.html", "runs.html"):
        assert "capacity" not in (site / name).read_text()
    (digest,) = (site / "data" / "runs").glob("*.json")
    assert "capacity" not in json.loads(digest.read_text())


def test_a_capacity_page_escapes_what_the_digest_holds(tmp_path: Path) -> None:
    site = tmp_path / "site"
    publish(str(SERVING_RUN), "-o", str(site))
    (path,) = (site / "data" / "runs").glob("*.json")
    digest = json.loads(path.read_text())
    digest["capacity"][0]["title"] = "<b>bold</b>"
    digest["capacity"][0]["crossovers"] = ["<script>alert(1)</script>"]
    path.write_text(json.dumps(digest))
    publish("-o", str(site))
    page = next((site / "capacity").glob("*.html")).read_text()
    assert "<b>bold" not in page and "&lt;b&gt;bold&lt;/b&gt;" in page
    assert "<script>alert" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_another_run_of_a_published_runs_id_is_refused_not_swapped_in(tmp_path: Path) -> None:
    """Ids are made to the second: two sweeps of one config started in the same second (into two --out folders)
    share one. Publishing the second must not replace the first."""
    first, second = synthetic_runs(tmp_path / "runs", [1.0, 1.3], only=STEPPED)
    data = json.loads((first / "run.json").read_text())
    twin = json.loads((second / "run.json").read_text())
    (second / "run.json").write_text(json.dumps({**twin, "run_id": data["run_id"]}))
    assert twin["created_utc"] != data["created_utc"]
    site = tmp_path / "site"
    publish(str(first), "-o", str(site))
    held = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    result = runner.invoke(app, ["publish", str(second), "-o", str(site)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == held  # the site as it was
    assert "1 run (0 new)" in publish(str(first), "-o", str(site))  # the same run again: still fine
