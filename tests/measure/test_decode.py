"""A decode case through the executor: one step timed at context n, the state computed and measured, a cache
too large to hold an ``oom`` row, and longer contexts skipped after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.cases import Case, TimingPolicy
from attnbench.families.catalogue import kind_of
from attnbench.families.state_bytes import state_bytes
from attnbench.results.store import load_run
from attnbench.timing.executor import ExecutorSettings
from attnbench.timing.torch_executor import TorchExecutor
from tests.support import QUICK_TIMING, mentions, tiny_config

# Warm: these tests hold what a row records, not the cold flush (tested in test_timing and test_gpu_timing). A cold
# flush is twice the last-level cache a call, and a VM may report its host's whole L3 (480 MiB seen here): ~100 ms
# a call, past these budgets on a quiet machine.
QUICK = TimingPolicy(min_samples=5, min_time_s=0.01, max_case_s=0.3, warmup_max_s=0.05, target_ci=0.05, cache="warm")
runner = CliRunner()


@pytest.fixture(scope="module")
def executor() -> Iterator[TorchExecutor]:
    threads = torch.get_num_threads()
    yield TorchExecutor(ExecutorSettings("cpu", QUICK, threads=1, telemetry="off"))
    torch.set_num_threads(threads)


def decode(model: str, n: int, *, batch: int = 2, d_model: int = 64) -> Case:
    heads = None if model in ("lstm", "gru", "mingru", "minlstm") else 4
    return Case(model, "decode", "float32", "cpu", batch, n, d_model, heads, 1, True)


@pytest.mark.parametrize("model", ["lstm", "mingru", "vanilla", "sdpa-flash"])
@pytest.mark.slow
def test_a_decode_row_times_one_step_and_records_its_state(executor: TorchExecutor, model: str) -> None:
    case = decode(model, 4096)
    result = executor.run(case)
    assert result.status == "ok", result.reason
    assert result.tokens_per_s == pytest.approx(case.batch / result.median_s)  # one token per sequence a call
    assert result.state_bytes == state_bytes(case)
    assert result.extra["state_mem_method"] == "resident-pages"
    assert str(result.extra["flops_formula"]).endswith("-decode-v1")
    assert isinstance(result.extra["prefill_s"], float)
    held = result.state_mem_bytes
    assert held is not None
    page = 4096
    if kind_of(case) == "attention":  # 4.2 MiB of K and V: its pages, the first and last maybe shared
        assert state_bytes(case) <= held <= state_bytes(case) + 2 * page
    else:  # h (and c) of a few hundred bytes: the page or two each sits in (two allocations may share none)
        tensors = 2 if model == "lstm" else 1
        assert page <= held <= 2 * page * tensors


def test_a_cache_too_large_to_hold_is_an_oom_row_that_says_so(executor: TorchExecutor) -> None:
    # K and V of 65536 sequences × 2^21 positions × 256 features: 256 TiB, beyond any address space.
    result = executor.run(decode("sdpa", 2**21, batch=65536, d_model=256))
    assert result.status == "oom"
    assert mentions(result.reason, "n=2097152", "256 TiB", values=(65536,))  # the context, the bytes, the batch

    assert executor.run(decode("lstm", 64)).ok  # and the next case runs as if nothing happened


@pytest.mark.slow
def test_longer_contexts_are_skipped_after_a_cache_that_did_not_fit(tmp_path: pytest.TempPathFactory) -> None:
    config = tmp_path / "oom.yaml"  # type: ignore[operator]
    config.write_text(
        tiny_config(
            "oom",
            models=["sdpa"],
            modes=["decode"],
            causal=True,
            d_model=256,
            heads=4,
            grid={"batch": [65536], "seq_len": [2**21, 2**22]},
            timing=QUICK_TIMING,
        )
    )
    out = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path), "-q", "--no-isolate"])
    assert out.exit_code == 0, out.output
    (folder,) = [p for p in tmp_path.iterdir() if p.is_dir()]  # type: ignore[attr-defined]
    results = load_run(folder).results
    assert [(r.case.seq_len, r.status) for r in results] == [(2**21, "oom"), (2**22, "oom")]
    assert "KV cache" in results[0].reason and results[1].extra.get("skipped") is True


@pytest.mark.parametrize(
    ("model", "options"), [("lstm", ()), ("mingru", ()), ("linear-attn", ()), ("mamba2", (("head_dim", 16),))]
)
def test_what_only_a_step_needs_is_dropped_before_the_state_is_measured(
    model: str, options: tuple[tuple[str, object], ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A recurrent state's next-state buffers (a step's output) once doubled its measured size on a GPU: the
    executor drops them first, and what remains is exactly the state the row computes."""
    from attnbench.families.registry import build_model
    from attnbench.families.states import tensor_bytes
    from attnbench.timing import decode_setup as decode_module

    heads = 4 if model == "linear-attn" else None
    case = Case(model, "decode", "float32", "cpu", 2, 32, 64, heads, 2, True, options)  # type: ignore[arg-type]
    model_ = build_model(case, "cpu", torch.float32)
    setup = decode_module.DecodeSetup(model_, case, torch.device("cpu"), torch.float32)
    with torch.inference_mode():
        setup.step()
    state = setup._state
    scratch = [
        t for t in _all_tensors(state) if all(t.data_ptr() != s.data_ptr() for s in state.tensors())
    ]  # the step's buffers, beside the state
    assert scratch, "a step keeps its result aside"
    seen: list[int] = []
    real = decode_module.drop_scratch
    monkeypatch.setattr(decode_module, "drop_scratch", lambda s: (real(s), seen.append(len(_all_tensors(s)))))
    setup.release()
    assert seen == [len(list(state.tensors()))]  # only the state is left when it is measured
    assert tensor_bytes(state) == state_bytes(case) == setup.extra["state_bytes"]


def _all_tensors(obj: object, depth: int = 0) -> list[torch.Tensor]:
    """Every tensor an object holds in its attributes, lists and tuples (a state's, recursively)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if depth > 6 or obj is None or isinstance(obj, str | int | float | bool):
        return []
    items: list[object]
    if isinstance(obj, list | tuple):
        items = list(obj)
    elif hasattr(obj, "__dict__"):
        items = list(vars(obj).values())
    else:
        return []
    return [t for item in items for t in _all_tensors(item, depth + 1)]
