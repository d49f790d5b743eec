"""Is a two-thread LSTM's slow level a property of the process or of the moment (issue 38)?

    python scripts/bench_lstm_levels.py [--processes 8] [--seconds 40] [--report FILE]

A two-thread oneDNN LSTM on a 2-vCPU VM reads at one of two levels, ~35 % apart. Two experiments tell where the
level comes from:

1. **Fresh processes, four environments** (libgomp's default; threads bound to cores; malloc on transparent huge
   pages; the active wait), interleaved, ``--processes`` each: each process times the same LSTM forward (b=4,
   n=256, d=256) and prints its median. If the level were set per process by one of these, that variant's
   processes would all read the fast level.
2. **One process over time**, at two threads and at one: the median of each 2 s window for ``--seconds``. If the
   level moves within one process, no per-process setting can pin it; only sampling spread over time (several
   runs a side, alternated) averages it out.

Prints a markdown report; run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

# One LSTM forward timed in a fresh interpreter: warm-up, then either one median (mode "once") or the median of each
# 2 s window until the time is up (mode "windows").
PROBE = """
import statistics, sys, time, torch
mode, threads, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
torch.set_num_threads(threads)
lstm, x = torch.nn.LSTM(256, 256, batch_first=True), torch.randn(4, 256, 256)

def window(until):
    times = []
    while time.perf_counter() < until or len(times) < 5:
        start = time.perf_counter(); lstm(x); times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3

with torch.inference_mode():
    for _ in range(20):
        lstm(x)
    if mode == "once":
        print(f"{window(time.perf_counter() + 0.6):.3f}")
    else:
        end, found = time.perf_counter() + seconds, []
        while time.perf_counter() < end:
            found.append(window(time.perf_counter() + 2.0))
        print(" ".join(f"{t:.2f}" for t in found))
"""

VARIANTS = {
    "default": {},
    "bound": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    "huge pages": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "active wait": {"OMP_WAIT_POLICY": "ACTIVE"},
}


def probe(mode: str, threads: int, seconds: float, extra: dict[str, str]) -> list[float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "GOMP_", "GLIBC_TUNABLES"))}
    run = subprocess.run(
        [sys.executable, "-c", PROBE, mode, str(threads), str(seconds)],
        env={**env, **extra},
        capture_output=True,
        text=True,
        check=True,
        timeout=seconds + 120,
    )
    return [float(t) for t in run.stdout.split()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()

    started = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    found: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for _ in range(args.processes):
        for name, extra in VARIANTS.items():
            found[name] += probe("once", 2, 0.0, extra)
    two = probe("windows", 2, args.seconds, {})
    one = probe("windows", 1, args.seconds, {})

    def spread(values: list[float]) -> str:
        return f"{min(values):.2f}–{max(values):.2f} ms (max/min {max(values) / min(values):.2f})"

    lines = [
        "# A two-thread LSTM's two levels: per process, or per moment? (issue 38)",
        "",
        f"`python scripts/bench_lstm_levels.py --processes {args.processes} --seconds {args.seconds:g}`, {started}, "
        f"{os.cpu_count()} logical CPUs; nn.LSTM(256, 256) forward, b=4, n=256, float32, inference mode.",
        "",
        "## Fresh processes, two threads, interleaved",
        "",
        "| environment | variables | each process's median (ms), sorted | range |",
        "| --- | --- | --- | --- |",
    ]
    for name, extra in VARIANTS.items():
        values = sorted(found[name])
        env = " ".join(f"`{k}={v}`" for k, v in extra.items()) or "(none)"
        lines.append(f"| {name} | {env} | {' '.join(f'{t:.2f}' for t in values)} | {spread(values)} |")
    lines += [
        "",
        "## One process over time: the median of each 2 s window",
        "",
        "| threads | windows in order (ms) | range | median |",
        "| --- | --- | --- | --- |",
        f"| 2 | {' '.join(f'{t:.2f}' for t in two)} | {spread(two)} | {statistics.median(two):.2f} ms |",
        f"| 1 | {' '.join(f'{t:.2f}' for t in one)} | {spread(one)} | {statistics.median(one):.2f} ms |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.report is not None:
        args.report.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
