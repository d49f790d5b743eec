"""``torch.compile`` around a case's timed call: compiled before the timing, its recompilations watched during it.

A row with ``compile`` other than ``none`` (every model takes it), and every ``flex`` row (FlexAttention is
compiled by construction), goes through here:

1. Dynamo's caches are reset first (``torch._dynamo.reset``), so one case's graphs never serve the next, and a
   long in-process sweep never reaches dynamo's recompile limit (8 per frame, past which it falls back to eager
   silently). Its counters are cleared too: ``reset`` leaves them.
2. The first call compiles; it runs before any timing, and its wall time is the row's ``compile_s``. Inductor's
   on-disk cache may make it short: that is what a user's second run sees too.
3. The timing follows. ``counters["stats"]["unique_graphs"]`` is read before and after: a graph compiled during
   the timing means a guard failed (shape, grad mode, a Python value the graph depends on), so some samples timed
   a compilation. The row says so (``recompiles`` and a warning) rather than timing it silently.

CUDA graphs (``reduce-overhead``, and ``max-autotune``, which turns them on): inductor skips them for a graph whose
inputs it sees mutated or moved (a decode step writes its KV cache or state in place) and runs it without graphs,
which a row labelled reduce-overhead would hide. ``counters["inductor"]["cudagraph_skips"]`` is read after the
first call and after the timing; a skip is the row's ``cudagraph_skips`` and a warning. A decode state's tensors,
and the buffers a step computes the next state into, are marked static (``torch._dynamo.mark_static_address``:
allocated once, never moved) so the step can be graphed. Under CUDA graphs the row's peak memory comes from an eager
call, made after the timing: a graph replay runs in the graph's private pool and would read about 0 bytes. Every
other compiled row's peak is its compiled call's own (``peak_mem_from`` says which).

A compiler that cannot run here (no C++ toolchain, an op inductor cannot lower, a backend missing) raises from
dynamo or inductor on the first call: the case is ``unsupported`` with that reason. A model dynamo cannot capture
at all (``nn.LSTM``: "Dynamo does not support RNN, GRU, or LSTM") runs eager behind a graph break; the row's
``compile_graphs`` is then 0 and a warning says the timing is eager.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

Extra = dict[str, str | int | float | bool | None]
# Exceptions from these packages on the first compiled call mean the compiler, not the model, failed.
_COMPILER_MODULES = ("torch._dynamo", "torch._inductor", "torch.compiler", "triton")


def compile_mode(case_option: object) -> str | None:
    """The ``torch.compile`` mode an option value asks for, or None for eager."""
    return None if case_option in (None, "none") else str(case_option)


def _counters() -> Any:
    from torch._dynamo.utils import counters

    return counters


def fresh() -> None:
    """Forget every compiled graph and counter of the cases before (step 1 of the module notes)."""
    torch._dynamo.reset()
    _counters().clear()


def replayable_backward(case_mode: str, compiling: bool) -> contextlib.AbstractContextManager[object]:
    """A ``backward`` row replays one graph's backward (``retain_graph=True``), which AOTAutograd's donated buffers
    forbid ("compiled with non-empty donated buffers which requires ... retain_graph=False"): they are turned off
    for such a row, a memory optimisation of the backward that train rows keep."""
    if not compiling or case_mode != "backward":
        return contextlib.nullcontext()
    return torch._functorch.config.patch(donated_buffer=False)


def wrap(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """``fn`` (a module or a method) compiled with ``mode``; nothing is compiled until it is called."""
    return torch.compile(fn, mode=mode)


def is_compiler_failure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) comes from the compiler rather than the model's own computation."""
    seen: BaseException | None = exc
    while seen is not None:
        if type(seen).__module__.startswith(_COMPILER_MODULES):
            return True
        seen = seen.__cause__
    return False


def _cudagraph_skips() -> int:
    return int(_counters()["inductor"]["cudagraph_skips"])


def uses_cudagraphs(mode: str | None) -> bool:
    """Whether torch.compile's ``mode`` records CUDA graphs (on a CUDA device)."""
    return mode in ("reduce-overhead", "max-autotune")


def mark_static(tensors: Any) -> None:
    """Tell dynamo these tensors stay where they are for the graph's life (a decode state, written in place), so
    CUDA graphs can take them as fixed inputs rather than skip the graph."""
    for tensor in tensors:
        torch._dynamo.mark_static_address(tensor)


def _graphs() -> int:
    return int(_counters()["stats"]["unique_graphs"])


def _graph_breaks() -> int:
    return int(sum(_counters()["graph_break"].values()))


@dataclass
class CompileWatch:
    """What the compilation of one case did: its wall time, graphs and graph breaks, and the graphs compiled
    later, during the timing."""

    mode: str
    extra: Extra = field(default_factory=dict)
    _before_timing: int = 0

    def first_call(self, step: Callable[[], object], synchronize: Callable[[], None]) -> None:
        """Compile by calling ``step`` once (step 2); raises what the compiler raised."""
        started = time.perf_counter()
        step()
        synchronize()
        self.extra["compile_s"] = time.perf_counter() - started
        self.extra["compile_mode"] = self.mode
        self.extra["compile_graphs"] = _graphs()
        self.extra["graph_breaks"] = _graph_breaks()
        self._before_timing = _graphs()
        if uses_cudagraphs(self.mode):
            self.extra["cudagraph_skips"] = _cudagraph_skips()

    def after_timing(self) -> list[str]:
        """Graphs compiled since the first call (step 3), into ``extra``; the warnings the row should carry."""
        recompiles = _graphs() - self._before_timing
        self.extra["recompiles"] = recompiles
        warnings = []
        if recompiles:
            warnings.append(
                f"recompiled during timing: {recompiles} new graph(s) after the first call, so some samples "
                "include compilation (TORCH_LOGS=recompiles says which guard failed)"
            )
        if uses_cudagraphs(self.mode):
            skips = _cudagraph_skips()
            self.extra["cudagraph_skips"] = skips
            if skips:
                warnings.append(
                    f"torch.compile(mode={self.mode}) skipped CUDA graphs for {skips} graph(s) (an input mutated or "
                    "moved, e.g. a cache written in place): those ran without graphs, so the timing is not of "
                    f"{self.mode} as labelled (TORCH_LOGS=perf_hints says why)"
                )
        if not self.extra.get("compile_graphs"):
            warnings.append(
                f"torch.compile(mode={self.mode}) captured no graph (graph breaks: {self.extra.get('graph_breaks')}): "
                "the timing is of the eager model"
            )
        return warnings
