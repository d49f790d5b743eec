"""One reading of a stored run: every figure its renderers show, derived once from the run folder and handed to each
of them (terminal, markdown, HTML, CSV, JSON, plots, roofline), so the renderers only render and always agree.

A ``Reading`` holds the run and its rows; what is read off them — the peaks the rows are held against, the pivot
tables with their speed-ups, scaling laws and crossovers, the capacity and shared-prefix tables, the published
models' section, the self-consistency checks, the rows that beat their roofline — is computed the first time a
renderer asks and kept, so a format that needs none of it (JSON lines of raw samples) pays nothing, and one rendered
run derives each exactly once however many formats are drawn from it. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from attnbench.analysis.capacity import CapacityTable, capacity_tables
from attnbench.analysis.consistency import TrainCheck, train_check_summary, train_checks
from attnbench.analysis.efficiency import (
    PeakTable,
    Prediction,
    below_roofline_flags,
    faster_than_roofline,
    peak_flags,
)
from attnbench.analysis.pivot import PivotTable, pivot_tables
from attnbench.analysis.prefix import PrefixTable, prefix_tables
from attnbench.analysis.presets import PresetsSection, presets_section
from attnbench.results.records import Result, Run
from attnbench.results.store import StoredRun


@dataclass(frozen=True)
class Reading:
    """A run read once: ``run`` and its ``results`` as stored, ``baseline`` the model speed-ups are against (None:
    the first recurrent model). Every other attribute is derived on first use and then kept."""

    run: Run
    results: Sequence[Result]
    baseline: str | None = None

    @classmethod
    def of(cls, stored: StoredRun, baseline: str | None = None) -> Reading:
        """The reading of a stored run folder."""
        return cls(stored.run, stored.results, baseline)

    @cached_property
    def peaks(self) -> PeakTable:
        """The peaks the rows are held against: the run's calibration, else the vendor's figures."""
        return PeakTable.for_run(self.run)

    @cached_property
    def tables(self) -> tuple[PivotTable, ...]:
        """The comparison tables, with each row's speed-ups, scaling laws and crossovers."""
        return tuple(pivot_tables(self.results, self.baseline))

    @cached_property
    def capacity(self) -> tuple[CapacityTable, ...]:
        """The capacity tables (``mode: capacity`` rows); none without such rows."""
        return tuple(capacity_tables(self.results))

    @cached_property
    def prefix(self) -> tuple[PrefixTable, ...]:
        """The shared-prefix tables (``mode: prefix`` rows); none without such rows."""
        return tuple(prefix_tables(self.results))

    @cached_property
    def presets(self) -> PresetsSection | None:
        """The published models' section, or None for a run without presets' rows."""
        return presets_section(self.results)

    @cached_property
    def train_checks(self) -> tuple[TrainCheck, ...]:
        """train / (forward + backward) for every case timed in all three modes."""
        return tuple(train_checks(self.results))

    @cached_property
    def train_summary(self) -> str:
        """The train checks in one line ("" when no case ran all three modes)."""
        return train_check_summary(self.train_checks) if self.train_checks else ""

    @cached_property
    def over_peak(self) -> tuple[str, ...]:
        """The rows above 100 % of their peak (impossible), one line each."""
        return tuple(peak_flags(self.peaks, self.results))

    @cached_property
    def below_roofline(self) -> tuple[str, ...]:
        """The rows faster than their roofline time, one line each with the likelier cause."""
        return tuple(below_roofline_flags(self.peaks, self.results))

    @cached_property
    def faster_than_roofline(self) -> Mapping[str, tuple[Prediction, float]]:
        """The rows (by case key) faster than their roofline time: their prediction and measured / predicted."""
        return faster_than_roofline(self.peaks, self.results)
