"""The config's schema: pydantic models of every section, with their ranges and descriptions.

The lowest module of ``config`` but ``messages`` and ``checks``: ``options``, ``decoding``, ``users`` and ``experiment``
import it, and it imports none of them. A field's docstring is its description in the JSON Schema
(``attnbench schema``), which editors show on hover.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Discriminator, Field, Tag, create_model

from attnbench.config.messages import ITEM, TAG, Path_
from attnbench.core.cases import (
    MAX_BATCH,
    MAX_D_MODEL,
    MAX_DRAFT,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_PACKED,
    MAX_PATTERN,
    MAX_REQUESTS,
    MAX_SAMPLES,
    MAX_SEQ_LEN,
    MAX_THREADS,
    MAX_TOKENS,
    CacheState,
    FlushKind,
    TimingPolicy,
)
from attnbench.families.catalogue import PRESET_CORE_DEFAULT, option_axes

MAX_NAME_LEN = 64
NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
# The sections of a config whose cases a sweep runs, in the order it runs them unless ``order`` says otherwise.
SECTION_ORDER: tuple[str, ...] = ("grid", "decode", "presets")


def as_list(value: Any) -> Any:
    """A scalar where a list is allowed means a one-element list."""
    return value if isinstance(value, list) else [value]


def preset_names(value: Any) -> Any:
    """``presets: [bert-base, lstm-110m]`` (or one name) means ``presets: {names: [...]}``."""
    return {"names": value} if isinstance(value, list | str) else value


def yaml_on_off(value: Any) -> Any:
    """YAML 1.1 reads a bare ``on`` as true and ``off`` as false: ``check: off`` means the word."""
    return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


def yaml_off(value: Any) -> Any:
    """YAML 1.1 reads a bare ``off`` as false: ``telemetry: off`` means the word."""
    return "off" if value is False else value


Names = Annotated[list[str], BeforeValidator(as_list), Field(min_length=1)]
Flags = Annotated[list[bool], BeforeValidator(as_list), Field(min_length=1)]
Batches = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_BATCH)]],
    BeforeValidator(as_list),
    Field(min_length=1),
]
SeqLens = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)]],
    BeforeValidator(as_list),
    Field(min_length=1),
]
DModels = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_D_MODEL)]],
    BeforeValidator(as_list),
    Field(min_length=1),
]
HeadCounts = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_HEADS)]],
    BeforeValidator(as_list),
    Field(min_length=1),
]
LayerCounts = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_LAYERS)]],
    BeforeValidator(as_list),
    Field(min_length=1),
]
Seconds = Annotated[float, Field(gt=0)]
_POLICY = TimingPolicy()
# The serving questions' keys (issue 41): each one value or a list, crossed like a grid axis.
Chunks = Annotated[list[Annotated[int, Field(ge=0, le=MAX_SEQ_LEN)]], BeforeValidator(as_list), Field(min_length=1)]
KvDtypes = Annotated[
    list[Literal["float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8"]],
    BeforeValidator(as_list),
    Field(min_length=1),
]
PageTokens = Annotated[
    list[Literal[0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096]],
    BeforeValidator(as_list),
    Field(min_length=1),
]
HybridPages = Annotated[list[Literal["separate", "aligned"]], BeforeValidator(as_list), Field(min_length=1)]
StateDtypes = Annotated[list[Literal["float32", "bfloat16", "float16"]], BeforeValidator(as_list), Field(min_length=1)]
Drafts = Annotated[list[Annotated[int, Field(gt=0, le=MAX_DRAFT)]], BeforeValidator(as_list), Field(min_length=1)]
Accepts = Annotated[list[Annotated[int, Field(ge=0, le=MAX_DRAFT)]], BeforeValidator(as_list), Field(min_length=1)]
PrefixLengths = Annotated[
    list[Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)]], BeforeValidator(as_list), Field(min_length=1)
]
Requests = Annotated[list[Annotated[int, Field(gt=0, le=MAX_REQUESTS)]], BeforeValidator(as_list), Field(min_length=1)]
Lengths = Annotated[list[Annotated[int, Field(gt=0, le=MAX_SEQ_LEN)]], Field(min_length=1, max_length=MAX_PACKED)]
# The most tokens a drawn packing may hold: MAX_PACKED sequences of a long context each.
MAX_PACKED_TOKENS = 2**24


class _Strict(BaseModel):
    # strict: no "128" → 128, no true → 1, no 1.5 → 1; an int is still accepted where a float is asked for.
    # The docstring under each field is its description in the JSON Schema (`attnbench schema`), which editors
    # show on hover: say what the key does and what it takes, in one or two sentences.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, use_attribute_docstrings=True)


class _Grid(_Strict):
    """The axes crossed into cases: every combination is one case."""

    batch: Batches | None = None
    """Sequences per call; each value is crossed with every seq_len. Give batch or tokens."""
    tokens: Annotated[int, Field(gt=0, le=MAX_TOKENS)] | None = None
    """Tokens per call instead of batch: batch = tokens // seq_len, so every case moves the same number."""
    seq_len: SeqLens
    """Tokens per sequence: the axis the comparison is about."""
    d_model: DModels | None = None
    """Model width: the RNN hidden size, the attention embedding size (here or at the top level)."""
    heads: HeadCounts | None = None
    """Attention heads, each must divide d_model; ignored by recurrent models (here or at the top level)."""
    layers: LayerCounts | None = None
    """Stacked layers (or blocks) of each model (here or at the top level)."""
    causal: Flags | None = None
    """Causal attention mask (true) or full attention (false); a unidirectional RNN is causal by construction."""


def _option_axis_fields(elsewhere: str) -> dict[str, Any]:
    """A field for each option a grid axis may set (``catalogue.option_axes``: heads_kv), typed and bounded as the
    option is, here or ``elsewhere`` (not both)."""
    made: dict[str, Any] = {}
    for name, option in option_axes().items():
        item: Any = option.type
        if option.choices is not None:
            item = Literal[option.choices]
        elif option.type is int:
            item = Annotated[int, Field(ge=option.minimum, le=option.maximum)]
        values = Annotated[list[item], BeforeValidator(as_list), Field(min_length=1)]
        help_text = (
            f"A grid axis that sets the model option {name} for every model that has it, here or {elsewhere} (not "
            f"both); left out = each model's default. {name}: {option.help}."
        )
        made[name] = (values | None, Field(default=None, description=help_text))
    return made


# Subclasses with a field per option axis, made at import (the families say which options are axes); to a type
# checker they are the classes above.
if TYPE_CHECKING:
    GridModel = _Grid
else:
    GridModel = create_model(
        "GridModel", __base__=_Grid, __doc__=_Grid.__doc__, **_option_axis_fields("at the top level")
    )


class PresetsModel(_Strict):
    """Fixed-size models (``catalogue.PRESETS``) cased beside the grid; batch and seq_len default to the grid's."""

    names: Names
    """Presets to run: bert-base, lstm-110m, mingru-110m, and published models' token mixers (llama3.1-8b, …)."""
    core: Names = Field(default_factory=lambda: list(PRESET_CORE_DEFAULT))
    """The attention model(s) an attention preset (bert-base) or a published model's attention layers are built on."""
    scope: Literal["core", "block", "model"] | None = None
    """A published model's scope: core (each of its mixers, one layer), block (each mixer's pre-norm block) or model
    (the whole stack at the published layer count); null = core. bert-base, lstm-110m and mingru-110m are models."""
    modes: Names | None = None
    """The presets' modes; null = the config's modes."""
    batch: Batches | None = None
    """The presets' batch sizes; null = the grid's."""
    seq_len: SeqLens | None = None
    """The presets' sequence lengths; null = the grid's."""


class LognormalModel(_Strict):
    """Sequence lengths drawn from a log-normal distribution, rounded to whole tokens (at least 1)."""

    mean: Annotated[float, Field(gt=0, le=MAX_SEQ_LEN)]
    """The lengths' mean, in tokens (of the lengths themselves, not of their logarithm)."""
    sigma: Annotated[float, Field(ge=0, le=4)]
    """The spread: the standard deviation of the lengths' natural logarithm (0 = every length the mean)."""


class PackingModel(_Strict):
    """Packed lengths drawn until a token budget is filled: the last length is cut so that they sum to it."""

    lognormal: LognormalModel
    """The distribution the lengths are drawn from: {mean: …, sigma: …}."""
    tokens: Annotated[int, Field(gt=0, le=MAX_PACKED_TOKENS)]
    """The tokens the packed sequences hold together."""
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    """Seeds the draw, so every run packs the same lengths."""


def _packing_tag(value: Any) -> str:
    return f"{TAG}draw" if isinstance(value, dict | PackingModel) else f"{TAG}lengths"


Packing = Annotated[
    Annotated[Lengths, Tag(f"{TAG}lengths")] | Annotated[PackingModel, Tag(f"{TAG}draw")],
    Discriminator(_packing_tag),
]


class DecodeModel(_Strict):
    """Decode cases beside the grid, at their own context lengths; each key left out is the grid's (models: the
    config's). Always causal: a decode step sees the tokens before it only."""

    models: Names | None = None
    """Models that decode (the config's models when left out); attention decodes causally."""
    seq_len: SeqLens | None = None
    """Context lengths n: the KV cache or recurrent state holds n tokens when the next one is timed."""
    batch: Batches | None = None
    """Sequences decoded side by side (the grid's batch when left out)."""


class TimingModel(_Strict):
    """``TimingPolicy``'s fields with their ranges; the defaults are the policy's own (a test holds them)."""

    target_ci: Annotated[float, Field(gt=0, lt=1)] = _POLICY.target_ci
    """Stop sampling once the 95 % CI of the median is within ± this fraction of it (0.01 = ±1 %)."""
    min_samples: Annotated[int, Field(ge=3, le=MAX_SAMPLES)] = _POLICY.min_samples
    """Never stop with fewer samples than this."""
    max_samples: Annotated[int, Field(ge=3, le=MAX_SAMPLES)] = _POLICY.max_samples
    """Never take more samples than this."""
    min_time_s: Seconds = _POLICY.min_time_s
    """Sample for at least this many seconds."""
    max_case_s: Seconds = _POLICY.max_case_s
    """The whole budget of a case in seconds, warm-up included; a case that runs out says converged: false."""
    warmup_min_calls: Annotated[int, Field(ge=1, le=MAX_SAMPLES)] = _POLICY.warmup_min_calls
    """Untimed calls first: the last this many must agree (warmup_settle) before timing starts."""
    warmup_max_s: Seconds = _POLICY.warmup_max_s
    """The longest warm-up in seconds before timing starts anyway."""
    warmup_settle: Annotated[float, Field(gt=0, lt=1)] = _POLICY.warmup_settle
    """Warm-up calls within this fraction of their median count as settled."""
    min_sample_s: Seconds = _POLICY.min_sample_s
    """A sample shorter than this many seconds is built from several calls, so clock resolution vanishes."""
    warmup_audit: Annotated[int, Field(ge=0, le=1000)] = _POLICY.warmup_audit
    """The first this many timed samples must agree with the later ones, else they join the warm-up; 0 = off."""
    warmup_agree: Annotated[float, Field(gt=0, lt=1)] = _POLICY.warmup_agree
    """How closely (a fraction) the audited samples' median must agree with the later samples'."""
    processes: Annotated[int, Field(ge=1, le=50)] = _POLICY.processes
    """Run every case in this many fresh worker processes; the spread of their medians widens the CI."""
    rounds: Annotated[int, Field(ge=1, le=50)] = _POLICY.rounds
    """Visit every case this many times across the sweep, each visit with its share of max_case_s, and merge the
    visits into its row (their medians widen the CI): contention then lands on all cases alike. 1 = once."""
    cache: CacheState | None = _POLICY.cache
    """The same as the top-level cache (give one of the two): cold flushes the last-level cache before every timed
    call, warm does not; null = each mode's default."""
    cuda_graph: bool = _POLICY.cuda_graph
    """GPU only: replay forward passes from a captured CUDA graph, which removes per-kernel launch cost."""
    flush: FlushKind = _POLICY.flush
    """GPU only, cache cold: zero overwrites the flush buffer (triton's do_bench), read reduces it without writing,
    so no dirty lines are written back during the timed call."""
    process_warmup_s: Annotated[float, Field(ge=0, le=60)] = _POLICY.process_warmup_s
    """Before the first case of each process, this many seconds of a mixed parallel workload, so the first case does
    not pay for thread pools, clock ramp-up and first-use initialisation; 0 = none."""


class UserModelEntry(_Strict):
    """A model you bring: ``factory`` is called with the case (an ``attnbench.plugin.ModelRequest``) and returns a
    ``torch.nn.Module`` mapping (batch, seq_len, d_model) to the same shape. Sweeping it imports and runs your code."""

    name: str
    """The model's name in rows, tables and plots: lower-case letters, digits, '.', '_' and '-', not a built-in
    model's name."""
    factory: str
    """The function that builds it, as module.path:function (importable from where attnbench runs)."""
    kind: Literal["recurrent", "attention"]
    """Which side of the comparison it joins: recurrent (a recurrence: causal, decodes from a fixed-size state) or
    attention."""
    options: dict[str, Any] = Field(default_factory=dict)
    """Its own options, passed to the factory and recorded in every row's key; a list of values crosses them."""


class HybridEntry(_Strict):
    """A hybrid stack: pre-norm blocks of built-in models, cycling through ``hybrid`` for the case's ``layers``
    (Jamba, Qwen3-Next: three recurrent blocks to one of attention)."""

    name: str
    """The stack's name in rows, tables and plots: lower-case letters, digits, '.', '_' and '-', not a built-in
    model's name."""
    hybrid: Annotated[list[str], Field(min_length=1, max_length=MAX_PATTERN)]
    """The built-in models its blocks cycle through, e.g. [gated-deltanet, gated-deltanet, gated-deltanet,
    sdpa-flash]; layers must be at least this long."""
    kind: Literal["hybrid", "recurrent", "attention"] = "hybrid"
    """Which side of the comparison it joins: a side of its own (hybrid), or the one named."""


def _model_tag(value: Any) -> str:
    if isinstance(value, HybridEntry) or (isinstance(value, dict) and "hybrid" in value):
        return f"{TAG}hybrid"
    return f"{TAG}entry" if isinstance(value, dict | UserModelEntry) else f"{TAG}name"


ModelEntry = Annotated[
    Annotated[str, Tag(f"{TAG}name")]
    | Annotated[UserModelEntry, Tag(f"{TAG}entry")]
    | Annotated[HybridEntry, Tag(f"{TAG}hybrid")],
    Discriminator(_model_tag),
]
ModelEntries = Annotated[list[ModelEntry], BeforeValidator(as_list), Field(min_length=1)]


class _Config(_Strict):
    """An attnbench experiment: which models to time, on which grid, how carefully."""

    name: str
    """Names the experiment and its run folders (results/runs/<time>-<name>-<device>/): lower-case letters,
    digits, '.', '_' and '-'."""
    description: str = ""
    """Free text, kept in run.json."""
    device: str = "auto"
    """auto (CUDA when torch can use it, else the CPU), cpu, cuda or cuda:N; --device overrides it."""
    models: ModelEntries
    """The models to time: a built-in's or an installed plugin's name (`attnbench models` lists them and says which
    run here), {name, factory, kind, options} for a model you bring, or {name, hybrid: [models…]} for a hybrid
    stack of built-ins."""
    model_options: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Options per model, e.g. {sdpa: {scope: block}}; a list of values crosses them, each a variant of its own."""
    modes: Names = Field(default_factory=lambda: ["forward", "train"])
    """forward (under inference_mode), train (forward + backward), backward (the backward pass alone) and decode
    (one new token after a context of seq_len: a KV cache or a recurrent state filled outside the timing)."""
    dtype: Names = Field(default_factory=lambda: ["float32"])
    """Floating-point types to time."""
    grid: GridModel
    """The axes crossed into cases: batch (or tokens) and seq_len, and optionally d_model, heads, layers, causal."""
    presets: Annotated[PresetsModel | None, BeforeValidator(preset_names)] = None
    """Published-size models (bert-base, lstm-110m, mingru-110m) beside the grid, at their own batch and seq_len;
    a bare list of names is short for {names: [...]}."""
    decode: DecodeModel | None = None
    """Decode cases (one new token after a context of seq_len) with lengths, batches and models of their own."""
    order: Annotated[list[Literal["grid", "decode", "presets"]], BeforeValidator(as_list)] | None = None
    """Which sections' cases run first: e.g. [decode, presets, grid] when a time limit might cut the sweep short and
    those matter most; sections left out follow in the default order (grid, decode, presets)."""
    d_model: DModels | None = None
    """Model width: the RNN hidden size, the attention embedding size (here or under grid)."""
    heads: HeadCounts | None = None
    """Attention heads, each must divide d_model; ignored by recurrent models (here or under grid)."""
    layers: LayerCounts | None = None
    """Stacked layers (or blocks) of each model (here or under grid)."""
    causal: Flags | None = None
    """Causal attention mask (true) or full attention (false); a unidirectional RNN is causal by construction."""
    threads: Annotated[int, Field(gt=0, le=MAX_THREADS)] | None = None
    """torch CPU threads; null = on a CPU every CPU the process may use but one (left to the harness and the OS:
    a thread on every vCPU made fresh processes disagree by up to 2×), on a GPU torch's default."""
    cache: CacheState | None = None
    """cold: flush the last-level cache (a GPU's L2, a CPU's L3) before every timed call, outside the timed region,
    so each call reads its weights and state from memory; warm: back-to-back calls find them cached. null = each
    mode's default: decode cold (a small model's step state fits in an H200's 50 MB L2 and would read faster than
    memory allows), forward, train and backward warm. sweep --cache sets it."""
    seed: Annotated[int, Field(ge=0, lt=2**63)] = 0
    """Seeds inputs and weights, so reruns time the same numbers."""
    timing: TimingModel = Field(default_factory=TimingModel)
    """How carefully each case is timed (seconds throughout)."""
    isolate: bool | None = None
    """Each case in a worker process, so a segfault, a hang or a poisoned CUDA context costs one row, not the
    sweep; null = on for CUDA devices (where those failures happen), off on a CPU."""
    case_timeout_s: Seconds | None = None
    """A case still running after this many seconds is killed and recorded as timeout (with isolation);
    null = 60 s + 10 × timing.max_case_s."""
    skip_larger_after_oom: bool = True
    """Once a model runs out of memory at some seq_len, record its longer lengths as oom without running them."""
    check: Annotated[Literal["on", "off"], BeforeValidator(yaml_on_off)] = "on"
    """on: before a case is timed, run its path once on a small input and hold its output (and a decode state) to
    its family's reference in float64; a case off it by more than its dtype's tolerance is an incorrect row, never
    timed. off: time without checking (sweep --no-check)."""
    telemetry: Annotated[Literal["off", "basic", "full"], BeforeValidator(yaml_off)] = "basic"
    """Hardware telemetry around each case's timed window: off; basic (NVML utilisation, memory, power and clocks
    on a GPU, psutil CPU use); full (basic + NVML GPM counters on Hopper and newer)."""
    telemetry_interval_s: Annotated[float, Field(ge=0.001, le=10.0)] | None = None
    """The sampler's polling interval in seconds; null = 100 ms: on a CPU the sampler shares the cores being
    measured (at 20 ms it cost 1.4 %: results/telemetry-overhead-cpu.md); on a GPU utilisation, power and clocks
    come from NVML's own sample buffers, so the poll reads only memory in use, temperature and clock reasons."""
    memory_budget: Annotated[int, Field(gt=0)] | str | None = None
    """mode capacity: the memory a model's decode step must fit (weights, the state of every sequence, the step's
    working memory), e.g. 4GiB, 512MiB or bytes; left out, a GPU's free memory less max(1 GiB, 5 % of it). A CPU
    needs one."""
    prefill_chunk: Chunks | None = None
    """mode prefill: tokens per chunk the prompt is fed in (0 = the whole prompt at once; the default); a list crosses
    them."""
    kv_dtype: KvDtypes | None = None
    """every stateful mode (decode, capacity, prefill, verify, prefix): the dtype an attention cache is stored in,
    converted to the case's dtype to compute (float32, float16, bfloat16, float8_e4m3fn, float8_e5m2, or int8 with a
    scale per layer and key/value head); left out, the case's own. A list crosses them, into the models that keep a
    KV cache only."""
    state_dtype: StateDtypes | None = None
    """every stateful mode: the dtype a recurrent state is stored in between tokens, converted to what
    its layer computes in (float32, bfloat16, float16); left out, the family's own. A list crosses them, into the
    models that keep a recurrent state only."""
    page_tokens: PageTokens | None = None
    """every stateful mode: positions per page of an attention cache (vLLM's block_size; 16 is its
    default), a power of two up to 4096: the cache grows in whole pages and a step reads it through a page table;
    0 (the default) keeps it contiguous. A list crosses them, into the models that keep a KV cache only."""
    hybrid_pages: HybridPages | None = None
    """every stateful mode: a hybrid's layout: separate (the default) keeps attention pages and
    recurrent states in pools of their own; aligned makes one page size fit both, as vLLM's hybrid allocator does
    (attention pages grown to a multiple of 16 positions that holds the largest state, every state padded to a
    page). A list crosses them, into the hybrids that keep a KV cache and a recurrent state only."""
    draft: Drafts | None = None
    """mode verify: draft tokens k one call checks after the context; a list crosses them."""
    accept: Accepts | None = None
    """mode verify: how many of the drafts are kept (r ≤ k), the state rolled back to the context and those; a list
    crosses them (pairs with r > k are left out)."""
    prefix_tokens: PrefixLengths | None = None
    """mode prefix: tokens P that every request's prompt of seq_len begins with, shared (P < every seq_len); a list
    crosses them."""
    requests: Requests | None = None
    """mode prefix: requests M that share the prefix and differ after it, all prefilled to their first token; a list
    crosses them."""
    checkpoint_every: Chunks | None = None
    """mode prefix: a recurrent state is checkpointed every this many prefix tokens and a request restores the last
    checkpoint at or before P (each checkpoint holds a state's bytes); 0 (the default) keeps none, so a recurrent
    model recomputes the prefix for every request. A list crosses them."""
    packing: Packing | None = None
    """forward and train: sequences of these lengths packed end to end stand in for the grid's batch × seq_len, e.g.
    [64, 512, 96, 33], or lengths drawn, {lognormal: {mean: …, sigma: …}, tokens: 4096, seed: 0}."""


if TYPE_CHECKING:
    ConfigModel = _Config
else:
    ConfigModel = create_model(
        "ConfigModel", __base__=_Config, __doc__=_Config.__doc__, **_option_axis_fields("under grid")
    )

SECTIONS: dict[Path_, type[BaseModel]] = {
    (): ConfigModel,
    ("grid",): GridModel,
    ("timing",): TimingModel,
    ("presets",): PresetsModel,
    ("decode",): DecodeModel,
    ("packing", f"{TAG}draw"): PackingModel,
    ("packing", "lognormal"): LognormalModel,
    ("models", ITEM): UserModelEntry,
    ("models", ITEM, f"{TAG}hybrid"): HybridEntry,
}
