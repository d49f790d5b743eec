"""Mode prefix through the executor (issue 52 item 3): a row times the shared strategy's time to first token of all M
requests, the independent prefills as a part, each strategy's held bytes measured and by formula; a model that
cannot share a prefix is an ``unsupported`` row with the reason."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch

from attnbench.core.cases import Case, TimingPolicy
from attnbench.report.rows import summary_row
from attnbench.timing.executor import ExecutorSettings
from attnbench.timing.torch_executor import TorchExecutor
from tests.support import tiny_case

QUICK = TimingPolicy(min_samples=3, min_time_s=0.01, max_case_s=0.3, warmup_max_s=0.02, target_ci=0.2, cache="warm")


@pytest.fixture(scope="module")
def executor() -> Iterator[TorchExecutor]:
    threads = torch.get_num_threads()
    yield TorchExecutor(ExecutorSettings("cpu", QUICK, threads=1, telemetry="off", check=False))
    torch.set_num_threads(threads)


def prefix(model: str, *, every: int = 0, p: int = 24, n: int = 32, m: int = 4, **options: object) -> Case:
    case = tiny_case(model, seq_len=n, d_model=32, heads=2, causal=True, **options)
    serving = (("checkpoint_every", every), ("prefix_tokens", p), ("requests", m))
    return replace(case, mode="prefix", batch=1, serving=serving)


@pytest.mark.parametrize(("model", "every", "reused", "checkpoints"), [("lstm", 8, 24, 3), ("sdpa-flash", 0, 24, 0)])
def test_a_prefix_row_times_both_strategies_and_holds_their_bytes(
    executor: TorchExecutor, model: str, every: int, reused: int, checkpoints: int
) -> None:
    result = executor.run(prefix(model, every=every))
    assert result.status == "ok", result.reason
    extra = result.extra
    assert (extra["prefix_reused"], extra["prefix_checkpoints"]) == (reused, checkpoints)
    assert isinstance(extra["independent_s"], float) and extra["independent_s"] > 0
    assert extra["prefix_held_bytes"] == extra["prefix_bytes_formula"]
    assert extra["independent_held_bytes"] == extra["independent_bytes_formula"]
    assert 0 <= extra["prefix_error"] <= 1e-4
    assert result.tokens_per_call == 4 * 32  # every request's prompt
    row = summary_row(result)
    assert (row["prefix_tokens"], row["requests"], row["checkpoint_every"]) == (24, 4, every)
    assert row["prefix_held_bytes"] == extra["prefix_held_bytes"] and row["independent_ms"] > 0


def test_a_kept_cache_in_pages_is_shared_by_whole_pages(executor: TorchExecutor) -> None:
    case = replace(prefix("sdpa-flash", p=20), kept=(("page_tokens", "8"),))
    result = executor.run(case)
    assert result.status == "ok", result.reason
    assert result.extra["prefix_reused"] == 16  # the prefix's last partial page is each request's own
    assert result.extra["prefix_held_bytes"] == result.extra["prefix_bytes_formula"]


@pytest.mark.parametrize(
    "case",
    [
        prefix("sdpa-flash", window=8),  # a ring cache overwrites the prefix's slots
        prefix("lstm", compile="default"),  # the serving questions time eager calls
        prefix("flex"),  # compiled for each exact shape
        prefix("lstm", bidirectional=True),  # forward only: it reads the sequence backwards too
    ],
    ids=["window", "compiled", "flex", "bidirectional"],
)
def test_a_model_that_cannot_share_a_prefix_is_an_unsupported_row_with_the_reason(
    executor: TorchExecutor, case: Case
) -> None:
    result = executor.run(case)
    assert result.status == "unsupported" and result.reason


def test_a_model_you_bring_is_unsupported_with_the_reason(executor: TorchExecutor) -> None:
    from attnbench.families.user.spec import UserModel

    case = replace(
        prefix("sdpa-flash"),
        model="mine",
        definition=UserModel("tests.measure.hostile_models:fine", "attention").definition(),
    )
    result = executor.run(case)
    assert result.status == "unsupported" and result.reason


@pytest.mark.slow
@pytest.mark.parametrize(
    "model",
    ["gru", "mingru", "minlstm", "linear-attn", "mamba2", "mamba3", "gated-deltanet", "deltanet", "kda", "rwkv7",
     "vanilla", "sdpa", "sdpa-math", "mla", "hybrid"],
)  # fmt: skip
def test_every_decoding_family_answers_with_a_row(executor: TorchExecutor, model: str) -> None:
    from attnbench.families.hybrid.spec import HybridModel

    case = prefix("sdpa-flash" if model == "hybrid" else model, every=8)
    if model == "hybrid":
        case = replace(
            case, model="mamba2-sdpa", definition=HybridModel(("mamba2", "sdpa-flash")).definition(), layers=2
        )
    result = executor.run(case)
    assert result.status == "ok", result.reason
    assert result.extra["prefix_reused"] == 24 and result.extra["independent_s"] > 0
    assert result.extra["prefix_held_bytes"] == result.extra["prefix_bytes_formula"]
    assert result.extra["independent_held_bytes"] == result.extra["independent_bytes_formula"]
