"""The values a run folder stores: ``Result`` (one case's row), ``Memory`` and ``Run`` (everything but the rows),
with their one serialisation. Torch-free.

Schema history (``SCHEMA_VERSION``):
  1 — first version: run.json (``Run``) + results.jsonl (one ``Result`` per line).
      Keys added since, all optional and absent when empty, so older files read back unchanged: run.json
      ``calibration``, ``code`` (the benchmarked checkout), ``label``, ``shard`` ({index, count}: the slice
      ``sweep --shard i/N`` measured; ``config_sha256`` stays the full config's) and ``merged_from`` (the
      ``Source`` runs ``attnbench merge`` joined into this one); measurement ``warmup_moved``,
      ``replicate_medians_s``, ``injected_delay_s``; row ``contention`` (``results.contention``: whether other work
      competed for the machine while the case was timed, with the evidence) and run.json ``contended_cases`` (how
      many rows say so, counted as they are appended); the status ``too_slow_for_budget`` (and measurement
      ``stop_reason`` of the same name). A reader older than a key refuses a file that carries it
      (unknown keys are errors), with the hint to upgrade.
      Mode ``decode`` (issue 13) is a value a case may hold since; a reader from before refuses such a row.
      ``extra`` is open-ended (scalars by name); decode rows carry ``state_bytes`` (the KV cache or
      recurrent state, computed), ``state_mem_bytes`` and ``state_mem_method`` (the same, measured) and
      ``prefill_s`` (the set-up's prefill, untimed).
      Issue 14: models ``linear-attn`` and ``flex`` and options ``heads_kv``, ``window``, ``compile``, ``form``,
      ``chunk``, ``feature``, ``decay``, ``kernel`` (a reader from before refuses them as unknown); ``extra`` may carry
      ``gqa_path`` (how a core read fewer K/V heads), ``compile_s`` (torch.compile's first call, untimed) and
      ``recompiles`` (graphs dynamo compiled during the timing: nonzero means the timing saw a recompilation).
      Issue 26: a case may carry ``user`` ({factory, kind, source}: a model the user brought, whose name is then
      any config model name and whose options are its own); model ``mamba2``; ``flops_formula`` ``counted-v1``
      (FLOPs counted by torch's FlopCounterMode over one call). ``extra``'s keys are declared with their types in
      ``results.extras``: a declared key of the wrong type is refused, an undeclared one kept as stored.
      Issue 41: modes ``capacity``, ``prefill`` and ``verify``; a case may carry ``serving`` ({name: integer}: the
      mode's parameters, ``core.cases.SERVING_PARAMS``) and ``packing`` (the packed lengths of a forward or train
      case); ``extra`` may carry ``capacity_batch``, ``bytes_per_sequence``, ``memory_budget_bytes``,
      ``weight_bytes``, ``capacity_method``, ``capacity_capped``, ``prefill_chunks``, ``verify_s``, ``rollback_s``,
      ``rollback_method``, ``padded_s`` and ``padded_tokens_per_s``; later ``capacity_unsettled`` (issue 50: a search
      that did not settle, its batch a lower bound). Every numeric extra is at least 0, ``capacity_batch`` at least 1.
      Issue 48: run.json ``timing.flush`` (written when ``read``; absent: ``zero``, as every earlier run);
      ``extra`` may carry ``capacity_capped_by`` (memory, kernel-grid, search), ``capacity_excluded_bytes`` and
      ``fla_version``.
      Issue 49: a case's ``hybrid`` may carry ``members`` ([{label, model, heads, options}]: a published preset's
      mixers, which its pattern names by label) and a pattern entry ``a+b`` (members side by side in one block);
      options ``head_dim``, ``bias``, ``output_gate``, ``qk_norm`` (attention) and ``heads_v`` (Gated DeltaNet);
      the published presets' names as values of ``preset``.
      Issue 50: row ``check`` (``results.numerics.NumericCheck``: the numerical check against the family's
      reference, with its errors and tolerance) and the status ``incorrect`` (the check failed; never timed).
      Issue 52: a stateful case may carry ``kept`` ({kv_dtype, state_dtype}: the dtypes its KV cache or recurrent
      state was stored in, ``core.cases.KEPT_DTYPES``); ``extra`` may carry ``kept_error_max`` and
      ``kept_error_mean`` (at least 0: the error that costs against the full-precision decode). Later in issue 52,
      ``kept`` may also say ``page_tokens`` (a KV cache's page, ``core.cases.PAGE_TOKENS`` as text) and
      ``hybrid_pages`` (separate or aligned); rows without them are contiguous, separate. Mode ``prefix`` (its
      ``serving``: ``prefix_tokens``, ``requests``, ``checkpoint_every``); ``extra`` may carry ``prefix_reused``,
      ``prefix_checkpoints``, ``independent_s``, ``prefix_held_bytes``, ``independent_held_bytes``,
      ``prefix_bytes_formula``, ``independent_bytes_formula`` and ``prefix_error`` (every one at least 0).
      Issue 51: run.json ``timing.rounds`` (written when above 1; absent: 1, as every earlier run); ``extra`` may
      carry ``rounds`` (the row merges that many rounds, one median each in ``replicate_medians_s``); a run folder
      may hold ``rounds.jsonl`` (``results.store``: the finished rounds of cases without a row yet).
Readers accept every version listed here and refuse newer ones with a hint to upgrade. They trust nothing else
either: every field is checked (``results.fields``) and a bad one is a ``ResultsError`` naming file, line and key.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from attnbench.core.cases import (
    DTYPES,
    KEPT_DTYPES,
    KINDS,
    MAX_BATCH,
    MAX_D_MODEL,
    MAX_DRAFT,
    MAX_HEADS,
    MAX_LAYERS,
    MAX_MEMORY_BUDGET,
    MAX_PACKED,
    MAX_PATTERN,
    MAX_REQUESTS,
    MAX_SEQ_LEN,
    MODES,
    PACKING_MODES,
    PARALLEL,
    RESOLVED_DEVICE,
    SERVING_PARAMS,
    SIDES,
    STATEFUL_MODES,
    Case,
    TimingPolicy,
)
from attnbench.core.shards import MAX_SHARDS, Shard
from attnbench.families.catalogue import HYBRID, MODEL_NAMES, MODELS, cannot_build
from attnbench.families.extras import declared
from attnbench.families.plugins import FACTORY
from attnbench.results import fields
from attnbench.results.calibration import Calibration
from attnbench.results.contention import Contention
from attnbench.results.environment import CodeIdentity
from attnbench.results.fields import FieldError
from attnbench.results.measurement import Measurement
from attnbench.results.numerics import NumericCheck
from attnbench.results.telemetry import TelemetrySummary

SCHEMA_VERSION = 1

# too_slow_for_budget: timing.min_samples samples of the case do not fit in timing.max_case_s. Not a failure of the
# case (exit 0, like unsupported), and never a timing: one or two samples are no evidence (issue 17, item 4).
# incorrect: the numerical check found the case's output off its family's reference (results.numerics); it is never
# timed, since a fast wrong number is worse than none, and it fails a sweep as an error does (exit 1).
Status = Literal["ok", "oom", "unsupported", "error", "timeout", "crashed", "too_slow_for_budget", "incorrect"]

STATUSES: tuple[Status, ...] = (
    *("ok", "oom", "unsupported", "error", "timeout", "crashed", "too_slow_for_budget", "incorrect"),
)

# Statuses that make `sweep` exit 1: the case broke, rather than the hardware saying no.
FAILED: frozenset[str] = frozenset({"error", "timeout", "crashed", "incorrect"})

RunState = Literal["running", "complete", "interrupted"]

RUN_STATES: tuple[RunState, ...] = ("running", "complete", "interrupted")

MEMORY_METHODS: tuple[str, ...] = ("cuda-allocator", "rss-hwm", "unavailable")

Extra = Mapping[str, str | int | float | bool | None]


@dataclass(frozen=True)
class Memory:
    """Peak memory of one call above the post-setup baseline, and how it was measured."""

    peak_bytes: int | None
    method: str  # one of MEMORY_METHODS
    note: str = ""

    @classmethod
    def from_dict(cls, data: object) -> Memory:
        m = fields.record(data, "", ("peak_bytes", "method"), ("note",))
        peak = m["peak_bytes"]
        return cls(
            peak_bytes=None if peak is None else fields.integer(peak, "peak_bytes", minimum=0),
            method=fields.choice(m["method"], "method", MEMORY_METHODS, "memory method"),
            note=fields.text(m.get("note", ""), "note"),
        )


@dataclass(frozen=True)
class Result:
    """One case's outcome. Every non-ok status carries a human ``reason``; nothing is encoded as NaN."""

    case: Case
    status: Status
    reason: str = ""
    measurement: Measurement | None = None
    memory: Memory | None = None
    parameters: int | None = None
    started_utc: str = ""
    duration_s: float = 0.0
    extra: Extra = field(default_factory=dict)
    telemetry: TelemetrySummary | None = None
    # Whether other work competed for the machine while the case was timed (``measure.contention``); None when it
    # was not watched (a row that was never timed, or written before the watch existed).
    contention: Contention | None = None
    # The numerical check against the family's reference (``results.numerics``); None in rows from before it.
    check: NumericCheck | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def is_timed(self) -> bool:
        """An ok row with a measurement: the one test every table, fit, claim and export uses."""
        return self.ok and self.measurement is not None

    @property
    def timing(self) -> Measurement:
        """The measurement of a timed row. Asking a row that ``is_timed`` is not is a bug of ours."""
        if not self.ok or self.measurement is None:
            raise ValueError(f"{self.case.key}: a {self.status} row has no timing")
        return self.measurement

    @property
    def median_s(self) -> float:
        """The median time per call of a timed row (``timing.median_s``)."""
        return self.timing.median_s

    @property
    def contended(self) -> bool:
        """A row whose calls were timed while other work competed for the machine: its timing is not reliable, and
        neither is a ``too_slow_for_budget`` that the competition may have caused."""
        return self.measurement is not None and self.contention is not None and self.contention.contended

    @property
    def state_bytes(self) -> int | None:
        """A decode row's KV cache or recurrent state, computed from shapes and dtype; None for other rows."""
        return _count(self.extra.get("state_bytes"))

    @property
    def state_mem_bytes(self) -> int | None:
        """The same state, measured (``extra["state_mem_method"]`` says how); None where not measured."""
        return _count(self.extra.get("state_mem_bytes"))

    @property
    def tokens_per_call(self) -> int:
        """Tokens one timed call produces: the case's (``Case.tokens``), or for a capacity row one per sequence of
        the batch it found (``capacity_batch``)."""
        found = _count(self.extra.get("capacity_batch")) if self.case.mode == "capacity" else None
        return found if found is not None and found > 0 else self.case.tokens  # 0 only if built in memory

    @property
    def tokens_per_s(self) -> float | None:
        if self.measurement is None or self.measurement.median_s <= 0:
            return None
        return self.tokens_per_call / self.measurement.median_s

    def to_dict(self, *, include_raw: bool = False) -> dict[str, Any]:
        """``include_raw`` keeps the raw telemetry samples (for a worker's pipe); results.jsonl leaves them to
        the telemetry sidecar."""
        return {
            "case": self.case.to_dict(),
            "key": self.case.key,
            "status": self.status,
            "reason": self.reason,
            "measurement": None if self.measurement is None else self.measurement.to_dict(),
            "memory": None if self.memory is None else vars(self.memory).copy(),
            "parameters": self.parameters,
            "started_utc": self.started_utc,
            "duration_s": self.duration_s,
            "extra": dict(self.extra),
            # Absent rather than null when there is none, so rows from before telemetry read back unchanged.
            **({} if self.telemetry is None else {"telemetry": self.telemetry.to_dict(include_raw=include_raw)}),
            **({} if self.contention is None else {"contention": self.contention.to_dict()}),
            **({} if self.check is None else {"check": self.check.to_dict()}),
        }

    @classmethod
    def from_dict(cls, data: object) -> Result:
        """Read ``to_dict``'s output back; anything else raises ``fields.FieldError`` naming the key."""
        r = fields.record(data, "", ("case", "status"), _RESULT_OPTIONAL)
        case = fields.nested("case", _case_from_dict, r["case"])
        if "key" in r:
            fields.text(r["key"], "key")  # derived from the case (Case.key) and recomputed from it, never trusted
        timed, memory, parameters = r.get("measurement"), r.get("memory"), r.get("parameters")
        telemetry, contention, check = r.get("telemetry"), r.get("contention"), r.get("check")
        status = fields.choice(r["status"], "status", STATUSES, "status")
        if status == "ok" and timed is None:
            # Contradictory: every reader would take "ok" as a timing and find none (compare called it regressed).
            raise FieldError("measurement", 'a row with status "ok" must hold a measurement, found null')
        return cls(
            case=case,
            status=status,  # type: ignore[arg-type]
            reason=fields.text(r.get("reason", ""), "reason"),
            measurement=None if timed is None else fields.nested("measurement", Measurement.from_dict, timed),
            memory=None if memory is None else fields.nested("memory", Memory.from_dict, memory),
            parameters=None if parameters is None else fields.integer(parameters, "parameters", minimum=0),
            started_utc=fields.text(r.get("started_utc", ""), "started_utc"),
            duration_s=fields.duration(r.get("duration_s", 0.0), "duration_s"),
            extra=_extra(r.get("extra", {})),
            telemetry=None if telemetry is None else fields.nested("telemetry", TelemetrySummary.from_dict, telemetry),
            contention=None if contention is None else fields.nested("contention", Contention.from_dict, contention),
            check=None if check is None else fields.nested("check", NumericCheck.from_dict, check),
        )


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


_RESULT_OPTIONAL = (
    "key",
    "reason",
    "measurement",
    "memory",
    "parameters",
    "started_utc",
    "duration_s",
    "extra",
    "telemetry",
    "contention",
    "check",
)

# The same caps a config is held to: a stored case beyond them was not written by a sweep.
_CASE_CAPS = {
    "batch": MAX_BATCH,
    "seq_len": MAX_SEQ_LEN,
    "d_model": MAX_D_MODEL,
    "heads": MAX_HEADS,
    "layers": MAX_LAYERS,
}

_CASE_REQUIRED = ("model", "mode", "dtype", "device", "batch", "seq_len", "d_model", "heads", "layers", "causal")
_CASE_OPTIONAL = ("options", "user", "hybrid", "serving", "packing", "kept")
# The bounds of each serving parameter a stored case may carry (accept is held to its draft besides).
_SERVING_BOUNDS = {
    "memory_budget": (0, MAX_MEMORY_BUDGET),
    "prefill_chunk": (0, MAX_SEQ_LEN),
    "draft": (1, MAX_DRAFT),
    "accept": (0, MAX_DRAFT),
    "prefix_tokens": (1, MAX_SEQ_LEN),
    "requests": (1, MAX_REQUESTS),
    "checkpoint_every": (0, MAX_SEQ_LEN),
}


def _case_from_dict(data: object) -> Case:
    """``Case.from_dict`` after checking every field against the catalogue, so a bad row never reaches it."""
    c = fields.record(data, "", _CASE_REQUIRED, _CASE_OPTIONAL)
    if "user" in c:
        return _user_case(c)
    if "hybrid" in c:
        _hybrid(c)
        spec = HYBRID.entry_spec(fields.text(c["model"], "model"))
    else:
        spec = MODELS[fields.choice(c["model"], "model", MODEL_NAMES, "model")]
    model = spec.name
    _check_sizes(c)
    kinds = {o.name: o.type for o in spec.options}
    for name, value in fields.record(c.get("options", {}), "options", (), kinds).items():
        kind = kinds[name]
        fits = kind is bool if isinstance(value, bool) else isinstance(value, int | float if kind is float else kind)
        if not fits:
            raise fields.expected(fields.path("options", name), f"a {kind.__name__} ({model}'s option)", value)
        _bounded(value, fields.path("options", name))
    case = Case.from_dict(c)
    # A case its family cannot describe (key/value heads that do not divide the heads) was not written by a sweep,
    # and its numbers would not be safe to compute with.
    problem = cannot_build(case) if case.mode not in STATEFUL_MODES or case.causal else None
    if problem is not None and problem.option is not None:
        raise fields.expected(fields.path("options", problem.option), problem.message, case.given(problem.option))
    return case


def _check_sizes(c: Mapping[str, Any]) -> None:
    fields.choice(c["mode"], "mode", MODES, "mode")
    fields.choice(c["dtype"], "dtype", DTYPES, "dtype")
    if not RESOLVED_DEVICE.fullmatch(fields.text(c["device"], "device")):
        raise fields.expected("device", "cpu, cuda or cuda:N", c["device"])
    for name, cap in _CASE_CAPS.items():
        if name != "heads" or c[name] is not None:
            fields.integer(c[name], name, maximum=cap)
    fields.flag(c["causal"], "causal")
    _serving(c)
    _kept(c)


def _kept(c: Mapping[str, Any]) -> None:
    """The dtypes a stateful case keeps its state in: known keys, each one of its dtypes."""
    if "kept" not in c:
        return
    if c["mode"] not in STATEFUL_MODES:
        raise fields.expected("kept", f"no kept dtypes (mode {c['mode']} keeps no state)", c["kept"])
    for name, value in fields.record(c["kept"], "kept", (), tuple(KEPT_DTYPES)).items():
        fields.choice(value, fields.path("kept", name), KEPT_DTYPES[name], name)


def _serving(c: Mapping[str, Any]) -> None:
    """A serving mode's parameters, exactly those of its mode and within their bounds; packed lengths only on a
    forward or train case, whose batch says how many and whose seq_len the longest."""
    mode = c["mode"]
    names = SERVING_PARAMS.get(mode, ())
    serving = fields.record(c.get("serving", {}), "serving", names if "serving" in c else (), ())
    if "serving" in c and not names:
        raise fields.expected("serving", f"no serving parameters (mode {mode} takes none)", c["serving"])
    for name, value in serving.items():
        low, high = _SERVING_BOUNDS[name]
        fields.integer(value, fields.path("serving", name), minimum=low, maximum=high)
    if serving.get("accept", 0) > serving.get("draft", 0):
        raise fields.expected("serving.accept", f"at most draft ({serving['draft']})", serving["accept"])
    if "packing" not in c:
        return
    if mode not in PACKING_MODES:
        raise fields.expected("packing", f"no packed lengths (mode {mode} takes none)", c["packing"])
    lengths = fields.items(c["packing"], "packing", lambda v, k: fields.integer(v, k, maximum=MAX_SEQ_LEN))
    if not 1 <= len(lengths) <= MAX_PACKED or len(lengths) != c["batch"] or max(lengths) != c["seq_len"]:
        raise fields.expected(
            "packing", f"1 to {MAX_PACKED} lengths, as many as batch and the longest seq_len", c["packing"]
        )


def _hybrid(c: Mapping[str, Any]) -> None:
    """A hybrid stack's case: a name of its own, a pattern of built-in models, a side."""
    model = fields.text(c["model"], "model")
    if model in MODEL_NAMES:
        raise fields.expected("model", "a name of its own (a hybrid stack's)", model)
    hybrid = fields.record(c["hybrid"], "hybrid", ("pattern",), ("kind", "members"))
    pattern = hybrid["pattern"]
    if not isinstance(pattern, list) or not 1 <= len(pattern) <= MAX_PATTERN:
        raise fields.expected("hybrid.pattern", f"a list of 1 to {MAX_PATTERN} built-in models", pattern)
    labels: dict[str, str] = {}
    members = hybrid.get("members", [])
    if not isinstance(members, list) or len(members) > MAX_PATTERN:
        raise fields.expected("hybrid.members", f"a list of at most {MAX_PATTERN} members", members)
    for i, member in enumerate(members):
        record = fields.record(member, f"hybrid.members[{i}]", ("label", "model"), ("heads", "options"))
        model = fields.choice(record["model"], f"hybrid.members[{i}].model", MODEL_NAMES, "model")
        labels[fields.text(record["label"], f"hybrid.members[{i}].label")] = model
        if record.get("heads") is not None:
            fields.integer(record["heads"], f"hybrid.members[{i}].heads", minimum=1)
        if not isinstance(record.get("options", {}), Mapping):
            raise fields.expected(f"hybrid.members[{i}].options", "a mapping of options", record.get("options"))
    for i, entry in enumerate(pattern):
        for part in fields.text(entry, f"hybrid.pattern[{i}]").split(PARALLEL):
            if part not in labels:
                fields.choice(part, f"hybrid.pattern[{i}]", MODEL_NAMES, "model")
    if "kind" in hybrid:
        fields.choice(hybrid["kind"], "hybrid.kind", SIDES, "kind")


def _user_case(c: Mapping[str, Any]) -> Case:
    """A user model's case: any model name, its own options (scalars), and where it came from."""
    model = fields.text(c["model"], "model")
    if model in MODEL_NAMES:
        raise fields.expected("model", "a name of its own (a user model's)", model)
    user = fields.record(c["user"], "user", ("factory", "kind"), ("source",))
    if not FACTORY.fullmatch(fields.text(user["factory"], "user.factory")):
        raise fields.expected("user.factory", "module.path:function", user["factory"])
    fields.choice(user["kind"], "user.kind", KINDS, "kind")
    if "source" in user:
        fields.text(user["source"], "user.source")
    _check_sizes(c)
    options = c.get("options", {})
    if not isinstance(options, dict):
        raise fields.expected("options", "an object", options)
    for name, value in options.items():
        key = fields.path("options", name)
        if not isinstance(value, bool | int | float | str):
            raise fields.expected(key, "a string, number or boolean", value)
        _bounded(value, key)
    return Case.from_dict(c)


def _bounded(value: object, key: str) -> None:
    """A stored number of any kind stays within int64, so that every sum, product and float conversion of it is
    finite (a 10**400 would pass the type check and overflow the first conversion to float)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and abs(value) > fields.MAX_INTEGER:
        raise fields.expected(key, f"a number of at most {fields.MAX_INTEGER} in size", value)


def _extra(data: object) -> dict[str, str | int | float | bool | None]:
    """The row's extras: scalars, each declared key of its declared type (``core.extras``)."""
    if not isinstance(data, dict):
        raise fields.expected("extra", "an object", data)
    known = _DECLARED
    for name, value in data.items():
        key = fields.path("extra", name)
        if value is not None and not isinstance(value, str | int | float | bool):
            raise fields.expected(key, "a string, number, boolean or null", value)
        spec = known.get(name)
        if spec is not None and not spec.fits(value):
            raise fields.expected(key, spec.wanted, value)
        _bounded(value, key)
    return dict(data)


_DECLARED = declared()


def _shard_from_dict(data: object) -> Shard:
    s = fields.record(data, "", ("index", "count"))
    count = fields.integer(s["count"], "count")
    if count > MAX_SHARDS:
        raise fields.expected("count", f"at most {MAX_SHARDS}", count)
    index = fields.integer(s["index"], "index", minimum=0)
    if index >= count:
        raise fields.expected("index", f"an index below count ({count})", index)
    return Shard(index, count)


@dataclass(frozen=True)
class Source:
    """One run folder that ``attnbench merge`` joined into a merged run: which, from where, and how many rows."""

    run_id: str
    shard: Shard | None  # None: a whole run (or an earlier merge) rather than one slice
    hostname: str
    device: str
    rows: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "shard": None if self.shard is None else self.shard.to_dict(),
            "hostname": self.hostname,
            "device": self.device,
            "rows": self.rows,
        }

    @classmethod
    def from_dict(cls, data: object) -> Source:
        d = fields.record(data, "", ("run_id", "shard", "hostname", "device", "rows"))
        shard = d["shard"]
        return cls(
            run_id=fields.text(d["run_id"], "run_id"),
            shard=None if shard is None else fields.nested("shard", _shard_from_dict, shard),
            hostname=fields.text(d["hostname"], "hostname"),
            device=fields.text(d["device"], "device"),
            rows=fields.integer(d["rows"], "rows", minimum=0),
        )


def _source(value: object, key: str) -> Source:
    return fields.nested(key, Source.from_dict, value)


@dataclass(frozen=True)
class Run:
    """Everything about a run but its rows. ``state`` is "running" until the sweep ends."""

    run_id: str
    created_utc: str
    config_source: str
    config: Mapping[str, Any]
    config_sha256: str
    timing: TimingPolicy
    environment: Mapping[str, Any]
    command: tuple[str, ...] = ()
    state: RunState = "running"
    finished_utc: str = ""
    schema_version: int = SCHEMA_VERSION
    # The device's measured ceilings (attnbench calibrate), cached per machine when the sweep started; None when
    # there was none. Optional and absent when None, so runs written before it read back unchanged.
    calibration: Calibration | None = None
    # The git checkout the sweep was started in (the benchmarked code) and a free label (sweep --label): what
    # history and compare name a run by. Optional and absent when empty, as calibration.
    code: CodeIdentity | None = None
    label: str = ""
    # The slice of the config's cases this run measured (sweep --shard i/N); None for a whole run.
    shard: Shard | None = None
    # The runs `attnbench merge` joined into this one, in shard order; empty for a run a sweep wrote.
    merged_from: tuple[Source, ...] = ()
    # How many rows were timed on a busy machine (``Result.contended``), counted by the writer as rows land; None
    # for a run written before the watch existed (readers then count the rows themselves).
    contended_cases: int | None = None
    # The Chrome traces the sweep wrote (--profile), relative to the run folder, in the order the rows landed.
    traces: tuple[str, ...] = ()

    @property
    def commit(self) -> str | None:
        """The benchmarked commit, or None when the sweep did not run in a git checkout."""
        return None if self.code is None else self.code.commit

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "run_id": self.run_id,
            "created_utc": self.created_utc,
            "finished_utc": self.finished_utc,
            "state": self.state,
            "command": list(self.command),
            "config_source": self.config_source,
            "config_sha256": self.config_sha256,
            "config": dict(self.config),
            "timing": self.timing.to_dict(),
            "environment": dict(self.environment),
            **({} if self.calibration is None else {"calibration": self.calibration.to_dict()}),
            **({} if self.code is None else {"code": self.code.to_dict()}),
            **({"label": self.label} if self.label else {}),
            **({} if self.shard is None else {"shard": self.shard.to_dict()}),
            **({"merged_from": [s.to_dict() for s in self.merged_from]} if self.merged_from else {}),
            **({} if self.contended_cases is None else {"contended_cases": self.contended_cases}),
            **({"traces": list(self.traces)} if self.traces else {}),
        }

    @classmethod
    def from_dict(cls, data: object) -> Run:
        """Read ``to_dict``'s output back; anything else raises ``fields.FieldError`` naming the key."""
        d = fields.record(data, "", _RUN_REQUIRED, _RUN_OPTIONAL)
        version = fields.integer(d["schema_version"], "schema_version")
        if version > SCHEMA_VERSION:
            raise FieldError("schema_version", f"{version} is newer than this attnbench reads ({SCHEMA_VERSION})")
        run_id = fields.text(d["run_id"], "run_id")
        if not run_id:
            raise fields.expected("run_id", "a non-empty string", run_id)
        config = d["config"]
        if not isinstance(config, dict):
            raise fields.expected("config", "an object", config)
        environment = d.get("environment", {})
        if not isinstance(environment, dict):
            raise fields.expected("environment", "an object", environment)
        calibration, code, shard = d.get("calibration"), d.get("code"), d.get("shard")
        contended = d.get("contended_cases")
        return cls(
            run_id=run_id,
            created_utc=fields.text(d["created_utc"], "created_utc"),
            config_source=fields.text(d.get("config_source", ""), "config_source"),
            config=dict(config),
            config_sha256=fields.text(d["config_sha256"], "config_sha256"),
            timing=fields.nested("timing", _timing_from_dict, d.get("timing", {})),
            environment=dict(environment),
            command=tuple(fields.items(d.get("command", []), "command", fields.text)),
            state=fields.choice(d.get("state", "running"), "state", RUN_STATES, "state"),  # type: ignore[arg-type]
            finished_utc=fields.text(d.get("finished_utc", ""), "finished_utc"),
            schema_version=version,
            calibration=None
            if calibration is None
            else fields.nested("calibration", Calibration.from_dict, calibration),
            code=None if code is None else fields.nested("code", CodeIdentity.from_dict, code),
            label=fields.text(d.get("label", ""), "label"),
            shard=None if shard is None else fields.nested("shard", _shard_from_dict, shard),
            merged_from=tuple(fields.items(d.get("merged_from", []), "merged_from", _source)),
            contended_cases=None if contended is None else fields.integer(contended, "contended_cases", minimum=0),
            traces=tuple(fields.items(d.get("traces", []), "traces", fields.text)),
        )


_RUN_REQUIRED = ("schema_version", "run_id", "created_utc", "config_sha256", "config")

_RUN_OPTIONAL = (
    "finished_utc",
    "state",
    "command",
    "config_source",
    "timing",
    "environment",
    "calibration",
    "code",
    "label",
    "shard",
    "merged_from",
    "contended_cases",
    "traces",
)


def _timing_from_dict(data: object) -> TimingPolicy:
    """``TimingPolicy.from_dict`` after checking each field's type; a field left out takes the default."""
    defaults = TimingPolicy()
    names = list(TimingPolicy.__dataclass_fields__)
    t = fields.record(data, "", (), names)
    for name, value in t.items():
        default = getattr(defaults, name)
        if name == "cache":  # null: each mode's default (a run written before that existed says "warm")
            if value is not None:
                fields.choice(value, name, ("warm", "cold"), "cache policy")
        elif name == "flush":  # left out: a run from before the read flush, which zeroed (the default)
            fields.choice(value, name, ("zero", "read"), "flush")
        elif isinstance(default, bool):
            fields.flag(value, name)
        elif isinstance(default, int):
            fields.integer(value, name, minimum=0)
        else:
            fields.number(value, name)
    # A run written before timing.process_warmup_s existed had no process warm-up, whatever the default is now.
    return TimingPolicy.from_dict({"process_warmup_s": 0.0, **t})
