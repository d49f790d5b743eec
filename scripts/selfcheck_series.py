"""Does ``attnbench selfcheck`` conclude on this machine? Five runs, one after another (issue 50 §4: pass or FAIL
within 120 s in at least 4 of 5 runs on a quiet 2-core VM).

    python scripts/selfcheck_series.py [--runs 5] [--device cpu] [--budget-s 120] [--calibrate]
        [--report results/selfcheck-series-cpu.md] [--conditions "on a quiet machine"] [-- EXTRA SELFCHECK ARGS]

Each run is ``attnbench selfcheck --device DEVICE -f json -o RUN.json`` in its own process, with the command's
defaults unless ``--budget-s`` or extra arguments say otherwise; its wall time is taken here, around the whole
command (interpreter start-up, import and exit included: what a user waits).

``--calibrate`` first runs ``attnbench calibrate --device DEVICE --dtype float32 --noise-processes 0 -f json``
(this machine's cached calibration when it has one, which the report says; else it measures and caches one, as
calibrate does) and quotes its float32 matmul and copy ceilings at the sweep's default thread count, so that two
VMs of the same kind can be told apart.

The report is rewritten after every run (a stopped series keeps what it had): per run the start time, the load
average, the exit code (0 pass, 1 FAIL, 5 inconclusive), the wall time, whether it concluded within the budget,
the selfcheck's own summary line and the ops it left undecided; then the count against the target. Every run's
JSON is kept next to the report (``<report>.jsonl``, started afresh).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONCLUDED = (0, 1)  # pass, FAIL; 5 is inconclusive


@dataclass(frozen=True)
class Run:
    started: str
    load: str
    exit: int
    seconds: float
    summary: str
    undecided: tuple[str, ...]


def load() -> str:
    try:
        return " / ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "unknown"


def attnbench(*args: str) -> list[str]:
    return [sys.executable, "-m", "attnbench", *args]


def ceilings(device: str) -> str:
    """The machine's float32 matmul and copy ceilings, as ``attnbench calibrate`` measures them now."""
    command = attnbench("calibrate", "--device", device, "--dtype", "float32", "--noise-processes", "0")
    done = subprocess.run([*command, "-f", "json"], capture_output=True, text=True, check=False, cwd=ROOT)
    try:
        data = json.loads(done.stdout)
        calibration = data["calibration"]
    except (json.JSONDecodeError, KeyError):
        return f"calibrate failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    matmul = next((m for m in calibration["matmul"] if m["dtype"] == "float32"), None)
    copy = calibration.get("copy")
    parts = [f"{calibration['device_name']}, {calibration['torch_threads']} torch threads"]
    if matmul is not None:
        parts.append(f"float32 matmul **{matmul['flops_per_s'] / 1e9:.0f} GFLOP/s**")
    if copy is not None:
        parts.append(f"copy **{copy['bytes_per_s'] / 1e9:.1f} GB/s**")
    measured = f"{calibration['created_utc']}, {data.get('origin', '')}".strip(", ")
    return ", ".join(parts) + f" (`{' '.join(command[3:])}`: {measured})"


def one(args: argparse.Namespace, output: Path) -> Run:
    command = attnbench("selfcheck", "--device", args.device, "-f", "json", "-o", str(output), *args.extra)
    if args.budget_s is not None:
        command += ["--budget-s", str(args.budget_s)]
    started, at = time.monotonic(), f"{datetime.now(UTC):%H:%M:%S}"
    said = load()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    seconds = time.monotonic() - started
    summary, undecided = "", ()
    try:
        data = json.loads(output.read_text(encoding="utf-8"))
        summary = data.get("summary", "")
        undecided = tuple(f"{op['op']} {op['shape']}" for op in data["ops"] if op.get("outcome") == "inconclusive")
    except (OSError, json.JSONDecodeError, KeyError):
        summary = f"no JSON: {done.stderr.strip()[-200:]}"
    return Run(at, said, done.returncode, seconds, summary, undecided)


def render(args: argparse.Namespace, runs: list[Run], machine: str) -> str:
    budget = args.budget_s if args.budget_s is not None else 120.0
    lines = [
        f"# `attnbench selfcheck --device {args.device}`, {args.runs} runs (issue 50 §4)",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d} UTC on {platform.node() or 'this machine'} ({os.cpu_count()} CPUs), "
        f"{args.conditions}. {machine}",
        "",
        f"Each run: `attnbench selfcheck --device {args.device}"
        + ("" if args.budget_s is None else f" --budget-s {args.budget_s:g}")
        + "".join(f" {a}" for a in args.extra)
        + "`, one after another; wall time is the whole command (start-up and exit included). "
        "Script: `scripts/selfcheck_series.py`.",
        "",
        "| run | start (UTC) | load avg (1/5/15 min) | exit | wall | concluded within the budget | verdict | "
        "undecided ops |",
        "| ---: | --- | --- | ---: | ---: | --- | --- | --- |",
    ]
    for n, run in enumerate(runs, 1):
        within = run.exit in CONCLUDED and run.seconds <= budget
        lines.append(
            f"| {n} | {run.started} | {run.load} | {run.exit} | {run.seconds:.1f} s | {'yes' if within else 'no'} | "
            f"{run.summary} | {', '.join(run.undecided) or '–'} |"
        )
    concluded = sum(r.exit in CONCLUDED and r.seconds <= budget for r in runs)
    lines += [
        "",
        f"**Concluded (pass or FAIL) within {budget:g} s: {concluded} of {len(runs)}** "
        f"({sum(r.exit == 0 for r in runs)} pass, {sum(r.exit == 1 for r in runs)} FAIL, "
        f"{sum(r.exit == 5 for r in runs)} inconclusive, {sum(r.exit not in (0, 1, 5) for r in runs)} other). "
        "Target (issue 50 §4): at least 4 of 5 on a quiet 2-core VM.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--budget-s", type=float, default=None, help="selfcheck's --budget-s (default: its own)")
    parser.add_argument("--calibrate", action="store_true", help="measure and quote the matmul and copy ceilings")
    parser.add_argument("--report", type=Path, default=ROOT / "results" / "selfcheck-series-cpu.md")
    parser.add_argument(
        "--conditions",
        default="**with other jobs running on the machine**",
        help="what the machine was doing, as the report says it (e.g. 'on a quiet machine')",
    )
    parser.add_argument("extra", nargs="*", help="more selfcheck arguments, after --")
    args = parser.parse_args()
    machine = f"Ceilings: {ceilings(args.device)}." if args.calibrate else ""
    log = args.report.with_suffix(".jsonl")
    log.write_text("")
    runs: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="selfcheck-series-") as tmp:
        for n in range(args.runs):
            output = Path(tmp) / f"run{n + 1}.json"
            runs.append(one(args, output))
            run = runs[-1]
            print(f"{n + 1}/{args.runs}: exit {run.exit} in {run.seconds:.1f} s: {run.summary}", flush=True)
            args.report.write_text(render(args, runs, machine))
            if output.is_file():
                with log.open("a") as out:
                    out.write(json.dumps(json.loads(output.read_text(encoding="utf-8"))) + "\n")
    print(render(args, runs, machine))
    return 0


if __name__ == "__main__":
    sys.exit(main())
