"""The numerical check before timing (issue 50, item 1): a case whose path computes the wrong function is an
``incorrect`` row, never timed; a right one passes, and the check is shown to have run."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch
from torch import nn

from attnbench.core.cases import Case, TimingPolicy
from attnbench.families.deltanet import layers as deltanet
from attnbench.families.deltanet.layers import DeltaNetTorch
from attnbench.families.hybrid.spec import HybridModel
from attnbench.families.user.spec import UserModel
from attnbench.results.numerics import TOLERANCE, NumericCheck
from attnbench.results.records import FAILED, Result
from attnbench.timing import reference_check, torch_executor
from attnbench.timing.executor import ExecutorSettings
from attnbench.timing.reference_check import run_check
from attnbench.timing.torch_executor import TorchExecutor
from tests.support import QUICK_TIMING, ROOT, tiny_case

QUICK = replace(TimingPolicy(**QUICK_TIMING), max_case_s=5.0)  # type: ignore[arg-type]
CPU = torch.device("cpu")


def executor(**settings: Any) -> TorchExecutor:
    return TorchExecutor(ExecutorSettings("cpu", QUICK, telemetry="off", threads=1, **settings))


def calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """Count the calls of ``owner.name`` (the real function still runs): the spy that proves a path ran."""
    seen: list[int] = []
    real = getattr(owner, name)

    def spy(*args: Any, **kwargs: Any) -> Any:
        seen.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return seen


# ---------------------------------------------------------------------------------------------- built-in families


def test_a_correct_chunked_case_passes_and_both_the_fast_form_and_the_reference_ran(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    chunked = calls(monkeypatch, deltanet, "delta_rule_chunked")
    recurrent = calls(monkeypatch, deltanet, "delta_rule_recurrent")
    references = calls(monkeypatch, DeltaNetTorch, "reference")
    checks = calls(monkeypatch, torch_executor, "run_check")
    result = executor().run(tiny_case("gated-deltanet", seq_len=256, d_model=32, heads=2, chunk=16))
    assert result.ok and result.is_timed
    check = result.check
    assert check is not None and check.status == "passed"
    assert check.rel_err is not None and check.max_abs_err is not None and check.rel_err <= check.tol == 5e-3
    assert check.seq_len == 2 * 16 + 3  # two whole chunks and part of a third: the carried state is on the path
    assert (len(checks), len(references)) == (1, 1) and chunked and recurrent
    assert "form=recurrent" in check.reference


def _flipped_gates(real: Callable[..., Any]) -> Callable[..., Any]:
    def flipped(q: Any, k: Any, v: Any, g: Any, beta: Any, chunk: int, initial: Any = None) -> Any:
        return real(q, k, v, None if g is None else g.flip(-1), beta, chunk, initial)  # the gates in reverse order

    return flipped


def test_a_chunked_form_with_its_gate_order_flipped_is_incorrect_and_never_timed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(deltanet, "delta_rule_chunked", _flipped_gates(deltanet.delta_rule_chunked))
    timed = calls(monkeypatch, torch_executor, "measure")
    result = executor().run(tiny_case("gated-deltanet", seq_len=256, d_model=32, heads=2, chunk=16))
    assert result.status == "incorrect" and result.status in FAILED
    assert result.measurement is None and not timed
    check = result.check
    assert check is not None and check.status == "failed" and check.rel_err is not None
    assert check.rel_err > 10 * check.tol
    # The row reads back (results.jsonl) with its check.
    again = Result.from_dict(result.to_dict())
    assert again.status == "incorrect" and again.check == check


def test_a_decode_state_wrong_in_the_case_dtype_only_is_caught_by_the_state_comparison(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A step whose output is right but whose committed state is off (a precision bug of the case's dtype): only the
    comparison of the states after prefill and step can see it."""
    case = tiny_case("deltanet", mode="decode", seq_len=64, d_model=32, heads=2)
    passed = run_check(case, CPU, 0)
    assert passed.status == "passed"
    real = deltanet.DeltaState.advance

    def drifting(self: Any) -> None:
        real(self)
        if self.memory.dtype != torch.float64:
            self.memory.mul_(1.05)

    monkeypatch.setattr(deltanet.DeltaState, "advance", drifting)
    failed = run_check(case, CPU, 0)
    assert failed.status == "failed" and failed.rel_err is not None and failed.rel_err > failed.tol


def test_a_hybrid_holds_each_member_to_its_own_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hybrid's chunked member with its gates flipped: the stack is incorrect, so its reference ran the member's
    recurrent form rather than the same chunked one in float64."""
    pattern = ("gated-deltanet", "sdpa-flash")
    stack = HybridModel(pattern).definition()
    case = Case("stack", "forward", "float32", "cpu", 2, 96, 32, 4, 2, True, definition=stack)
    assert run_check(case, CPU, 0).status == "passed"
    monkeypatch.setattr(deltanet, "delta_rule_chunked", _flipped_gates(deltanet.delta_rule_chunked))
    assert run_check(case, CPU, 0).status == "failed"


def test_a_parallel_hybrid_holds_each_side_by_side_member_to_its_own_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    """Falcon-H1's block (attention and Mamba-2 side by side): the check builds the same block in reference forms,
    so a flipped chunked gate in one member is caught through the sum."""
    side_by_side = HybridModel(("sdpa-flash+gated-deltanet",)).definition()
    case = Case("par", "forward", "float32", "cpu", 2, 96, 32, 4, 2, True, definition=side_by_side)
    assert run_check(case, CPU, 0).status == "passed"
    monkeypatch.setattr(deltanet, "delta_rule_chunked", _flipped_gates(deltanet.delta_rule_chunked))
    assert run_check(case, CPU, 0).status == "failed"


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("sdpa-flash", {}),
        ("mingru", {}),
        ("mamba2", {"chunk": 8}),
        ("rwkv7", {"chunk": 8}),
        ("linear-attn", {"chunk": 8}),
        ("vanilla", {"scope": "model", "vocab": 100, "positional": "learned", "max_len": 65}),  # a preset's table
        ("kda", {"chunk": 8}),
        ("mamba3", {"chunk": 8}),
        ("mamba3", {"chunk": 8, "mimo_rank": 2}),
        ("mla", {}),
        ("sdpa-flash", {"sinks": True, "window": 16}),
        ("sdpa-flash", {"head_dim": 8, "output_gate": True, "qk_norm": True, "bias": False}),  # a published shape
    ],
)
@pytest.mark.parametrize("mode", ["forward", "train", "decode"])
def test_every_built_in_path_passes_against_its_reference(model: str, options: dict[str, Any], mode: str) -> None:
    case = tiny_case(model, mode=mode, seq_len=64, d_model=32, heads=2, causal=True, **options)  # type: ignore[arg-type]
    check = run_check(case, CPU, 0)
    assert check.status == "passed", check.reason
    assert check.rel_err is not None and check.rel_err <= TOLERANCE["float32"]


def test_serving_questions_are_skipped_with_the_reason() -> None:
    case = replace(tiny_case("lstm", mode="prefill", seq_len=64), serving=(("prefill_chunk", 16),))
    check = run_check(case, CPU, 0)
    assert check.status == "skipped" and check.reason and check.rel_err is None


def test_a_check_that_cannot_run_is_skipped_and_the_case_still_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_: Any) -> nn.Module:
        raise RuntimeError("no room for the float64 twin")

    monkeypatch.setattr(DeltaNetTorch, "reference", broken)
    result = executor().run(tiny_case("deltanet", seq_len=32, d_model=16, heads=2))
    assert result.ok and result.check is not None and result.check.status == "skipped"
    assert "RuntimeError" in result.check.reason


# ---------------------------------------------------------------------------------------------- the executor


def test_the_check_runs_once_per_model_options_dtype_and_mode_not_per_length(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = calls(monkeypatch, reference_check, "build_model")
    ex = executor()
    rows = [ex.run(tiny_case("mingru", seq_len=n, d_model=16)) for n in (32, 64, 128)]
    rows.append(ex.run(tiny_case("mingru", seq_len=16, d_model=16)))  # shorter than the check: a check of its own
    assert all(r.ok and r.check is not None and r.check.status == "passed" for r in rows)
    assert len(checks) == 2
    assert [r.check.seq_len for r in rows if r.check] == [32, 32, 32, 16]


def test_turned_off_the_check_never_runs_and_the_row_says_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    checks = calls(monkeypatch, torch_executor, "run_check")
    monkeypatch.setattr(deltanet, "delta_rule_chunked", _flipped_gates(deltanet.delta_rule_chunked))
    result = executor(check=False).run(tiny_case("gated-deltanet", seq_len=64, d_model=16, heads=2, chunk=16))
    assert result.ok and not checks  # the wrong kernel is timed, as asked
    assert result.check is not None and result.check.status == "skipped"


# ---------------------------------------------------------------------------------------------- models you bring


class Squash(nn.Module):
    """tanh of a projection; its fast form adds ``offset`` to what its reference computes."""

    def __init__(self, request: Any, offset: float) -> None:
        super().__init__()
        self.proj = nn.Linear(request.d_model, request.d_model, device=request.device, dtype=request.torch_dtype)
        self.offset = offset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x)) + self.offset

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.proj(x))


class NoReference(nn.Module):
    def __init__(self, request: Any) -> None:
        super().__init__()
        self.proj = nn.Linear(request.d_model, request.d_model, device=request.device, dtype=request.torch_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def right(request: Any) -> nn.Module:
    return Squash(request, 0.0)


def off_by_1e_2(request: Any) -> nn.Module:
    return Squash(request, 1e-2)


def without_reference(request: Any) -> nn.Module:
    return NoReference(request)


def user_case(factory: str, mode: str = "forward") -> Case:
    user = UserModel(f"{__name__}:{factory}", "recurrent", "config")
    return Case(factory, mode, "float32", "cpu", 2, 64, 16, 2, 1, True, definition=user.definition())  # type: ignore[arg-type]


def test_a_user_model_whose_fast_form_is_off_its_reference_by_1e_2_is_incorrect() -> None:
    result = executor().run(user_case("off_by_1e_2"))
    assert result.status == "incorrect" and result.measurement is None
    check = result.check
    assert check is not None and check.status == "failed"
    assert check.max_abs_err == pytest.approx(1e-2, rel=1e-3)
    assert check.rel_err is not None and check.rel_err > check.tol


@pytest.mark.parametrize("mode", ["forward", "train"])
def test_a_user_model_equal_to_its_reference_passes(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    references = calls(monkeypatch, Squash, "reference")
    result = executor().run(user_case("right", mode))
    assert result.ok and result.check is not None and result.check.status == "passed"
    assert result.check.seq_len == 32 and references  # the check's size, and the reference ran


def test_a_user_model_without_a_reference_is_timed_and_says_unchecked() -> None:
    result = executor().run(user_case("without_reference"))
    assert result.ok and result.check is not None and result.check.status == "unchecked"


def test_an_old_row_without_a_check_reads_back_and_a_bad_check_is_refused() -> None:
    row = Result(tiny_case("lstm"), "error", "boom").to_dict()
    assert "check" not in row and Result.from_dict(row).check is None
    good = NumericCheck("passed", 1e-7, 2e-7, 5e-3, 32, "float64")
    assert Result.from_dict({**row, "check": good.to_dict()}).check == good
    for bad in ({"status": "fine"}, {"status": "passed", "rel_err": -1.0}, {"status": "passed", "tol": 1e400}):
        with pytest.raises(ValueError):
            Result.from_dict({**row, "check": bad})


def test_methodology_states_each_dtypes_tolerance() -> None:
    page = (ROOT / "docs" / "explanation" / "methodology.md").read_text(encoding="utf-8")
    rows = dict(re.findall(r"^\| `(\w+)` \| ([0-9.e-]+) \|", page, flags=re.MULTILINE))
    assert {dtype: float(value) for dtype, value in rows.items()} == TOLERANCE


@pytest.mark.slow
def test_an_isolated_workers_rows_carry_their_check_and_a_wrong_one_stays_incorrect() -> None:
    """The row crosses the worker's pipe with its check; a user model off its reference is incorrect there too."""
    from attnbench.sweeps.isolated_executor import IsolatedExecutor

    isolated = IsolatedExecutor(ExecutorSettings("cpu", QUICK, threads=1, timeout_s=120, telemetry="off"))
    try:
        right_row = isolated.run(tiny_case("mingru", seq_len=32, d_model=16))
        wrong_row = isolated.run(user_case("off_by_1e_2"))
    finally:
        isolated.close()
    assert right_row.ok and right_row.check is not None and right_row.check.status == "passed"
    assert wrong_row.status == "incorrect" and wrong_row.check is not None and wrong_row.check.status == "failed"


def test_a_case_that_fails_after_its_check_keeps_the_check_on_its_row() -> None:
    # K and V of 65536 sequences × 2^21 positions: beyond any address space, found after the check passed.
    case = Case("sdpa", "decode", "float32", "cpu", 65536, 2**21, 64, 4, 1, True)
    result = executor().run(case)
    assert result.status == "oom" and result.check is not None and result.check.status == "passed"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("lstm", {}),  # cuDNN, TF32 by default in float32: the tolerance must leave it room
        ("sdpa-flash", {}),
        ("sdpa-efficient", {}),
        ("sdpa-cudnn", {}),
        ("sdpa", {}),
        ("flash-attn", {}),
        ("gated-deltanet", {"kernel": "fla"}),
        ("mamba2", {"kernel": "mamba_ssm"}),
    ],
)
@pytest.mark.parametrize("mode", ["forward", "train", "decode"])
def test_every_fused_gpu_kernel_that_runs_here_passes_its_check(
    model: str, options: dict[str, Any], dtype: str, mode: str
) -> None:
    from attnbench.families.registry import probe

    case = tiny_case(model, mode=mode, dtype=dtype, device="cuda:0", seq_len=256, d_model=128, heads=2, causal=True)
    case = replace(case, options=tuple(sorted(options.items())))  # type: ignore[arg-type]
    reason = probe(case, "cuda:0")
    if reason is not None:
        pytest.skip(reason)
    check = run_check(case, torch.device("cuda:0"), 0)
    assert check.status == "passed", (check.rel_err, check.tol, check.reason)
