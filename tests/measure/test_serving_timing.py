"""The serving questions through the executor (issue 41): each call made the same call again by an untimed
preparation, the parts a row records, a capacity found from measured memory, and the questions a model cannot
answer as ``unsupported`` rows."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
import torch

from attnbench.core.cases import Case, TimingPolicy
from attnbench.families.flops import count_flops
from attnbench.families.torch_family import LaunchLimit
from attnbench.families.traffic import bytes_moved
from attnbench.sweeps.isolated_executor import IsolatedExecutor
from attnbench.timing.capacity import MAX_CAPACITY, _on_cpu, gpu_budget, margin_bytes, search_batches
from attnbench.timing.executor import ExecutorSettings
from attnbench.timing.serving import PreparedClock
from attnbench.timing.torch_executor import TorchExecutor
from tests.support import tiny_case

# Warm: these tests hold what a row records, not the cold flush (tested in test_timing and test_gpu_timing). A cold
# flush is twice the last-level cache a call, and a VM may report its host's whole L3 (480 MiB seen here): ~100 ms
# a call, past these budgets on a quiet machine.
QUICK = TimingPolicy(min_samples=5, min_time_s=0.01, max_case_s=0.5, warmup_max_s=0.05, target_ci=0.05, cache="warm")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def executor() -> Iterator[TorchExecutor]:
    threads = torch.get_num_threads()
    yield TorchExecutor(ExecutorSettings("cpu", QUICK, threads=1, telemetry="off"))
    torch.set_num_threads(threads)


def serving(model: str, mode: str, n: int = 64, **params: int) -> Case:
    case = tiny_case(model, seq_len=n, d_model=32, heads=4, causal=True)
    return replace(case, mode=mode, serving=tuple(sorted(params.items())))  # type: ignore[arg-type]


class CountingClock:
    """A fake clock: each timed call takes one second; it says how many calls it timed."""

    def __init__(self) -> None:
        self.calls = 0

    def now(self) -> float:
        return float(self.calls)

    def time(self, fn: Callable[[], object], calls_per_sample: int, samples: int) -> list[float]:
        for _ in range(calls_per_sample * samples):
            fn()
            self.calls += 1
        return [1.0] * samples


def test_a_prepared_clock_puts_the_state_back_before_every_call_untimed() -> None:
    log: list[str] = []
    clock = PreparedClock(CountingClock(), lambda: log.append("prepare"))
    assert clock.time(lambda: log.append("call"), 2, 3) == [1.0, 1.0, 1.0]
    assert log == ["prepare", "call"] * 6


@pytest.mark.slow
@pytest.mark.parametrize("model", ["lstm", "sdpa-flash"])
def test_each_question_is_a_row_with_its_parts(executor: TorchExecutor, model: str) -> None:
    prefill = executor.run(serving(model, "prefill", prefill_chunk=16))
    assert prefill.status == "ok", prefill.reason
    assert prefill.extra["prefill_chunks"] == 4 and isinstance(prefill.extra["flops"], int)
    verify = executor.run(serving(model, "verify", draft=4, accept=2))
    assert verify.status == "ok", verify.reason
    assert {"verify_s", "rollback_s"} <= set(verify.extra)
    assert verify.extra["rollback_method"] == ("replay" if model == "lstm" else "truncate")
    # the k drafts' useful work and compulsory bytes: a verify row gets a roofline prediction
    assert verify.extra["flops"] == verify.extra["executed_flops"] == count_flops(verify.case).flops > 0
    assert verify.extra["bytes_moved"] == bytes_moved(verify.case, verify.parameters)[0]  # type: ignore[index]
    packed = executor.run(
        replace(tiny_case(model, d_model=32, heads=4, causal=True), batch=3, seq_len=12, packing=(3, 12, 5))
    )
    assert packed.status == "ok", packed.reason
    assert packed.tokens_per_s == pytest.approx(20 / packed.median_s)
    assert packed.extra["padded_tokens_per_s"] == pytest.approx(20 / packed.extra["padded_s"])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mamba2", "linear-attn", "gated-deltanet", "rwkv7"])
@pytest.mark.parametrize("mode", ["prefill", "verify", "train"])
def test_the_other_families_answer_too(executor: TorchExecutor, model: str, mode: str) -> None:
    if mode == "train":
        case = replace(
            tiny_case(model, mode="train", d_model=32, heads=4, causal=True), batch=2, seq_len=9, packing=(9, 4)
        )
    else:
        case = serving(model, mode, **({"prefill_chunk": 16} if mode == "prefill" else {"draft": 3, "accept": 3}))
    result = executor.run(case)
    assert result.status == "ok", result.reason


@pytest.mark.slow
def test_a_capacity_holds_a_recurrence_at_any_n_and_shrinks_attentions_with_it() -> None:
    """The issue's check at a budget a test can afford: the LSTM's batch the same at n = 64 and 1024 (within 15 %),
    attention's at 1024 at most a fifth of its batch at 64. d_model 16 keeps the steps cheap; 128 MiB keeps the
    step's largest buffers above glibc's 32 MiB mmap threshold, whose heap below it lends a process's history to
    the reading. In a fresh worker, as a sweep with isolate: a test process's history is whatever ran before it."""
    found = {}
    executor = IsolatedExecutor(ExecutorSettings("cpu", QUICK, threads=1, telemetry="off"))
    for model in ("lstm", "sdpa-flash"):
        for n in (64, 1024):
            case = replace(serving(model, "capacity", n, memory_budget=128 * 2**20), d_model=16)
            result = executor.run(replace(case, batch=1))
            # The search is the point here; a step at that batch may not fit a test's timing budget on a busy machine.
            assert result.status in ("ok", "too_slow_for_budget"), result.reason
            assert result.extra["memory_budget_bytes"] == 128 * 2**20 and result.extra["capacity_method"] == "rss-fit"
            assert result.extra["capacity_capped_by"] == "memory"  # no launch limit on a CPU
            found[model, n] = result.extra["capacity_batch"]
            # the decode step's compulsory bytes at the batch found: a capacity row gets a roofline prediction
            step = replace(case, mode="decode", serving=(), batch=found[model, n])
            want = bytes_moved(step, result.parameters, result.extra["state_bytes"])  # type: ignore[arg-type]
            assert want is not None and result.extra["bytes_moved"] == want[0]
            if result.ok:
                assert result.tokens_per_s == pytest.approx(found[model, n] / result.median_s)
    executor.close()
    # Within 15 %: a capacity row steps a recurrence in 4 MiB tiles (``timing.precision.TILE_BYTES``), whose
    # buffers come from glibc's heap, and its history moves a 128 MiB reading by up to about 10 %.
    assert abs(found["lstm", 1024] - found["lstm", 64]) <= 0.15 * found["lstm", 64]
    assert found["sdpa-flash", 1024] <= found["sdpa-flash", 64] / 5


def test_a_budget_not_one_sequence_fits_is_an_oom_row_and_a_cpu_without_one_unsupported(
    executor: TorchExecutor,
) -> None:
    tight = executor.run(serving("sdpa-flash", "capacity", 4096, memory_budget=64 * 2**10))
    assert tight.status == "oom" and "not one sequence fits" in tight.reason
    none = executor.run(serving("lstm", "capacity", 64, memory_budget=0))
    assert none.status == "unsupported" and "memory_budget" in none.reason


class FakeRss:
    """A resident-memory meter over a made-up law of bytes against batch (what ``run`` last ran)."""

    def __init__(self, law: Callable[[int], int]) -> None:
        self.law, self.batch, self.tries = law, 0, []

    def run(self, batch: int, held: int = 0) -> int:
        self.batch = batch
        self.tries.append(batch)
        return held

    def start(self) -> None:
        self.batch = 0

    def peak_bytes(self) -> int:
        return self.law(self.batch)


def test_a_cpu_search_solves_the_fitted_line_and_confirms_it() -> None:
    meter = FakeRss(lambda b: 1000 + 300 * b)
    found = _on_cpu(meter.run, 1_000_000 + 5_000, 5_000, meter)  # type: ignore[arg-type]
    assert found.batch == (1_000_000 - 1000) // 300 and found.bytes_per_sequence == 300
    assert meter.tries[:3] == [1, 2, 16] and meter.tries[-1] == found.batch  # the last run confirms it


def test_a_confirmation_that_does_not_fit_lowers_the_batch() -> None:
    # Linear where it is fitted, steeper near the budget: the line overshoots and the confirmation says so.
    meter = FakeRss(lambda b: 100 * b + (b - 5000) ** 2 // 50 * (b > 5000))
    found = _on_cpu(meter.run, 1_000_000, 0, meter)  # type: ignore[arg-type]
    assert meter.law(found.batch) <= 1_000_000 < 100 * 10_000 + 5000**2 // 50
    assert len([b for b in meter.tries if b > 2]) > 2  # a confirmation failed and a lower batch was tried


def test_a_line_fitted_where_fixed_costs_weigh_is_corrected_upwards() -> None:
    """Bytes that grow slower than the batch (the allocator's fixed costs amortised): the line through the small
    batches overstates a sequence's bytes, the first confirmation fits with room to spare, and the batch is raised."""

    def law(b: int) -> int:
        return 300 * b + 20_000 * math.isqrt(b)

    meter = FakeRss(law)
    room = 10_000_000
    found = _on_cpu(meter.run, room, 0, meter)  # type: ignore[arg-type]
    largest = max(b for b in range(1, room // 300) if law(b) <= room)
    assert law(found.batch) <= room and found.batch >= 0.97 * largest
    assert 300 <= found.bytes_per_sequence < 400  # the growth at scale, not the small batches' slope


def test_a_reading_of_pages_kept_resident_never_makes_a_state_fit() -> None:
    """A long-lived process may hold freed pages resident, so the work reads no growth at all: the state's own bytes,
    which the try knows, are the floor (it failed before: the search found the largest batch it tries)."""
    meter = FakeRss(lambda b: 0)
    found = _on_cpu(lambda b: meter.run(b, 1000 * b), 1_000_000, 0, meter)  # type: ignore[arg-type]
    assert found.batch == 1000 and not found.capped
    with pytest.raises(MemoryError, match="not one sequence fits"):
        _on_cpu(lambda b: meter.run(b, 2_000_000 * b), 1_000_000, 0, meter)  # type: ignore[arg-type]


def test_a_search_stops_at_its_largest_batch_and_says_so() -> None:
    meter = FakeRss(lambda b: 1 + b // 1000)
    found = _on_cpu(meter.run, 2**40, 0, meter)  # type: ignore[arg-type]
    assert found.batch == MAX_CAPACITY and found.capped


@cuda
def test_a_gpu_search_finds_the_batch_by_running_out_of_memory() -> None:
    executor = TorchExecutor(ExecutorSettings("cuda", replace(QUICK, cache=None), telemetry="off"))  # its default: cold
    case = replace(serving("sdpa-flash", "capacity", 4096, memory_budget=2 * 2**30), device="cuda")
    result = executor.run(replace(case, batch=1))
    assert result.status == "ok", result.reason
    assert result.extra["capacity_method"] == "cuda-oom-search"
    held = result.extra["capacity_batch"] * result.extra["bytes_per_sequence"]
    assert held <= 2 * 2**30
    getter = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    assert getter is None or getter(0) == 1.0  # the allocator's cap put back


def test_every_chunk_of_a_timed_prefill_computes_its_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """As the one pass does: a chunked prefill that skipped its earlier chunks' outputs would leave out attention a
    one-pass prefill computes (the whole last layer's, in a one-layer model)."""
    from attnbench.families.registry import build_model
    from attnbench.timing.serving import PrefillSetup

    case = serving("sdpa-flash", "prefill", 16, prefill_chunk=4)
    model = build_model(case, "cpu", torch.float32)
    with torch.inference_mode():
        setup = PrefillSetup(model, case, torch.device("cpu"), torch.float32)
        asked: list[bool] = []
        real = setup.decoder.prefill

        def spy(x: torch.Tensor, state: object, *, output: bool = True) -> torch.Tensor | None:
            asked.append(output)
            return real(x, state, output=output)

        monkeypatch.setattr(setup.decoder, "prefill", spy)
        setup.prepare()
        setup.step()
    assert asked == [True] * 4


# ---------------------------------------------------------------- issue 48: what bounds a capacity, what it holds


def test_a_search_never_tries_a_batch_past_its_ceiling() -> None:
    """Past a kernel's launch limit a try fails with a launch error, not an OOM: no batch above it is tried."""
    tried: list[int] = []

    def fits(memory: int) -> Callable[[int], bool]:
        return lambda batch: tried.append(batch) or batch <= memory

    assert search_batches(fits(10**9), 4095) == 4095 and max(tried) == 4095
    tried.clear()
    assert search_batches(fits(3000), 4095) == 3000 and max(tried) <= 4095  # memory first: bisected below
    assert search_batches(fits(0), 4095) == 0


def test_the_attention_kernels_that_put_the_batch_on_a_grid_axis_are_bounded_by_it() -> None:
    """SDPA's flash, efficient and cuDNN kernels and flash-attn's decode kernel: batch × heads ≤ 65,535 on CUDA
    (pytorch#146704); the math path, a CPU and a recurrence have no such bound. A hybrid takes its members'."""
    from attnbench.families.registry import launch_limit

    for model in ("sdpa", "sdpa-flash", "sdpa-efficient", "sdpa-cudnn", "flash-attn"):
        limit = launch_limit(replace(serving(model, "capacity"), heads=16), "cuda")
        assert limit is not None and limit.batch == 65_535 // 16, model
        assert launch_limit(serving(model, "capacity"), "cpu") is None
    for model in ("sdpa-math", "vanilla", "lstm", "mamba2"):
        assert launch_limit(serving(model, "capacity"), "cuda") is None, model


@pytest.mark.slow
def test_a_capacity_stopped_by_its_kernel_is_recorded_as_capped_by_the_kernel(
    executor: TorchExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search stops at the family's launch limit and the row says the kernel, not memory, bounded it (here a
    CPU run under a limit of 3, as the attention family's on CUDA; before, the search ran into the launch error)."""
    import attnbench.timing.serving as serving_module

    asked: list[str] = []

    def limit(case: Case, device_type: str) -> LaunchLimit:
        asked.append(device_type)
        return LaunchLimit(3, "a grid axis")

    monkeypatch.setattr(serving_module, "launch_limit", limit)
    result = executor.run(serving("lstm", "capacity", 16, memory_budget=8 * 2**20))
    # The search is the point; the step's timing may not fit a test's budget on a busy machine (a cold flush each).
    assert result.status in ("ok", "too_slow_for_budget"), result.reason
    assert asked == ["cpu"]
    assert result.extra["capacity_batch"] == 3 and result.extra["capacity_capped"] is True
    assert result.extra["capacity_capped_by"] == "kernel-grid"


def test_a_gpu_budget_leaves_what_the_sweep_holds_outside() -> None:
    """The cold flush's buffer (≥ 256 MiB, alive for the worker) was a quarter of a 1 GiB budget: now it is held
    outside the budget (the allocator's cap raised by it) and recorded; a default budget is what is left besides."""
    mib, gib = 2**20, 2**30
    budget, excluded = gpu_budget(
        gib, free=70 * gib, reserved=300 * mib, allocated=256 * mib + 10 * mib, weights=10 * mib, total=80 * gib
    )
    assert (budget, excluded) == (gib, 256 * mib)
    default, excluded = gpu_budget(
        0, free=70 * gib, reserved=300 * mib, allocated=266 * mib, weights=10 * mib, total=80 * gib
    )
    assert excluded == 256 * mib and default == 70 * gib + 300 * mib - margin_bytes(80 * gib) - 256 * mib
    assert gpu_budget(gib, free=gib, reserved=0, allocated=5, weights=10, total=80 * gib) == (gib, 0)


@pytest.mark.gpu
@cuda
def test_on_a_gpu_attention_capacity_stops_at_the_kernels_grid_and_the_flush_is_outside_the_budget() -> None:
    executor = TorchExecutor(ExecutorSettings("cuda", replace(QUICK, cache=None), telemetry="off"))  # its default: cold
    case = replace(
        serving("sdpa-flash", "capacity", 16, memory_budget=2**30), device="cuda", heads=16, d_model=128
    )  # head_dim 8: flash takes it
    result = executor.run(replace(case, dtype="bfloat16"))
    assert result.status == "ok", result.reason
    assert result.extra["capacity_batch"] == 65_535 // 16 and result.extra["capacity_capped_by"] == "kernel-grid"
    assert result.extra["capacity_excluded_bytes"] >= 256 * 2**20  # capacity is cold: the flush's buffer, outside
    executor.close()


def test_a_search_that_does_not_settle_reports_the_largest_batch_that_held() -> None:
    """Issue 50 §3.7: on a noisy machine no confirmation fitted (another job's pages, a heap's history), and the
    valid case became an error row. The search now keeps the largest try that held within the budget, and says so."""
    room = 1_000_000

    def law(b: int) -> int:  # the growth points read clean; every confirmation reads over the budget
        return 1000 * b if b in (1, 2, 16, 128) else room + 1

    meter = FakeRss(law)
    found = _on_cpu(meter.run, room, 0, meter)  # type: ignore[arg-type]
    assert found.batch == 128 and law(found.batch) <= room
    assert found.unsettled and not found.capped
    assert len([b for b in meter.tries if b not in (1, 2, 16, 128)]) >= 1  # confirmations were tried
    steady = FakeRss(lambda b: 1000 + 300 * b)
    assert not _on_cpu(steady.run, room, 0, steady).unsettled  # type: ignore[arg-type]


def test_a_try_may_not_allocate_beyond_its_budget() -> None:
    """Issue 50 §3.4: a plugin's ``fill_to`` that asks for 50 GB was attempted. A try is bounded by its budget: an
    allocation beyond fails at once and the try does not fit; one within runs as before."""
    from attnbench.host.memory import bounded_allocation
    from attnbench.timing.failures import is_oom

    huge = 8 * 2**30  # 8 GiB, asked for and never touched: unbounded, the kernel would map it
    assert torch.empty(huge, dtype=torch.uint8).numel() == huge
    with bounded_allocation(64 * 2**20):
        assert torch.empty(16 * 2**20, dtype=torch.uint8).numel() == 16 * 2**20
        with pytest.raises(Exception) as caught:
            torch.empty(huge, dtype=torch.uint8)
        assert is_oom(caught.value)
    assert torch.empty(huge, dtype=torch.uint8).numel() == huge  # the bound is lifted after

    meter = FakeRss(lambda b: 1000 * b)

    def greedy(batch: int) -> int:  # a fill_to that asks for far more than the budget whatever the batch
        meter.run(batch)
        torch.empty(huge, dtype=torch.uint8)
        return 0

    with pytest.raises(MemoryError, match="not one sequence fits"):
        _on_cpu(greedy, 64 * 2**20, 0, meter)  # type: ignore[arg-type]
