"""The published site in a real headless browser: Debian's chromium driven by playwright, from the file system and
with every request that is not a local file counted (there must be none).

The index loads with no console error; every case link opens a page whose graph has one point per run; hovering a
point shows its run and commit; the metric buttons redraw it; the regressions page lists the planted step. Skipped,
saying why, where chromium or playwright is missing (`.ci/run` installs both where apt is reachable).
Set ATTNBENCH_SITE_SCREENSHOT=PATH to keep the screenshot of a case page the test takes (the committed example's
was taken so).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from tests.support import ROOT

CHROMIUM = os.environ.get("ATTNBENCH_CHROMIUM") or next(
    (found for name in ("chromium", "chromium-browser", "google-chrome") if (found := shutil.which(name))), None
)
try:
    from playwright.sync_api import sync_playwright
except ImportError:  # pragma: no cover - depends on the machine
    sync_playwright = None  # type: ignore[assignment]

pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # a real browser: seconds a page
    pytest.mark.skipif(sync_playwright is None, reason="needs playwright (pip install playwright)"),
    pytest.mark.skipif(CHROMIUM is None, reason="needs a chromium binary (apt-get install chromium)"),
]
EXAMPLE_RUNS = ROOT / "results" / "history-example-cpu" / "runs"
COMMIT = "c696c51ed8fd"  # the example runs' commit, as a hover label shows it (12 characters)
POINTS = "#graph .scatterlayer .trace .points path.point"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("site") / "site"
    result = CliRunner().invoke(app, ["publish", str(EXAMPLE_RUNS), "-o", str(folder)])
    assert result.exit_code == 0, result.output
    return folder


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    assert sync_playwright is not None and CHROMIUM is not None
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


class Watched:
    """A page whose console errors, uncaught exceptions and requests beyond the file system are collected."""

    def __init__(self, browser: Any) -> None:
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors: list[str] = []
        self.remote: list[str] = []
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else self.remote.append(r.url))

    def open(self, url: str) -> Any:
        self.page.goto(url)
        return self.page

    def graph(self, url: str) -> Any:
        page = self.open(url)
        page.wait_for_selector("#graph[data-ready='true']", timeout=20_000)
        return page


def test_index_and_every_case_page(site: Path, browser: Any) -> None:
    watched = Watched(browser)
    index = watched.open((site / "index.html").as_uri())
    assert index.title() == "cases · attnbench"
    links = index.eval_on_selector_all("a.case", "links => links.map(a => a.href)")
    assert len(links) == 8
    assert index.locator("svg.spark").count() == 8
    assert "+23.0 %" in index.inner_text("main")  # the step every case took

    for link in links:
        page = watched.graph(link)
        assert page.locator(POINTS).count() == 12, link  # one point per run
        assert page.locator("#graph .shapelayer path, #graph .layer-above path").count() >= 1  # the step is marked
    assert watched.errors == [] and watched.remote == []


def test_hover_shows_the_run_and_its_commit_and_metrics_redraw(site: Path, browser: Any) -> None:
    watched = Watched(browser)
    (case,) = sorted((site / "cases").glob("aa-cpu-lstm-forward-*.html"))
    page = watched.graph(case.as_uri())
    page.locator(POINTS).nth(8).hover(force=True)
    page.wait_for_selector("#graph .hoverlayer .hovertext", timeout=10_000)
    label = page.text_content("#graph .hoverlayer") or ""
    assert "run 9: run-09-slow25" in label and f"commit {COMMIT}" in label and "95 % CI" in label
    shot = os.environ.get("ATTNBENCH_SITE_SCREENSHOT")
    if shot:
        page.screenshot(path=shot, full_page=False)
    page.click("button[data-metric='peak_mem']")
    page.wait_for_selector("#graph[data-metric='peak_mem']")
    assert page.locator(POINTS).count() == 12
    assert "peak memory" in (page.text_content("#graph .ytitle") or "")
    assert page.locator("section[data-steps='peak_mem']").is_visible()
    assert watched.errors == [] and watched.remote == []


def test_the_regressions_page_lists_the_planted_step(site: Path, browser: Any) -> None:
    watched = Watched(browser)
    page = watched.open((site / "regressions.html").as_uri())
    rows = page.locator("table.steps tbody tr")
    assert rows.count() == 1
    text = rows.first.inner_text()
    assert "9. run-09-slow25" in text and "8. run-08" in text and "+23.0 %" in text and COMMIT in text
    runs = page.locator("table.steps a[href*='runs.html#run-']")
    assert runs.count() == 2
    runs.first.click()
    assert page.url.endswith("runs.html#run-20261203-103257-aa-cpu-cpu")
    assert page.locator("#run-20261203-103257-aa-cpu-cpu").is_visible()
    assert watched.errors == [] and watched.remote == []


def test_the_committed_example_site_opens_too(browser: Any) -> None:
    example = ROOT / "results" / "site-example-cpu"
    watched = Watched(browser)
    index = watched.open((example / "index.html").as_uri())
    first = index.eval_on_selector("a.case", "a => a.href")
    page = watched.graph(first)
    assert page.locator(POINTS).count() == 12
    assert watched.errors == [] and watched.remote == []


def test_a_capacity_page_draws_batch_and_tokens_per_s_against_n(tmp_path: Path, browser: Any) -> None:
    """The serving fixture's capacity page, reached from the runs page: both panels drawn, a point per model and n
    in each (2 models × 3 lengths × 2 panels), the crossing marked."""
    folder = tmp_path / "site"
    result = CliRunner().invoke(app, ["publish", str(ROOT / "tests" / "data" / "runs" / "tiny-serving-cpu"), "-o",
                                      str(folder)])  # fmt: skip
    assert result.exit_code == 0, result.output
    watched = Watched(browser)
    runs = watched.open((folder / "runs.html").as_uri())
    runs.click("a.capacity")
    runs.wait_for_selector("#capacity-graph-0[data-ready='true']", timeout=20_000)
    assert runs.locator("#capacity-graph-0 .scatterlayer .trace .points path.point").count() == 12
    assert runs.locator("#capacity-graph-0 .shapelayer path, #capacity-graph-0 .layer-above path").count() >= 1
    assert runs.locator("table.capacity td[data-batch]").count() == 6
    assert watched.errors == [] and watched.remote == []
