"""Which thread-pool settings make fresh CPU worker processes agree with each other (issue 38)?

    python scripts/bench_thread_env.py [--processes 6] [--variants default,active,...] [--report FILE]

For each variant (a set of environment variables a worker process starts with), ``calibrate``'s noise measurement
runs the reference cases (an LSTM forward, a vanilla attention train step, a fused attention forward) in
``--processes`` fresh worker processes and pools their spread into the floor ``compare`` would use: the half-width
of a 95 % interval of the ratio of two single processes. The variants run interleaved, one process of each in
turn, so that a machine drifting over the minutes lands on every variant alike. Prints a markdown table; run it on
a quiet machine (the load average is recorded before each round).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attnbench.instrument.noise import NOISE_POLICY, noise_floor, reference_cases  # noqa: E402
from attnbench.sweeps.isolated_executor import IsolatedExecutor  # noqa: E402
from attnbench.timing.executor import ExecutorSettings  # noqa: E402

VARIANTS: Mapping[str, Mapping[str, str]] = {
    "default": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},
    "spin-30ms": {"GOMP_SPINCOUNT": "3000000"},
    "bind-close": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores"},
    "bind-active": {"OMP_PROC_BIND": "close", "OMP_PLACES": "cores", "OMP_WAIT_POLICY": "ACTIVE"},
}


def one_process(env: Mapping[str, str], threads: int | None) -> list[float]:
    """The reference cases' medians in one fresh worker that starts with exactly ``env`` for its thread pool."""
    settings = ExecutorSettings(device="cpu", timing=NOISE_POLICY, threads=threads, telemetry="off")
    worker = IsolatedExecutor(settings)
    worker.env = {k: v for k, v in worker.env.items() if not k.startswith(("OMP_", "GOMP_"))} | dict(env)
    try:
        medians = []
        for case in reference_cases("cpu"):
            result = worker.run(case)
            medians.append(result.measurement.median_s if result.measurement is not None else float("nan"))
        return medians
    finally:
        worker.close()


def floor(medians: list[list[float]]) -> float:
    """compare's floor from per-process medians of each case, as ``calibrate`` pools them (``noise_floor``); a
    process whose case did not time (NaN) is left out of that case. Unlike ``calibrate`` no busy round is retaken:
    the load before each process is in the report instead."""
    by_case = [[x for x in m if math.isfinite(x)] for m in zip(*medians, strict=True)]
    return noise_floor(by_case)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, one per core)")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    names = args.variants.split(",")
    for name in os.environ:
        if name.startswith(("OMP_", "GOMP_")):
            raise SystemExit(f"{name} is set in this shell: unset it, the variants set their own")
    runs: dict[str, list[list[float]]] = {name: [] for name in names}
    loads: list[float] = []
    for i in range(args.processes):
        for name in names:
            loads.append(os.getloadavg()[0])
            runs[name].append(one_process(VARIANTS[name], args.threads))
            print(f"process {i + 1}/{args.processes} {name}: " + ", ".join(f"{m * 1e3:.3f} ms" for m in runs[name][-1]))
    cases = [c.label for c in reference_cases("cpu")]
    lines = [
        f"{args.processes} fresh worker processes per variant, interleaved; torch threads {args.threads or 'default'}; "
        f"1-minute load {min(loads):.2f}–{max(loads):.2f} before each process.",
        "",
        "| variant | env | floor (±) | " + " | ".join(f"{c}: min–max ms" for c in cases) + " |",
        "|---|---|---|" + "---|" * len(cases),
    ]
    for name in names:
        medians = runs[name]
        spans = [f"{min(m) * 1e3:.3f}–{max(m) * 1e3:.3f}" for m in zip(*medians, strict=True)]
        env = " ".join(f"{k}={v}" for k, v in VARIANTS[name].items()) or "(none)"
        lines.append(f"| {name} | {env} | {floor(medians):.1%} | " + " | ".join(spans) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.report:
        args.report.write_text(text)


if __name__ == "__main__":
    main()
