"""What is measured (``Case``) and how (``TimingPolicy``): the frozen values the rest of the flow passes on.

Pure Python, and knowing no model: a case is the values that name one measurement, nothing more. What a model's
family says about a case (its side in the claims, an option's default, its FLOPs) is the family's to answer
(``attnbench.families.catalogue``); expanding a config's grid into cases is the config's (``config.grid``). The
policy is kept beside the cases, not inside them, so that changing how carefully we time something never changes
which thing it is: ``Case.key`` matches rows across runs (baseline vs current, resume) and depends on case fields
alone.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from attnbench.core.units import format_bytes

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

# What a case's key is joined with (``Case.key``: name=value|name=value): no option name or text value may hold them,
# or two different cases would have one key.
KEY_SEPARATORS = "|="

Mode = Literal["forward", "train", "backward", "decode", "capacity", "prefill", "verify", "prefix"]
# backward = the backward pass alone (graph kept, grads cleared), so train can be checked against forward + backward.
# decode = one new token per sequence with a context of seq_len tokens already in the KV cache or recurrent state.
# The serving questions (issue 41): capacity = the largest batch whose decode step at context seq_len fits a memory
# budget, and that step timed at it; prefill = a prompt of seq_len ingested in chunks (time to first token); verify =
# k draft tokens checked in one call after seq_len of context, then the rollback to the r accepted ones; prefix (issue
# 52) = M requests whose prompts of seq_len share their first P tokens, prefilled to their first tokens, the prefix's
# state shared (a KV cache's by reference) or restored from a checkpoint, against M independent prefills.
MODES: tuple[Mode, ...] = ("forward", "train", "backward", "decode", "capacity", "prefill", "verify", "prefix")
# The modes whose case carries a state from token to token: they need a model that looks backwards only (causal).
STATEFUL_MODES: frozenset[str] = frozenset({"decode", "capacity", "prefill", "verify", "prefix"})
# The parameters each serving mode's case carries (``Case.serving``), by mode; the config's top-level keys of the
# same names set them. memory_budget is in bytes, 0 meaning the device's default (a GPU's free memory less a margin).
SERVING_PARAMS: dict[str, tuple[str, ...]] = {
    "capacity": ("memory_budget",),
    "prefill": ("prefill_chunk",),
    "verify": ("accept", "draft"),
    "prefix": ("checkpoint_every", "prefix_tokens", "requests"),
}
# The modes whose cases packed variable lengths (``Case.packing``) may stand in for batch × seq_len.
PACKING_MODES: tuple[Mode, ...] = ("forward", "train")
MAX_PACKED = 1_024  # sequences in one pack
MAX_DRAFT = 1_024  # draft tokens one verify call checks
MAX_REQUESTS = 4_096  # requests one prefix case serves at once
MAX_MEMORY_BUDGET = 2**50  # bytes: a pebibyte, far beyond any device, short of a typo's extra digits
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float64")
# What a config or --device may ask for, and what a resolved case records.
DEVICE_REQUEST = re.compile(r"auto|cpu|cuda|cuda:\d+")
RESOLVED_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
# Which side of the article's comparison a model joins; a hybrid stack of both may stand on a side of its own.
Kind = Literal["recurrent", "attention"]
KINDS: tuple[Kind, ...] = ("recurrent", "attention")
Side = Literal["recurrent", "attention", "hybrid"]
SIDES: tuple[Side, ...] = ("recurrent", "attention", "hybrid")
# The most members a hybrid's pattern may cycle through.
MAX_PATTERN = 64
OptionValue = bool | int | float | str
Options = tuple[tuple[str, OptionValue], ...]
# A serving mode's parameters, sorted by name (``SERVING_PARAMS``): ("prefill_chunk", 128), ("accept", 2), ….
Serving = tuple[tuple[str, int], ...]
# What a decoder keeps between tokens may be stored narrower than it computes (issue 52), as an engine stores it:
# ``kv_dtype`` an attention cache (torch's dtype names; int8 with a scale per layer and key/value head, float8 as
# vLLM's fp8 cache at its default scale of 1), ``state_dtype`` a recurrent state. Either is crossed like a grid axis
# for the stateful modes, and only into a model it applies to (``Family.kept_keys``); absent, the case's own.
KV_DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8")
STATE_DTYPES: tuple[str, ...] = ("float32", "bfloat16", "float16")
# ``page_tokens`` how a KV cache is laid out: contiguous (0) or in pages of that many positions (vLLM's block_size,
# 16 by default); ``hybrid_pages`` a hybrid's: attention pages and state slots in pools of their own (separate) or one
# page size aligned to the largest state (aligned: vLLM's hybrid allocator). Crossed as the dtypes are, kept as text.
PAGE_TOKENS: tuple[int, ...] = (0, *(2**i for i in range(13)))
HYBRID_PAGES: tuple[str, ...] = ("separate", "aligned")
KEPT_DTYPES: dict[str, tuple[str, ...]] = {
    "kv_dtype": KV_DTYPES,
    "state_dtype": STATE_DTYPES,
    "page_tokens": tuple(map(str, PAGE_TOKENS)),
    "hybrid_pages": HYBRID_PAGES,
}
# Bytes of one element of each dtype a case computes or keeps in.
DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int8": 1,
}
# The dtypes torch holds on each device type a case may run on (float8 storage and its casts run on any CPU or CUDA
# device since torch 2.1; only its matmuls need sm_89, and a kept cache is converted before it is computed with).
HOLDABLE: dict[str, frozenset[str]] = {
    "cpu": frozenset(DTYPE_BYTES),
    "cuda": frozenset(DTYPE_BYTES),
}
# What a case keeps in: (("kv_dtype", "int8"),), sorted by name, only the keys set to other than the default.
Kept = tuple[tuple[str, str], ...]


def serving_text(key: str, value: int) -> str:
    """A serving key's value for a person: a memory budget in binary units without a space, as a config writes it
    (``memory_budget=1GiB``, not 1073741824); the others are counts."""
    if key == "memory_budget" and value > 0:
        return format_bytes(value).replace(" ", "")
    return str(value)


def packing_text(lengths: tuple[int, ...]) -> str:
    """Packed lengths as keys and labels write them: ``64+512+96+33``."""
    return "+".join(str(n) for n in lengths)


def option_text(name: str, value: OptionValue) -> str:
    """``name=value`` as keys and labels write it: booleans lower-case, like YAML."""
    return f"{name}={str(value).lower() if isinstance(value, bool) else value}"


# A pattern entry naming several members joined by this runs them side by side in one block (Falcon-H1).
PARALLEL = "+"


@dataclass(frozen=True)
class Definition:
    """A model its case defines itself (one a user brings, a hybrid stack), as its family wrote it down: the key a
    stored case keeps it under (``"user"``, ``"hybrid"``) and its content, JSON in the order the family wrote it.

    Opaque here on purpose: core knows no model, so only the family whose key it is reads it
    (``families.catalogue.family_of``); it travels in the case so that a stored row says what its model was without
    the config or the user's code, and reads back byte for byte."""

    key: str
    text: str

    @classmethod
    def of(cls, key: str, data: Mapping[str, Any]) -> Definition:
        """``data`` (JSON-shaped: mappings, lists, scalars) under ``key``, frozen as it is, its keys' order kept."""
        return cls(key, json.dumps(data, separators=(",", ":")))

    @property
    def data(self) -> Any:
        """The content, a fresh copy each time (the case stays frozen whatever the caller does with it)."""
        return json.loads(self.text)


@dataclass(frozen=True)
class Case:
    """One measured configuration. All models map (batch, seq_len, d_model) to the same shape.

    ``options`` holds the model options the case sets, sorted, and only those: an option left at its default is
    not in it (nor in the key). ``heads`` is ``None`` for models without heads (LSTM, GRU, min-RNNs); linear
    attention has them. ``causal`` says whether position t sees only ≤ t: a flag for attention, and a property of
    the architecture for a recurrent model (unidirectional ⇒ causal), so that a ``causal: [true, false]`` grid does
    not time the same LSTM twice.

    ``definition`` is set for a model the case defines itself (``Definition``: a config's ``factory:`` entry or an
    installed plugin, a hybrid stack), so a stored row says what it was without the config or the user's code; its
    family alone reads it. It is not in the key: such a model's name is its identity, as a built-in's is.

    ``mode == "decode"``: ``seq_len`` is the context length n already held in the KV cache or recurrent state,
    and one call produces one new token per sequence (position n); such a case is always causal.

    The serving modes (``STATEFUL_MODES`` but decode) carry their parameters in ``serving`` (``SERVING_PARAMS``):
    ``capacity`` (a decode step at context n, at the largest batch that fits ``memory_budget`` bytes: the batch is
    found, so the case's own ``batch`` is 1), ``prefill`` (the n prompt tokens in chunks of ``prefill_chunk``, 0 for
    one pass), ``verify`` (``draft`` tokens after n, rolled back to the ``accept`` first of them), ``prefix``
    (``requests`` prompts of n tokens sharing their first ``prefix_tokens``, a recurrent state checkpointed every
    ``checkpoint_every``; one row for all of them, so the case's own ``batch`` is 1). ``packing`` holds
    the lengths of the sequences a forward or train call runs packed end to end (then ``batch`` is how many and
    ``seq_len`` the longest). Both are written to a row and appended to the key only when set, so every other case
    reads and keys as it always did.
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
    definition: Definition | None = None
    serving: Serving = ()
    packing: tuple[int, ...] = ()
    kept: Kept = ()

    @property
    def tokens(self) -> int:
        """Tokens one call produces: batch × seq_len; one per sequence for decode and capacity (whose batch found
        is the row's: ``Result.tokens_per_call``); the draft tokens for verify; every request's prompt for prefix;
        the packed lengths' sum."""
        if self.packing:
            return sum(self.packing)
        if self.mode == "prefix":
            return self.param("requests") * self.seq_len
        if self.mode in ("decode", "capacity"):
            return self.batch
        if self.mode == "verify":
            return self.batch * self.param("draft")
        return self.batch * self.seq_len

    @property
    def span(self) -> int:
        """Positions one sequence covers: seq_len, and for decode the new token after the context too (n + 1), for
        verify the draft tokens after it (n + k)."""
        if self.mode in ("decode", "capacity"):
            return self.seq_len + 1
        if self.mode == "verify":
            return self.seq_len + self.param("draft")
        return self.seq_len

    def kept_dtype(self, name: str) -> str | None:
        """The dtype the case keeps its KV cache (``kv_dtype``) or recurrent state (``state_dtype``) in, or None
        where it keeps the default (the case's own; a family may keep a state wider)."""
        return next((value for key, value in self.kept if key == name), None)

    @property
    def page_tokens(self) -> int:
        """Positions per page of the case's KV cache (``page_tokens``), 0 where it is contiguous."""
        return int(self.kept_dtype("page_tokens") or 0)

    def param(self, name: str) -> int:
        """The serving parameter ``name`` the case carries (``SERVING_PARAMS``), 0 where it carries none."""
        return next((value for key, value in self.serving if key == name), 0)

    @property
    def head_dim(self) -> int | None:
        return None if self.heads is None else self.d_model // self.heads

    def given(self, name: str) -> OptionValue | None:
        """The value the case sets for model option ``name``, or None where it leaves the option at its default
        (which only the model's family knows: ``families.catalogue.option_of``)."""
        return next((value for key, value in self.options if key == name), None)

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
        # Only when set: every case without them keys as it always did.
        parts += [f"{k}={v}" for k, v in self.serving]
        if self.packing:
            parts.append(f"packing={packing_text(self.packing)}")
        parts += [f"{k}={v}" for k, v in self.kept]
        return "|".join(parts)

    @property
    def label(self) -> str:
        """Short human label for progress lines."""
        extra = "" if self.heads is None else f" h={self.heads}" + (" causal" if self.causal else "")
        # Options tell variants apart (scope, positional, preset…): without them two rows would read the same.
        extra += "".join(f" {option_text(k, v)}" for k, v in self.options)
        extra += "".join(f" {k}={serving_text(k, v)}" for k, v in self.serving)
        extra += f" packing={packing_text(self.packing)}" if self.packing else ""
        extra += "".join(f" {k}={v}" for k, v in self.kept)
        return f"{self.model} {self.mode} {self.dtype} b={self.batch} n={self.seq_len} d={self.d_model}{extra}"

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {}
        for name, value in asdict(self).items():
            if name != "definition":
                data[name] = value
            elif self.definition is not None:  # under its own key, where it always stood; a built-in has none
                data[self.definition.key] = self.definition.data
        data["options"] = {k: v for k, v in self.options}
        if self.serving:  # likewise for a serving mode's parameters and packed lengths
            data["serving"] = dict(self.serving)
        else:
            del data["serving"]
        if self.packing:
            data["packing"] = list(self.packing)
        else:
            del data["packing"]
        if self.kept:  # likewise for the dtypes a state is kept in
            data["kept"] = dict(self.kept)
        else:
            del data["kept"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> Case:
        raw = dict(data)
        options = raw.pop("options", {}) or {}
        assert isinstance(options, Mapping)
        # Any key that is no field is a definition's (at most one, a mapping), kept as it was stored.
        definition = None
        for key in [key for key in raw if key not in cls.__dataclass_fields__]:
            value = raw.pop(key)
            if definition is not None or not isinstance(value, Mapping):
                raise ValueError(f"a case defines its model once, as a mapping; got {key!r} too")
            definition = Definition.of(key, value)
        serving = raw.pop("serving", {}) or {}
        assert isinstance(serving, Mapping)
        packing = raw.pop("packing", []) or []
        assert isinstance(packing, list | tuple)
        kept = raw.pop("kept", {}) or {}
        assert isinstance(kept, Mapping)
        return cls(
            options=tuple(sorted(options.items())),
            definition=definition,
            serving=tuple(sorted((str(k), int(v)) for k, v in serving.items())),
            packing=tuple(int(n) for n in packing),
            kept=tuple(sorted((str(k), str(v)) for k, v in kept.items())),
            **raw,  # type: ignore[arg-type]
        )


CacheState = Literal["warm", "cold"]
FlushKind = Literal["zero", "read"]  # how a GPU's cold flush evicts L2 (TimingPolicy.flush)
# The cache state each mode is timed in unless the config says (``cache``). A decode step's state and weights at the
# sizes a sweep decodes fit in a last-level cache (an H200's L2 is 50 MB; flashinfer#4468, TileGym#118), so timed
# back to back a warm step reads them faster than memory allows, which no decoder serving other layers and requests
# sees: decode is timed cold. A whole sequence's activations outgrow the cache at the lengths that matter, and the
# field times them warm (torch.utils.benchmark, the FlashAttention benchmarks): warm.
# The serving questions follow the call they time: a capacity row's decode step and a verify's few tokens read a
# state that would stay in cache, so they run cold like decode; a prefill (a prefix's too) works through a prompt,
# like forward.
DEFAULT_CACHE: dict[str, CacheState] = {
    "forward": "warm",
    "train": "warm",
    "backward": "warm",
    "decode": "cold",
    "capacity": "cold",
    "prefill": "warm",
    "verify": "cold",
    "prefix": "warm",
}


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
    # Rounds over cases (``sweeps.rounds``): the sweep visits every case this many times, each visit with its share
    # of the budget, and merges a case's blocks into its row, so that contention lands on all cases alike.
    rounds: int = 1
    # cold: flush the last-level cache before each timed call, outside the timed region (a GPU's L2: 4× its size,
    # ≥ 256 MiB, waited for; a CPU's LLC: a read and write of twice its size), so a call finds its weights and state
    # in memory; warm: no flush. None: each mode's default (``DEFAULT_CACHE``).
    cache: CacheState | None = None
    # GPU only: replay forward passes from a captured CUDA graph, which removes per-kernel launch cost.
    cuda_graph: bool = False
    # GPU only, cache cold: how the flush evicts L2, overwriting its buffer (zero: triton's do_bench) or reading it
    # (read: no dirty lines left to write back during the timed call). ``timing.gpu_timing.DeviceFlush``.
    flush: FlushKind = "zero"
    # Before the first case of each process: this long of a mixed, parallel workload (``measure.process_warmup``),
    # so the first case does not pay for the thread pool's start, the autograd engine's, clock ramp-up and
    # first-use initialisation that every later case finds done. 0 = none.
    process_warmup_s: float = 0.5

    def cache_for(self, mode: str) -> CacheState:
        """The cache state ``mode``'s calls are timed in: the policy's, else the mode's default."""
        return self.cache if self.cache is not None else DEFAULT_CACHE[mode]

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        # Written only when there is one, so a run from before the warm-up existed reads back as it was stored
        # (results.records reads a missing key as 0: those runs had none).
        if not self.process_warmup_s:
            del data["process_warmup_s"]
        if self.flush == "zero":  # likewise: every run from before the read flush zeroed, and reads back unchanged
            del data["flush"]
        if self.rounds == 1:  # likewise: every run from before rounds visited each case once
            del data["rounds"]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> TimingPolicy:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})  # type: ignore[arg-type]


# How much hardware telemetry a case records: none, NVML/psutil basics, or those plus GPM metrics (Hopper and newer).
Level = Literal["off", "basic", "full"]
LEVELS: tuple[Level, ...] = ("off", "basic", "full")


def default_interval_s(device: str) -> float:
    """The sampler's polling interval when the config leaves it null: 100 ms on every device.

    On a CPU the sampler shares the cores it measures (at 20 ms it cost 1.4 %: results/telemetry-overhead-cpu.md).
    On a GPU what changes fast (utilisation, power, clocks) comes from NVML's own sample buffers, read at the
    window's ends; the poll reads only memory in use, temperature and clock-event reasons."""
    return 0.1
