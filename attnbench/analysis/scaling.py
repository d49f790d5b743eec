"""How each model's cost grows with sequence length, and where two models' curves cross.

Pure Python, stdlib only at run time (results are only read through their attributes), so claims, reports and
anything else may import it without torch or numpy. Three parts:

- ``fit_power_law``: least squares of log y on log x, with a t-distribution CI of the slope;
- ``crossovers``: where the ratio of two cost curves crosses 1, interpolated on log-log;
- ``group_curves`` / ``scaling_laws`` / ``crossover_lines``: the same applied to a run, one curve per pivot row.

``group_curves`` is the one definition of "which rows form one curve along seq_len"; the pivot tables are laid
out from it, so a fitted line always describes exactly one table row. Decode rows (mode ``decode``) form groups of
their own; their memory curve is the KV cache or recurrent state a step reads (measured, beside the computed
bytes), not the step's peak, and their crossovers read "lstm decodes faster than sdpa from n ≈ …".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from attnbench.core.stats import student_t_975
from attnbench.core.units import format_approx, format_bytes, format_fixed, format_number
from attnbench.families.catalogue import SIDE_ORDER, causal_from_grid, is_recurrent, kind_of, known, state_noun

if TYPE_CHECKING:
    from attnbench.results.records import Result

# ---------------------------------------------------------------------------------------------------------------
# Power laws


@dataclass(frozen=True)
class PowerLaw:
    """y = prefactor · x^exponent, fitted by least squares on (log x, log y)."""

    exponent: float  # b in y = a·x^b
    exponent_low: float  # 95 % CI of b (t-distribution on the slope's standard error; = exponent when points == 2)
    exponent_high: float
    prefactor: float  # a
    x_min: float
    x_max: float
    points: int
    r2: float


def _usable(value: float) -> bool:
    return math.isfinite(value) and value > 0


def fit_power_law(xs: Sequence[float], ys: Sequence[float]) -> PowerLaw | None:
    """Fit y = a·x^b through the points whose x and y are both positive and finite (any order, duplicates
    allowed). None with fewer than 2 such points, or when they all share one x (no slope to speak of)."""
    if len(xs) != len(ys):
        raise ValueError(f"fit_power_law: {len(xs)} xs but {len(ys)} ys")
    kept = [(x, y) for x, y in zip(xs, ys, strict=True) if _usable(x) and _usable(y)]
    points = [(math.log(x), math.log(y)) for x, y in kept]
    n = len(points)
    if n < 2:
        return None
    mean_x = math.fsum(u for u, _ in points) / n
    mean_y = math.fsum(v for _, v in points) / n
    sxx = math.fsum((u - mean_x) ** 2 for u, _ in points)
    if sxx == 0:
        return None
    slope = math.fsum((u - mean_x) * (v - mean_y) for u, v in points) / sxx
    intercept = mean_y - slope * mean_x
    sse = math.fsum((v - intercept - slope * u) ** 2 for u, v in points)
    syy = math.fsum((v - mean_y) ** 2 for _, v in points)
    # Two points fix the line exactly: there are no residuals to estimate the slope's error from.
    half = student_t_975(n - 2) * math.sqrt(sse / (n - 2) / sxx) if n > 2 else 0.0
    return PowerLaw(
        exponent=slope,
        exponent_low=slope - half,
        exponent_high=slope + half,
        prefactor=math.exp(intercept),
        x_min=float(min(x for x, _ in kept)),
        x_max=float(max(x for x, _ in kept)),
        points=n,
        r2=1 - sse / syy if syy > 0 else 1.0,
    )


# ---------------------------------------------------------------------------------------------------------------
# Crossovers

Direction = Literal["a becomes slower than b", "a becomes faster than b"]
SLOWER: Direction = "a becomes slower than b"
FASTER: Direction = "a becomes faster than b"


@dataclass(frozen=True)
class Crossover:
    """Where the cost ratio a/b crosses 1. ``x`` is interpolated linearly in (log x, log ratio) between the
    bracketing measured points ``low_x``/``high_x``; when the ratio is exactly 1 at measured points, those are
    the bracket (and ``x`` their geometric mean: the point itself when there is one)."""

    x: float
    low_x: float
    high_x: float
    direction: Direction


def _log_ratios(xs: Sequence[float], ys_a: Sequence[float], ys_b: Sequence[float]) -> list[tuple[float, float]]:
    """(x, log(a/b)) sorted by x, over the points where x, a and b are all positive and finite."""
    if not len(xs) == len(ys_a) == len(ys_b):
        raise ValueError(f"crossovers: {len(xs)} xs, {len(ys_a)} ys_a, {len(ys_b)} ys_b")
    points = sorted(
        (x, math.log(a) - math.log(b))
        for x, a, b in zip(xs, ys_a, ys_b, strict=True)
        if _usable(x) and _usable(a) and _usable(b)
    )
    for (x0, _), (x1, _) in itertools.pairwise(points):
        if x0 == x1:
            raise ValueError(f"crossovers: x={x0:g} appears twice; a curve has one value per x")
    return points


def crossovers(xs: Sequence[float], ys_a: Sequence[float], ys_b: Sequence[float]) -> list[Crossover]:
    """Every sign change of log(ys_a/ys_b) over the xs where both curves have a usable (positive, finite)
    value. ys are costs: a rising ratio means a *becomes slower*. A ratio that touches 1 and turns back is no
    crossover; neither is one that starts or ends at exactly 1."""
    found: list[Crossover] = []
    last: tuple[float, float] | None = None  # the last point whose ratio was not exactly 1
    ties: list[float] = []  # xs since then where it was
    for x, d in _log_ratios(xs, ys_a, ys_b):
        if d == 0:
            if last is not None:
                ties.append(x)
            continue
        if last is not None and (last[1] < 0) != (d < 0):
            direction = SLOWER if d > 0 else FASTER
            if ties:
                low, high = ties[0], ties[-1]
                at = math.sqrt(low * high)
            else:
                low, high = last[0], x
                # log-ratio is linear in log x between the two points when both curves are (log-log lines).
                share = last[1] / (last[1] - d)
                at = min(high, max(low, math.exp(math.log(low) + share * (math.log(high) - math.log(low)))))
            found.append(Crossover(at, low, high, direction))
        ties = []
        last = (x, d)
    return found


# ---------------------------------------------------------------------------------------------------------------
# Curves of a run: one per pivot row


@dataclass(frozen=True)
class Curve:
    """One model configuration's results along seq_len (one pivot row)."""

    label: str  # model plus whatever else varies within its group ("vanilla h=8 causal", "lstm b=4")
    model: str
    batch: int | None  # None when batch is tied to seq_len (a constant-tokens grid)
    results: Mapping[int, Result]  # by seq_len

    @property
    def recurrent(self) -> bool:
        """Whether the model joins the recurrent side (its kind; a user model's entry says)."""
        return any(is_recurrent(r.case) for r in self.results.values())

    @property
    def side(self) -> int | None:
        """Where the model stands between the two sides: attention 0, a hybrid stack 1, recurrent 2; None for a
        model this catalogue does not know."""
        sides = {SIDE_ORDER.index(kind_of(r.case)) for r in self.results.values() if known(r.case)}
        return min(sides) if sides else None


@dataclass(frozen=True)
class CurveGroup:
    """Curves that share mode, dtype, device, d_model and layers (one pivot table)."""

    mode: str
    dtype: str
    device: str
    d_model: int
    layers: int
    seq_lens: tuple[int, ...]
    batches: tuple[int, ...]  # distinct, ascending
    batch_for_seq: Mapping[int, int] | None  # set when batch is tied to seq_len (a constant-tokens grid)
    curves: tuple[Curve, ...]

    @property
    def tied(self) -> bool:
        return self.batch_for_seq is not None


def _row_label(result: Result, varying: set[str]) -> str:
    case = result.case
    parts = [case.model]
    if "heads" in varying and case.heads is not None:
        parts.append(f"h={case.heads}")
    if "causal" in varying and causal_from_grid(case):
        parts.append("causal" if case.causal else "full")
    if "batch" in varying:
        parts.append(f"b={case.batch}")
    parts += [f"{k}={v}" for k, v in case.options]
    # A serving question's parameters tell its curves apart (prefill_chunk 0 and 128 of one model are two curves).
    parts += [f"{k}={v}" for k, v in case.serving if k != "memory_budget"]
    # So do what it keeps and how (kv_dtype int8 and bfloat16, pages of 16 or none): without them one row of a
    # model would silently take another's place in its curve.
    parts += [f"{k}={v}" for k, v in case.kept]
    return " ".join(parts)


def _varies(name: str, members: Sequence[Result]) -> bool:
    """Whether case field ``name`` takes several values among the rows where the grid chose it (causal only where
    the grid's mask decides it, heads only where a model has heads)."""
    if name == "causal":
        values = {r.case.causal for r in members if causal_from_grid(r.case)}
    else:
        values = {getattr(r.case, name) for r in members if getattr(r.case, name) is not None}
    return len(values) > 1


def _devices(members: Sequence[Result]) -> str:
    """The devices a group's rows ran on: one ("cuda:0"), or several of one kind ("cuda:0+cuda:1") when a sweep
    spread its cases over identical devices (sweep --devices)."""
    names = {r.case.device for r in members}
    return "+".join(sorted(names, key=lambda d: (len(d), d)))


def group_curves(results: Sequence[Result]) -> list[CurveGroup]:
    """Group by mode/dtype/kind of device/d_model/layers, then one curve per model (with what else varies), in
    the order the results first name them. Rows of one kind of device are one group whichever device of a
    ``--devices`` sweep measured them (the pool's rule: the devices are the same hardware)."""
    groups: dict[tuple[str, str, str, int, int], list[Result]] = {}
    for r in results:
        c = r.case
        groups.setdefault((c.mode, c.dtype, c.device.split(":")[0], c.d_model, c.layers), []).append(r)
    out = []
    for (mode, dtype, _, d_model, layers), members in groups.items():
        device = _devices(members)
        batches_by_seq: dict[int, set[int]] = {}
        for r in members:
            batches_by_seq.setdefault(r.case.seq_len, set()).add(r.case.batch)
        distinct = set().union(*batches_by_seq.values())
        tied = len(distinct) > 1 and all(len(b) == 1 for b in batches_by_seq.values())
        varying = {name for name in ("heads", "causal", "batch") if _varies(name, members)}
        if tied:
            varying.discard("batch")
        elif len(distinct) > 1:
            varying.add("batch")
        rows: dict[str, dict[int, Result]] = {}
        models: dict[str, str] = {}
        for r in members:
            label = _row_label(r, varying)
            rows.setdefault(label, {})[r.case.seq_len] = r
            models[label] = r.case.model
        curves = tuple(
            Curve(label, models[label], None if tied else next(iter(cells.values())).case.batch, cells)
            for label, cells in rows.items()
        )
        out.append(
            CurveGroup(
                mode=mode,
                dtype=dtype,
                device=device,
                d_model=d_model,
                layers=layers,
                seq_lens=tuple(sorted(batches_by_seq)),
                batches=tuple(sorted(distinct)),
                batch_for_seq={n: next(iter(b)) for n, b in batches_by_seq.items()} if tied else None,
                curves=curves,
            )
        )
    return out


def _timed(curve: Curve) -> list[tuple[int, Result]]:
    """The curve's ok, timed points in seq_len order."""
    return sorted(((n, r) for n, r in curve.results.items() if r.is_timed), key=lambda p: p[0])


# A median whose 95 % CI is within ±5 % is evidence enough for a fit, a crossover or a speed-up, even when the
# stopping rule's tighter target (±1 % by default) was missed; wider than that, or timed on a busy machine, not.
GOOD_CI = 0.05
LEFT_OUT = "noisy or contended"  # why a timed length is left out, in every line that says so
INDICATIVE = "a best estimate, marked"  # a crossover from lengths that are no evidence: said, not withheld


def good_evidence(result: Result) -> bool:
    """Whether a row's time may enter fits, crossovers and speed-ups: timed, not contended (``Result.contended``),
    and converged or with its median's 95 % CI within ±``GOOD_CI``."""
    if not result.is_timed or result.contended:
        return False
    m = result.timing
    return m.converged or m.summary.ci_halfwidth_rel <= GOOD_CI


def _good(curve: Curve) -> list[tuple[int, Result]]:
    return [(n, r) for n, r in _timed(curve) if good_evidence(r)]


def _lengths(ns: Sequence[int]) -> str:
    return f"n={', '.join(str(n) for n in ns)}"


# ---------------------------------------------------------------------------------------------------------------
# Scaling laws of a run

# A top-of-range slope this far from the whole-range one is worth a mention: the curve bends (fixed per-call
# cost at short lengths, or the n² term taking over), so the whole-range exponent undersells the asymptote.
BEND = 0.2


@dataclass(frozen=True)
class ScalingLine:
    """How one curve's time and peak memory grow with seq_len."""

    label: str
    model: str
    mode: str
    dtype: str
    device: str
    d_model: int
    layers: int
    batch: int | None  # None: batch tied to seq_len, so the fits are per token
    time: PowerLaw | None
    memory: PowerLaw | None
    recurrent: bool = False  # the model's side of the comparison (recurrent or attention)
    time_top: PowerLaw | None = None  # the two longest lengths alone, when the whole fit has ≥ 3 points
    memory_top: PowerLaw | None = None
    notes: tuple[str, ...] = ()  # why a fit is missing
    # Decode: the state's computed bytes against n (``memory`` is then the measured state, not the peak).
    state: PowerLaw | None = None
    state_noun: str = "state"  # what the family calls its decode state: "KV cache", "recurrent state", …

    @property
    def per_token(self) -> bool:
        return self.batch is None

    @property
    def decode(self) -> bool:
        return self.mode == "decode"

    @property
    def text(self) -> str:
        """'vanilla: time ∝ n^1.93 (95 % CI 1.85–2.01, n=64–1024, 4 points), memory ∝ n^2.00 (…)'."""
        if self.decode:
            return self._decode_text()
        unit = " per token" if self.per_token else ""
        parts = []
        if self.time is not None:
            parts.append(_law_text(f"time{unit}", self.time, self.time_top, None))
        if self.memory is not None:
            parts.append(_law_text(f"memory{unit}", self.memory, self.memory_top, self.time))
        return f"{self.label}: " + ", ".join(parts + list(self.notes))

    def _decode_text(self) -> str:
        """'sdpa: time per token ∝ n^0.78 (…), KV cache ∝ n^1.00 (computed; measured ∝ n^1.00, 95 % CI …)'."""
        parts = [] if self.time is None else [_law_text("time per token", self.time, self.time_top, None)]
        what = self.state_noun
        if self.state is not None:
            if self.state.exponent == 0:  # the same bytes at every n: a fit says nothing a number does not
                computed = f"{what} fixed at {format_bytes(self.state.prefactor)}"
            else:
                computed = f"{what} ∝ n^{format_fixed(self.state.exponent)}"
            measured = self.notes[-1] if self.memory is None and self.notes else "not measured"
            if self.memory is not None:
                measured = _law_text("measured", self.memory, self.memory_top, self.state)
            parts.append(f"{computed} (computed; {measured})")
        elif self.time is None:
            parts += self.notes
        return f"{self.label}: " + ", ".join(parts)


def _law_text(name: str, fit: PowerLaw, top: PowerLaw | None, like: PowerLaw | None) -> str:
    details = []
    if fit.points > 2:
        low, high = format_fixed(fit.exponent_low), format_fixed(fit.exponent_high)
        details.append(f"95 % CI {low} to {high}" if fit.exponent_low < 0 else f"95 % CI {low}–{high}")
    span = f"n={format_number(fit.x_min)}–{format_number(fit.x_max)}"
    if like is None or (like.x_min, like.x_max, like.points) != (fit.x_min, fit.x_max, fit.points):
        details.append(f"{span}, {fit.points} points" if fit.points > 2 else f"{span}, 2-point fit: no CI")
    elif fit.points == 2:
        details.append("2-point fit: no CI")
    text = f"{name} ∝ n^{format_fixed(fit.exponent)} (" + ", ".join(details)
    if top is not None and abs(top.exponent - fit.exponent) >= BEND:
        bend = "steepening" if top.exponent > fit.exponent else "flattening"
        text += f"; {bend} to n^{format_fixed(top.exponent)} at n={format_number(top.x_min)}–{format_number(top.x_max)}"
    return text + ")"


def _fits(xs: list[int], ys: list[float]) -> tuple[PowerLaw | None, PowerLaw | None]:
    """The whole-range fit, and with ≥ 3 usable points the two longest lengths' own slope."""
    usable = [(x, y) for x, y in zip(xs, ys, strict=True) if _usable(y)]
    whole = fit_power_law([x for x, _ in usable], [y for _, y in usable])
    top = None
    if whole is not None and whole.points >= 3:
        top = fit_power_law([x for x, _ in usable[-2:]], [y for _, y in usable[-2:]])
    return whole, top


def scaling_line(group: CurveGroup, curve: Curve) -> ScalingLine:
    """Fit one curve: median time per call (per token when batch is tied to seq_len) and peak memory, over its
    ok lengths; for decode, the state a step reads in place of the peak (measured, and computed in ``state``)."""
    timed = _timed(curve)
    good = [(n, r) for n, r in timed if good_evidence(r)]

    # With batch tied to seq_len a call's time mixes two effects; per token, only the length's remains.
    def scale(r: Result) -> float:
        return 1 / r.case.tokens if group.tied else 1.0

    # Time from the lengths whose timing is good evidence; memory (or a decode step's state) from every length
    # that ran: it is measured on its own, and neither noise nor a neighbour's load changes what a call allocates.
    xs = [n for n, _ in good]
    time, time_top = _fits(xs, [r.median_s * scale(r) for _, r in good])
    state = None
    if group.mode == "decode":
        measured = [(n, float(b) * scale(r)) for n, r in timed if (b := r.state_mem_bytes) is not None]
        computed = [(n, float(r.state_bytes or 0) * scale(r)) for n, r in timed]
        state = fit_power_law([n for n, _ in computed], [b for _, b in computed])
    else:
        measured = [
            (n, r.memory.peak_bytes * scale(r))
            for n, r in timed
            if r.memory is not None and r.memory.peak_bytes is not None
        ]
    memory, memory_top = _fits([n for n, _ in measured], [b for _, b in measured])
    notes = []
    left_out = [n for n, r in timed if not good_evidence(r)]
    if time is None and left_out:
        notes.append(f"time not fitted: {len(left_out)} of {len(timed)} lengths {LEFT_OUT} ({_lengths(left_out)})")
    elif time is None:
        notes.append(f"time not fitted ({_count(len(xs), 'length')} ran)")
    elif left_out:
        notes.append(f"time fit leaves out {_lengths(left_out)} ({LEFT_OUT})")
    if memory is None:
        notes.append(_state_note(measured) if group.mode == "decode" else _memory_note(measured))
    return ScalingLine(
        label=curve.label,
        model=curve.model,
        recurrent=curve.recurrent,
        state_noun=state_noun(next(iter(curve.results.values())).case),
        mode=group.mode,
        dtype=group.dtype,
        device=group.device,
        d_model=group.d_model,
        layers=group.layers,
        batch=curve.batch,
        time=time,
        memory=memory,
        time_top=time_top,
        memory_top=memory_top,
        notes=tuple(notes),
        state=state,
    )


def _memory_note(measured: list[tuple[int, float]]) -> str:
    if not measured:
        return "memory not measured"
    zero = [str(n) for n, peak in measured if peak <= 0]
    text = f"memory not fitted ({_count(len(measured) - len(zero), 'nonzero peak')}"
    if zero:
        # rss-hwm grows in pages and allocator chunks: a small case can stay inside what is already resident.
        text += f"; 0 at n={', '.join(zero)}: below what the method resolves"
    return text + ")"


def _state_note(measured: list[tuple[int, float]]) -> str:
    """Why a decode row's measured state has no fit: every reading, or all but one, was 0 B (a method that could
    not see the state)."""
    if not measured:
        return "not measured"
    zero = [str(n) for n, held in measured if held <= 0]
    if len(zero) == len(measured):
        return "measured 0 B at every n: smaller than what the method resolves"
    return f"measured, not fitted: {_count(len(measured) - len(zero), 'nonzero reading')}; 0 at n={', '.join(zero)}"


def _count(n: int, what: str) -> str:
    return f"{'no' if n == 0 else n} {what}{'' if n == 1 else 's'}"


def group_scaling_laws(group: CurveGroup) -> list[ScalingLine]:
    """One line per curve that has at least one timed length."""
    return [scaling_line(group, c) for c in group.curves if _timed(c)]


def scaling_laws(results: Sequence[Result]) -> list[ScalingLine]:
    """Time and peak-memory exponents of every curve in the run (ok rows only), group by group."""
    return [line for group in group_curves(results) for line in group_scaling_laws(group)]


# ---------------------------------------------------------------------------------------------------------------
# Crossovers of a run


@dataclass(frozen=True)
class CrossoverLine:
    """Where curve ``a`` crosses curve ``b`` (same group, same batch) in time per call."""

    a: str  # row labels
    b: str
    mode: str
    dtype: str
    device: str
    d_model: int
    layers: int
    batch: int | None
    seq_lens: tuple[int, ...]  # lengths both ran
    ratios: tuple[float, ...]  # a's time per token / b's at those lengths (per call, alike tokens): > 1: a is slower
    crossings: tuple[Crossover, ...]
    # Lengths where the ratio's bounds from the two medians' 95 % CIs include 1: which is faster there is noise.
    unclear: tuple[int, ...] = ()
    # Lengths both curves ran but left out: one side's timing is not good evidence (``good_evidence``).
    left_out: tuple[int, ...] = ()
    # Where no length is good evidence: the same line over every length both timed, a best estimate the text gives
    # marked (a busy machine's answer) instead of none. Nothing else reads it: claims and fits keep to evidence.
    indicative: CrossoverLine | None = None

    @property
    def stable(self) -> bool:
        """False when the order flips more than once and a flip rests on a length where it is within noise."""
        brackets = {int(x) for c in self.crossings for x in (c.low_x, c.high_x)}
        return len(self.crossings) < 2 or not brackets & set(self.unclear)

    @property
    def text(self) -> str:
        """'sdpa-flash becomes slower than lstm at n ≈ 190 (between 64 and 256)', or what holds throughout."""
        return self._text() + self._left_out()

    def _left_out(self) -> str:
        if not self.left_out or not self.seq_lens:
            return ""
        total = len(self.seq_lens) + len(self.left_out)
        return f"; {len(self.left_out)} of {total} lengths left out ({LEFT_OUT}: {_lengths(self.left_out)})"

    def _text(self) -> str:
        if not self.seq_lens:
            total = len(self.left_out)
            if self.indicative is not None and self.indicative.seq_lens:
                return f"{self.indicative._text()} ({INDICATIVE}: {total} of {total} lengths {LEFT_OUT})"
            return f"{self.a} vs {self.b}: crossover not determined: {total} of {total} lengths {LEFT_OUT}"
        if not self.stable:
            span = f"n={self.seq_lens[0]}–{self.seq_lens[-1]}"
            flips = [str(n) for n in self.unclear]
            return (
                f"{self.a} vs {self.b}: no stable crossover in range {span}: the order flips "
                f"{len(self.crossings)} times, within noise at n={', '.join(flips)}"
            )
        if self.crossings:
            parts = []
            for i, c in enumerate(self.crossings):
                if self.mode in _FROM_WORDS:  # in the faster model's words: "lstm decodes faster than sdpa from n ≈ …"
                    faster, slower = (self.b, self.a) if c.direction == SLOWER else (self.a, self.b)
                    head = f"{faster} {_FROM_WORDS[self.mode]} {slower}" if i == 0 else f"then {faster}"
                    parts.append(f"{head} from {self._where(c)}")
                    continue
                word = "slower" if c.direction == SLOWER else "faster"
                head = f"{self.a} becomes {word} than {self.b}" if i == 0 else f"then {word}"
                parts.append(f"{head} at {self._where(c)}")
            brackets = {x for c in self.crossings for x in (c.low_x, c.high_x)}
            return ", ".join(parts) + self._noise(brackets)
        if len(self.seq_lens) == 1:
            verdict = _verdict(self.ratios[0])
            text = f"{self.a} vs {self.b}: {verdict} at n={self.seq_lens[0]}, the only length both ran"
            return text + self._noise(set(self.seq_lens))
        # No crossing over ≥ 2 lengths: every ratio that is not exactly 1 lies on the same side.
        verdicts = {_verdict(r) for r in self.ratios if r != 1}
        verdict = verdicts.pop() if verdicts else "as fast"
        span = f"n={self.seq_lens[0]}–{self.seq_lens[-1]}"
        text = f"{self.a} vs {self.b}: none in range {span}: {verdict} throughout"
        ties = [str(n) for n, r in zip(self.seq_lens, self.ratios, strict=True) if r == 1]
        if ties and verdict != "as fast":
            text += f" (equal at n={', '.join(ties)})"
        return text + self._noise(set(self.seq_lens))

    def _noise(self, lengths: set[float]) -> str:
        ties = {n for n, r in zip(self.seq_lens, self.ratios, strict=True) if r == 1}  # already said: equal
        unclear = [str(n) for n in self.unclear if n in lengths and n not in ties]
        return f"; within noise at n={', '.join(unclear)}" if unclear else ""

    def _where(self, c: Crossover) -> str:
        if c.low_x == c.high_x:
            return f"n = {format_number(c.x)} (measured)"
        ratio = dict(zip(self.seq_lens, self.ratios, strict=True))
        if ratio.get(int(c.low_x)) == 1:
            return f"n ≈ {format_approx(c.x)} (equal from {format_number(c.low_x)} to {format_number(c.high_x)})"
        return f"n ≈ {format_approx(c.x)} (between {format_number(c.low_x)} and {format_number(c.high_x)})"


# How a crossover of these modes reads, in the faster model's words.
_FROM_WORDS = {
    "decode": "decodes faster than",
    "capacity": "serves more tokens/s under the memory budget than",
}


def _verdict(ratio: float) -> str:
    return "slower" if ratio > 1 else "faster" if ratio < 1 else "as fast"


def _pairs(group: CurveGroup, baseline_model: str | None) -> list[tuple[Curve, Curve]]:
    """Each curve against each of another side, the attention-like one first (attention against hybrid stacks
    and recurrent models, hybrid stacks against recurrent models); with a baseline model, also every other curve
    against the baseline's (the pair the table's speed-ups show), unless that pair is already there the other
    way."""
    pairs = []
    for a in group.curves:
        for b in group.curves:
            if a is b or a.batch != b.batch or asked(a) != asked(b):
                continue
            sa, sb = a.side, b.side
            across = sa is not None and sb is not None and sa < sb
            vs_baseline = (
                baseline_model is not None
                and b.model == baseline_model
                and a.model != baseline_model
                and not (sa is not None and sb is not None and sa > sb)
            )
            if across or vs_baseline:
                pairs.append((a, b))
    return pairs


def asked(curve: Curve) -> tuple[tuple[str, int], ...]:
    """A curve's serving question (its prefill chunk, its drafts): two curves compare only when they ask the same."""
    return next((r.case.serving for r in curve.results.values()), ())


def crossover_line(group: CurveGroup, a: Curve, b: Curve) -> CrossoverLine | None:
    """Where ``a``'s time per token crosses ``b``'s (per call, where both calls hold the same tokens), over the
    lengths where both timings are good evidence; None when no length has both timed."""
    timed_b = dict(_timed(b))
    both = [(n, r, timed_b[n]) for n, r in _timed(a) if n in timed_b]
    if not both:
        return None
    common = [(n, ra, rb) for n, ra, rb in both if good_evidence(ra) and good_evidence(rb)]
    left_out = tuple(n for n, ra, rb in both if not (good_evidence(ra) and good_evidence(rb)))
    indicative = None if common else _line_over(group, a, b, both, ())
    return _line_over(group, a, b, common, left_out, indicative)


def _line_over(
    group: CurveGroup,
    a: Curve,
    b: Curve,
    common: list[tuple[int, Result, Result]],
    left_out: tuple[int, ...],
    indicative: CrossoverLine | None = None,
) -> CrossoverLine:
    """The crossover line of ``a`` and ``b`` over the lengths of ``common``."""
    xs = [n for n, _, _ in common]
    # Time per token: the time per call where both curves' calls hold the same tokens (every mode but capacity,
    # where each found its own batch: there the curves cross where one serves more tokens per second).
    ya = [r.median_s / r.tokens_per_call for _, r, _ in common]
    yb = [r.median_s / r.tokens_per_call for _, _, r in common]
    return CrossoverLine(
        a=a.label,
        b=b.label,
        mode=group.mode,
        dtype=group.dtype,
        device=group.device,
        d_model=group.d_model,
        layers=group.layers,
        batch=a.batch,
        seq_lens=tuple(xs),
        ratios=tuple(x / y for x, y in zip(ya, yb, strict=True)),
        crossings=tuple(crossovers(xs, ya, yb)),
        unclear=tuple(n for n, ra, rb in common if _overlaps(ra, rb)),
        left_out=left_out,
        indicative=indicative,
    )


def _overlaps(a: Result, b: Result) -> bool:
    """Whether the 95 % CIs of the two medians overlap, i.e. the ratio's bounds include 1. A CI needs ≥ 6
    samples; without one on either side there is nothing to say, so False."""
    sa, sb = a.measurement.summary, b.measurement.summary  # type: ignore[union-attr]
    finite = all(math.isfinite(v) for v in (sa.ci_low, sa.ci_high, sb.ci_low, sb.ci_high))
    return finite and sa.ci_low <= sb.ci_high and sb.ci_low <= sa.ci_high


def group_crossover_lines(group: CurveGroup, baseline_model: str | None = None) -> list[CrossoverLine]:
    """``crossover_lines`` for one group (one pivot table), in row order."""
    lines = (crossover_line(group, a, b) for a, b in _pairs(group, baseline_model))
    return [line for line in lines if line is not None]


def crossover_lines(results: Sequence[Result], baseline_model: str | None = None) -> list[CrossoverLine]:
    """Where each attention variant becomes slower (or faster) than each recurrent model of the same batch,
    interpolated between measured lengths; ``baseline_model`` adds every other model against it."""
    return [line for group in group_curves(results) for line in group_crossover_lines(group, baseline_model)]
