"""Where a sweep's wall time goes: timed samples vs warm-up vs per-case setup vs the sweep around the cases.

Reads stored runs only (no torch), so it can be pointed at any run folder, including committed ones:

    python scripts/bench_overhead.py results/<run> [more runs…] [--wall-s SECONDS] [-o results/overhead-cpu.md]

``--wall-s`` is the whole command's wall time as the shell measured it (`time attnbench sweep …`), which also
covers Python start-up and importing torch; without it the run's own created → finished span is used.
Issue 3's target: wall time ≤ 1.5 × the time inside timed regions, for cases of at least 1 ms.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnbench.results.records import Result
from attnbench.results.store import load_run


def _parse_utc(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def _timed_s(result: Result) -> float:
    m = result.measurement
    return 0.0 if m is None else sum(m.samples_s) * m.calls_per_sample


def breakdown(folder: Path, wall_s: float | None) -> list[str]:
    stored = load_run(folder)
    run, results = stored.run, stored.results
    span = (_parse_utc(run.finished_utc) - _parse_utc(run.created_utc)).total_seconds()
    wall = wall_s if wall_s is not None else span
    long = [r for r in results if r.measurement is not None and r.measurement.median_s >= 1e-3]
    lines = [f"## `{run.run_id}`", ""]
    rows = []
    for label, members in (("all cases", results), ("cases ≥ 1 ms", long)):
        timed = sum(_timed_s(r) for r in members)
        warm = sum(r.measurement.warmup_s for r in members if r.measurement is not None)
        case_total = sum(r.duration_s for r in members)
        rows.append((label, len(members), timed, warm, case_total - timed - warm, case_total))
    lines += [
        "| cases | n | timed samples | warm-up | setup + memory pass + telemetry | inside cases |",
        "|---|---|---|---|---|---|",
    ]
    lines += [f"| {label} | {n} | {t:.1f} s | {w:.1f} s | {o:.1f} s | {c:.1f} s |" for label, n, t, w, o, c in rows]
    timed_all, case_all = rows[0][2], rows[0][5]
    lines += [
        "",
        f"- whole command: {wall:.1f} s ({'measured by the shell' if wall_s is not None else 'run.json span'}); "
        f"the run's own span {span:.1f} s; outside the cases (start-up, torch import, environment, rendering): "
        f"{wall - case_all:.1f} s",
        f"- **wall / timed = {wall / timed_all:.2f}×** for the whole sweep; for the cases ≥ 1 ms alone, "
        f"time inside them / timed = {rows[1][5] / rows[1][2]:.2f}×"
        if rows[1][2] > 0
        else "",
        "",
    ]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--wall-s", type=float, action="append", help="shell-measured wall time, per run in order")
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    walls = args.wall_s or []
    lines = ["# Sweep overhead: where the wall time goes", ""]
    for index, folder in enumerate(args.runs):
        lines += breakdown(folder, walls[index] if index < len(walls) else None)
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
