"""The serving questions, timed: one case of ``mode: capacity``, ``prefill`` or ``verify``, or of packed lengths.

Everything but the timed call happens outside the timing, as in ``torch_executor``, and a call that changes what the
next one would find is put back before it, untimed (``PreparedClock``):

- ``prefill``: the prompt (n tokens per sequence) made once and the state allocated once for n positions. A timed call
  is the prompt in chunks of ``prefill_chunk`` (0: one piece), each with its output, into an empty state: emptied
  (``Resettable``), or allocated anew, before each call. Every chunk computes its output, as the one pass does: only
  the last token's is needed for the first new token, but skipping the others' would let a chunked prefill of a
  one-layer model leave out attention a one-pass prefill computes (a deeper stack needs them for its next layer).
- ``verify``: the context of n prefilled for real (in chunks where the family carries its state across them) and the
  k draft tokens made. A timed call is the verify and the rollback to n + r; before each, a rollback to n (r = 0)
  undoes the last. Then each part is timed alone (the other done, untimed, between its calls): their medians are
  ``verify_s`` and ``rollback_s``.
- ``capacity``: the largest batch B whose decode step at context n fits the memory budget (``timing.capacity``), then
  the step timed at B, against a state standing in for n tokens (``Fillable``: a real prefill of B × n tokens could
  take hours, and a step's cost depends on the sizes it reads, not the values).
- ``prefix``: M prompts of n tokens sharing their first P, made once, and the states of both strategies allocated
  once (``families.serving.SharedPrefill``). A timed call is the shared strategy: the first R ≤ P prefix tokens
  prefilled once (a recurrent state checkpointed every ``checkpoint_every`` on the way), the M requests' caches
  reading it by reference and their other states restored from it, then every request's n − R tokens to its first
  token: the time to first token of all M. Then the independent strategy (the M prompts whole) timed the same way
  (``independent_s``). Each strategy's held bytes are measured (every tensor its states and checkpoints hold, once
  however many requests read it: ``prefix_held_bytes``, ``independent_held_bytes``) and given by the family's
  formula where it has one; the first token's output is compared with every request prefilling the prefix itself in
  the same pieces (``prefix_error``), and a case keeping its states as it computes is ``incorrect`` where they
  disagree beyond rounding.
- packed lengths (``forward``, ``train``): the packed call timed; then the same sequences padded to the longest as one
  batch, the whole-sequence call timed the same way (``padded_s``) and the useful tokens per second it reaches
  (``padded_tokens_per_s``), beside the row's own ``tokens_per_s``.

FLOPs are the useful work of what the call answers: a prefill's the whole-sequence forward's over n tokens; a packed
call's each sequence's alone; a capacity step's the decode step's at the batch found; a verify's the k draft tokens'
after n (``families.flops``). Compulsory bytes (``families.traffic``) for a verify and a capacity step (the decode
step's at the batch found), so both get a roofline prediction. A prefix has neither yet.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
from torch import nn

from attnbench.core.cases import SERVING_PARAMS, Case, TimingPolicy
from attnbench.families.catalogue import family_of
from attnbench.families.flops import analytic, count_flops, executed_flops
from attnbench.families.registry import (
    build_model,
    call_context,
    launch_limit,
    make_input,
    parameter_count,
    row_extras,
    torch_dtype,
    torch_family,
)
from attnbench.families.serving import SharedPrefill, chunks
from attnbench.families.state_bytes import state_bytes
from attnbench.families.states import decodable, packed, reset_state, rollback, spans, tensor_bytes, verify
from attnbench.families.torch_family import Unsupported
from attnbench.families.traffic import bytes_moved
from attnbench.host.memory import RssPeak
from attnbench.results.contention import Contention
from attnbench.results.measurement import Measurement
from attnbench.results.records import Memory, Result
from attnbench.results.telemetry import TelemetrySummary
from attnbench.timing.adaptive import Clock, measure, timed_row
from attnbench.timing.capacity import find_capacity, stand_in
from attnbench.timing.clocks import CpuClock, CudaClock

Extra = dict[str, str | int | float | bool | None]
# A decode context fed for real (a verify's) comes in chunks of this many tokens where the family carries its state.
PREFILL_CHUNK = 4096
Timing = tuple[Measurement, TelemetrySummary | None, Contention | None]
Timed = Callable[[Callable[[], object], Case, Extra, Clock], Timing]


def serves(case: Case) -> bool:
    """Whether ``case`` asks a serving question (this module times it) rather than a plain call."""
    return case.mode in SERVING_PARAMS or bool(case.packing)


@dataclass(frozen=True)
class Instruments:
    """What the executor lends: its device, clock, policy and seed, its timing inside the telemetry window
    (``timed``), its peak-memory call (``peak``) and, on a CPU, its resident-memory meter."""

    device: torch.device
    clock: Clock
    policy: TimingPolicy
    seed: int
    timed: Timed
    peak: Callable[[Callable[[], object]], Memory]
    rss: RssPeak | None


class PreparedClock:
    """A clock that runs ``prepare`` before every timed call, untimed: a call that changes what the next one would
    find (a prefill fills its state, a verify moves it on) is put back first, so that every call is the same."""

    def __init__(self, clock: Clock, prepare: Callable[[], object]) -> None:
        self.clock, self.prepare = clock, prepare

    def now(self) -> float:
        return self.clock.now()

    def time(self, fn: Callable[[], object], calls_per_sample: int, samples: int) -> list[float]:
        calls = calls_per_sample * samples
        if isinstance(self.clock, CpuClock | CudaClock):
            # Every call timed alone, the preparation (and a cold flush) queued before its start event: on a GPU one
            # synchronise for the block, not one per call (which put the host's launch latency in each sample).
            each = self.clock.time_each(fn, self.prepare, calls)
        else:  # a clock without per-call events: one call at a time through its own time()
            each = []
            for _ in range(calls):
                self.prepare()
                each += self.clock.time(fn, 1, 1)
        return [sum(each[i : i + calls_per_sample]) / calls_per_sample for i in range(0, calls, calls_per_sample)]


class Setup(Protocol):
    """A serving case set up: the case as timed (capacity: at the batch found), the timed call, the call whose peak
    memory is read (its preparation included), what is timed after (``parts``), and the row's extras."""

    case: Case
    extra: Extra

    def prepare(self) -> None: ...

    def step(self) -> object: ...

    def parts(self, clock: Clock, policy: TimingPolicy) -> Extra: ...


def _median(fn: Callable[[], object], clock: Clock, policy: TimingPolicy) -> float:
    """The median of ``fn`` timed alone, on half the case's budget (a part of the row, not a row)."""
    return measure(fn, clock, replace(policy, max_case_s=policy.max_case_s / 2)).median_s


class PrefillSetup:
    """A prompt of n tokens, and the state it is prefilled into, chunk by chunk (module notes)."""

    def __init__(self, model: nn.Module, case: Case, device: torch.device, dtype: torch.dtype) -> None:
        self.case, self.decoder = case, decodable(model)
        self.prompt = make_input(case, str(device), dtype)  # (B, n, d) or (B, n) ids
        self.state = self.decoder.init_state(case.batch, case.seq_len)
        self.pieces = chunks(case.seq_len, case.param("prefill_chunk"))
        self.extra: Extra = {"prefill_chunks": len(self.pieces), "state_bytes": tensor_bytes(self.state)}

    def prepare(self) -> None:
        if not reset_state(self.state):  # a user's state without reset(): a new one, untimed
            self.state = self.decoder.init_state(self.case.batch, self.case.seq_len)

    def step(self) -> object:
        out = None
        for start, end in self.pieces:
            out = self.decoder.prefill(self.prompt[:, start:end], self.state, output=True)
        return out

    def parts(self, clock: Clock, policy: TimingPolicy) -> Extra:
        return {}


class VerifySetup:
    """A context of n, prefilled for real, and k draft tokens to verify against it (module notes)."""

    def __init__(self, model: nn.Module, case: Case, device: torch.device, dtype: torch.dtype) -> None:
        self.case, self.model, self.decoder = case, model, decodable(model)
        self.draft, self.accept = case.param("draft"), case.param("accept")
        self.drafts = make_input(replace(case, seq_len=self.draft), str(device), dtype)
        self.state = self.decoder.init_state(case.batch, case.span)
        chunk = PREFILL_CHUNK if family_of(case).prefill_carries(case) else 0
        for start, end in chunks(case.seq_len, chunk):
            context = make_input(replace(case, seq_len=end - start), str(device), dtype)
            self.decoder.prefill(context, self.state, output=False)
        self.pending = False  # a verify has moved the state past n
        self.extra: Extra = {"rollback_method": _rollback_methods(model)}

    def verify(self) -> object:
        out = verify(self.model, self.drafts, self.state)
        self.pending = True
        return out

    def rollback(self) -> None:
        rollback(self.model, self.state, self.accept)

    def prepare(self) -> None:
        """Back to the context of n: the last verify rolled back with nothing accepted."""
        if self.pending:
            rollback(self.model, self.state, 0)

    def step(self) -> object:
        out = self.verify()
        self.rollback()
        return out

    def _verified(self) -> None:
        self.prepare()
        self.verify()

    def parts(self, clock: Clock, policy: TimingPolicy) -> Extra:
        verify_s = _median(self.verify, PreparedClock(clock, self.prepare), policy)
        rollback_s = _median(self.rollback, PreparedClock(clock, self._verified), policy)
        self.prepare()
        return {"verify_s": verify_s, "rollback_s": rollback_s}


def _rollback_methods(model: nn.Module) -> str:
    """How the model's layers roll back, as the row records it: each method once, in the order met."""
    methods = [getattr(m, "rollback_method", None) for m in model.modules()]
    found = list(dict.fromkeys(m for m in methods if isinstance(m, str)))
    return "+".join(found) if found else "verifiable"  # a user's model: its own rollback


class CapacitySetup:
    """The batch that fits the budget, found; the state of that many sequences at n and a token to step."""

    def __init__(
        self, model: nn.Module, case: Case, device: torch.device, dtype: torch.dtype, rss: RssPeak | None
    ) -> None:
        self.decoder = decodable(model)
        limit = launch_limit(case, device.type)  # a kernel's grid cap, which no budget can pass (the family knows)
        found = find_capacity(model, case, case.param("memory_budget"), device, dtype, rss, limit)
        batch = found.batch
        self.case = replace(case, batch=batch)  # what the timed step runs (telemetry's tokens per call)
        self.state: Any = stand_in(model, case, batch, device, dtype)  # a decoder's state: what init_state made
        self.token = make_input(replace(case, mode="decode", batch=batch, seq_len=1, serving=()), str(device), dtype)
        self.extra: Extra = {
            "capacity_batch": batch,
            "bytes_per_sequence": found.bytes_per_sequence,
            "memory_budget_bytes": found.budget_bytes,
            "weight_bytes": found.weight_bytes,
            "capacity_method": found.method,
            "capacity_capped": found.capped,
            "capacity_capped_by": found.capped_by,
            "capacity_excluded_bytes": found.excluded_bytes,
            **({"capacity_unsettled": found.unsettled} if found.unsettled else {}),
            "state_bytes": tensor_bytes(self.state),
        }

    def prepare(self) -> None:
        """Nothing: a step leaves a KV cache at n, and a recurrent state (stepped in place, as an engine steps it:
        ``timing.precision.KeptState``) one token on, which costs the next step the same."""

    def step(self) -> object:
        return self.decoder.step(self.token, self.state)

    def parts(self, clock: Clock, policy: TimingPolicy) -> Extra:
        return {}


class PackedSetup:
    """The sequences packed end to end, and the same padded to the longest as one batch (module notes)."""

    def __init__(self, model: nn.Module, case: Case, device: torch.device, dtype: torch.dtype) -> None:
        self.case, self.model, self.lengths = case, model, case.packing
        self.x = make_input(case, str(device), dtype)  # (1, T, d) or (1, T) ids
        padded = replace(case, packing=(), batch=len(case.packing), seq_len=max(case.packing))
        self.padded = make_input(padded, str(device), dtype)
        self.train = case.mode == "train"
        if self.train:
            model.train()
            for x in (self.x, self.padded):
                if x.is_floating_point():  # as a layer inside a network: backward computes dX too
                    x.requires_grad_(True)
            with torch.no_grad():
                self.grad = torch.randn_like(packed(model, self.x, self.lengths))
                self.padded_grad = torch.randn_like(model(self.padded))
        else:
            model.eval()
        self.extra: Extra = {}

    def prepare(self) -> None:
        """Nothing: a call leaves nothing behind (a train call clears the gradients it made)."""

    def _clear(self) -> None:
        self.model.zero_grad(set_to_none=True)
        self.x.grad = self.padded.grad = None

    def step(self) -> object:
        out = packed(self.model, self.x, self.lengths)
        if not self.train:
            return out
        self._clear()
        out.backward(self.grad)
        return None

    def padded_step(self) -> object:
        out = self.model(self.padded)
        if not self.train:
            return out
        self._clear()
        out.backward(self.padded_grad)
        return None

    def parts(self, clock: Clock, policy: TimingPolicy) -> Extra:
        padded_s = _median(self.padded_step, clock, policy)
        self._clear()
        return {"padded_s": padded_s, "padded_tokens_per_s": sum(self.lengths) / padded_s if padded_s > 0 else None}


class PrefixSetup:
    """M prompts sharing a prefix, prefilled the shared way (timed) and independently (a part) (module notes)."""

    def __init__(self, model: nn.Module, case: Case, device: torch.device, dtype: torch.dtype) -> None:
        self.case = case
        requests, prefix = case.param("requests"), case.param("prefix_tokens")
        alone = replace(case, mode="prefill", serving=(), batch=1, seq_len=prefix)
        head = make_input(alone, str(device), dtype)
        tails = make_input(replace(alone, batch=requests, seq_len=case.seq_len - prefix), str(device), dtype)
        prompts = torch.cat([head.expand(requests, *head.shape[1:]), tails], dim=1)
        self.run = SharedPrefill(model, case, head, prompts)
        shared, independent = self.run.held_bytes()
        self.extra: Extra = {
            "prefix_reused": self.run.reused,
            "prefix_checkpoints": len(self.run.checkpoints),
            "prefix_held_bytes": shared,
            "independent_held_bytes": independent,
            **_prefix_formulas(case, self.run.reused, len(self.run.checkpoints)),
        }

    def prepare(self) -> None:
        self.run.reset()

    def step(self) -> object:
        return self.run.shared()

    def first_tokens(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first token's output of every request, shared and unshared (each request computing the prefix
        itself, in the same pieces), each from empty states (untimed)."""
        self.run.reset()
        shared = self.run.shared()[:, -1]
        self.run.reset()
        return shared, self.run.unshared()[:, -1]

    def parts(self, clock: Clock, policy: TimingPolicy) -> Extra:
        return {"independent_s": _median(self.run.independent, PreparedClock(clock, self.run.reset), policy)}


def _prefix_formulas(case: Case, reused: int, checkpoints: int) -> Extra:
    """Each strategy's held bytes by the family's formula, where it has one: independent, the M requests' states at
    n; shared, one prefix state at R, the requests' own at n − R, and a state's bytes (positions aside) per
    checkpoint."""
    requests = case.param("requests")

    def held(batch: int, seq_len: int) -> int | None:
        return state_bytes(replace(case, mode="prefill", serving=(), batch=batch, seq_len=seq_len))

    independent = held(requests, case.seq_len)
    parts = [held(1, reused), held(requests, case.seq_len - reused), held(1, 0)] if reused else [independent, 0, 0]
    if independent is None or any(p is None for p in parts):
        return {}
    prefix, own, one = (p or 0 for p in parts)
    return {"independent_bytes_formula": independent, "prefix_bytes_formula": prefix + own + checkpoints * one}


def _setup(
    case: Case, model: nn.Module, device: torch.device, dtype: torch.dtype, rss: RssPeak | None
) -> PrefillSetup | VerifySetup | CapacitySetup | PackedSetup | PrefixSetup:
    if case.packing:
        return PackedSetup(model, case, device, dtype)
    model.eval()
    with torch.inference_mode():
        if case.mode == "prefill":
            return PrefillSetup(model, case, device, dtype)
        if case.mode == "verify":
            return VerifySetup(model, case, device, dtype)
        if case.mode == "prefix":
            return PrefixSetup(model, case, device, dtype)
        return CapacitySetup(model, case, device, dtype, rss)


def _check_protocols(case: Case, model: nn.Module, setup: Setup, device: torch.device, dtype: torch.dtype) -> None:
    """One checked call of every protocol method a user's model answers the question through, outside the timing
    (issue 50 §3.3: ``forward`` alone was checked, and a ``packed`` returning (1, 1, d) or float64, a ``verify``
    returning None, a rollback leaving a state of another batch, a capacity ``step`` returning (B, 2, d) or a
    prefill chunk's (B, 1, d) were timed as ``ok``). Each output must be a tensor of the shape the call promises,
    in the case's dtype, on the case's device (the family's ``check_output``: its error is the row's reason); and where
    the question promises an equality, it holds at the case's size: packed = each sequence alone, and after a
    rollback = the accepted drafts decoded for real (a packed call that ignores the boundaries, a rollback that does
    nothing)."""
    d = case.d_model
    if isinstance(setup, PackedSetup):
        with torch.no_grad():
            out = packed(model, setup.x, setup.lengths)
            torch_family(case).check_output(case, out, (1, sum(setup.lengths), d), device)
            alone = torch.cat([model(setup.x[:, start:end]) for start, end in spans(setup.lengths)], dim=1)
            _agree(case, "packed", out, alone, "each sequence run alone")
    elif isinstance(setup, PrefillSetup):
        setup.prepare()
        for start, end in setup.pieces:
            chunk = setup.decoder.prefill(setup.prompt[:, start:end], setup.state, output=True)
            torch_family(case).check_output(case, chunk, (case.batch, end - start, d), device)
        setup.prepare()
    elif isinstance(setup, CapacitySetup):
        torch_family(case).check_output(case, setup.step(), (setup.case.batch, 1, d), device)
    elif isinstance(setup, VerifySetup):
        _check_rollback(case, model, setup, device, dtype)


def _check_rollback(case: Case, model: nn.Module, setup: VerifySetup, device: torch.device, dtype: torch.dtype) -> None:
    """On states of their own (the timed calls start where the setup's stands): a verify, its rollback to n + r, and
    a verify after it must match the same verify after n + r tokens prefilled for real."""
    decoder, k, r = decodable(model), setup.draft, setup.accept
    context = make_input(case, str(device), dtype)
    drafts = setup.drafts
    chunk = PREFILL_CHUNK if family_of(case).prefill_carries(case) else 0

    def prefilled() -> Any:
        state = decoder.init_state(case.batch, case.seq_len + 2 * k)  # room for a verify after the rollback
        for start, end in chunks(case.seq_len, chunk):
            decoder.prefill(context[:, start:end], state, output=False)
        return state

    expected = (case.batch, k, case.d_model)
    rolled = prefilled()
    torch_family(case).check_output(case, verify(model, drafts, rolled), expected, device)
    rollback(model, rolled, r)
    after = verify(model, drafts, rolled)
    # A rollback that left a state of another batch (or none a verify can continue) shows in the next call.
    torch_family(case).check_output(case, after, expected, device)
    decoded = prefilled()
    if r:
        decoder.prefill(drafts[:, :r], decoded, output=False)
    _agree(case, f"a verify after rollback({r})", after, verify(model, drafts, decoded), f"{r} drafts prefilled")


def _difference(got: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    """The largest |got − reference| and what it may reach: the dtype's rounding (a float32 call's, or a 16-bit
    one's) scaled by the reference's size."""
    tolerance = 1e-3 if got.dtype in (torch.float32, torch.float64) else 5e-2
    scale = max(1.0, float(reference.abs().max()))
    return float((got.float() - reference.float()).abs().max()), tolerance * scale


def _agree(case: Case, what: str, got: torch.Tensor, reference: torch.Tensor, against: str) -> None:
    """UserModelError unless ``got`` matches ``reference`` within the case's dtype's tolerance (``_difference``)."""
    error, allowed = _difference(got, reference)
    if not error <= allowed:  # NaN included
        message = f"{what} differs from {against} by {error:.3g} (tolerance {allowed:.3g})"
        raise torch_family(case).disagrees(case, message)


def _prefix_error(case: Case, shared: torch.Tensor, independent: torch.Tensor) -> tuple[float, str | None]:
    """The largest difference between the requests' first tokens shared and unshared, and why the row is
    incorrect where they differ beyond the dtype's rounding (``_agree``'s tolerance). A case keeping a narrower cache
    or state is exempt: each strategy quantises its own tensors (an int8 scale set by what it first wrote), so they
    differ by that rounding, which the row shows."""
    error, allowed = _difference(shared, independent)
    narrower = case.kept_dtype("kv_dtype") is not None or case.kept_dtype("state_dtype") is not None
    if error <= allowed or (narrower and math.isfinite(error)):
        return error, None
    return error, (
        f"the first token after a shared prefix differs from the requests' own prefill's by {error:.3g} (tolerance "
        f"{allowed:.3g}): sharing changed the answer"
    )


def _work(case: Case, setup: Setup, extra: Extra) -> None:
    """The useful FLOPs of what the call answers (module notes), where the family has a formula."""
    if not analytic(case) or case.mode == "prefix":
        return
    if case.packing:
        parts = [replace(case, packing=(), batch=1, seq_len=length) for length in case.packing]
    elif case.mode == "prefill":
        parts = [replace(case, mode="forward", serving=())]
    elif case.mode == "verify":
        parts = [case]
    else:
        parts = [replace(setup.case, mode="decode", serving=())]
    counts = [count_flops(part) for part in parts]
    extra["flops"], extra["flops_formula"] = sum(c.flops for c in counts), counts[0].formula
    extra["executed_flops"] = sum(executed_flops(p, extra) for p in parts)


def _traffic(case: Case, setup: Setup, parameters: int | None, extra: Extra) -> None:
    """The compulsory bytes of a verify, or of a capacity row's decode step at the batch found (module notes)."""
    held = extra.get("state_bytes")
    if case.mode == "verify":
        traffic = bytes_moved(case, parameters)
    elif case.mode == "capacity" and isinstance(held, int):
        traffic = bytes_moved(replace(setup.case, mode="decode", serving=()), parameters, held)
    else:
        return
    if traffic is not None:
        extra["bytes_moved"], extra["bytes_formula"] = traffic


def measure_serving(case: Case, tools: Instruments, on_timed: Callable[[Result], None] | None = None) -> Result:
    """Build, set up and time ``case``'s serving question; its row."""
    if tools.policy.cuda_graph and tools.device.type == "cuda":
        return Result(case, "unsupported", "cuda_graph replays one fixed call; the serving questions time eager calls")
    torch.manual_seed(tools.seed)
    dtype = torch_dtype(case.dtype)
    try:
        model = build_model(case, str(tools.device), dtype)
    except Unsupported as exc:  # said while building: a user's model without the protocol the question needs
        return Result(case, "unsupported", str(exc))
    extra: Extra = {"torch_threads": torch.get_num_threads(), **row_extras(case, str(tools.device))}
    try:
        setup = _setup(case, model, tools.device, dtype, tools.rss)
    except ValueError as exc:  # no budget to measure against here: the question cannot be asked
        if case.mode != "capacity":
            raise
        return Result(case, "unsupported", str(exc))
    if not torch_family(case).trusted:  # a user's model: every protocol call checked once, untimed
        with torch.inference_mode(), call_context(case, model):
            _check_protocols(case, model, setup, tools.device, dtype)
    if isinstance(setup, PrefixSetup):  # sharing must not change the answer: the first tokens held to each other
        with torch.inference_mode(), call_context(case, model):
            error, wrong = _prefix_error(case, *setup.first_tokens())
        if wrong is not None:
            return Result(case, "incorrect", wrong)
        extra["prefix_error"] = error
    grad = contextlib.nullcontext if case.mode == "train" else torch.inference_mode
    clock = PreparedClock(tools.clock, setup.prepare)
    with grad(), call_context(case, model):
        if tools.device.type == "cuda":
            torch.cuda.synchronize(tools.device)
        measurement, telemetry, contention = tools.timed(setup.step, setup.case, extra, clock)
        extra.update(setup.parts(tools.clock, tools.policy))

        def eager() -> object:
            setup.prepare()
            return setup.step()

        memory = tools.peak(eager)
    extra.update(setup.extra)
    _work(case, setup, extra)
    parameters = parameter_count(model)
    if case.mode == "capacity":
        held = state_bytes(replace(setup.case, mode="decode", serving=()))
        extra["state_bytes"] = held if held is not None else extra.get("state_bytes")
    _traffic(case, setup, parameters, extra)
    result = timed_row(
        case,
        measurement,
        memory=memory,
        parameters=parameters,
        extra=dict(extra),
        telemetry=telemetry,
        contention=contention,
    )
    if on_timed is not None:
        on_timed(result)
    return result
