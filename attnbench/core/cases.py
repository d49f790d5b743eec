"""What is measured (``Case``) and how (``TimingPolicy``): the frozen values the rest of the flow passes on.

Pure Python. The policy is kept beside the cases, not inside them, so that changing how carefully we
time something never changes which thing it is: ``Case.key`` matches rows across runs (baseline vs current,
resume) and depends on case fields alone.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

from attnbench.core.catalogue import MODELS, Kind, UserModel, decode_inert, has_heads, spec_of
from attnbench.core.families.base import OptionValue

# Caps on sizes: far above anything a single accelerator can run, low enough to catch a typo (an extra zero or
# two) before it turns into an hour of allocator failures. Configs are held to them (config.experiment), and so
# are the cases of stored rows (results.records), whose numbers must stay safe to compute with.
MAX_SEQ_LEN = 2**22
MAX_BATCH = 65_536
MAX_D_MODEL = 65_536
MAX_HEADS = 65_536
MAX_LAYERS = 256
MAX_TOKENS = 2**32
MAX_THREADS = 4_096
MAX_SAMPLES = 10_000_000

Mode = Literal["forward", "train", "backward", "decode"]
Options = tuple[tuple[str, OptionValue], ...]


def option_text(name: str, value: OptionValue) -> str:
    """``name=value`` as keys and labels write it: booleans lower-case, like YAML."""
    return f"{name}={str(value).lower() if isinstance(value, bool) else value}"


@dataclass(frozen=True)
class Case:
    """One measured configuration. All models map (batch, seq_len, d_model) to the same shape.

    ``heads`` is ``None`` for models without heads (LSTM, GRU, min-RNNs); linear attention has them. ``causal``
    says whether position t sees only ≤ t: a flag for attention, and a property of the architecture for a
    recurrent model (unidirectional ⇒ causal), so that a ``causal: [true, false]`` grid does not time the same
    LSTM twice.

    ``user`` is set for a model the user brings (a config's ``factory:`` entry or an installed plugin): where it
    comes from and which side it joins, so a stored row says so without the user's code. It is not in the key: a
    user model's name is its identity, as a built-in's is.

    ``mode == "decode"``: ``seq_len`` is the context length n already held in the KV cache or recurrent state,
    and one call produces one new token per sequence (position n); such a case is always causal.
    """

    model: str
    mode: Mode
    dtype: str
    device: str
    batch: int
    seq_len: int
    d_model: int
    heads: int | None
    layers: int
    causal: bool
    options: Options = ()
    user: UserModel | None = None

    @property
    def kind(self) -> Kind:
        """Which side of the article's claims the model joins: recurrent or attention."""
        return self.user.kind if self.user is not None else MODELS[self.model].kind

    @property
    def tokens(self) -> int:
        """Tokens one call produces: batch × seq_len, or for decode one per sequence (batch)."""
        return self.batch if self.mode == "decode" else self.batch * self.seq_len

    @property
    def span(self) -> int:
        """Positions one sequence covers: seq_len, and for decode the new token after the context too (n + 1)."""
        return self.seq_len + 1 if self.mode == "decode" else self.seq_len

    @property
    def head_dim(self) -> int | None:
        return None if self.heads is None else self.d_model // self.heads

    @property
    def heads_kv(self) -> int | None:
        """Key/value heads: ``heads`` for multi-head attention, fewer for GQA, 1 for MQA; None without heads."""
        if self.heads is None:
            return None
        spec = spec_of(self).option("heads_kv")
        return (int(self.option("heads_kv")) if spec is not None else 0) or self.heads

    @property
    def window(self) -> int:
        """The sliding window's width in positions, or 0 for attention over the whole sequence."""
        return int(self.option("window")) if spec_of(self).option("window") is not None else 0

    def has_option(self, name: str) -> bool:
        """Whether the model has option ``name`` at all (set here or left at its default)."""
        return spec_of(self).option(name) is not None

    def option(self, name: str) -> OptionValue:
        """The case's value for a model option, or the catalogue default."""
        for key, value in self.options:
            if key == name:
                return value
        spec = spec_of(self).option(name)
        if spec is None:
            raise KeyError(f"model {self.model!r} has no option {name!r}")
        return spec.default

    @property
    def key(self) -> str:
        """Stable, readable identity. The device index is left out so cuda:0 and cuda:1 runs match."""
        device_type = self.device.split(":", 1)[0]
        parts = [
            f"model={self.model}",
            f"mode={self.mode}",
            f"dtype={self.dtype}",
            f"device={device_type}",
            f"batch={self.batch}",
            f"seq_len={self.seq_len}",
            f"d_model={self.d_model}",
            f"heads={'-' if self.heads is None else self.heads}",
            f"layers={self.layers}",
            f"causal={str(self.causal).lower()}",
        ]
        parts += [option_text(k, v) for k, v in self.options]
        return "|".join(parts)

    @property
    def label(self) -> str:
        """Short human label for progress lines."""
        extra = "" if self.heads is None else f" h={self.heads}" + (" causal" if self.causal else "")
        # Options tell variants apart (scope, positional, preset…): without them two rows would read the same.
        extra += "".join(f" {option_text(k, v)}" for k, v in self.options)
        return f"{self.model} {self.mode} {self.dtype} b={self.batch} n={self.seq_len} d={self.d_model}{extra}"

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["options"] = {k: v for k, v in self.options}
        if self.user is None:
            del data["user"]  # written only for a user model, so built-in rows read as they always did
        else:
            data["user"] = self.user.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Case:
        raw = dict(data)
        options = raw.pop("options", {}) or {}
        assert isinstance(options, Mapping)
        user = raw.pop("user", None)
        assert user is None or isinstance(user, Mapping)
        return cls(
            options=tuple(sorted(options.items())),
            user=None if user is None else UserModel.from_dict(user),
            **raw,  # type: ignore[arg-type]
        )


@dataclass(frozen=True)
class TimingPolicy:
    """How carefully each case is timed. Seconds throughout.

    The stopping rule: sample until the distribution-free 95 % CI of the median is within ±``target_ci``
    (relative), after at least ``min_samples`` samples and ``min_time_s`` of sampling; give up at
    ``max_case_s`` (warm-up included) or ``max_samples`` and record ``converged=False``.
    """

    target_ci: float = 0.01
    min_samples: int = 10
    max_samples: int = 10_000
    min_time_s: float = 0.2
    max_case_s: float = 10.0
    warmup_min_calls: int = 3
    warmup_max_s: float = 2.0
    # Timings within this relative band of their median count as settled at the end of warm-up.
    warmup_settle: float = 0.10
    # A sample shorter than this is built from several calls so clock resolution and call overhead vanish.
    min_sample_s: float = 1e-4
    # Warm-up audit: the first ``warmup_audit`` timed samples must agree with the next as many (medians within
    # ``warmup_agree``, beyond the noise); while they run slower they are moved into the warm-up. 0 = no audit.
    warmup_audit: int = 10
    warmup_agree: float = 0.02
    # Between-process replicates: each case runs in this many fresh worker processes (isolation on), and the
    # spread of their medians widens the case's CI. Drift between processes is larger than within one.
    processes: int = 1
    # GPU only. cold: overwrite 4× the device's L2 (≥ 256 MiB) before each timed call and wait for it, so the
    # flush is not timed and launch gaps are; warm: no flush.
    cache: Literal["warm", "cold"] = "warm"
    # GPU only: replay forward passes from a captured CUDA graph, which removes per-kernel launch cost.
    cuda_graph: bool = False
    # Before the first case of each process: this long of a mixed, parallel workload (``measure.process_warmup``),
    # so the first case does not pay for the thread pool's start, the autograd engine's, clock ramp-up and
    # first-use initialisation that every later case finds done. 0 = none.
    process_warmup_s: float = 0.5

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        # Written only when there is one, so a run from before the warm-up existed reads back as it was stored
        # (results.records reads a missing key as 0: those runs had none).
        if not self.process_warmup_s:
            del data["process_warmup_s"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TimingPolicy:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})  # type: ignore[arg-type]


@dataclass(frozen=True)
class Axes:
    """The value lists one experiment crosses. Every combination is a case (after de-duplication)."""

    models: tuple[str, ...]
    modes: tuple[Mode, ...]
    dtypes: tuple[str, ...]
    batch: tuple[int, ...]
    seq_len: tuple[int, ...]
    d_model: tuple[int, ...]
    heads: tuple[int, ...]
    layers: tuple[int, ...]
    causal: tuple[bool, ...]
    device: str
    # Per model, the option sets to cross it with (a config may list several values for an option); a model
    # left out runs once, with every option at its default.
    model_options: Mapping[str, tuple[Options, ...]] = field(default_factory=dict)
    # The grid's key/value head counts, crossed into every model that has the heads_kv option (0: = heads).
    heads_kv: tuple[int, ...] = (0,)
    # The models of ``models`` that the user brings, by name (config ``factory:`` entries and installed plugins).
    users: Mapping[str, UserModel] = field(default_factory=dict)


def expand(axes: Axes) -> list[Case]:
    """Cross every axis into cases, in a stable order, dropping combinations that do not apply.

    The order is model-major (then the model's option sets) with seq_len innermost, so a sweep walks each
    model's length curve in turn and a progress line reads naturally. Decode cases are causal only (a non-causal
    combination does not apply: config validation refuses a model left with none) and carry no option that is
    decode-inert for their family. A user model always carries ``heads``; a recurrent one is causal (a recurrence
    is causal by construction, as a unidirectional LSTM's case is).
    """
    seen: set[Case] = set()
    cases: list[Case] = []
    variants = [(model, options) for model in axes.models for options in axes.model_options.get(model, ((),))]
    for (model, options), heads_kv, mode, dtype, batch, d_model, heads, layers, causal, seq_len in itertools.product(
        variants,
        axes.heads_kv,
        axes.modes,
        axes.dtypes,
        axes.batch,
        axes.d_model,
        axes.heads,
        axes.layers,
        axes.causal,
        axes.seq_len,
    ):
        if mode == "decode":
            options = tuple(o for o in options if o[0] not in decode_inert(model))
        user = axes.users.get(model)
        if user is not None:
            causal = causal or user.kind == "recurrent"
            case = Case(model, mode, dtype, axes.device, batch, seq_len, d_model, heads, layers, causal, options, user)
        elif MODELS[model].kind == "recurrent":
            options = _with_heads_kv(model, options, heads_kv, heads)
            bidirectional = bool(dict(options).get("bidirectional", False))
            case = Case(
                model,
                mode,
                dtype,
                axes.device,
                batch,
                seq_len,
                d_model,
                heads if has_heads(model) else None,
                layers,
                not bidirectional,
                options,
            )
        else:
            options = _with_heads_kv(model, options, heads_kv, heads)
            case = Case(model, mode, dtype, axes.device, batch, seq_len, d_model, heads, layers, causal, options)
        if mode == "decode" and not case.causal:
            continue
        if case not in seen:
            seen.add(case)
            cases.append(case)
    return cases


def _with_heads_kv(model: str, options: Options, grid_value: int, heads: int) -> Options:
    """``options`` with the grid's heads_kv (where the model has the option and its own options leave it at the
    default), and without a heads_kv equal to ``heads``: that is multi-head attention, whose key says nothing."""
    if MODELS[model].option("heads_kv") is None:
        return options
    chosen = dict(options)
    value = int(chosen.get("heads_kv", 0)) or grid_value
    chosen.pop("heads_kv", None)
    if value and value != heads:
        chosen["heads_kv"] = value
    return tuple(sorted(chosen.items()))


# How much hardware telemetry a case records: none, NVML/psutil basics, or those plus GPM metrics (Hopper and newer).
Level = Literal["off", "basic", "full"]
LEVELS: tuple[Level, ...] = ("off", "basic", "full")


def default_interval_s(device: str) -> float:
    """The sampler's polling interval when the config leaves it null: 100 ms on every device.

    On a CPU the sampler shares the cores it measures (at 20 ms it cost 1.4 %: results/telemetry-overhead-cpu.md).
    On a GPU what changes fast (utilisation, power, clocks) comes from NVML's own sample buffers, read at the
    window's ends; the poll reads only memory in use, temperature and clock-event reasons."""
    return 0.1
