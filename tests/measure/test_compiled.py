"""torch.compile and the compiled cores in the executor (issue 14): compiled before the timing, its time stored
apart, recompilations counted, and a compiler that cannot run here an ``unsupported`` row.

Real compilation on tiny shapes (a few seconds each with a warm inductor cache); the broken compiler is a real
one too: inductor pointed at a C++ compiler that does not exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from attnbench.timing.compiled import CompileWatch, fresh, is_compiler_failure
from tests.measure.test_torch_executor import executor
from tests.support import ROOT, mentions, tiny_case


@pytest.mark.parametrize("mode", ["forward", "train", "backward", "decode"])
@pytest.mark.slow
def test_a_compiled_row_records_its_compile_time_apart_and_no_recompilation(mode: str) -> None:
    case = tiny_case("sdpa", mode=mode, seq_len=32, d_model=32, heads=4, causal=True, compile="default", heads_kv=2)
    result = executor().run(case)
    assert result.status == "ok", result.reason
    assert isinstance(result.extra["compile_s"], float) and result.extra["compile_s"] > 0
    assert result.extra["compile_mode"] == "default" and int(result.extra["compile_graphs"] or 0) >= 1
    assert result.extra["recompiles"] == 0
    assert result.extra["gqa_path"] == "enable_gqa"
    assert not any("recompiled" in w for w in result.measurement.warnings)  # type: ignore[union-attr]


@pytest.mark.slow
def test_an_lstm_that_dynamo_cannot_capture_says_its_timing_is_eager() -> None:
    result = executor().run(tiny_case("lstm", seq_len=16, compile="default"))
    assert result.status == "ok"
    assert result.extra["compile_graphs"] == 0
    assert any("captured no graph" in w for w in result.measurement.warnings)  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_recompilation_during_the_timing_is_counted_and_flagged() -> None:
    fresh()
    shapes = iter([torch.randn(2, 3), torch.randn(2, 3)] + [torch.randn(n, 5) for n in range(3, 40)])
    compiled = torch.compile(lambda x: x.sin() + 1)
    watch = CompileWatch("default")
    watch.first_call(lambda: compiled(next(shapes)), lambda: None)
    compiled(next(shapes))  # same shape: the graph serves it
    assert watch.after_timing() == [] or watch.extra["recompiles"] == 0
    for _ in range(3):
        compiled(next(shapes))  # a new shape: a guard fails, dynamo compiles again
    warnings = watch.after_timing()
    assert int(watch.extra["recompiles"] or 0) >= 1 and any("recompiled during timing" in w for w in warnings)


_BROKEN_COMPILER = """
import json
import torch._inductor.config as inductor
inductor.cpp.cxx = ("/nonexistent/g++",)
inductor.force_disable_caches = True  # a warm cache must not hide the missing compiler
from tests.measure.test_torch_executor import executor
from tests.support import ROOT, tiny_case
# minGRU's scan is element-wise work inductor must generate C++ for (attention alone may lower to library calls
# and need no compiler at all).
result = executor().run(tiny_case("mingru", seq_len=16, d_model=16, compile="default"))
print(json.dumps([result.status, result.reason]))
"""


@pytest.mark.slow
def test_a_compiler_that_cannot_run_makes_the_row_unsupported_with_its_reason() -> None:
    # In a process of its own: inductor remembers what it found out about the C++ compiler.
    done = subprocess.run(
        [sys.executable, "-c", _BROKEN_COMPILER], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    status, reason = json.loads(done.stdout.strip().splitlines()[-1])
    assert status == "unsupported", reason
    assert mentions(reason, "mode=default", "mingru")
    assert "compiler" in reason.lower()


def test_a_model_error_under_compile_is_not_mistaken_for_the_compiler() -> None:
    assert not is_compiler_failure(RuntimeError("shapes do not match"))
    from torch._dynamo.exc import BackendCompilerFailed

    try:
        raise BackendCompilerFailed.__new__(BackendCompilerFailed)
    except BackendCompilerFailed as exc:
        assert is_compiler_failure(exc)


@pytest.mark.parametrize("mode", ["forward", "decode", "train"])
@pytest.mark.slow
def test_flex_runs_compiled_forward_and_decode_on_cpu_and_says_why_not_train(mode: str) -> None:
    case = tiny_case("flex", mode=mode, seq_len=64, d_model=32, heads=4, causal=True, window=16, heads_kv=1)
    result = executor().run(case)
    if mode == "train":
        assert result.status == "unsupported" and mentions(result.reason or "", "backward", "CPU")

        return
    assert result.status == "ok", result.reason
    assert isinstance(result.extra["compile_s"], float) and result.extra["recompiles"] == 0
    assert result.extra["gqa_path"] == "native"
    if mode == "decode":
        assert result.state_bytes == replace(case, seq_len=15).layers * 2 * 2 * 16 * 8 * 4  # K, V × batch × W × D


@pytest.mark.slow
def test_flex_shares_one_compiled_block_mask_and_is_its_own_probe(monkeypatch: pytest.MonkeyPatch) -> None:
    """Eager create_block_mask materialised the whole (T, T) mask (8 GiB of int64 at 32k), each layer had a mask_mod
    of its own (a recompile per layer), and the tiny probe compiled shapes the case never ran (dynamic=False)."""
    import torch

    from attnbench.families import registry
    from attnbench.families.attention import layers as attention
    from attnbench.families.attention.layers import FlexCore
    from attnbench.families.registry import build_model, make_input, probe

    compiled, asked = attention.compiled_block_mask(), []

    def spy(*args: object, **kwargs: object) -> object:
        asked.append(kwargs)
        return compiled(*args, **kwargs)

    monkeypatch.setattr(attention, "_COMPILED_BLOCK_MASK", [spy])
    case = tiny_case("flex", seq_len=64, d_model=32, heads=4, layers=3, causal=True, window=16)
    ran: list[object] = []
    monkeypatch.setattr(registry, "_probe_tiny", lambda *a: ran.append(a))
    assert probe(case, "cpu") is None and ran == []  # no tiny copy: the first compiled call is the probe
    built = build_model(case, "cpu", torch.float32)
    with torch.inference_mode():
        built(make_input(case, "cpu", torch.float32))
    cores = [m for m in built.modules() if isinstance(m, FlexCore)]
    assert len(cores) == 3 and len({id(c.masks) for c in cores}) == 1
    # One block mask for three layers, from create_block_mask compiled (not its deprecated _compile flag).
    assert len(asked) == 1 and "_compile" not in asked[0]


def test_a_cuda_graph_skip_is_a_column_and_a_warning() -> None:
    """Under reduce-overhead a decode step writes its cache in place, and inductor ran it without CUDA graphs while
    the row said reduce-overhead. The skip counter is inductor's (counters['inductor']['cudagraph_skips'])."""
    from attnbench.timing.compiled import _counters

    fresh()
    watch = CompileWatch("reduce-overhead")
    watch.first_call(lambda: None, lambda: None)
    assert watch.extra["cudagraph_skips"] == 0
    _counters()["inductor"]["cudagraph_skips"] += 2  # what inductor counts when it gives a graph up
    warnings = watch.after_timing()
    assert watch.extra["cudagraph_skips"] == 2
    assert mentions(warnings, "CUDA graphs", "reduce-overhead", values=(2,))
    plain = CompileWatch("default")
    plain.first_call(lambda: None, lambda: None)
    assert "cudagraph_skips" not in plain.extra  # a mode without graphs has none to skip
    fresh()


def test_only_cuda_graphs_make_a_compiled_rows_peak_memory_come_from_the_eager_model() -> None:
    from attnbench.timing.torch_executor import peak_memory_source

    assert peak_memory_source("reduce-overhead", "cuda") == peak_memory_source("max-autotune", "cuda") == "eager"
    assert peak_memory_source("default", "cuda") == "compiled"
    assert peak_memory_source("reduce-overhead", "cpu") == "compiled"  # no CUDA graphs on a CPU
    assert peak_memory_source(None, "cuda") == "compiled"  # an eager row measures its own call


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["forward", "backward", "decode"])
def test_a_compiled_rows_peak_memory_is_the_compiled_call_and_no_eager_graph_is_built(
    mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without CUDA graphs the compiled call's peak is readable: it is the row's, and the row says so. The eager
    graph of a backward row kept its saved activations alive through the compiled timing (twice the activations):
    no eager call is made or built at all here."""
    from attnbench.timing import torch_executor

    timed: list[object] = []
    measured: list[object] = []
    built: list[object] = []
    real_timed, real_memory = (
        torch_executor.TorchExecutor._timed_with_telemetry,
        torch_executor.TorchExecutor._peak_memory,
    )
    real_whole = torch_executor._whole_sequence

    def spy_timed(self: object, step: object, *args: object) -> object:
        timed.append(step)
        return real_timed(self, step, *args)  # type: ignore[arg-type]

    def spy_memory(self: object, step: object) -> object:
        measured.append(step)
        return real_memory(self, step)  # type: ignore[arg-type]

    def spy_whole(*args: object) -> object:
        built.append(args[-1])
        return real_whole(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(torch_executor.TorchExecutor, "_timed_with_telemetry", spy_timed)
    monkeypatch.setattr(torch_executor.TorchExecutor, "_peak_memory", spy_memory)
    monkeypatch.setattr(torch_executor, "_whole_sequence", spy_whole)
    case = tiny_case("sdpa", mode=mode, seq_len=32, d_model=32, heads=4, causal=True, compile="default")
    result = executor().run(case)
    assert result.status == "ok", result.reason
    assert measured == timed  # the compiled call itself
    assert result.extra["peak_mem_from"] == "compiled"
    assert len(built) == (0 if mode == "decode" else 1)  # the compiled step's graph only


@pytest.mark.gpu
@pytest.mark.compiles(limit_s=60)
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("compile_mode", "source"), [("reduce-overhead", "eager"), ("default", "compiled")])
def test_on_cuda_the_peak_memory_comes_from_eager_only_under_cuda_graphs(compile_mode: str, source: str) -> None:
    from attnbench.core.cases import Case, TimingPolicy
    from attnbench.timing.executor import ExecutorSettings
    from attnbench.timing.torch_executor import TorchExecutor

    quick = TimingPolicy(min_samples=5, min_time_s=0.05, max_case_s=2.0, warmup_max_s=0.5, target_ci=0.05)
    gpu = TorchExecutor(ExecutorSettings("cuda:0", quick, telemetry="off"))
    case = Case("sdpa", "backward", "bfloat16", "cuda:0", 2, 256, 256, 4, 2, True, (("compile", compile_mode),))
    result = gpu.run(case)
    assert result.status == "ok", result.reason
    assert result.extra["peak_mem_from"] == source
    assert result.memory is not None and (result.memory.peak_bytes or 0) > 0


@pytest.mark.gpu
@pytest.mark.compiles(limit_s=90)  # inductor and CUDA graphs on a cold Triton cache, three models
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["sdpa", "linear-attn", "mamba2"])
def test_a_decode_step_under_reduce_overhead_is_graphed_not_skipped(model: str) -> None:
    """The decode state, and the buffers linear attention's and Mamba-2's steps compute the next state into, are
    marked static, so CUDA graphs take the step rather than skip it."""
    from attnbench.core.cases import Case, TimingPolicy
    from attnbench.timing.executor import ExecutorSettings
    from attnbench.timing.torch_executor import TorchExecutor

    quick = TimingPolicy(min_samples=5, min_time_s=0.05, max_case_s=2.0, warmup_max_s=0.5, target_ci=0.05)
    gpu = TorchExecutor(ExecutorSettings("cuda:0", quick, telemetry="off"))
    heads = None if model == "mamba2" else 4
    case = Case(model, "decode", "float16", "cuda:0", 2, 256, 256, heads, 2, True, (("compile", "reduce-overhead"),))
    result = gpu.run(case)
    assert result.status == "ok", result.reason
    assert result.extra["cudagraph_skips"] == 0, result.measurement.warnings if result.measurement else None
    assert result.extra["peak_mem_from"] == "eager"
    assert result.memory is not None and (result.memory.peak_bytes or 0) > 0  # an eager call, not a replay
