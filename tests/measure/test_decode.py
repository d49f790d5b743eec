"""A decode case through the executor: one step timed at context n, the state computed and measured, a cache
too large to hold an ``oom`` row, and longer contexts skipped after it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.cases import Case, TimingPolicy
from attnbench.core.decode_state import state_bytes
from attnbench.measure.executor import ExecutorSettings
from attnbench.measure.torch_executor import TorchExecutor
from attnbench.results.store import load_run
from tests.support import QUICK_TIMING, tiny_config

QUICK = TimingPolicy(min_samples=5, min_time_s=0.01, max_case_s=0.3, warmup_max_s=0.05, target_ci=0.05)
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
    if case.kind == "attention":  # 4.2 MiB of K and V: its pages, the first and last maybe shared
        assert state_bytes(case) <= held <= state_bytes(case) + 2 * page
    else:  # h (and c) of a few hundred bytes: the page or two each sits in (two allocations may share none)
        tensors = 2 if model == "lstm" else 1
        assert page <= held <= 2 * page * tensors


def test_a_cache_too_large_to_hold_is_an_oom_row_that_says_so(executor: TorchExecutor) -> None:
    # K and V of 65536 sequences × 2^21 positions × 256 features: 256 TiB, beyond any address space.
    result = executor.run(decode("sdpa", 2**21, batch=65536, d_model=256))
    assert result.status == "oom"
    assert (
        "the KV cache for a context of n=2097152 (256 TiB, batch 65536, 1 layer) cannot be allocated" in result.reason
    )
    assert executor.run(decode("lstm", 64)).ok  # and the next case runs as if nothing happened


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
