"""A row's reason in a verdict table is clipped to a line, but never inside a clause: a too-slow row's reason ends
with what to raise, and the table showed "raise timing.max_case_s or …" (issue 51)."""

from __future__ import annotations

from attnbench.analysis.case_compare import _clip, _side_status
from attnbench.core.cases import TimingPolicy
from attnbench.results.records import Result
from attnbench.timing.adaptive import _too_slow
from tests.support import tiny_case


def test_a_too_slow_reason_reaches_the_table_whole() -> None:
    policy = TimingPolicy(max_case_s=2.5, min_samples=5)
    reason = _too_slow(0.42, policy, 1.65, taken=3)
    rows = [Result(tiny_case("lstm"), "too_slow_for_budget", reason), Result(tiny_case("lstm"), "ok")]
    status, note = _side_status(rows)
    assert status == "too_slow_for_budget" and note.endswith(reason) and "…" not in note


def test_a_long_line_is_cut_between_words() -> None:
    words = " ".join(f"word{i}" for i in range(200))
    clipped = _clip(words, 100)
    assert len(clipped) <= 100 and clipped.endswith(" …")
    assert all(w.startswith("word") and w[4:].isdigit() for w in clipped[:-2].split())  # every word whole
