"""What the telemetry sampler costs: the same cases timed with it and without it, interleaved in one process.

    python scripts/telemetry_overhead.py [--device cpu|cuda] [--rounds 10] [--interval S] [--nvml real|fake] \
        >> results/telemetry-overhead-cpu.md

Each round times every case twice (telemetry off, then on, the order alternating between rounds), so drift of
the machine hits both sides alike; the figure is the median over rounds of the on/off ratio of medians. Beside
it, the same for each measurement's fastest sample (other load only ever adds time, so on a shared machine the
fastest samples are what the sampler alone does to a call), and the CPU time the sampler thread burns per
second of an open window, which other load cannot inflate.

``--nvml fake`` (CPU only) runs the GPU telemetry path — NVML's sample buffers, the polled readings, GPM at level
full — against the fake pynvml of the test suite, around CPU cases: what the sampler thread beside the timed calls
costs the host, measured where no GPU is (the fake's calls are Python, where the real bindings' are ctypes; both
hold the GIL). On ``--device cuda`` the cases are bf16 (FlashAttention has no float32 kernel) and a row that is not
``ok`` is reported and left out rather than ending the run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

STARTED = time.perf_counter()  # before torch's import, which --budget-s counts too
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # scripts run from a checkout; the fake pynvml lives in its tests/

from attnbench.core.cases import Case, TimingPolicy, default_interval_s  # noqa: E402
from attnbench.core.units import plural  # noqa: E402
from attnbench.timing import torch_executor  # noqa: E402
from attnbench.timing.executor import ExecutorSettings  # noqa: E402
from attnbench.timing.torch_executor import TorchExecutor  # noqa: E402

CPU_CASES = (
    Case("lstm", "forward", "float32", "cpu", 4, 256, 256, None, 1, True),
    Case("sdpa-flash", "forward", "float32", "cpu", 4, 512, 256, 4, 1, False),
    Case("vanilla", "train", "float32", "cpu", 4, 256, 256, 4, 1, False),
)
# On a GPU: short, launch-heavy calls (where a thread competing for the GIL would show) and a long fused one.
CUDA_CASES = (
    Case("lstm", "forward", "bfloat16", "cuda", 1, 256, 1024, None, 1, True),
    Case("sdpa-flash", "forward", "bfloat16", "cuda", 8, 2048, 1024, 16, 1, False),
    Case("vanilla", "train", "bfloat16", "cuda", 4, 1024, 1024, 16, 1, False),
)


def fake_nvml_telemetry() -> Callable[..., Any]:
    """``open_telemetry`` bound to a fake Hopper GPU: the GPU session's code path around a CPU case."""
    from attnbench.host.sensors import open_telemetry
    from attnbench.host.sensors.identity import GpuIdentity
    from tests.fake_pynvml import FakeGpu, FakeNvml

    fake = FakeNvml([FakeGpu(util_period_s=1 / 6, sample_period_s=0.02)])
    ident = GpuIdentity("cuda:0", fake.gpus[0].uuid, None)

    def opened(device: str, level: Any, interval_s: float) -> Any:
        return open_telemetry("cuda:0", level, interval_s, nvml=lambda: fake, identity=lambda d: ident)

    return opened


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--interval", type=float, default=None, help="the sampler's polling interval (s)")
    parser.add_argument("--nvml", choices=("real", "fake"), default="real", help="fake: the GPU path, on a CPU")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="one case at n and d_model 64, 0.3 s per measurement, short warm-ups, a 0.5 s sampler window: plumbing",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="fit the whole run in this many seconds: each measurement and the sampler's window sized from it "
        f"(after {RESERVED_S:g} s for torch's import, CUDA's start and the first profile)",
    )
    args = parser.parse_args()
    cuda = args.device.startswith("cuda")
    if args.nvml == "fake" and cuda:
        parser.error("--nvml fake times CPU cases; on a GPU the real NVML is used")
    interval = args.interval or default_interval_s(args.device if args.nvml == "real" else "cuda")
    policy = TimingPolicy(target_ci=0.01, min_samples=20, min_time_s=0.5, max_case_s=1.5, warmup_max_s=0.3)
    window_s = 2.0
    if args.quick:
        policy = TimingPolicy(
            target_ci=0.05, min_samples=5, min_time_s=0.05, max_case_s=0.3, warmup_max_s=0.1, process_warmup_s=0.05
        )
        window_s = 0.5
    if args.budget_s is not None:
        plan = budgeted(args.budget_s, 2 * len(CUDA_CASES if cuda else CPU_CASES) * args.rounds)
        if plan is None:
            parser.error(f"--budget-s {args.budget_s:g} leaves nothing for the measurements after {RESERVED_S:g} s")
        policy, window_s = plan
    level = "full" if cuda or args.nvml == "fake" else "basic"
    off = TorchExecutor(ExecutorSettings(args.device, policy, telemetry="off"))
    on = TorchExecutor(ExecutorSettings(args.device, policy, telemetry=level, telemetry_interval_s=interval))
    if args.nvml == "fake":
        # The executor opens telemetry through this module attribute; the stand-in serves the "on" side only.
        torch_executor.open_telemetry = partial(_either, real=torch_executor.open_telemetry, fake=fake_nvml_telemetry())
    what = "GPU path on a fake pynvml, CPU cases" if args.nvml == "fake" else args.device
    opener = fake_nvml_telemetry() if args.nvml == "fake" else _real_telemetry
    sampler_ms = sampler_cpu_ms_per_s(partial(opener, args.device), level, interval, window_s)
    rounds = plural(args.rounds, "round")
    print(f"## Telemetry overhead ({what}, level {level}, interval {interval * 1e3:g} ms, {rounds})\n")
    print(
        "| case | median off | median on | on/off (median of rounds) | rounds on > off | on/off, fastest samples "
        "| samples per case |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    overall, overall_fastest = [], []
    cases = CUDA_CASES if cuda else CPU_CASES
    if args.quick:  # plumbing only: one case (SDPA's, the cheapest to build and run), at small shapes
        cases = cases[1:2]
    for template in cases:
        case = replace(template, device=args.device)
        if args.quick:
            case = replace(case, seq_len=min(case.seq_len, 64), d_model=min(case.d_model, 64))
        ratios, fastest, offs, ons, samples = [], [], [], [], []
        skipped = ""
        for i in range(args.rounds):
            pair = (off, on) if i % 2 == 0 else (on, off)
            results = {id(executor): executor.run(case) for executor in pair}
            a, b = results[id(off)], results[id(on)]
            if not (a.is_timed and b.is_timed):
                skipped = next(r.reason or r.status for r in (a, b) if not r.is_timed)
                break
            offs.append(a.median_s)
            ons.append(b.median_s)
            ratios.append(b.median_s / a.median_s)
            fastest.append(b.timing.summary.min / a.timing.summary.min)
            samples.append(b.telemetry.samples if b.telemetry else 0)
        if skipped:
            print(f"| {case.label} | skipped: {skipped} | | | | | |")
            continue
        ratio, fast = statistics.median(ratios), statistics.median(fastest)
        overall.append(ratio)
        overall_fastest.append(fast)
        print(
            f"| {case.label} | {statistics.median(offs) * 1e3:.3f} ms | {statistics.median(ons) * 1e3:.3f} ms | "
            f"{ratio:.4f} | {sum(r > 1 for r in ratios)}/{len(ratios)} | {fast:.4f} | "
            f"{statistics.median(samples):.0f} |"
        )
    if overall:
        median, fast = statistics.median(overall), statistics.median(overall_fastest)
        print(
            f"\nOverall: median on/off ratio {median:.4f} ({(median - 1) * 100:+.2f} %); of the fastest samples "
            f"{fast:.4f} ({(fast - 1) * 100:+.2f} %)."
        )
    else:
        print("\nOverall: no case ran here.")
    print(
        f"\nThe sampler thread itself: {sampler_ms:.2f} ms of CPU time per second of window (an idle {window_s:g} s "
        "window; CPU time, so other load on the machine does not inflate it).\n"
    )
    if args.budget_s is not None:
        print(f"Ran in {time.perf_counter() - STARTED:.1f} s of its {args.budget_s:g} s budget (--budget-s).\n")
    return 0


# What a run spends outside its measurements, at most (seen: torch's import with CUDA 13's libraries ~3 s, CUDA's
# context ~1 s, CUPTI's first profile ~1-2 s, two executors' process warm-ups) and the sampler window's opening.
RESERVED_S = 8.0
# Each measurement's own overhead beyond its max_case_s: building the model, the profiled call, telemetry's edges.
PER_MEASUREMENT_S = 0.25


def budgeted(budget_s: float, measurements: int) -> tuple[TimingPolicy, float] | None:
    """The policy and sampler window that fit ``measurements`` timed cases and the window in ``budget_s`` seconds
    (``RESERVED_S`` of it set aside): each case's ``max_case_s`` (its warm-up inside it) from what is left, capped at
    the full run's 1.5 s; the window a tenth of the budget, 0.5-2 s. None where nothing is left."""
    window_s = min(2.0, max(0.5, budget_s / 10))
    left = budget_s - RESERVED_S - window_s - measurements * PER_MEASUREMENT_S
    if left <= 0 or measurements < 1:
        return None
    case_s = min(1.5, left / measurements)
    policy = TimingPolicy(
        target_ci=0.01,
        min_samples=5,
        min_time_s=case_s / 3,
        max_case_s=case_s,
        warmup_max_s=case_s / 5,
        process_warmup_s=min(0.5, case_s / 5),
    )
    return policy, window_s


def sampler_cpu_ms_per_s(opener: Callable[..., Any], level: Any, interval_s: float, window_s: float = 2.0) -> float:
    """CPU time the sampler thread spends per second while a window is open, the main thread asleep: what runs
    beside the timed calls (the window's edges, outside them, are left out)."""
    with opener(level, interval_s):
        time.sleep(0.3)  # past the window's opening
        before = time.process_time()
        time.sleep(window_s)
        spent = time.process_time() - before
    return spent / window_s * 1e3


def _real_telemetry(device: str, level: Any, interval_s: float) -> Any:
    from attnbench.host.sensors import open_telemetry

    return open_telemetry(device, level, interval_s)


def _either(device: str, level: Any, interval_s: float, *, real: Any, fake: Any) -> Any:
    return real(device, level, interval_s) if level == "off" else fake(device, level, interval_s)


if __name__ == "__main__":
    sys.exit(main())
