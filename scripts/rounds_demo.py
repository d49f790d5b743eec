"""Rounds over cases against a bursty neighbour: the ratio of two cases' medians, swept case after case and in
rounds (``timing.rounds``), while a load that comes and goes runs beside (issue 51, item 2).

    python scripts/rounds_demo.py [--sessions 5] [--rounds 4] [--load-procs 2] [--on 1.5] [--off 1.5]
        [--max-case-s 4] [--seq-len 256] [--report results/rounds-demo-cpu.md] [--conditions "a quiet machine"]

Each session sweeps the same two cases (lstm and mingru, forward, one torch thread) twice, plainly and in rounds,
in alternating order, through the library (``open_sweep``, in this process), while ``--load-procs`` processes beside
it spin for ``--on`` seconds and sleep for ``--off`` seconds over and over. Measured case after case, a burst lands
on one case and not the other, and the ratio of their medians moves with it; in rounds each case samples every
stretch alike, so the ratio should move less. The report gives, per way of sweeping, each session's ratio (lstm /
mingru), the spread of the ratios (max / min − 1, and the standard deviation of their logs) and how many rows were
marked contended. Takes about sessions × 2 × 2 × max_case_s plus warm-ups: 2–3 minutes with the defaults.

Say in the report what else the machine was doing (``--conditions``): the spread is the evidence only beside the
load this script makes, on an otherwise quiet machine.
"""

from __future__ import annotations

import argparse
import math
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import yaml

from attnbench.results.records import Result
from attnbench.sweeps.events import QuietListener
from attnbench.sweeps.runner import SweepRequest, open_sweep

MODELS = ("lstm", "mingru")


def burst(on_s: float, off_s: float, stop: mp.synchronize.Event) -> None:
    """A neighbour that comes and goes: spin ``on_s`` seconds, sleep ``off_s``, until told to stop."""
    while not stop.is_set():
        end = time.perf_counter() + on_s
        while time.perf_counter() < end:
            sum(range(10_000))
        stop.wait(off_s)


def config(folder: Path, args: argparse.Namespace, rounds: int) -> Path:
    timing = {"target_ci": 0.01, "min_samples": 10, "min_time_s": 0.2, "max_case_s": args.max_case_s}
    if rounds > 1:
        timing["rounds"] = rounds
    data = {
        "name": f"rounds-demo-{rounds}",
        "device": "cpu",
        "models": list(MODELS),
        "modes": ["forward"],
        "grid": {"batch": [1], "seq_len": [args.seq_len]},
        "d_model": 64,
        "threads": 1,
        "telemetry": "off",
        "timing": timing,
    }
    path = folder / f"rounds-{rounds}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def sweep(path: Path, out: Path) -> tuple[float | None, int]:
    """The ratio of the two cases' medians (None when one is not ok), and how many rows were marked contended."""
    with open_sweep(SweepRequest(path, "cpu", out, isolate=False)) as opened:
        rows: Sequence[Result] = opened.run(QuietListener())
    medians = {r.case.model: r.measurement.median_s for r in rows if r.ok and r.measurement is not None}
    contended = sum(r.contended for r in rows)
    if not all(m in medians for m in MODELS):
        return None, contended
    return medians[MODELS[0]] / medians[MODELS[1]], contended


def spread(ratios: Sequence[float]) -> str:
    if len(ratios) < 2:
        return "too few sessions"
    logs = [math.log(r) for r in ratios]
    return f"max/min − 1 = {max(ratios) / min(ratios) - 1:.1%}, sd of log ratio = {statistics.stdev(logs):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--load-procs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--on", type=float, default=1.5, help="seconds the load spins")
    parser.add_argument("--off", type=float, default=1.5, help="seconds the load sleeps")
    parser.add_argument("--max-case-s", type=float, default=4.0)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--report", type=Path, default=None)
    parser.add_argument("--conditions", default="not said")
    args = parser.parse_args()
    ratios: dict[str, list[float]] = {"case after case": [], f"{args.rounds} rounds": []}
    contended: dict[str, int] = dict.fromkeys(ratios, 0)
    lines: list[str] = []
    context = mp.get_context("spawn")
    stop = context.Event()
    load = [context.Process(target=burst, args=(args.on, args.off, stop), daemon=True) for _ in range(args.load_procs)]
    with tempfile.TemporaryDirectory(prefix="rounds-demo-") as tmp:
        folder = Path(tmp)
        paths = {"case after case": config(folder, args, 1), f"{args.rounds} rounds": config(folder, args, args.rounds)}
        for process in load:
            process.start()
        try:
            for session in range(args.sessions):
                order = list(paths) if session % 2 == 0 else list(paths)[::-1]  # drift hits both ways alike
                for way in order:
                    ratio, marked = sweep(paths[way], folder / "out")
                    contended[way] += marked
                    if ratio is not None:
                        ratios[way].append(ratio)
                    said = "n/a" if ratio is None else f"{ratio:.3f}"
                    lines.append(f"- session {session + 1}, {way}: lstm / mingru = {said} ({marked} rows contended)")
                    print(lines[-1], flush=True)
        finally:
            stop.set()
            for process in load:
                process.join(5)
    summary = [
        "# Rounds over cases beside a bursty load",
        "",
        f"Conditions: {args.conditions}. Load: {args.load_procs} processes, {args.on:g} s on / {args.off:g} s off. "
        f"Cases: {', '.join(MODELS)} forward, n={args.seq_len}, d_model 64, 1 thread, max_case_s {args.max_case_s:g}.",
        "",
        *[f"- {way}: {spread(r)} over {len(r)} sessions; {contended[way]} rows contended" for way, r in ratios.items()],
        "",
        *lines,
    ]
    print("\n".join(summary[4 : 4 + len(ratios)]))
    if args.report is not None:
        args.report.write_text("\n".join(summary) + "\n", encoding="utf-8")
        print(f"wrote {args.report}")


if __name__ == "__main__":
    main()
