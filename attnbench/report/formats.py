"""The output formats of the commands that render stored values (``report``, ``history``, ``compare``), one
registry each: a format's name → how the value becomes text (for stdout or ``-o FILE``), a terminal's rich view,
or a binary file written to the path given. The CLI looks the name up and hands the result to one writer
(``cli.common.emit``); a new format is an entry here and its renderer module. Torch-free; each renderer's module
(pandas, matplotlib, rich) is imported only when its format is asked for.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from attnbench.core.units import plural

if TYPE_CHECKING:
    from attnbench.analysis.compare import Comparison
    from attnbench.analysis.history import History
    from attnbench.analysis.reading import Reading
    from attnbench.report.plots import Plot
    from attnbench.results.store import StoredRun

T = TypeVar("T")


@dataclass(frozen=True)
class Format(Generic[T]):
    """One format: ``text`` renders it as text; ``terminal`` (when set) is what a terminal shows instead when no file
    is named; ``file`` writes a binary file itself (such a format needs ``-o FILE``). ``figures``: it embeds the
    plots, so they are drawn first. ``note``: a line to show before it is written, or None. ``by_suffix``: the
    ``-o`` name's suffix picks another format of the same name (``samples``: ``.csv``, ``.parquet``)."""

    name: str
    text: Callable[[T], str] | None = None
    terminal: Callable[[T], Any] | None = None
    file: Callable[[T, Path], None] | None = None
    figures: bool = False
    note: Callable[[T], str | None] | None = None
    by_suffix: Mapping[str, Format[T]] = field(default_factory=dict)

    @property
    def binary(self) -> bool:
        """Written as bytes to a file the renderer opens, never as text."""
        return self.file is not None

    @property
    def needs_file(self) -> bool:
        """It cannot go to a terminal: ``-o FILE`` must name where it goes."""
        return self.text is None

    def for_output(self, output: str | None) -> Format[T]:
        """The format that writes to ``output`` (None or ``-``: stdout): this one, or the one its suffix picks."""
        suffix = Path(output).suffix.lower() if output not in (None, "-") else ""
        return self.by_suffix.get(suffix, self)


# ---------------------------------------------------------------------------------------------------- report


@dataclass(frozen=True)
class RunView:
    """What ``report`` renders: a stored run and its one reading (with the model its speed-ups are against), and
    the plots an HTML page embeds (or the notice that says why there are none)."""

    stored: StoredRun
    reading: Reading
    figures: tuple[Plot, ...] = ()
    notice: str = ""

    @classmethod
    def of(cls, stored: StoredRun, baseline: str | None = None) -> RunView:
        """The view of a stored run, read once (``analysis.reading``) for every format drawn from it."""
        from attnbench.analysis.reading import Reading

        return cls(stored, Reading.of(stored, baseline))


def _markdown(view: RunView) -> str:
    from attnbench.report.markdown import render_markdown

    return render_markdown(view.reading)


def _terminal(view: RunView) -> Any:
    from attnbench.report.terminal import comparison_tables

    return comparison_tables(view.reading, memory=True)


def _csv(view: RunView) -> str:
    from attnbench.report.rows import render_csv

    return render_csv(view.reading)


def _json(view: RunView) -> str:
    from attnbench.report.jsonfmt import render_json

    return render_json(view.reading)


def _html(view: RunView) -> str:
    from attnbench.report.html import render_html

    return render_html(view.reading, list(view.figures), view.notice)


def _export(name: str) -> Format[RunView]:
    """A dashboard's JSON (github-action-benchmark, Bencher): timed rows only, the rest counted in a note."""
    from attnbench.report import exports

    def render(view: RunView) -> str:
        return (exports.render_gab if name == "gab" else exports.render_bmf)(view.stored.results)

    def note(view: RunView) -> str | None:
        n = exports.left_out(view.stored.results)
        return f"{plural(n, 'case')} without a timing are not in the {name} export" if n else None

    return Format(name, text=render, note=note)


def _parquet(view: RunView, path: Path) -> None:
    from attnbench.report.frames import frame, write_parquet

    write_parquet(frame([view.stored]), path, instead="-f csv for the same columns as text")


def _samples_jsonl(view: RunView) -> str:
    from attnbench.report.samples import render_samples_jsonl

    return render_samples_jsonl(view.stored.run, view.stored.results)


def _samples_csv(view: RunView) -> str:
    from attnbench.report.samples import render_samples_csv

    return render_samples_csv(view.stored.run, view.stored.results)


def _samples_parquet(view: RunView, path: Path) -> None:
    from attnbench.report.frames import write_samples_parquet

    write_samples_parquet(view.stored.run, view.stored.results, path)


REPORT_FORMATS: dict[str, Format[RunView]] = {
    "table": Format("table", text=_markdown, terminal=_terminal),  # to a file: the markdown
    "csv": Format("csv", text=_csv),
    "md": Format("md", text=_markdown),
    "json": Format("json", text=_json),
    "html": Format("html", text=_html, figures=True),
    "samples": Format(
        "samples",
        text=_samples_jsonl,
        by_suffix={".csv": Format("samples", text=_samples_csv), ".parquet": Format("samples", file=_samples_parquet)},
    ),
    "gab": _export("gab"),
    "bmf": _export("bmf"),
    "parquet": Format("parquet", file=_parquet),
}


def _telemetry_markdown(view: RunView) -> str:
    from attnbench.report.telemetry import render_telemetry_markdown

    return render_telemetry_markdown(view.stored.results)


def _telemetry_terminal(view: RunView) -> Any:
    from attnbench.report.terminal import telemetry_renderable

    return telemetry_renderable(view.stored.results)


# ``report --telemetry``: the per-case telemetry table, in a terminal or as markdown.
TELEMETRY_FORMATS: dict[str, Format[RunView]] = {
    "table": Format("table", text=_telemetry_markdown, terminal=_telemetry_terminal),
    "md": Format("md", text=_telemetry_markdown),
}


# --------------------------------------------------------------------------------------------------- history


@dataclass(frozen=True)
class HistoryView:
    """What ``history`` renders: the history, and its plots as (file name, PNG) for an HTML page."""

    history: History
    pictures: Sequence[tuple[str, bytes]] = ()


def _history_markdown(view: HistoryView) -> str:
    from attnbench.report.history_md import render_history_markdown

    return render_history_markdown(view.history)


def _history_terminal(view: HistoryView) -> Any:
    from attnbench.report.history_md import history_tables

    return history_tables(view.history)


def _history_csv(view: HistoryView) -> str:
    from attnbench.report.history_md import render_history_csv

    return render_history_csv(view.history)


def _history_json(view: HistoryView) -> str:
    from attnbench.report.history_json import render_history_json

    return render_history_json(view.history)


def _history_html(view: HistoryView) -> str:
    from attnbench.report.history_md import render_history_html

    return render_history_html(view.history, view.pictures)


HISTORY_FORMATS: dict[str, Format[HistoryView]] = {
    "table": Format("table", text=_history_markdown, terminal=_history_terminal),
    "md": Format("md", text=_history_markdown),
    "csv": Format("csv", text=_history_csv),
    "html": Format("html", text=_history_html, figures=True),
    "json": Format("json", text=_history_json),
}


# --------------------------------------------------------------------------------------------------- compare


def _compare_markdown(comparison: Comparison) -> str:
    from attnbench.report.compare_md import render_compare_markdown

    return render_compare_markdown(comparison)


def _compare_terminal(comparison: Comparison) -> Any:
    from attnbench.report.compare_md import compare_table

    return compare_table(comparison)


def _compare_json(comparison: Comparison) -> str:
    return json.dumps(comparison.to_dict(), indent=2, allow_nan=False) + "\n"


COMPARE_FORMATS: dict[str, Format[Comparison]] = {
    "table": Format("table", text=_compare_markdown, terminal=_compare_terminal),
    "md": Format("md", text=_compare_markdown),
    "json": Format("json", text=_compare_json),
}
