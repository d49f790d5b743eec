"""Why do the written-out attention's paired ratios spread in ``attnbench selfcheck`` (issue 50 §4)?

    python scripts/selfcheck_spread.py [--rounds 12] [--pairs 3]

Each process times, in paired rounds as ``selfcheck`` did before the fix (50 ms blocks, attnbench then
torch.utils.benchmark, the order alternating), vanilla at b=2, n=256 and 512, and the LSTM at b=4, n=256 as a
control for the machine's load in the same minutes; it prints each op's per-round ratio spread (the standard
deviation of the log ratios) and the minor page faults each timer's block took. Processes alternate between
glibc's default malloc and ``host.memory.steady_heap`` (which no process can undo: mallopt turns glibc's dynamic
thresholds off for good), ``--pairs`` times. Run it with one thread, as selfcheck's CPU default is.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

PROBE = r"""
import math, resource, statistics, sys, contextlib, torch
from torch.utils.benchmark import Timer
from attnbench.host.memory import steady_heap
from attnbench.instrument.agreement import _built, block_policy, ops_for, policy_for
from attnbench.timing.adaptive import measure
from attnbench.timing.clocks import clock_for

rounds, steady = int(sys.argv[1]), sys.argv[2] == "steady"
torch.set_num_threads(1)
dev, clock = torch.device("cpu"), clock_for(torch.device("cpu"))
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
wanted = [("vanilla", 256), ("vanilla", 512), ("lstm", 256)]
ops = [op for op in ops_for("cpu") if op.case is not None and (op.name, op.case.seq_len) in wanted]
with steady_heap() if steady else contextlib.nullcontext():
    for op in ops:
        with _built(op, dev) as fn, torch.inference_mode():
            call = measure(fn, clock, policy_for(False)).median_s
            timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=1)
            runners = [lambda: measure(fn, clock, block_policy(0.05)).median_s,
                       lambda: float(timer.blocked_autorange(min_run_time=0.05).median)]
            ratios, took = [], [0, 0]
            for r in range(rounds):
                got = [0.0, 0.0]
                for i in ([0, 1] if r % 2 == 0 else [1, 0]):
                    before = faults()
                    got[i] = runners[i]()
                    took[i] += faults() - before
                ratios.append(got[0] / got[1])
            sd = statistics.stdev(math.log(x) for x in ratios)
            print(f"| {'steady_heap' if steady else 'default'} | {op.name} n={op.case.seq_len} | {call * 1e3:.1f} ms "
                  f"| {sd:.2f} | {min(ratios):.2f}–{max(ratios):.2f} | {took[0] // rounds} / {took[1] // rounds} |",
                  flush=True)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--pairs", type=int, default=3)
    args = parser.parse_args()
    print("| malloc | op | call | sd of log ratios | ratio min–max | faults a block: attnbench / Timer |")
    print("| --- | --- | --- | --- | --- | --- |")
    for _ in range(args.pairs):
        for mode in ("default", "steady"):
            subprocess.run([sys.executable, "-c", PROBE, str(args.rounds), mode], check=True)


if __name__ == "__main__":
    main()
