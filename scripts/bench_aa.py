"""A/A check of ``attnbench compare``: unchanged code, measured again and again, must not be called a regression.

    python scripts/bench_aa.py [--runs 10] [--config configs/aa-cpu.yaml] [--fail-on median:5% --fail-on median:3%]
        [--noise-floor 4%] [--processes 1] [--runs-per-side 1 [--interleave]] [--set key=value ...]
        [--report results/compare-aa-cpu.md] [--hog] [--quiet-load 1.0 [--wait-quiet 600]]

``--hog`` runs a one-core Python busy loop throughout (the loaded A/A table); ``--quiet-load L`` waits before each
sweep until the 1-minute load average is below L (at most ``--wait-quiet`` seconds) and records it per run.

Runs ``attnbench sweep CONFIG`` ``--runs`` times, each in its own process through the CLI (``--runs-per-side K``: K
sweeps per run, a folder of K runs being one side), then compares each run with the next (``--runs`` − 1
comparisons; with ``--interleave`` the sides come in pairs, each pair swept alternately A B B A … and compared on its
own, as compare advises for folders of runs) through ``attnbench compare --format json`` at every ``--fail-on``
threshold, and writes a markdown report: the verdict counts per comparison, the total number of cases flagged
regressed (target: at most 1 in all), and the spread of the same case between two processes on this machine, with
the ``--noise-floor`` it suggests (the 95th percentile of |ratio − 1|). About 25 s per run of the default config on
a 2-core CPU (sweep and start-up; no plots), so 10 runs and the comparisons take about 5 minutes.

``scripts/bench_power.py`` imports the helpers below.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")
VERDICTS = ("regressed", "improved", "same", "noisy", "new", "missing")


def attnbench(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """The CLI in a fresh process, from this checkout (installed or not)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    out = subprocess.run(
        [sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, env=env, cwd=ROOT, check=False
    )
    if check and out.returncode not in (0, 1):
        raise SystemExit(f"attnbench {shlex.join(args)} exited {out.returncode}:\n{out.stderr}")
    return out


@dataclass(frozen=True)
class Sweep:
    folder: Path
    wall_s: float
    load_1m: float = math.nan  # the 1-minute load average just before the sweep started
    contended: int = 0  # cases the sweep itself found contended (run.json contended_cases)
    runs: tuple[Sweep, ...] = ()  # a side made of several sweeps (a folder of runs): each of them


# Set by --quiet-load / --wait-quiet: before each sweep, wait up to WAIT_QUIET_S for the 1-minute load average to
# fall below QUIET_LOAD (the "quiet": < 1.0), and record what it was.
QUIET_LOAD = math.inf
WAIT_QUIET_S = 0.0


def wait_quiet() -> float:
    """The 1-minute load average once it is below ``QUIET_LOAD``, or when ``WAIT_QUIET_S`` has passed."""
    deadline = time.monotonic() + WAIT_QUIET_S
    while os.getloadavg()[0] >= QUIET_LOAD and time.monotonic() < deadline:
        time.sleep(5)
    return os.getloadavg()[0]


def sweep(config: Path, out: Path, sets: Sequence[str], extra: Sequence[str] = ()) -> Sweep:
    """One ``attnbench sweep`` in its own process, into ``out`` (which may hold earlier runs: a folder of runs is
    one side of a comparison); returns the run folder it made."""
    before = set(out.iterdir()) if out.is_dir() else set()
    load_1m = wait_quiet()
    start = time.perf_counter()
    attnbench("sweep", str(config), "--out", str(out), "-q", "--no-plots", *(f"--set={s}" for s in sets), *extra)
    wall = time.perf_counter() - start
    (folder,) = (p for p in out.iterdir() if (p / "run.json").is_file() and p not in before)
    contended = json.loads((folder / "run.json").read_text()).get("contended_cases") or 0
    return Sweep(folder, wall, load_1m, contended)


def stored(folder: Path) -> Sweep:
    """A sweep already on disk (``--from-work``): its wall time from run.json's timestamps, the load it started at
    from its first row's contention record, and its contended rows counted as `compare` counts them."""
    run = json.loads((folder / "run.json").read_text())
    begun, ended = (datetime.fromisoformat(run[k].replace("Z", "+00:00")) for k in ("created_utc", "finished_utc"))
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines() if line.strip()]
    loads = [r["contention"]["load_start"] for r in rows if "load_start" in r.get("contention", {})]
    contended = sum(1 for r in rows if r.get("measurement") and r.get("contention", {}).get("contended"))
    return Sweep(folder, (ended - begun).total_seconds(), loads[0] if loads else math.nan, contended)


def merge_side(folder: Path, runs: Sequence[Sweep]) -> Sweep:
    """One side of a comparison made of several sweeps (a folder of runs): the highest load any of them began at,
    their contended cases summed."""
    return Sweep(
        folder,
        sum(r.wall_s for r in runs),
        max(r.load_1m for r in runs),
        sum(r.contended for r in runs),
        tuple(runs),
    )


def stored_side(side: Path) -> Sweep:
    """A side already on disk (``--from-work``): the run folders in it, in the order their sweeps were made."""
    runs = sorted((stored(p) for p in side.iterdir() if (p / "run.json").is_file()), key=lambda s: s.folder.name)
    return merge_side(side, runs)


def stored_sides(work: Path) -> list[Sweep]:
    """The sides under ``work`` (each sub-folder holding run folders), in the order their first sweeps were made
    (by run id, which starts with the time)."""
    sides = [stored_side(p) for p in sorted(work.iterdir()) if p.is_dir() and any(p.glob("*/run.json"))]
    return sorted(sides, key=lambda s: s.runs[0].folder.name)


class Hog:
    """``--hog``: a Python busy loop in its own process, one core's worth of competing load, for the whole run."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Hog:
        if self.on:
            self.proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def contended_verdicts(data: dict[str, Any]) -> int:
    """Cases of one comparison that compare called noisy because a side was timed on a busy machine."""
    return sum(1 for c in data["cases"] if c.get("contended"))


def overall_cell(data: dict[str, Any]) -> str:
    """Compare's verdict on every case together (folders of runs only), with its change and interval, and the
    runs' spread (σ of one run's score) with the runs a side compare said it would take when it was noisy."""
    o = data.get("overall")
    if not o:
        return "—"
    cell = f"{o['verdict']} {pct(o['ratio'] - 1)} [{pct(o['ci_low'] - 1)}, {pct(o['ci_high'] - 1)}]"
    if "spread" in o:
        cell += f", σ {pct(o['spread'])}"
        if o["verdict"] == "noisy" and o["runs_needed"] > min(o["base_runs"], o["current_runs"]):
            cell += f" (needs ~{o['runs_needed']} a side)"
    return cell


def conditions(args: argparse.Namespace) -> str:
    """The run's conditions in words, for the report's header."""
    parts = ["a one-core Python busy loop (`--hog`) ran throughout" if args.hog else "no load of our own"]
    if math.isfinite(args.quiet_load):
        parts.append(
            f"before each sweep the 1-minute load average had to be below {args.quiet_load:g} (waiting up to "
            f"{args.wait_quiet:g} s; the load each sweep started at is in the table)"
        )
    return "; ".join(parts)


def compare(base: Path, current: Path, fail_on: str, floor: str | None) -> dict[str, Any]:
    """``attnbench compare --format json`` in its own process; checks that its exit code agrees with its verdicts."""
    args = ["compare", str(base), str(current), "--fail-on", fail_on, "--format", "json", "-o", "-"]
    out = attnbench(*args, *(("--noise-floor", floor) if floor else ()))
    data: dict[str, Any] = json.loads(out.stdout)
    if out.returncode != (1 if data["regressed"] else 0):
        raise SystemExit(f"compare exited {out.returncode} but reports regressed={data['regressed']}")
    return data


def label(case: dict[str, Any]) -> str:
    heads = f" h={case['heads']}" if case["heads"] is not None else ""
    return f"{case['model']} {case['mode']} {case['dtype']} b={case['batch']} n={case['seq_len']}{heads}"


def machine(folder: Path) -> str:
    env = json.loads((folder / "run.json").read_text())["environment"]
    device = env.get("gpu_name") or env.get("cpu_model")
    return (
        f"{device}, {env.get('cpu_logical')} logical CPUs, torch {env.get('torch')}, "
        f"{env.get('torch_threads')} threads, python {env.get('python')}, host `{platform.node()}`"
    )


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 1]."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def when(from_work: bool, sides: Sequence[Sweep], load_before: str, wall_s: float, walls: Sequence[float]) -> str:
    """When the sweeps ran: now, with the load around them; or, judged again from stored runs, the span their
    run.json files record (the load now says nothing about them)."""
    if not from_work:
        return (
            f"Load average {load_before} before, {load()} after. Wall time {wall_s:.0f} s ({len(walls)} sweeps, "
            f"{statistics.median(walls):.1f} s median)."
        )
    runs = [json.loads((r.folder / "run.json").read_text()) for s in sides for r in s.runs or (s,)]
    start, end = min(r["created_utc"] for r in runs), max(r["finished_utc"] for r in runs)
    return (
        f"Judged again from the stored runs (`--from-work`): {len(walls)} sweeps made {start[:16].replace('T', ' ')}"
        f"–{end[11:16]} UTC, {statistics.median(walls):.1f} s median each."
    )


def pct(x: float) -> str:
    return f"{x * 100:.1f} %"


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def common_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "aa-cpu.yaml")
    parser.add_argument(
        "--fail-on",
        action="append",
        help="threshold(s) to judge at (repeatable; default median:5%% and median:3%%)",
    )
    parser.add_argument("--noise-floor", default=None, help="compare's --noise-floor (default: compare's own)")
    parser.add_argument(
        "--processes", type=int, default=1, help="timing.processes: fresh worker processes per case in each run"
    )
    parser.add_argument(
        "--runs-per-side",
        type=int,
        default=1,
        help="sweeps per side (alternated A B B A … where there are two sides): each side is then a folder of runs, "
        "judged on their per-process medians",
    )
    parser.add_argument("--set", dest="sets", action="append", default=[], help="config override for every sweep")
    parser.add_argument("--work", type=Path, default=None, help="keep the run folders here (default: a temp dir)")
    parser.add_argument("--hog", action="store_true", help="run a one-core Python busy loop throughout")
    parser.add_argument(
        "--from-work",
        action="store_true",
        help="sweep nothing: judge the run folders already in --work again (the load is each run's first row's)",
    )
    parser.add_argument(
        "--quiet-load", type=float, default=math.inf, help="wait for a 1-minute load average below this first"
    )
    parser.add_argument("--wait-quiet", type=float, default=600.0, help="seconds to wait for --quiet-load, at most")


def apply_quiet(args: argparse.Namespace) -> None:
    global QUIET_LOAD, WAIT_QUIET_S
    QUIET_LOAD, WAIT_QUIET_S = args.quiet_load, args.wait_quiet


def sweep_sets(args: argparse.Namespace) -> list[str]:
    return [*args.sets, *([f"timing.processes={args.processes}"] if args.processes != 1 else [])]


def command_line() -> str:
    return "python " + shlex.join([str(Path(sys.argv[0]).resolve().relative_to(ROOT)), *sys.argv[1:]])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    common_arguments(parser)
    parser.add_argument(
        "--runs",
        type=int,
        default=10,
        help="sides, each --runs-per-side sweeps (comparisons: runs - 1, or runs / 2 with --interleave)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="sides in pairs, each pair swept alternately (A B B A …) and compared on its own (runs / 2 "
        "comparisons): the protocol compare advises for folders of runs",
    )
    parser.add_argument("--report", type=Path, default=ROOT / "results" / "compare-aa-cpu.md")
    args = parser.parse_args()
    if args.runs < 2 or args.runs_per_side < 1 or (args.interleave and args.runs % 2):
        parser.error("--runs must be at least 2 (even with --interleave) and --runs-per-side at least 1")
    thresholds = args.fail_on or ["median:5%", "median:3%"]
    started, load_before, clock = datetime.now(UTC), load(), time.perf_counter()
    work = args.work or Path(tempfile.mkdtemp(prefix="attnbench-aa-"))
    apply_quiet(args)
    runs: list[Sweep] = stored_sides(work) if args.from_work else []
    with Hog(args.hog and not args.from_work):
        for i in range(0 if args.from_work else args.runs // 2 if args.interleave else args.runs):
            runs += sweep_pair(args, work, i) if args.interleave else [sweep_side(args, work, i)]
            print(f"side {len(runs)}/{args.runs} done ({runs[-1].wall_s:.1f} s)", file=sys.stderr)
    pairs = list(zip(runs[::2], runs[1::2], strict=False) if args.interleave else itertools.pairwise(runs))
    results = {t: [compare(a.folder, b.folder, t, args.noise_floor) for a, b in pairs] for t in thresholds}
    text = report(args, pairs, results, started, load_before, time.perf_counter() - clock)
    args.report.parent.mkdir(parents=True, exist_ok=True)
    args.report.write_text(text, encoding="utf-8")
    print(text)
    print(f"wrote {args.report}; run folders in {work}", file=sys.stderr)
    return 0


def sweep_side(args: argparse.Namespace, work: Path, i: int) -> Sweep:
    """Side ``i`` (from 0): ``--runs-per-side`` sweeps one after another."""
    side = work / f"run-{i + 1:02d}"
    return merge_side(side, [sweep(args.config, side, sweep_sets(args)) for _ in range(args.runs_per_side)])


def sweep_pair(args: argparse.Namespace, work: Path, i: int) -> list[Sweep]:
    """Pair ``i`` (from 0) of ``--interleave``: its two sides swept alternately, A B B A …, so the machine's drift
    during the pair falls on both alike."""
    folders = [work / f"pair-{i + 1:02d}-{side}" for side in "ab"]
    made: list[list[Sweep]] = [[], []]
    for side in alternated([0, 1], args.runs_per_side):
        made[side].append(sweep(args.config, folders[side], sweep_sets(args)))
    return [merge_side(folder, runs) for folder, runs in zip(folders, made, strict=True)]


def alternated(sides: Sequence[T], rounds: int) -> Iterator[T]:
    """Every side once a round, the order reversed every other round (A B B A …), so the machine's drift falls on
    every side alike."""
    for rep in range(rounds):
        yield from sides if rep % 2 == 0 else sides[::-1]


def report(
    args: argparse.Namespace,
    pairs: list[tuple[Sweep, Sweep]],
    results: dict[str, list[dict[str, Any]]],
    started: datetime,
    load_before: str,
    wall_s: float,
) -> str:
    first = next(iter(results.values()))
    floor = first[0]["policy"]["noise_floor"]
    source = first[0]["policy"].get("noise_floor_source", "")
    cases = len(first[0]["cases"])
    sides = list(dict.fromkeys(side for pair in pairs for side in pair))  # each side once, in order
    protocol = (
        f"in pairs swept alternately (A B B A …), each pair compared on its own ({len(pairs)} comparisons)"
        if args.interleave
        else f"each compared with the next ({len(pairs)} comparisons)"
    )
    config = Path(args.config).relative_to(ROOT) if Path(args.config).is_relative_to(ROOT) else args.config
    lines = [
        f"# `attnbench compare` A/A check ({Path(args.config).stem})",
        "",
        f"`{command_line()}`, {started:%Y-%m-%d %H:%M} UTC: {len(sides)} × "
        f"{args.runs_per_side} sweep(s) of `{config}` "
        f"({cases} cases{', overrides ' + ', '.join(sweep_sets(args)) if sweep_sets(args) else ''}), each in its "
        f"own process, {protocol} by `attnbench compare` with noise "
        f"floor {pct(floor)}{f' ({source})' if source else ''}, {args.processes} process(es) per case and "
        f"{args.runs_per_side} sweep(s) per side (a side of several is a folder of runs).",
        "",
        f"Conditions: {conditions(args)}.",
        "",
        f"Machine: {machine((sides[0].runs or (sides[0],))[0].folder)}. "
        + when(args.from_work, sides, load_before, wall_s, [r.wall_s for s in sides for r in s.runs or (s,)]),
        "",
        "## Verdicts",
        "",
        "Load: the 1-minute load average as each side's sweep started. Contended: cases each sweep found timed on "
        "a busy machine; `noisy (contended)`: verdicts compare withheld for that reason (they are among the noisy).",
        "",
        "| comparison | threshold | load (base, current) | contended (base/current) | "
        + " | ".join(VERDICTS)
        + " | noisy (contended) | every case together | exit |",
        "| --- | --- | --- | --- | " + " | ".join("---" for _ in VERDICTS) + " | --- | --- | --- |",
    ]
    totals: dict[str, dict[str, int]] = {}
    for threshold, comparisons in results.items():
        totals[threshold] = dict.fromkeys(VERDICTS, 0)
        for i, data in enumerate(comparisons):
            for verdict in VERDICTS:
                totals[threshold][verdict] += data["counts"][verdict]
            counts = " | ".join(str(data["counts"][v]) for v in VERDICTS)
            a, b = pairs[i]
            name = f"pair {i + 1}" if args.interleave else f"run {i + 1} → {i + 2}"
            lines.append(
                f"| {name} | {threshold} | {a.load_1m:.2f}, {b.load_1m:.2f} | "
                f"{a.contended}/{b.contended} | {counts} | {contended_verdicts(data)} | {overall_cell(data)} | "
                f"{data['exit_code']} |"
            )
    lines += [
        "",
        "**Target: at most 1 false regression in all comparisons** (a case flagged regressed, or every case together).",
        "",
    ]
    for threshold, total in totals.items():
        n = cases * len(pairs)
        overall = sum(1 for data in results[threshold] if (data.get("overall") or {}).get("verdict") == "regressed")
        exits = sum(1 for data in results[threshold] if data["exit_code"] == 1)
        verdict = "PASS" if total["regressed"] + overall <= 1 else "FAIL"
        lines.append(
            f"- {threshold}: {total['regressed']} regressed and {total['improved']} improved of {n} case "
            f"comparisons ({total['same']} same, {total['noisy']} noisy); every case together regressed in "
            f"{overall} of {len(results[threshold])} comparisons; compare exited 1 (regressed) in {exits} of "
            f"{len(results[threshold])} → **{verdict}**"
        )
    lines += noise_section(first)
    return "\n".join(lines) + "\n"


def noise_section(comparisons: list[dict[str, Any]]) -> list[str]:
    """How far the same case moved between consecutive processes, and the noise floor that implies."""
    moves: dict[str, list[float]] = {}
    labels: dict[str, str] = {}
    for data in comparisons:
        for c in data["cases"]:
            if c["ratio"] is not None:
                moves.setdefault(c["key"], []).append(abs(math.log(c["ratio"])))
                labels[c["key"]] = label(c["case"])
    every = [m for values in moves.values() for m in values]
    if not every:
        return ["", "No case was timed on both sides of any comparison."]
    lines = [
        "",
        "## The same case in two processes",
        "",
        "| case | median \\|Δ\\| | max \\|Δ\\| |",
        "| --- | --- | --- |",
    ]
    for key, values in moves.items():
        lines.append(
            f"| {labels[key]} | {pct(math.expm1(statistics.median(values)))} | {pct(math.expm1(max(values)))} |"
        )
    q95 = math.expm1(percentile(every, 0.95))
    lines += [
        "",
        f"Over all {len(every)} pairs: median |Δ| {pct(math.expm1(statistics.median(every)))}, 90th percentile "
        f"{pct(math.expm1(percentile(every, 0.90)))}, 95th percentile {pct(q95)} — the `--noise-floor` this "
        f"machine needs when a side has one process: **{math.ceil(q95 * 100)}%**.",
    ]
    return lines


if __name__ == "__main__":
    raise SystemExit(main())
