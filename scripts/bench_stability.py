"""How far the same case moves between two runs of the same config: the distribution of |Δ median|.

Reads stored runs only (no torch). Pair runs made back to back on one machine:

    attnbench sweep --out /tmp/stab && attnbench sweep --out /tmp/stab
    python scripts/bench_stability.py /tmp/stab/<first> /tmp/stab/<second> [-o results/stability-cpu.md]

Issue 3's aim is a median |Δ| ≤ 3 % for cases of at least 1 ms on a CPU. Cases are matched by key.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attnbench.results.store import load_run


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def stability(first: Path, second: Path) -> list[str]:
    a, b = load_run(first), load_run(second)
    medians_a = {r.case.key: r.measurement.median_s for r in a.results if r.ok and r.measurement is not None}
    rows = []
    for r in b.results:
        if r.ok and r.measurement is not None and r.case.key in medians_a:
            base = medians_a[r.case.key]
            rows.append((r.case.label, base, r.measurement.median_s, r.measurement.median_s / base - 1))
    lines = [f"## `{a.run.run_id}` → `{b.run.run_id}`", ""]
    for label, members in (("all cases", rows), ("cases ≥ 1 ms", [x for x in rows if x[1] >= 1e-3])):
        deltas = [abs(x[3]) for x in members]
        if not deltas:
            continue
        lines.append(
            f"- {label} ({len(deltas)}): median |Δ| {statistics.median(deltas):.1%}, "
            f"90th percentile {_quantile(deltas, 0.9):.1%}, max {max(deltas):.1%}; "
            f"signed median Δ {statistics.median(x[3] for x in members):+.1%} "
            f"(a shared shift means the machine as a whole ran faster or slower)"
        )
    lines += ["", "| case | first | second | Δ |", "|---|---|---|---|"]
    lines += [f"| {label} | {x * 1e3:.3f} ms | {y * 1e3:.3f} ms | {d:+.1%} |" for label, x, y, d in rows]
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first", type=Path)
    parser.add_argument("second", type=Path)
    parser.add_argument("-o", "--output", type=Path)
    args = parser.parse_args()
    text = "\n".join(["# Run-to-run stability", "", *stability(args.first, args.second)]) + "\n"
    sys.stdout.write(text)
    if args.output:
        args.output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
