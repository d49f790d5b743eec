"""What a model family is, torch-free: the values every family declares and the methods every family answers.

A family is one folder, ``attnbench/families/<name>/``: ``spec.py`` (this half: names, options and their rules,
FLOPs, parameters, decode state, the packages its kernels use, the peak its matmuls run at, its role in the
article's claims, the row extras and columns it writes) and ``layers.py`` (the torch half: build, probe, decode,
extras, the process and call context it needs). ``attnbench.families.catalogue`` finds every folder whose ``spec``
defines ``FAMILY`` and loops over them, so nothing outside the folder names a model or one of its options. The
pattern is tritonbench's operator modules (``operators/*/operator.py``, one registered unit per operator) and pyperf's
``_metadata.py`` table (each metadata key with its type, unit and formatter) for the extras.

The option rules come in two checks, each written once, in the family: ``no_effect`` (an option that changes
nothing given the others: config validation drops it from a case, so a key never carries a setting that changed
nothing, and refuses one that has no effect anywhere it is given) and ``cannot_build`` (a case that describes no
model that can be built: config validation refuses it at the key that made it so, and the executor records a case
made by hand as ``unsupported``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from attnbench.core.cases import KINDS, Case, Definition, Kind, Options, OptionValue, Side

__all__ = [
    "KINDS",
    "ClaimRole",
    "ExtraSpec",
    "ExtraValue",
    "Family",
    "FlopCount",
    "Kind",
    "ModelSpec",
    "OptionSpec",
    "OptionType",
    "OptionValue",
    "Options",
    "Package",
    "Parts",
    "Preset",
    "Problem",
    "ValueOf",
    "frozen",
]

OptionType = type[bool] | type[int] | type[float] | type[str]
ExtraValue = str | int | float | bool | None
# Reads an option of the model in question: the value given, else the option's default.
ValueOf = Callable[[str], OptionValue]


@dataclass(frozen=True)
class OptionSpec:
    """One model option a config may set under ``model_options.<model>``.

    ``choices`` closes the set of values a string option takes; ``minimum``/``maximum`` bound an integer one;
    ``refused`` names values that a reader might expect to work, with why they do not and what to use instead
    (rope on a recurrent model). Config validation enforces all three; a stored row is only type-checked, so that
    a later release may add a choice without making older results unreadable.
    """

    name: str
    type: OptionType
    default: OptionValue
    help: str
    choices: tuple[str, ...] | None = None
    minimum: int | float | None = None
    maximum: int | float | None = None
    refused: tuple[tuple[str, str, str], ...] = ()  # (value, why, hint)
    # A grid axis of the same name sets it for every model that has the option (heads_kv: GQA across models).
    axis: bool = False

    def refusal(self, value: OptionValue) -> tuple[str, str] | None:
        """(why, hint) if ``value`` is one this option refuses by name, else None."""
        return next(((why, hint) for v, why, hint in self.refused if v == value), None)

    def allowed(self) -> str:
        """What the option takes, as ``attnbench models`` and the errors say it."""
        if self.choices is not None:
            return "|".join(self.choices)
        if self.type is bool:
            return "true|false"
        if self.minimum is None and self.maximum is None:
            return self.type.__name__
        return f"{self.minimum}…{self.maximum}"


@dataclass(frozen=True)
class ModelSpec:
    """One model name: which side it joins (``kind``), which family builds it, what it needs."""

    name: str
    kind: Side
    family: str  # the family's name: its folder, attnbench.families.<family> (spec and layers)
    summary: str
    # Devices the kernel exists for at all; finer limits (dtype, head dim) are found by probing a tiny input.
    devices: tuple[str, ...] = ("cpu", "cuda")
    # A Python package the model needs beyond torch (import name).
    package: str | None = None
    options: tuple[OptionSpec, ...] = ()
    # Whether the model's cases carry ``heads`` (attention, linear attention, user models).
    heads: bool = False
    # Where the model comes from: "built-in", "plugin <distribution>" or "config".
    source: str = "built-in"

    def option(self, name: str) -> OptionSpec | None:
        return next((o for o in self.options if o.name == name), None)


@dataclass(frozen=True)
class Preset:
    """A model of fixed, published size, cased beside the grid by a config's top-level ``presets`` key.

    The case it becomes carries every size in its own fields and options (``preset`` among them, so a row
    says which preset it is); builders never look a preset up.
    """

    name: str
    kind: Kind
    summary: str
    model: str | None  # the one model it is built from; None: any attention model (the config's presets.core)
    d_model: int
    heads: int | None
    layers: int
    options: tuple[tuple[str, OptionValue], ...]  # sorted by name, as Case keeps them
    max_seq_len: int | None = None  # learned positions cover this many tokens
    reference: str = ""
    # Whether it can produce one token at a time (an encoder's attention sees the whole sequence: it cannot).
    decodes: bool = True


@dataclass(frozen=True)
class Problem:
    """Why an option has no effect, or why a case cannot be built: the message, the option to point at (None: the
    case's sizes or mode) and what to do about it."""

    message: str
    option: str | None = None
    hint: str = ""


@dataclass(frozen=True)
class ExtraSpec:
    """One key a row's ``extra`` may hold, as pyperf's METADATA table keeps its keys: the type its values take
    (besides null), the unit (SI: ``s``, ``bytes``, ``flop``; ``""`` for a count, a name or a flag) and what it
    says. Readers check a declared key's type; a key no release declares is kept as it was stored."""

    name: str
    type: type[str] | type[int] | type[float] | type[bool]
    unit: str
    help: str
    # A column of summary.csv (and of the frames and exports), after the columns every row has.
    column: bool = False
    # The least a number may be: every count, size, time and rate is at least 0 (a stored file is untrusted, and a
    # negative FLOP count or time would read as a negative rate); a capacity found is at least one sequence.
    minimum: float = 0

    def fits(self, value: ExtraValue) -> bool:
        if value is None:
            return True
        if self.type is bool or isinstance(value, bool):
            return self.type is bool and isinstance(value, bool)
        if self.type is float:
            return isinstance(value, int | float) and value >= self.minimum
        return isinstance(value, self.type) and (not isinstance(value, int) or value >= self.minimum)

    @property
    def wanted(self) -> str:
        """What ``fits`` accepts, for an error message."""
        if self.type in (int, float):
            least = f"{self.minimum:g}"
            return f"{'an integer' if self.type is int else 'a number'} ≥ {least} or null ({self.help})"
        return f"{self.type.__name__} or null ({self.help})"


@dataclass(frozen=True)
class Package:
    """A Python package a family's kernels may run on: recorded in run.json with its version where installed (a new
    version of a kernel changes the numbers, as a new torch does)."""

    distribution: str  # as pip knows it: "flash-attn"
    module: str  # as Python imports it: "flash_attn"


ClaimSide = Literal["rnn", "attention"]


@dataclass(frozen=True)
class ClaimRole:
    """Which side of the article's claims a case stands on: ``rnn`` (the recurrence the article means: one step
    after another) or ``attention`` (full self-attention). ``parallel``: a recurrence whose steps the model computes
    together (a parallel scan), which removes the premise of claim 1a; ``shown``: options a claim always names
    for it (a scan mode), set or default."""

    side: ClaimSide
    parallel: bool = False
    shown: tuple[tuple[str, OptionValue], ...] = ()


@dataclass(frozen=True)
class FlopCount:
    """The FLOPs of one call of a case's mode, the formula that gave them, and the parts they add up from.

    ``detail`` names the forward parts (``projections``, ``core`` for attention; ``gates`` for recurrent
    models) and, for ``train``, their backward counterparts (``projections_backward``, …). ``flops`` is their
    sum.
    """

    flops: int
    formula: str
    detail: Mapping[str, int]


Parts = dict[str, int]


class Family:
    """One model family's torch-free facts. A family module defines ``FAMILY``, an instance of a subclass.

    The defaults here are those of a family with nothing to say: no option rules beyond the declared ones, no
    decode state, no formula (FLOPs are then counted on the device: ``flops_formula`` ``counted-v1``).
    """

    name: str = ""
    order: int = 1000  # where its models come in `attnbench models` and in tables (lower first)
    models: tuple[ModelSpec, ...] = ()
    presets: tuple[Preset, ...] = ()
    extras: tuple[ExtraSpec, ...] = ()
    # Options that change only how the whole sequence is computed, so a decode step is the same whatever their value:
    # decode cases leave them out, so that two values do not time one step twice.
    decode_inert: frozenset[str] = frozenset()
    # Whether FLOPs come from a formula here (False: counted by torch's FlopCounterMode over one call).
    analytic: bool = True
    # Packages its kernels may run on (recorded in run.json with their versions where installed).
    packages: tuple[Package, ...] = ()
    # Columns of summary.csv that describe the case and that only this family's cases fill (key/value heads, a
    # window): their values come from ``case_columns``.
    case_columns: tuple[ExtraSpec, ...] = ()
    # What a decode state is called in the family's messages.
    state_noun: str = "recurrent state"
    # The model a preset of this family without a model of its own (``Preset.model`` None) is built on by default.
    preset_core: str | None = None
    # The key a case of this family carries its model's definition under (``Case.definition``), for a family whose
    # models their cases define (a user's, a hybrid stack); None: its models are the catalogue's, known by name.
    defines: str | None = None

    # ---------------------------------------------------------------------------------------------- a defined model
    def define(self, data: Mapping[str, Any]) -> Definition:
        """The definition a case of a model of this family carries, read from ``data`` as a config or stored row
        writes it (JSON-shaped) and written down as the family writes it; ValueError where ``data`` is not one."""
        raise ValueError(f"the {self.name} family's models are known by name; a case defines none")

    def described(self, case: Case) -> Mapping[str, object]:
        """What ``attnbench models`` lists of ``case``'s model beyond its spec (a stack's pattern)."""
        return {}

    def source(self, case: Case) -> str:
        """Where ``case``'s model comes from, as summary.csv's ``source`` column says it: built-in, else where a
        user's model was given (``config``, ``plugin <distribution>``)."""
        return "built-in"

    def config_entry(self, case: Case) -> dict[str, object] | None:
        """The ``models`` entry a config writes for ``case``'s model where its name alone does not say it (a factory
        entry, its options inside it), or None."""
        return None

    # ---------------------------------------------------------------------------------------------- a model's options
    def spec(self, case: Case) -> ModelSpec:
        """The spec of ``case``'s model (one of ``models``)."""
        spec = next((m for m in self.models if m.name == case.model), None)
        if spec is None:
            raise KeyError(f"{case.model!r} is not a model of the {self.name} family")
        return spec

    def option(self, case: Case, name: str) -> OptionValue:
        """``case``'s value for a model option, or the option's default; KeyError for an option the model lacks."""
        given = case.given(name)
        if given is not None:
            return given
        option = self.spec(case).option(name)
        if option is None:
            raise KeyError(f"model {case.model!r} has no option {name!r}")
        return option.default

    def has_option(self, case: Case, name: str) -> bool:
        return self.spec(case).option(name) is not None

    def values(self, case: Case) -> ValueOf:
        """``option`` bound to ``case``: what the shared rules and counts read a case's options through."""
        return lambda name: self.option(case, name)

    # ---------------------------------------------------------------------------------------------- grid and cases
    def causal(self, spec: ModelSpec, options: Mapping[str, OptionValue], requested: bool) -> bool:
        """Whether a case of ``spec`` with ``options`` is causal when the grid asks for ``requested``: attention
        follows the grid; a recurrence is causal by construction (a family with a bidirectional option says so)."""
        return requested if spec.kind == "attention" else True

    def canonical(self, spec: ModelSpec, options: Options, heads: int) -> Options:
        """``options`` with any value that, given the case's sizes, is the default in effect left out (so that two
        spellings of one model never make two keys). Nothing to leave out by default."""
        return options

    def decode_problem(self, case: Case) -> Problem | None:
        """Why ``case`` cannot produce one token at a time (a new token may see only the tokens before it), or None.
        ``causal`` is what tells: attention must be causal, a recurrence unidirectional."""
        if case.causal:
            return None
        return Problem(
            f"{case.model} with causal=false lets every position see the whole sequence, so it cannot produce one "
            "token at a time (decode needs causal attention)"
        )

    def case_column_values(self, case: Case) -> Mapping[str, ExtraValue]:
        """The values of ``case_columns`` for ``case``."""
        return {}

    def serving_problem(self, case: Case) -> Problem | None:
        """Why ``case``'s serving question (``capacity``, ``prefill``, ``verify``, ``prefix``, packed lengths) cannot be
        asked of its model, or None: an ``unsupported`` row with the reason, never a refused config (``option`` stays
        None). By default every question can be asked, eagerly: the serving modes time eager calls, so a compiled
        model says so here."""
        if self.has_option(case, "compile") and self.option(case, "compile") != "none":
            return Problem(
                f"{case.mode}{' with packed lengths' if case.packing else ''} times eager calls; "
                f"compile={self.option(case, 'compile')} is not applied to them",
                hint="leave compile at none for the serving questions",
            )
        return None

    # ---------------------------------------------------------------------------------------------- readings of rows
    def peak_dtype(self, case: Case) -> str:
        """Which peak ``case``'s matmuls are held against: the case's dtype, or ``tf32`` where the family's kernels
        run float32 on TF32 tensor cores by default (cuDNN's RNNs)."""
        return case.dtype

    def claim_role(self, case: Case) -> ClaimRole | None:
        """Where ``case`` stands in the article's claims, or None where it is neither the RNN nor the attention
        those claims are about (compared in its own right)."""
        return None

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        """A Problem if option ``name`` changes nothing given the model's other options (``value_of``)."""
        return None

    def no_effect_up_to(self, model: str, name: str, value: OptionValue, longest: int) -> Problem | None:
        """A Problem if option ``name`` = ``value`` changes nothing at any sequence length up to ``longest`` (the
        grid's longest): config validation refuses it at the option."""
        return None

    def cannot_build(self, case: Case) -> Problem | None:
        """A Problem if ``case`` describes no model that can be built (checked on the real case, before a probe
        shrinks it), else None. The catalogue checks what every family shares first (decoding needs causality,
        option values); this is what is the family's own."""
        return None

    def formula(self, case: Case) -> str:
        """The id of the FLOP formula for ``case``: family, scope, variant and decode, versioned."""
        raise NotImplementedError(f"{self.name} has no FLOP formula")

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        """Forward and backward FLOPs of one call, by part (see ``attnbench.families.flops``)."""
        raise NotImplementedError(f"{self.name} has no FLOP formula")

    def scores_in_full(self, case: Case, extra: Mapping[str, object]) -> bool:
        """Whether ``case``'s core computes all n² scores though its mask keeps fewer (executed ≠ useful FLOPs),
        given the row's ``extra`` (what ran)."""
        return False

    def parameters(self, case: Case) -> int | None:
        """The parameter count of ``case``'s model as the torch half builds it (a test holds them equal); None
        where only the built module knows."""
        return None

    def state_dtype(self, case: Case) -> str:
        """The dtype a decode state is kept in: the case's ``state_dtype`` where it sets one."""
        return case.kept_dtype("state_dtype") or case.dtype

    def kept_default(self, case: Case, key: str) -> str | None:
        """The value of kept key ``key`` (``core.cases.KEPT_DTYPES``) that keeps ``case``'s state as it is kept when
        none is given (a case given it keeps nothing, its key unchanged), or None where no one value is."""
        if key == "state_dtype":  # a recurrent state's own (float32 for some 16-bit cases)
            return self.state_dtype(case)
        return {"kv_dtype": case.dtype, "page_tokens": "0", "hybrid_pages": "separate"}[key]

    def kept_keys(self, case: Case) -> tuple[str, ...]:
        """Which of ``core.cases.KEPT_DTYPES`` apply to ``case`` (crossed into its cases only): a cache's ``kv_dtype``,
        a recurrence's ``state_dtype``; () where its state cannot be kept narrower."""
        return ("kv_dtype", "page_tokens") if self.spec(case).kind == "attention" else ("state_dtype",)

    def page_layout(self, case: Case) -> tuple[int, int]:
        """How the case's states are laid out: positions per KV cache page (0: contiguous) and the bytes per sequence
        each recurrent state's slot takes (0: its own; a hybrid's pages aligned to its state, as vLLM's are)."""
        return case.page_tokens, 0

    def state_bytes(self, case: Case) -> int | None:
        """Bytes of the KV cache or recurrent state a decode step at context ``case.seq_len`` reads; None where
        only the built module knows (it is then measured, not computed)."""
        return None

    def prefix_step(self, case: Case) -> int:
        """Mode prefix: the multiple of positions at which the state after a shared prefix can be reused, or 0 where
        none can (the prefix recomputed by every request). A KV cache shares whole pages by reference (any position
        where contiguous, as a radix tree's token-granular prefix); a recurrent state only where a checkpoint was
        taken (``checkpoint_every``: 0 takes none)."""
        if self.spec(case).kind == "attention":
            return case.page_tokens or 1
        return case.param("checkpoint_every")

    def state_written(self, case: Case, state_bytes: int) -> int:
        """Bytes of its state a decode step writes back: the whole state for a recurrence (a family whose state grows
        with n writes one position's share)."""
        return state_bytes

    def prefill_carries(self, case: Case) -> bool:
        """Whether a context can be fed in chunks, the state carrying across them (a recurrence); False: the
        prefill is one pass over the whole context (an attention cache attends to all of it at once)."""
        return True

    def takes_tokens(self, case: Case) -> bool:
        """Whether one call takes int64 token ids (B, T) rather than activations (B, T, d_model)."""
        return False

    # ---------------------------------------------------------------------------------------------- traffic
    def lookup_table(self, case: Case) -> tuple[int, int] | None:
        """(rows, width) of the table a call reads row by row (the token embedding at scope model), or None: a call
        reads the rows its tokens gather, not the whole table (``attnbench.families.traffic``)."""
        return None

    def intermediate_elements(self, case: Case) -> int:
        """Elements of the activations one forward call writes for a later kernel of the same call to read, beyond
        the call's input and output (in the case's dtype): the traffic between kernels that no fusion removes, each
        written once and read once (``attnbench.families.traffic``). By default the activations handed from one of
        ``layers`` stacked layers to the next, which a user's model asked for that many layers has too."""
        return (case.layers - 1) * case.tokens * case.d_model


def frozen(parts: Mapping[str, int]) -> Mapping[str, int]:
    return MappingProxyType(dict(parts))
