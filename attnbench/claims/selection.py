"""Finding the rows a claim uses: which rows count, how they group into curves and variations, and the small
readings of a row (its kind, an option, its peak FLOP/s) every claim shares.

Claim-specific choices (claim 1's batch, claim 2's representative case, claim 4's nearest length) live beside
the verdict rules that name them, in each claim's module.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from attnbench.analysis import efficiency as peak_use
from attnbench.analysis.efficiency import Peak, PeakTable
from attnbench.core.cases import Case, OptionValue
from attnbench.families.catalogue import claim_role, known, option_of
from attnbench.results.records import Result

K = TypeVar("K", int, str)  # what varies within a group of otherwise equal cases (heads, an option's value)


def latest_rows(results: Iterable[Result]) -> list[Result]:
    """One row per case: a later row for the same case (a rerun of a failed one) supersedes the earlier."""
    return list({r.case: r for r in results}.values())


def kind(case: Case) -> str | None:
    """Which side of the claims the row stands on ("recurrent": the article's RNN; "attention"), or None for a model
    the claims are not about: its family says (``catalogue.claim_role``: a sliding window, linear attention, Mamba-2
    are compared in their own right, results/README.md), as for a built-in model this catalogue does not know."""
    role = claim_role(case)
    if role is None:
        return None
    return "recurrent" if role.side == "rnn" else "attention"


def option(case: Case, name: str) -> OptionValue | None:
    """A model option's value, or None where the model (or this catalogue) has no such option."""
    try:
        return option_of(case, name) if known(case) else None
    except KeyError:
        return None


def article_variant(case: Case) -> bool:
    """Whether ``case`` is a model the article's complexity claims are about (its family gives it a role)."""
    return claim_role(case) is not None


def parallel_recurrence(case: Case) -> bool:
    """Whether the family computes this recurrence's steps together (a parallel scan): claim 1a's premise fails."""
    role = claim_role(case)
    return role is not None and role.parallel


def peak_of(peaks: PeakTable, result: Result) -> Peak | None:
    """The peak FLOP/s a row is held against (calibrated, else vendor: ``peaks``, the run's, derived once by
    ``evaluate_claims``), or None where unknown."""
    return peaks.for_case(result.case)


def pct_of_peak(peaks: PeakTable, result: Result) -> float | None:
    """Achieved FLOP/s (analytic ``extra["flops"]`` / median) as a percentage of the row's peak."""
    return peak_use.pct_of_peak(result, peak_of(peaks, result)) if result.is_timed else None


def label(case: Case) -> str:
    """Short, readable: 'lstm forward b=1 n=512 float32 d=768 h=12 scope=model'."""
    parts = [case.model, case.mode, f"b={case.batch}", f"n={case.seq_len}", case.dtype, f"d={case.d_model}"]
    if case.heads is not None:
        parts.append(f"h={case.heads}")
    if case.layers != 1:
        parts.append(f"layers={case.layers}")
    parts += [f"{k}={v}" for k, v in case.options]
    return " ".join(parts)


def variant(case: Case) -> str:
    """Model and options, with the options the family always shows for it in the claims (a scan mode, which decides
    whether the recurrence is sequential) whether set or left at their default."""
    options = dict(case.options)
    role = claim_role(case)
    for name, value in role.shown if role is not None else ():
        options.setdefault(name, value)
    return " ".join([case.model, *(f"{k}={v}" for k, v in sorted(options.items()))])


@dataclass(frozen=True)
class Series:
    """Rows that differ only in seq_len: one curve."""

    shape: Case  # the shared case, seq_len set to 0
    points: tuple[Result, ...]  # timed rows, by seq_len

    @property
    def lengths(self) -> list[int]:
        return [r.case.seq_len for r in self.points]


def lengths_text(xs: Sequence[int]) -> str:
    return f"n={xs[0]}" if len(xs) == 1 else f"n={xs[0]}–{xs[-1]}"


def describe_series(s: Series) -> str:
    """'forward b=1 float32 d=256 h=4 n=128–2048': what a curve held fixed, and its lengths."""
    c = s.shape
    heads = "" if c.heads is None else f" h={c.heads}"
    return f"{c.mode} b={c.batch} {c.dtype} d={c.d_model}{heads} {lengths_text(s.lengths)}"


def series(results: Iterable[Result]) -> list[Series]:
    """Every curve in the timed rows of catalogue models."""
    curves: dict[Case, list[Result]] = {}
    for r in results:
        if r.is_timed and kind(r.case) is not None:
            curves.setdefault(replace(r.case, seq_len=0), []).append(r)
    return [Series(shape, tuple(sorted(rows, key=lambda r: r.case.seq_len))) for shape, rows in curves.items()]


def variation(
    results: Sequence[Result], value: Callable[[Case], K | None], strip: Callable[[Case], Case]
) -> dict[Case, dict[K, Result]]:
    """Timed rows grouped by ``strip(case)``, keyed within a group by ``value(case)``; groups of ≥ 2 values."""
    groups: dict[Case, dict[K, Result]] = {}
    for r in results:
        v = value(r.case)
        if r.is_timed and v is not None:
            groups.setdefault(strip(r.case), {})[v] = r
    return {k: g for k, g in groups.items() if len(g) >= 2}
