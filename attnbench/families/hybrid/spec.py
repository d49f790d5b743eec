"""Hybrid stacks of built-in models (Jamba, Qwen3-Next, Kimi Linear: recurrent layers with an attention layer every
few), torch-free. The torch half is ``attnbench.families.hybrid.layers``.

A config defines one: ``{name: gdn-3to1, hybrid: [gated-deltanet, gated-deltanet, gated-deltanet, sdpa-flash]}``. Its
case carries the pattern (``HybridModel``, as ``Case.definition`` under ``hybrid``), so a stored row needs no config
to be read. The model is ``layers`` pre-norm blocks, block i being the pattern's member i mod len(pattern) at scope
block with that member's defaults (an attention member's block has its FFN, ``ffn_mult`` wide; a recurrent member's
has none, as everywhere in attnbench), in front of them the token embedding and positions at scope model, after them
the final LayerNorm. Every count is the sum of its members' (``member``: the member's own case, one block): FLOPs
(formula ``hybrid-v1``, each member counted by its own formula), parameters, the decode state (the members' states
and KV caches together, so it grows with n only through the attention members), the bytes a step writes back. A
member's rule is the hybrid's: a case a member cannot build or decode is one the hybrid cannot.

A pattern entry ``a+b`` is a parallel hybrid's block (Falcon-H1): one pre-norm block whose mixer is its members side
by side on the same normed input, their outputs summed, then the FFN (``ffn_mult``) as an attention block has it;
its members are counted at scope core, and the block adds its two LayerNorms and the FFN. A stack may give its
members sizes and options of their own (``HybridModel.members``: a published preset's mixers, each under its label);
a member without its own heads takes the case's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from attnbench.core.cases import MAX_PATTERN, PARALLEL, SIDES, STATEFUL_MODES, Case, Definition, Options, Side
from attnbench.families import shared
from attnbench.families.base import (
    ExtraValue,
    Family,
    ModelSpec,
    OptionSpec,
    OptionValue,
    Parts,
    Problem,
    ValueOf,
)

__all__ = ["FORMULA", "HybridFamily", "HybridMember", "HybridModel", "stack_of"]

FORMULA = "hybrid-v1"
_OPTIONS = (
    OptionSpec(
        "scope",
        str,
        "block",
        "block: the stack of pre-norm blocks; model: token embedding + positions + the blocks + final LayerNorm, fed "
        "int64 token ids",
        choices=("block", "model"),
    ),
    shared.FFN_MULT,
    shared.VOCAB,
    shared.positional(rope=False),
    shared.MAX_LEN,
    shared.preset(),
    shared.COMPILE,
)
# The options a member's block takes from the hybrid's, where the member has them.
_SHARED_WITH_MEMBERS = ("ffn_mult",)
Resolve = Callable[[Case], Family]


@dataclass(frozen=True)
class HybridMember:
    """A member of a hybrid stack with sizes and options of its own (a published model's mixer): what its
    pattern's ``label`` stands for. ``heads`` None: the case's (where the model has heads)."""

    label: str
    model: str
    heads: int | None = None
    options: Options = ()

    def to_dict(self) -> dict[str, object]:
        return {"label": self.label, "model": self.model, "heads": self.heads, "options": dict(self.options)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HybridMember:
        heads, options = data.get("heads"), data.get("options") or {}
        if heads is not None and (not isinstance(heads, int) or isinstance(heads, bool) or heads < 1):
            raise ValueError(f"a member's heads must be a positive integer or null, got {heads!r}")
        if not isinstance(options, Mapping):
            raise ValueError("a member's options must be a mapping")
        return cls(str(data["label"]), str(data["model"]), heads, tuple(sorted(options.items())))


@dataclass(frozen=True)
class HybridModel:
    """A stack a config defines (``{name, hybrid: [m1, m2, …]}``): pre-norm blocks of built-in models cycling
    through ``pattern`` for the case's ``layers``, standing on ``kind``'s side of the comparison. It travels in the
    case (``definition``), so a stored row says what it was without the config.

    An entry ``a+b`` (``PARALLEL``) is one block running its members side by side on the same input, their outputs
    summed (a parallel hybrid: Falcon-H1). Where ``members`` is given (a published preset), entries name members'
    labels, each a built-in model with heads and options of its own; otherwise each is a built-in model, at its
    defaults."""

    pattern: tuple[str, ...]
    kind: Side = "hybrid"
    members: tuple[HybridMember, ...] = ()

    def parts(self, entry: str) -> tuple[str, ...]:
        """The members one pattern entry runs: one, or several side by side."""
        return tuple(entry.split(PARALLEL))

    def member(self, label: str) -> HybridMember:
        """What ``label`` stands for: the member of that label, else the built-in model of that name at its
        defaults."""
        return next((m for m in self.members if m.label == label), HybridMember(label, label))

    def definition(self) -> Definition:
        """What a case of this stack carries (``Case.definition``)."""
        return Definition.of(HybridFamily.defines, self.to_dict())

    def to_dict(self) -> dict[str, object]:
        data: dict[str, object] = {"pattern": list(self.pattern), "kind": self.kind}
        if self.members:  # only when given, so every stack without them reads as it always did
            data["members"] = [m.to_dict() for m in self.members]
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> HybridModel:
        kind, pattern = data.get("kind", "hybrid"), data["pattern"]
        if kind not in SIDES:
            raise ValueError(f"kind must be one of {', '.join(SIDES)}, got {kind!r}")
        if not isinstance(pattern, list | tuple) or not 1 <= len(pattern) <= MAX_PATTERN:
            raise ValueError(f"pattern must list 1 to {MAX_PATTERN} models")
        members = data.get("members") or []
        if not isinstance(members, list | tuple) or len(members) > MAX_PATTERN:
            raise ValueError(f"members must list at most {MAX_PATTERN} members")
        return cls(tuple(str(m) for m in pattern), kind, tuple(HybridMember.from_dict(m) for m in members))


@lru_cache(maxsize=1024)
def _read(definition: Definition) -> HybridModel:
    """A stack's definition read once: every count walks its pattern, case after case."""
    return HybridModel.from_dict(definition.data)


def stack_of(case: Case) -> HybridModel:
    """The stack ``case`` defines; ValueError where it defines none."""
    if case.definition is None or case.definition.key != HybridFamily.defines:
        raise ValueError(f"{case.model} is not a hybrid stack")
    return _read(case.definition)


class HybridFamily(Family):
    """Known by its case (``Case.definition`` under ``hybrid``), like a user's model; the catalogue makes the one
    instance, handing it the lookup of a member's family (a member is any built-in model)."""

    name = "hybrid"
    defines = "hybrid"
    order = 9_000
    state_noun = "members' states and KV caches"

    def __init__(self, resolve: Resolve, specs: Mapping[str, ModelSpec]) -> None:
        self.resolve = resolve
        self.specs = specs

    # ------------------------------------------------------------------------------------------------ the model
    def entry_spec(self, name: str) -> ModelSpec:
        """What a config's ``model_options`` may set for hybrid ``name`` (every hybrid takes the same options)."""
        return ModelSpec(name, "hybrid", self.name, "hybrid stack", options=_OPTIONS, source="config")

    def spec(self, case: Case) -> ModelSpec:
        hybrid = self._hybrid(case)
        models = [hybrid.member(label).model for entry in hybrid.pattern for label in hybrid.parts(entry)]
        return ModelSpec(
            case.model,
            hybrid.kind,
            self.name,
            "hybrid stack: " + " → ".join(hybrid.pattern),
            options=_OPTIONS,
            heads=any(self.specs[m].heads for m in models if m in self.specs),
            source="config",
        )

    def _hybrid(self, case: Case) -> HybridModel:
        return stack_of(case)

    def define(self, data: Mapping[str, Any]) -> Definition:
        return HybridModel.from_dict(data).definition()

    def config_entry(self, case: Case) -> dict[str, object] | None:
        hybrid = self._hybrid(case)
        if hybrid.members:
            return None  # a published preset's stack: its preset names it
        return {"name": case.model, "hybrid": list(hybrid.pattern), "kind": hybrid.kind}

    def described(self, case: Case) -> Mapping[str, object]:
        return {"pattern": list(self._hybrid(case).pattern)}

    def kept_default(self, case: Case, key: str) -> str | None:
        # Each member keeps its own state dtype, so no one value is the stack's: every value given is kept.
        return None if key == "state_dtype" else super().kept_default(case, key)

    def block(self, case: Case, i: int) -> tuple[Case, ...]:
        """Block ``i``'s members' own cases: the pattern's entry at that place, one block of its member (at scope
        block), or its members side by side (each at scope core: the norm, residual and FFN are the block's), each
        with its own options (a member's, else the model's defaults) and sizes (its own heads, else the hybrid's,
        where the model has heads; a recurrent member is causal by construction)."""
        hybrid = self._hybrid(case)
        labels = hybrid.parts(hybrid.pattern[i % len(hybrid.pattern)])
        scope = "block" if len(labels) == 1 else "core"
        return tuple(self._member(case, hybrid.member(label), scope) for label in labels)

    def _member(self, case: Case, member: HybridMember, scope: str) -> Case:
        spec = self.specs[member.model]
        options: dict[str, OptionValue] = dict(member.options)
        if scope != "core":
            options["scope"] = scope
        for name in _SHARED_WITH_MEMBERS:
            option = spec.option(name)
            if option is not None and scope != "core" and self.option(case, name) != option.default:
                options[name] = self.option(case, name)
        causal = case.causal if spec.kind == "attention" else True
        heads = (member.heads or case.heads) if spec.heads else None
        made = Case(member.model, case.mode, case.dtype, case.device, case.batch, case.seq_len, case.d_model, heads,
                    1, causal, tuple(sorted(options.items())), serving=case.serving, packing=case.packing)  # fmt: skip
        keys = self.resolve(made).kept_keys(made) if case.kept else ()  # kv_dtype to caches, state_dtype to states
        kept = tuple(item for item in case.kept if item[0] in keys)
        if "page_tokens" in keys and ("hybrid_pages", "aligned") in case.kept:  # the page the states set
            kept = tuple(sorted({**dict(kept), "page_tokens": str(self.page_layout(case)[0])}.items()))
        return replace(made, kept=kept) if keys else made

    def member(self, case: Case, i: int) -> Case:
        """Block ``i``'s case where it has one member (the first of several side by side)."""
        return self.block(case, i)[0]

    def members(self, case: Case) -> list[Case]:
        """Every member of every block, in order."""
        return [member for i in range(case.layers) for member in self.block(case, i)]

    def distinct(self, case: Case) -> list[Case]:
        """One case per member of the pattern (what a probe must run: every kernel the stack uses)."""
        cycle = len(self._hybrid(case).pattern)
        return list(dict.fromkeys(member for i in range(cycle) for member in self.block(case, i)))

    def parallel_blocks(self, case: Case) -> int:
        """How many of the ``layers`` blocks run several members side by side."""
        hybrid = self._hybrid(case)
        return sum(len(hybrid.parts(hybrid.pattern[i % len(hybrid.pattern)])) > 1 for i in range(case.layers))

    def _parallel_parameters(self, case: Case) -> int:
        """What a side-by-side block adds around its members: its two LayerNorms and its FFN (``ffn_mult``)."""
        d, m = case.d_model, int(self.option(case, "ffn_mult"))
        return 2 * 2 * d + (d * m * d + m * d) + (m * d * d + d)

    # ------------------------------------------------------------------------------------------------ rules
    def causal(self, spec: ModelSpec, options: Mapping[str, OptionValue], requested: bool) -> bool:
        return requested  # its attention members follow the grid; its recurrent members are causal anyway

    def no_effect(self, model: str, name: str, value_of: ValueOf) -> Problem | None:
        return shared.network_no_effect(name, value_of, recurrent=False)

    def cannot_build(self, case: Case) -> Problem | None:
        hybrid = self._hybrid(case)
        models = [hybrid.member(label).model for entry in hybrid.pattern for label in hybrid.parts(entry)]
        unknown = [m for m in dict.fromkeys(models) if m not in self.specs]
        if unknown:
            return Problem(f"{case.model}: {', '.join(unknown)} is not a built-in model", None, "members are built-ins")
        if case.layers < len(hybrid.pattern):
            left = ", ".join(hybrid.pattern[case.layers :])
            return Problem(
                f"{case.model} cycles through {len(hybrid.pattern)} members but has {case.layers} layers: {left} "
                "would be left out",
                None,
                f"give layers of at least {len(hybrid.pattern)} (a multiple of it keeps the ratio)",
            )
        for member in self.distinct(case):
            problem = self._member_problem(member)
            if problem is not None:
                return Problem(f"{case.model}'s member {member.model}: {problem.message}", None, problem.hint)
        return shared.network_cannot_build(case, self.values(case))

    def _member_problem(self, member: Case) -> Problem | None:
        family = self.resolve(member)
        if member.mode in STATEFUL_MODES:
            problem = family.decode_problem(member)
            if problem is not None:
                return problem
        return family.cannot_build(member)

    def serving_problem(self, case: Case) -> Problem | None:
        """A serving question is asked of every block: a member that cannot answer it is the stack's reason."""
        for member in self.distinct(case):
            problem = self.resolve(member).serving_problem(member)
            if problem is not None:
                return Problem(f"{case.model}'s member {member.model}: {problem.message}", None, problem.hint)
        return super().serving_problem(case)

    def decode_problem(self, case: Case) -> Problem | None:
        for member in self.distinct(case):
            problem = self.resolve(member).decode_problem(member)
            if problem is not None:
                return Problem(f"{case.model}'s member {member.model}: {problem.message}", problem.option, problem.hint)
        return None

    # ------------------------------------------------------------------------------------------------ counts
    def formula(self, case: Case) -> str:
        return shared.versioned("hybrid", shared.DECODE_SUFFIX * (case.mode == "decode"))

    def work(self, case: Case, full_scores: bool) -> tuple[Parts, Parts]:
        forward: Parts = {}
        backward: Parts = {}
        for member in self.members(case):
            f, b = self.resolve(member).work(member, full_scores)
            for total, parts in ((forward, f), (backward, b)):
                for name, flops in parts.items():
                    total[name] = total.get(name, 0) + flops
        parallel = self.parallel_blocks(case)
        if parallel:  # a side-by-side block's FFN (its members, at scope core, have none)
            ffn = parallel * shared.ffn_flops(case, self.values(case))
            forward["ffn"] = forward.get("ffn", 0) + ffn
            backward["ffn"] = backward.get("ffn", 0) + shared.MATMUL_BACKWARD * ffn
        return forward, backward

    def scores_in_full(self, case: Case, extra: Mapping[str, object]) -> bool:
        return any(self.resolve(m).scores_in_full(m, extra) for m in self.distinct(case))

    def parameters(self, case: Case) -> int | None:
        counts = [self.resolve(m).parameters(m) for m in self.members(case)]
        if any(c is None for c in counts):
            return None
        body = sum(c for c in counts if c is not None) + self.parallel_blocks(case) * self._parallel_parameters(case)
        return shared.network_parameters(case, self.values(case), body)

    def state_dtype(self, case: Case) -> str:
        return case.dtype  # each member keeps its own; the sum is in bytes

    def prefix_step(self, case: Case) -> int:
        """Where every member can be restored at once: a multiple of each member's step (its pages, aligned or its
        own, and its checkpoints), 0 where a member restores nothing (its state recomputed, the whole stack with it:
        the next block needs what the recurrent one computes)."""
        steps = [self.resolve(m).prefix_step(m) for m in self.distinct(case)]
        steps += [page for page in self.page_layout(case)[:1] if page]
        return 0 if 0 in steps else math.lcm(*steps)

    def kept_keys(self, case: Case) -> tuple[str, ...]:
        keys = {key for m in self.members(case) for key in self.resolve(m).kept_keys(m)}
        return tuple(sorted(keys | ({"hybrid_pages"} if {"page_tokens", "state_dtype"} <= keys else set())))

    def page_layout(self, case: Case) -> tuple[int, int]:
        """Aligned (vLLM's ``HybridAttentionMambaModelConfig``, without prefix caching): the attention page the
        smallest multiple of 16 positions whose K and V hold the largest recurrent state (the case's page_tokens
        where that is more), every state padded to the page's bytes. Separate: the case's pages, states as they are."""
        if ("hybrid_pages", "aligned") not in case.kept:
            return case.page_tokens, 0
        plain = replace(case, batch=1, kept=tuple(item for item in case.kept if item[0] != "hybrid_pages"))
        members = [(self.resolve(m), m) for m in self.members(plain)]
        states = [f.state_bytes(m) or 0 for f, m in members if "state_dtype" in f.kept_keys(m)]
        caches = [(f, replace(m, kept=tuple(i for i in m.kept if i[0] != "page_tokens"))) for f, m in members
                  if "page_tokens" in f.kept_keys(m)]  # fmt: skip
        per_token = max((f.state_bytes(replace(m, seq_len=m.seq_len + 1)) or 0) - (f.state_bytes(m) or 0)
                        for f, m in caches)  # fmt: skip
        tokens = max(case.page_tokens, 16 * -(-max(states) // (16 * max(1, per_token))))
        return tokens, tokens * per_token

    def state_bytes(self, case: Case) -> int | None:
        page = self.page_layout(case)[1]  # aligned: a state's slot is a page
        sizes = [
            case.batch * page if page and "state_dtype" in f.kept_keys(m) else f.state_bytes(m)
            for f, m in ((self.resolve(m), m) for m in self.members(case))
        ]
        return None if any(s is None for s in sizes) else sum(s for s in sizes if s is not None)

    def state_written(self, case: Case, state_bytes: int) -> int:
        total = 0
        for member in self.members(case):
            family = self.resolve(member)
            held = family.state_bytes(member)
            total += family.state_written(member, held) if held is not None else 0
        return total

    def prefill_carries(self, case: Case) -> bool:
        return all(self.resolve(m).prefill_carries(m) for m in self.distinct(case))

    def peak_dtype(self, case: Case) -> str:
        dtypes = {self.resolve(m).peak_dtype(m) for m in self.distinct(case)}
        return dtypes.pop() if len(dtypes) == 1 else case.dtype

    def case_column_values(self, case: Case) -> Mapping[str, ExtraValue]:
        return {}

    def takes_tokens(self, case: Case) -> bool:
        return self.option(case, "scope") == "model"
