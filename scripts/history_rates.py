"""How often `attnbench history` finds a planted step, and how often it finds one that is not there.

Simulated histories of 12 runs made from the committed tiny CPU run (tests/data/runs/tiny-cpu, 16 timed cases):
each run's samples are scaled by a factor shared by every case (the machine's state; log-normal, SD --sigma) and
one of each case's own (--case-sigma). Scenarios:

- one case 10 % slower from run 7: is that step found, alone?
- every case 10 % slower from run 7 (an injected slowdown, another host): is it one run-level step?
- flat: any step at all is a false one.

Prints a markdown table; results/history-detection-rates.md holds a run of it.

    python scripts/history_rates.py --seeds 100 > results/history-detection-rates.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from attnbench.analysis.history import build_history
from attnbench.results.store import load_runs
from tests.support import synthetic_runs

STEPPED = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"
PLANTED = [1.0] * 7 + [1.1] * 5


def scenario(name: str, seeds: int, sigma: float, case_sigma: float) -> dict[str, float]:
    counts = {"found": 0, "alone": 0, "false": 0, "shift": 0}
    for seed in range(seeds):
        with tempfile.TemporaryDirectory() as tmp:
            levels = [1.0] * 12 if name == "flat" else PLANTED
            only = STEPPED if name == "one case" else None
            runs, _ = load_runs(
                synthetic_runs(Path(tmp), levels, seed=seed, sigma=sigma, case_sigma=case_sigma, only=only)
            )
        history = build_history(runs)
        found = {c.key: [s.index for s in c.fit.steps] for c in history.cases if c.fit.steps}
        shift = history.segments[0].shift
        shift_steps = [] if shift is None else [s.index for s in shift.fit.steps]
        planted = [v for k, v in found.items() if k.startswith(STEPPED)]
        others = [k for k in found if not k.startswith(STEPPED) or name != "one case"]
        if name == "one case":
            counts["found"] += planted == [[7]]
            counts["alone"] += planted == [[7]] and not others and not shift_steps
            counts["false"] += bool(others) or bool(shift_steps)
        elif name == "every case":
            counts["found"] += shift_steps == [7]
            counts["alone"] += shift_steps == [7] and not found
            counts["false"] += bool(found) or any(i != 7 for i in shift_steps)
        else:
            counts["false"] += bool(found) or bool(shift_steps)
    return {k: v / seeds for k, v in counts.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=100)
    args = parser.parse_args()
    print("# Step detection in `attnbench history`: how often it is right, on simulated histories\n")
    print(f"{args.seeds} histories per row, 12 runs each, 16 timed cases (scripts/history_rates.py).\n")
    print(
        "| noise between runs (shared / each case) | scenario | step found at run 7 "
        "| found, and nothing else | histories with a false step |"
    )
    print("| --- | --- | --- | --- | --- |")
    for sigma, case_sigma in ((0.03, 0.01), (0.05, 0.02), (0.0, 0.03)):
        for name in ("one case", "every case", "flat"):
            r = scenario(name, args.seeds, sigma, case_sigma)
            found = "—" if name == "flat" else f"{r['found']:.0%}"
            alone = "—" if name == "flat" else f"{r['alone']:.0%}"
            print(f"| {sigma:.0%} / {case_sigma:.0%} | {name} | {found} | {alone} | {r['false']:.0%} |")
    print(
        '\n"one case": one case 10 % slower from run 7 — found means that case\'s step at run 7; a false step is '
        'any other case\'s, or a run-level one. "every case": all cases 10 % slower from run 7 — found means one '
        'run-level step at run 7; a false step is any case\'s own step, or a run-level one elsewhere. "flat": '
        "any step is false."
    )


if __name__ == "__main__":
    main()
