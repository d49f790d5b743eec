"""Runs one ``Case`` on a torch device and returns its ``Result``.

Everything that is not the work itself — building the model, making inputs, probing the backend — happens
outside the timed region. Failures become rows: an OOM is ``oom``, a backend that cannot run is
``unsupported``, anything else is ``error`` with the exception named. KeyboardInterrupt is not caught: the sweep
loop owns what happens on Ctrl-C. Nor is SystemExit, except from a user model (its ``sys.exit(n)`` is its row's
``error``). What a case sets for the whole process (torch's threads, default dtype, backends) is undone after it.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Literal

import torch
from torch import nn

from attnbench.core.cases import CacheState, Case, Level
from attnbench.families.catalogue import family_of
from attnbench.families.flops import COUNTED_FORMULA, analytic, count_flops, executed_flops
from attnbench.families.registry import (
    build_model,
    call_context,
    make_input,
    parameter_count,
    prepare_process,
    probe,
    row_extras,
    torch_dtype,
    torch_family,
)
from attnbench.families.torch_family import Unsupported
from attnbench.families.traffic import bytes_moved
from attnbench.host.busy import ContentionWatch
from attnbench.host.memory import RssPeak
from attnbench.host.sensors import open_telemetry
from attnbench.results.contention import Contention
from attnbench.results.files import utc_now
from attnbench.results.measurement import Measurement
from attnbench.results.numerics import NumericCheck
from attnbench.results.records import Memory, Result
from attnbench.results.telemetry import TelemetrySummary
from attnbench.timing.adaptive import Clock, measure, timed_row
from attnbench.timing.clocks import CpuClock, CudaClock, clock_for, cpu_flusher
from attnbench.timing.compiled import (
    CompileWatch,
    compile_mode,
    fresh,
    is_compiler_failure,
    replayable_backward,
    uses_cudagraphs,
    wrap,
)
from attnbench.timing.counting import Counted, count_call
from attnbench.timing.decode_setup import DecodeSetup
from attnbench.timing.executor import ExecutorSettings, detach_cupti_after_profiling
from attnbench.timing.failures import describe, is_oom
from attnbench.timing.gpu_timing import graphed, l2_flusher, launch_bound, profile_kernels, profile_refusal
from attnbench.timing.precision import keeping, kept_error
from attnbench.timing.process_warmup import warm_process
from attnbench.timing.profiling import TRACES, nvtx_range, trace_name, trace_refusal, write_trace
from attnbench.timing.reference_check import check_size, run_check
from attnbench.timing.serving import Instruments, measure_serving, serves
from attnbench.timing.torch_state import KeptTorchState


class TorchExecutor:
    """Times cases on one device with one timing policy."""

    def __init__(self, settings: ExecutorSettings) -> None:
        self.settings = settings
        self.device = torch.device(settings.device)
        self.policy = settings.timing
        self.inject_slowdown = settings.inject_slowdown
        self.seed = settings.seed
        self.telemetry: Level = settings.telemetry
        self.telemetry_interval_s = settings.interval_s
        if settings.threads is not None:
            torch.set_num_threads(settings.threads)
        prepare_process()  # every family's process-wide settings (SDPA's math path in the row's dtype, …)
        detach_cupti_after_profiling()  # in-process too: a profile must not slow the cases after it
        self._clocks: dict[CacheState, CpuClock | CudaClock] = {"warm": clock_for(self.device)}
        # torch's import leaves ~170 000 long-lived objects that every full collection would walk (~0.1 s, twice
        # per case: a quarter of a small case's cost). Freezing them keeps gc.collect() to this run's garbage.
        gc.freeze()
        # The numerical checks this executor ran, by the key of the check-sized case: one serves every length at or
        # above the check's (the check's cost is then per model, options, dtype and mode, not per case).
        self._checks: dict[str, NumericCheck] = {}
        self._case_check: NumericCheck | None = None  # the running case's, for a row its exception makes
        self.broken = ""  # why no case can run any more (the CUDA context died), or "" while it can
        self._process_warmup_s: float | None = None  # None: the process warm-up has not run yet
        self._host_memory: RssPeak | None = None
        self._host_memory_note = ""
        if self.device.type == "cpu":
            probe_result = RssPeak.probe()
            if probe_result.available:
                self._host_memory = RssPeak()
            else:
                self._host_memory_note = probe_result.reason

    def run(self, case: Case, *, on_timed: Callable[[Result], None] | None = None) -> Result:
        """Measure ``case``. ``on_timed`` (an isolated worker's pipe) gets the row as soon as its timing and
        memory exist, before the profiled call adds kernel counts: a slow profile cannot cost the timing."""
        started, t0 = utc_now(), time.perf_counter()
        if self.broken:
            return Result(case, "error", f"not run: {self.broken}", started_utc=started)

        def stamped(result: Result) -> Result:
            return replace(result, started_utc=started, duration_s=time.perf_counter() - t0)

        early = None if on_timed is None else lambda result: on_timed(stamped(result))
        kept = KeptTorchState()
        self._case_check = None
        try:
            first = None
            if self._process_warmup_s is None:  # before the first case only: see measure.process_warmup
                try:
                    self._process_warmup_s = first = warm_process(self.device, self.policy.process_warmup_s)
                except Exception:
                    # A device that cannot run the warm-up cannot run the case either: the case's own error,
                    # not the warm-up's, is the one its row should carry.
                    self._process_warmup_s = 0.0
            reason = self._policy_problem(case) or probe(case, str(self.device))
            with kept:  # what a model sets for the whole process (threads, dtype, backends) ends with its case
                result = Result(case, "unsupported", reason) if reason is not None else self._checked(case, early)
            if first is not None and result.ok:  # the row says its process was warmed up just before it
                result = replace(result, extra={**result.extra, "process_warmup_s": first})
        except Exception as exc:  # every failure of the work becomes a row; Ctrl-C is BaseException
            result = Result(case, "oom" if is_oom(exc) else "error", describe(exc))
        except BaseException as exc:
            # A user model's sys.exit(n) ends its row, not the sweep: its family says so.
            reason = torch_family(case).exited(case, exc) if isinstance(exc, SystemExit) else None
            if reason is None:
                with contextlib.suppress(Exception):  # Ctrl-C propagates whatever state the device is in
                    self._release()
                raise
            result = Result(case, "error", reason)
        if result.check is None and self._case_check is not None:  # a case that raised after its check passed
            result = replace(result, check=self._case_check)
        failure = self._release()
        if failure is not None:
            result = self._retire(result, failure)
        if kept.changed:
            result = replace(result, extra={**result.extra, "torch_state_changed": "; ".join(kept.changed)})
        return stamped(result)

    def close(self, *, now: bool = False) -> None:
        """Nothing to stop in-process: return what the last case left behind, and hand the objects frozen at the
        start back to the collector (in a caller's process they are the caller's); ``now`` (the process is about
        to exit, maybe from a signal handler) does nothing at all."""
        if not now:
            self._release()
            gc.unfreeze()

    def _retire(self, result: Result, failure: str) -> Result:
        """The device failed after the case's work (a sticky CUDA error: every later call raises it again).

        The row becomes ``error`` and keeps the case's own reason when it has one (the first report of the fault,
        not its echo); this executor refuses every later case, and an isolated worker retires."""
        case = result.case
        self.broken = (
            f"the CUDA context has been unusable since {case.key} ({failure}); only a new process recovers, "
            "which isolation (the CUDA default) gives the next case"
        )
        if result.status == "error":
            return result
        ended = "" if result.ok else f", which ended {result.status}: {result.reason}"
        return Result(case, "error", f"{failure} (releasing the device after the case{ended})")

    def _policy_problem(self, case: Case) -> str | None:
        """Why this timing policy cannot time the case, found before any model is built."""
        if self.device.type == "cuda" and self.policy.cuda_graph and case.mode not in ("forward", "decode"):
            return "cuda_graph replays forward passes and decode steps only; time train and backward without it"
        return None

    def _release(self) -> str | None:
        """Return what the last case left behind; the error if the device failed doing so, else None."""
        # After an OOM the failed case's tensors are still referenced from the traceback frames until the
        # exception is gone; collect them and return cached blocks so the next case starts clean.
        gc.collect()
        if self.device.type != "cuda" or not torch.cuda.is_initialized():
            return None
        try:
            # An asynchronous fault of the case's kernels surfaces here; a sticky one raises at every call.
            torch.cuda.synchronize(self.device)
            torch.cuda.empty_cache()
        except Exception as exc:
            return describe(exc)
        return None

    def _checked(self, case: Case, on_timed: Callable[[Result], None] | None = None) -> Result:
        """The numerical check first (``timing.reference_check``), once per check-sized case in this executor; a
        case whose output is off its reference is ``incorrect`` and never timed; any other carries its check."""
        if not self.settings.check:
            check = NumericCheck("skipped", reason="the numerical check was turned off (check: off, sweep --no-check)")
        else:
            key = check_size(case).key
            if key in self._checks:
                check = replace(self._checks[key], duration_s=0.0)  # ran for an earlier row: it cost this one nothing
            else:
                started = time.perf_counter()
                check = run_check(case, self.device, self.seed)
                check = self._checks[key] = replace(check, duration_s=time.perf_counter() - started)
        self._case_check = check
        if check.failed:
            reason = f"output off its reference ({check.reference}): {check.reason}"
            return Result(case, "incorrect", reason, check=check)
        early = None if on_timed is None else lambda result: on_timed(replace(result, check=check))
        # Every state the case allocates is kept as it asks (kv_dtype, state_dtype): every stateful mode. A capacity
        # row steps its recurrent states as an engine does, in place (``KeptState``), whatever their dtype, so that
        # the state's bytes, not the measure's next-state buffers, decide how many sequences fit.
        layout = family_of(case).page_layout(case)  # KV pages and state slots: a hybrid's may be aligned
        kept = (case.kept_dtype("kv_dtype"), case.kept_dtype("state_dtype"), *layout)
        with keeping(*kept, in_place=case.mode == "capacity"):
            result = replace(self._measure(case, early), check=check)
        if result.ok and case.kept:  # what the narrower state costs in accuracy, beside what it saves in time
            result = replace(result, extra={**result.extra, **kept_error(case, self.device, self.seed)})
        return result

    def _measure(self, case: Case, on_timed: Callable[[Result], None] | None = None) -> Result:
        if serves(case):  # capacity, prefill, verify, prefix, packed lengths: set up and timed by timing.serving
            clock = self._clock(self.policy.cache_for(case.mode))
            tools = Instruments(
                self.device, clock, self.policy, self.seed, self._timed_with_telemetry, self._peak_memory,
                self._host_memory,
            )  # fmt: skip
            return measure_serving(case, tools, on_timed)
        mode = compile_mode(torch_family(case).compile_option(case))
        compiling = mode is not None or torch_family(case).compiled(case)
        if compiling:
            fresh()  # no graph of an earlier case serves this one (attnbench.timing.compiled)
        try:
            with replayable_backward(case.mode, compiling):
                return self._measure_built(case, mode, compiling, on_timed)
        except Unsupported as exc:  # said while building: a user model asked for what it does not have
            return Result(case, "unsupported", str(exc))

    def _measure_built(
        self, case: Case, mode: str | None, compiling: bool, on_timed: Callable[[Result], None] | None
    ) -> Result:
        """The case built, set up, (compiled,) timed and measured; ``mode`` is its torch.compile mode or None."""
        torch.manual_seed(self.seed)
        dtype = torch_dtype(case.dtype)
        model = build_model(case, str(self.device), dtype)
        extra: dict[str, str | int | float | bool | None] = {"torch_threads": torch.get_num_threads()}
        # What the family records of the implementation that runs: which kernel dispatch chose, the RNN path, …
        extra.update(row_extras(case, str(self.device)))
        extra.update(formula_extras(case, extra))

        x: torch.Tensor | None = None
        decode: DecodeSetup | None = None
        if case.mode == "decode":
            decode = DecodeSetup(model, case, self.device, dtype, compile_mode=mode)
            grad_mode: Callable[[], contextlib.AbstractContextManager[object]] = torch.inference_mode
            step = decode.step
        else:
            x = make_input(case, str(self.device), dtype)
            grad_mode, step = _whole_sequence(case, model, x, model if mode is None else wrap(model, mode))
        if not torch_family(case).trusted:  # a user's model: its first call is checked, and what it does counted
            with grad_mode(), call_context(case, model):
                _check_call(case, model, x, decode)
                if not analytic(case):
                    extra.update(counted_extras(count_call(step)))

        # What the family sets around a call (a forced SDPA backend) is set once around every call below.
        with grad_mode(), call_context(case, model):
            watch = CompileWatch(mode or "default") if compiling else None
            if watch is not None:
                refusal = self._compile(case, watch, step)
                if refusal is not None:
                    return refusal
                extra.update(watch.extra)
            timed = step
            if self.device.type == "cuda":
                if self.policy.cuda_graph:  # forward and decode: run() refused the others before any setup
                    timed = graphed(step, self.device)
                    extra["cuda_graph"] = True
                torch.cuda.synchronize(self.device)  # setup's queued kernels must not land in the telemetry window
            measurement, telemetry, contention = self._timed_with_telemetry(timed, case, extra)
            if watch is not None:
                flagged = watch.after_timing()
                extra.update(watch.extra)
                measurement = replace(measurement, warnings=(*measurement.warnings, *flagged))
            model.zero_grad(set_to_none=True)
            if x is not None:
                x.grad = None
            memory = self._peak_memory(self._memory_call(case, model, x, decode, step, mode, extra))
            if decode is not None:
                extra.update(decode.extra)  # the computed state and the prefill, in the early row too
            parameters = parameter_count(model)
            state = extra.get("state_bytes")
            traffic = bytes_moved(case, parameters, state if isinstance(state, int) else None)
            if traffic is not None:
                extra["bytes_moved"], extra["bytes_formula"] = traffic
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
                on_timed(result)  # the timing is safe whatever the profile below does
            if self.device.type == "cuda":
                self._profile(timed, measurement, extra)
            if self.settings.trace_dir is not None and result.ok:
                self._trace(case, timed, measurement, extra)
        if decode is not None:
            decode.release()  # after the profile, which still steps: measures the state, then frees it
            extra.update(decode.extra)
        return replace(result, extra=extra)

    def _memory_call(
        self,
        case: Case,
        model: nn.Module,
        x: torch.Tensor | None,
        decode: DecodeSetup | None,
        step: Callable[[], object],
        mode: str | None,
        extra: dict[str, str | int | float | bool | None],
    ) -> Callable[[], object]:
        """The call whose peak memory the row reports, made after the timing: the timed step itself (never its CUDA
        graph replay: ``cuda_graph``'s pool would read about 0), except a compiled step under CUDA graphs, whose
        replays run in the graph's private pool too. That one is stood in for by the eager model, built only now: a
        backward row's eager forward keeps its saved activations alive while it exists, and built before the timing
        they sat beside the compiled graph's own through every timed call. A compiled row says which it measured."""
        source = peak_memory_source(mode, self.device.type)
        if mode is not None:
            extra["peak_mem_from"] = source
        if source == "compiled":
            return step
        if decode is not None:
            return decode.eager_step
        assert x is not None  # a whole-sequence case has its input
        return _whole_sequence(case, model, x, model)[1]

    def _compile(self, case: Case, watch: CompileWatch, step: Callable[[], object]) -> Result | None:
        """The first, compiling call, outside the timing; an ``unsupported`` row if the compiler cannot run here."""

        def synchronize() -> None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)

        try:
            watch.first_call(step, synchronize)
        except Exception as exc:
            # NotImplementedError: a kernel that does not exist here (flex's backward on a CPU), which a model
            # whose first compiled call is its probe meets here rather than in the probe.
            if is_oom(exc) or not (is_compiler_failure(exc) or isinstance(exc, NotImplementedError)):
                raise
            compiled_model = torch_family(case).compile_option(case) != "none"
            what = f"torch.compile(mode={watch.mode})" if compiled_model else f"{case.model}'s compiled kernel"
            if isinstance(exc, NotImplementedError) and not is_compiler_failure(exc):
                return Result(case, "unsupported", f"{case.model}: no {case.mode} kernel here: {describe(exc)}")
            return Result(case, "unsupported", f"{what} cannot compile {case.model} here: {describe(exc)}")
        return None

    def _clock(self, cache: CacheState) -> CpuClock | CudaClock:
        """The clock for a case timed in ``cache``: cold flushes the last-level cache before every sample (a
        sample is one call then), the GPU's L2 (4× its size, ≥ 256 MiB) or the CPU's (a read and write of twice
        its size), made on the first cold case and kept."""
        if cache not in self._clocks:
            flush = l2_flusher(self.device, self.policy.flush) if self.device.type == "cuda" else cpu_flusher()
            self._clocks[cache] = clock_for(self.device, flush=flush)
        return self._clocks[cache]

    def _timed_with_telemetry(
        self,
        step: Callable[[], object],
        case: Case,
        extra: dict[str, str | int | float | bool | None],
        clock: Clock | None = None,
    ) -> tuple[Measurement, TelemetrySummary | None, Contention | None]:
        """Time ``step`` inside the telemetry window (warm-up included, and counted in the calls), watched for
        contention over the same calls, in the cache state the policy gives its mode (the row says which); on
        ``clock`` where given (one that puts a serving call's state back between calls, around this cache state's
        clock), else the cache state's own. A failure of the telemetry itself costs the row its telemetry, never its
        measurement."""
        cache = self.policy.cache_for(case.mode)
        extra["cache"] = cache
        if case.key in self.settings.decided_ok:
            extra["budget_decided"] = True
        policy = replace(self.policy, cache=cache)
        measurement: Measurement | None = None
        watch = ContentionWatch(str(self.device), torch.get_num_threads())  # NVML opened outside the window
        try:
            with open_telemetry(str(self.device), self.telemetry, self.telemetry_interval_s) as sampler, watch:
                measurement = measure(
                    step,
                    clock or self._clock(cache),
                    policy,
                    inject_slowdown=self.inject_slowdown,
                    on_sampling=sampler.mark_sampling,
                    timed=self._nvtx(case, extra),
                    once=self.settings.run_once,
                    decided=case.key in self.settings.decided_ok,
                )
            calls = measurement.warmup_calls + len(measurement.samples_s) * measurement.calls_per_sample
            return measurement, sampler.summary(calls=calls, tokens_per_call=case.tokens), watch.result()
        except Exception as exc:  # the workload's own failures propagate; only telemetry's are absorbed
            if measurement is None:
                raise
            extra["telemetry_error"] = describe(exc)
            return measurement, None, watch.result() if watch.done else None

    def _nvtx(
        self, case: Case, extra: dict[str, str | int | float | bool | None]
    ) -> Callable[[Callable[[], object]], Callable[[], object]] | None:
        """The NVTX wrapper of the timed calls (sweep --nvtx, on a GPU), or None; the row says it was there (about
        a microsecond of host time per call) or why torch could not make one."""
        if not self.settings.nvtx or self.device.type != "cuda":
            return None
        try:
            wrap = nvtx_range(case.key)
        except Exception as exc:
            extra["nvtx_error"] = describe(exc)
            return None
        extra["nvtx"] = True
        return wrap

    def _profile(
        self, step: Callable[[], object], measurement: Measurement, extra: dict[str, str | int | float | bool | None]
    ) -> None:
        """Kernels per call and launch-boundness, from one profiled call outside the timed samples. The profiler
        is an aid: when it fails (CUPTI busy or missing) or a call is too long to profile cheaply, the row keeps
        its timing and says why."""
        skipped = profile_refusal(measurement.median_s)
        if skipped is not None:
            extra["profile_skipped"] = skipped
            return
        try:
            kernels = profile_kernels(step, self.device)
        except Exception as exc:
            extra["profile_error"] = describe(exc)
            return
        extra["kernels_per_call"] = kernels.kernels
        extra["kernel_busy_s"] = kernels.busy_s
        extra["launch_bound"] = launch_bound(measurement.median_s, kernels.busy_s)

    def _trace(
        self,
        case: Case,
        step: Callable[[], object],
        measurement: Measurement,
        extra: dict[str, str | int | float | bool | None],
    ) -> None:
        """One more call under the profiler, written as a Chrome trace (sweep --profile); the row names the file,
        relative to its run folder. As with the kernel count, a failure costs the row its trace only."""
        assert self.settings.trace_dir is not None
        kernels = extra.get("kernels_per_call")  # counted by the profile just before, on a GPU
        counted = kernels if isinstance(kernels, int) and not isinstance(kernels, bool) else None
        skipped = trace_refusal(measurement.median_s, counted, gpu=self.device.type == "cuda")
        if skipped is not None:
            extra["trace_skipped"] = skipped
            return
        name = trace_name(case)
        try:
            write_trace(step, self.device, Path(self.settings.trace_dir), name)
        except Exception as exc:
            extra["trace_error"] = describe(exc)
            return
        extra["trace"] = f"{TRACES}/{name}"

    def _peak_memory(self, step: Callable[[], object]) -> Memory:
        """One extra call, outside the timed samples, with the device's peak counter reset before it."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            baseline = torch.cuda.memory_allocated(self.device)
            step()
            torch.cuda.synchronize(self.device)
            peak = torch.cuda.max_memory_allocated(self.device) - baseline
            return Memory(int(peak), "cuda-allocator")
        if self._host_memory is None:
            return Memory(None, "unavailable", self._host_memory_note)
        self._host_memory.start()
        step()
        return Memory(self._host_memory.peak_bytes(), RssPeak.method)


def peak_memory_source(mode: str | None, device_type: str) -> Literal["compiled", "eager"]:
    """Which call a row's peak memory comes from: the compiled one it timed, or an eager stand-in where the compile
    ``mode`` records CUDA graphs on a CUDA device (a replay allocates from the graph's private pool, so the device's
    peak counter hardly moves). Eager rows measure their own call: "compiled" means the timed step."""
    return "eager" if device_type == "cuda" and uses_cudagraphs(mode) else "compiled"


def _whole_sequence(
    case: Case, model: nn.Module, x: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[Callable[[], contextlib.AbstractContextManager[object]], Callable[[], object]]:
    """The grad mode and the timed call of a forward, train or backward case over the whole input ``x``; ``run``
    is the model's call (the model itself, or compiled)."""
    if case.mode == "forward":
        model.eval()

        def forward() -> object:
            return run(x)

        return torch.inference_mode, forward
    model.train()
    # The input needs a gradient as a layer inside a network would: backward then computes dX too.
    if x.is_floating_point():
        x.requires_grad_(True)
    if case.mode == "train":
        with torch.no_grad():
            grad_out = torch.randn_like(model(x))

        def train() -> object:
            model.zero_grad(set_to_none=True)
            x.grad = None
            out = run(x)
            out.backward(grad_out)
            return None

        return contextlib.nullcontext, train
    # backward alone: one forward builds the graph outside the timed region; each call replays its backward
    # (retain_graph keeps the saved tensors), with grads cleared as train clears them.
    graph_out = run(x)
    grad_backward = torch.randn_like(graph_out)

    def backward() -> object:
        model.zero_grad(set_to_none=True)
        x.grad = None
        graph_out.backward(grad_backward, retain_graph=True)
        return None

    return contextlib.nullcontext, backward


def _check_call(case: Case, model: nn.Module, x: torch.Tensor | None, decode: DecodeSetup | None) -> None:
    """One call of a model only its factory knows, outside the timing: it must keep the input's shape, in the
    case's dtype, on the case's device."""
    family = torch_family(case)
    with torch.no_grad():
        if decode is not None:
            family.check_output(case, decode.step(), (case.batch, 1, case.d_model), decode.device)
        elif x is not None:
            expected = (*x.shape, case.d_model) if not x.is_floating_point() else tuple(x.shape)
            family.check_output(case, model(x), expected, x.device)


def formula_extras(case: Case, extra: Mapping[str, object]) -> dict[str, str | int | float | bool | None]:
    """What a row of a model with a FLOP formula stores of it, given the row's extras so far (what ran): none for a
    model without one."""
    if not analytic(case):
        return {}
    # Stored with the formula's id, so a later change of formula never silently changes an old row.
    work = count_flops(case)
    # A causal core that masks after computing does the full n² (pct_of_peak stays on the useful count).
    return {"flops": work.flops, "flops_formula": work.formula, "executed_flops": executed_flops(case, extra)}


def counted_extras(counted: Counted) -> dict[str, str | int | float | bool | None]:
    """What a row of a model with no formula of its own stores of its counted call: the FLOPs and their formula, or
    none and why (``attnbench.timing.counting``)."""
    if counted.flops is None:
        return {"flops_uncounted": counted.reason}
    return {"flops": counted.flops, "executed_flops": counted.flops, "flops_formula": COUNTED_FORMULA}
