"""What the telemetry sampler costs: the same cases timed with it and without it, interleaved in one process.

    python scripts/telemetry_overhead.py [--device cpu] [--rounds 10] [--interval 0.02] \
        > results/telemetry-overhead-cpu.md

Each round times every case twice (sampler off, then on, the order alternating between rounds), so drift of
the machine hits both sides alike; the figure is the median over rounds of the on/off ratio of medians.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from attnbench.core.cases import Case, TimingPolicy
from attnbench.measure.executor import ExecutorSettings
from attnbench.measure.torch_executor import TorchExecutor

CASES = (
    Case("lstm", "forward", "float32", "cpu", 4, 256, 256, None, 1, True),
    Case("sdpa-flash", "forward", "float32", "cpu", 4, 512, 256, 4, 1, False),
    Case("vanilla", "train", "float32", "cpu", 4, 256, 256, 4, 1, False),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--interval", type=float, default=0.02, help="the sampler's polling interval (s)")
    args = parser.parse_args()
    policy = TimingPolicy(target_ci=0.01, min_samples=20, min_time_s=0.5, max_case_s=1.5, warmup_max_s=0.3)
    off = TorchExecutor(ExecutorSettings(args.device, policy, telemetry="off"))
    on = TorchExecutor(ExecutorSettings(args.device, policy, telemetry="basic", telemetry_interval_s=args.interval))
    print(f"# Telemetry sampler overhead ({args.device}, interval {args.interval * 1e3:g} ms, {args.rounds} rounds)\n")
    print("| case | median off | median on | on/off (median of rounds) | rounds on > off | samples per case |")
    print("| --- | --- | --- | --- | --- | --- |")
    overall = []
    for case in CASES:
        case = Case(**{**case.__dict__, "device": args.device})
        ratios, offs, ons, samples = [], [], [], []
        for i in range(args.rounds):
            pair = (off, on) if i % 2 == 0 else (on, off)
            results = {id(executor): executor.run(case) for executor in pair}
            a, b = results[id(off)], results[id(on)]
            assert a.measurement and b.measurement, (a.reason, b.reason)
            offs.append(a.measurement.median_s)
            ons.append(b.measurement.median_s)
            ratios.append(b.measurement.median_s / a.measurement.median_s)
            samples.append(b.telemetry.samples if b.telemetry else 0)
        ratio = statistics.median(ratios)
        overall.append(ratio)
        print(
            f"| {case.label} | {statistics.median(offs) * 1e3:.3f} ms | {statistics.median(ons) * 1e3:.3f} ms | "
            f"{ratio:.4f} | {sum(r > 1 for r in ratios)}/{len(ratios)} | {statistics.median(samples):.0f} |"
        )
    print(
        f"\nOverall: median on/off ratio {statistics.median(overall):.4f} "
        f"({(statistics.median(overall) - 1) * 100:+.2f} %)."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
