"""Published models read off a run (issue 49): per model, where its own recurrent mixer starts beating its own
attention mixer, and the decode state its whole stack pays. Torch-free.

A run's preset rows (``presets: {names, scope: core}``) hold one layer of each mixer of each model at its real
dimensions. ``preset_crossovers`` pairs, per model, mode and dtype, each attention mixer's curve over n with each
recurrent mixer's, and reads them as the pivot tables do (``scaling.crossover_line``: on the rows that are evidence
enough, else — a busy machine's run — over every length both timed, a best estimate marked as one). The pivot
tables' own lines compare every curve of a table (one d_model: one model's mixers, save where two presets share a
width); these keep each model's mixers to themselves and name the model.

``stack_states`` needs no run: the families' own state formulas (the same ``state_bytes`` a decode row stores and a
test holds to the allocated state) times how many of the model's layers each mixer is, split into what a sequence
pays whatever its length (recurrent states, conv caches, a window's ring once full) and what each token of context
adds (K and V of every full-attention layer; MLA's latent).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, replace

from attnbench.analysis.scaling import CrossoverLine, Curve, CurveGroup, crossover_line
from attnbench.families.catalogue import (
    PRESET_CORE_DEFAULT,
    PUBLISHED,
    Published,
    decode_inert,
    has_option,
    option_of,
    published_layer,
    published_problem,
)
from attnbench.families.state_bytes import state_bytes
from attnbench.results.records import Result

__all__ = [
    "MixerState",
    "PresetCrossover",
    "PresetsSection",
    "StackState",
    "preset_crossovers",
    "presets_section",
    "stack_state",
    "stack_states",
]

_MODES = ("forward", "train", "decode")  # the modes whose rows time one call alike on both sides
# A context long enough that every window is full, so that what grows per token is what grows for good.
_LONG = 1 << 20


@dataclass(frozen=True)
class MixerState:
    """One mixer's decode state across the layers it has in the stack."""

    label: str
    model: str
    layers: int
    per_sequence_bytes: int
    per_token_bytes: int


@dataclass(frozen=True)
class StackState:
    """A published model's decode state, its mixers' summed: bytes per sequence and per token of context."""

    name: str
    dtype: str
    mixers: tuple[MixerState, ...]

    @property
    def per_sequence_bytes(self) -> int:
        return sum(m.per_sequence_bytes for m in self.mixers)

    @property
    def per_token_bytes(self) -> int:
        return sum(m.per_token_bytes for m in self.mixers)

    def at(self, n: int) -> int:
        """Bytes one sequence holds at a context of n tokens (n past every window)."""
        return self.per_sequence_bytes + n * self.per_token_bytes


def stack_state(preset: Published, dtype: str, core: str) -> StackState | None:
    """``preset``'s decode state in ``dtype`` (attention on ``core``), or None where a mixer's family cannot say
    (one this release lacks)."""
    if published_problem(preset, (core,)) is not None:
        return None
    mixers = []
    for mixer in preset.mixers:
        layer = replace(published_layer(preset, mixer.label, core), mode="decode", dtype=dtype)
        long, longer = state_bytes(replace(layer, seq_len=_LONG)), state_bytes(replace(layer, seq_len=_LONG + 1))
        if long is None or longer is None:
            return None
        per_token = longer - long
        count = preset.count(mixer.label)
        fixed = long - _LONG * per_token
        mixers.append(MixerState(mixer.label, layer.model, count, count * fixed, count * per_token))
    return StackState(preset.name, dtype, tuple(mixers))


def stack_states(dtype: str, core: str, names: Sequence[str] | None = None) -> list[StackState]:
    """Every published model's stack state (or those named) that this release can count."""
    chosen = [PUBLISHED[name] for name in names] if names is not None else list(PUBLISHED.values())
    return [state for preset in chosen if (state := stack_state(preset, dtype, core)) is not None]


@dataclass(frozen=True)
class PresetCrossover:
    """Where, in one model's own mixers, the attention one's time crosses the recurrent one's: the pivot tables'
    line (``scaling.crossover_line``: interpolated between measured lengths, noise and left-out lengths said, and
    over contended rows a best estimate, marked), None where no length has both timed."""

    name: str
    mode: str
    dtype: str
    recurrent: str  # the mixer labels
    attention: str
    line: CrossoverLine | None

    @property
    def evidence(self) -> CrossoverLine | None:
        """The line that has numbers: over the lengths that are evidence, else the marked estimate over all."""
        if self.line is None or self.line.seq_lens:
            return self.line
        return self.line.indicative

    @property
    def estimate(self) -> bool:
        """Whether the numbers rest on rows that are no evidence (contended or noisy): a best estimate."""
        return self.line is not None and not self.line.seq_lens and self.evidence is not None

    @property
    def at(self) -> tuple[float, ...]:
        """Each crossing's interpolated n."""
        return tuple(c.x for c in self.evidence.crossings) if self.evidence is not None else ()

    def text(self) -> str:
        if self.line is None:
            return f"{self.name} {self.mode}: {self.attention} vs {self.recurrent}: no length both were timed at"
        return f"{self.name} {self.mode}: {self.line.text}"


def _mixer_label(preset: Published, result: Result) -> str | None:
    """Which of ``preset``'s mixers a row is: the one whose model and options the row's case carries."""
    options = dict(result.case.options)
    for mixer in preset.mixers:
        if mixer.model is not None and mixer.model != result.case.model:
            continue
        if mixer.model is None and any(m.model == result.case.model for m in preset.mixers if m.model is not None):
            continue
        if all(options.get(name) == value or (name not in options and _default(result, name, value))
               for name, value in mixer.options):  # fmt: skip
            return mixer.label
    return None


def _default(result: Result, name: str, value: object) -> bool:
    """Whether option ``name`` left out of a row's case is at ``value``, or one a decode case leaves out (it changes
    only the whole-sequence form: ``catalogue.decode_inert``)."""
    if result.case.mode == "decode" and name in decode_inert(result.case.model):
        return True
    return has_option(result.case, name) and option_of(result.case, name) == value


def preset_crossovers(results: Sequence[Result]) -> list[PresetCrossover]:
    """Per published model in the run, mode, dtype and batch, each attention mixer against each recurrent one, over
    the lengths both were timed at."""
    rows: dict[tuple[str, str, str, int, str], dict[int, Result]] = {}
    for result in results:
        case = result.case
        name = dict(case.options).get("preset")
        # A whole published stack (a model its case defines) is no one mixer's row.
        if not isinstance(name, str) or name not in PUBLISHED or case.definition is not None:
            continue
        label = _mixer_label(PUBLISHED[name], result)
        if label is not None and case.mode in _MODES:
            timed = rows.setdefault((name, case.mode, case.dtype, case.batch, label), {})
            if result.is_timed:
                timed[case.seq_len] = result
    found = []
    order = sorted(rows, key=lambda k: (list(PUBLISHED).index(k[0]), _MODES.index(k[1]), k[2:]))
    for (name, mode, dtype, batch), group in itertools.groupby(order, key=lambda k: k[:4]):
        preset = PUBLISHED[name]
        labels = {key[4] for key in group}
        recurrent = [m.label for m in preset.mixers if m.recurrent and m.label in labels]
        attention = [m.label for m in preset.mixers if not m.recurrent and m.label in labels]
        for r, a in itertools.product(recurrent, attention):
            a_rows, r_rows = rows[(name, mode, dtype, batch, a)], rows[(name, mode, dtype, batch, r)]
            line = None
            if a_rows and r_rows:  # one mixer untimed at every length (too slow, out of memory): no line to draw
                curve_a, curve_r = _curve(a, batch, a_rows), _curve(r, batch, r_rows)
                first = next(iter(a_rows.values())).case
                ns = tuple(sorted({*a_rows, *r_rows}))
                table = CurveGroup(
                    mode, dtype, first.device, first.d_model, first.layers, ns, (batch,), None, (curve_a, curve_r)
                )
                line = crossover_line(table, curve_a, curve_r)
            found.append(PresetCrossover(name, mode, dtype, r, a, line))
    return found


def _curve(label: str, batch: int, results: dict[int, Result]) -> Curve:
    """One mixer's rows as a pivot table's curve, labelled by the mixer and its family's model."""
    model = next(iter(results.values())).case.model
    return Curve(f"{label} ({model})", model, batch, results)


@dataclass(frozen=True)
class PresetsSection:
    """What a run says about the published models its preset rows belong to: each model's whole-stack decode
    state (None where no state is known for it), in the order the run first names them, and each model's own
    crossovers."""

    states: tuple[tuple[str, StackState | None], ...]
    crossings: tuple[PresetCrossover, ...]


def presets_section(results: Sequence[Result]) -> PresetsSection | None:
    """The published models' section of a run, or None for a run without published presets' rows."""
    found: dict[str, tuple[str, str]] = {}  # name -> (dtype, attention core)
    for result in results:
        name = dict(result.case.options).get("preset")
        if isinstance(name, str) and name in PUBLISHED and name not in found:
            found[name] = (result.case.dtype, _core(name, results))
    if not found:
        return None
    states = tuple((name, stack_state(PUBLISHED[name], dtype, core)) for name, (dtype, core) in found.items())
    return PresetsSection(states, tuple(preset_crossovers(results)))


def _core(name: str, results: Sequence[Result]) -> str:
    """The attention core a model's attention rows ran on (its mixers without a model of their own), else the
    default."""
    models = {m.model for m in PUBLISHED[name].mixers}
    for result in results:
        if dict(result.case.options).get("preset") == name and result.case.model not in models:
            return result.case.model
    return PRESET_CORE_DEFAULT[0]
