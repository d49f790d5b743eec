"""Power of ``attnbench ab``: A/A sessions must not exit with a regression; sessions with a slowdown injected on one
side must (issue 50, item 2).

    python scripts/ab_power.py [--aa 20] [--slowed 10] [--slowdown 0.25] [--config configs/aa-cpu.yaml]
        [--set modes=[forward]] [--set threads=2] [--rounds 12] [--block 0.1] [--pair-rounds N]
        [--fail-on median:5%] [--report results/ab-power-cpu.md] [--conditions "a quiet machine"]

Each session is one ``attnbench ab CONFIG --format json`` in its own process, both sides this interpreter; a slowed
session's ``--head-python`` is a wrapper script that sets ``ATTNBENCH_INJECT_SLOWDOWN`` (every timed call of that
side busy-waits the fraction of its warm-up time per call). A/A and slowed sessions alternate, so drift of the
machine hits both series alike. The report is rewritten after every session (a stopped script keeps what it had):
per series the sessions, how many exited 0, 1 (a regression), 6 (unclear) or otherwise, the unclear rate, and the
cases' answers, then every session's line; each session's cases (ratio, interval, per-round and per-worker-pair
ratios) go to the report's ``.jsonl`` (started afresh by each run of the script). ``--conditions`` says in the
report what the machine was doing (the load averages at each session's start are recorded either way). Targets: 0
of 20 A/A sessions exit 1; at least 9 of 10 slowed sessions exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import stat
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ANSWERS = ("slower", "unclear", "faster", "same")


def wrapper(folder: Path, slowdown: float) -> Path:
    path = folder / "python-slowed"
    path.write_text(f'#!/bin/sh\nATTNBENCH_INJECT_SLOWDOWN={slowdown} exec "{sys.executable}" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@dataclass(frozen=True)
class Session:
    exit: int
    answers: Counter[str]
    seconds: float
    cases: tuple[dict[str, object], ...] = ()  # each case's answer, ratio and interval, as ab's JSON has them


def session(args: argparse.Namespace, out: Path, head: Path | None) -> Session:
    command = [sys.executable, "-m", "attnbench", "ab", str(args.config), "--out", str(out), "-q", "-f", "json"]
    command += ["--rounds", str(args.rounds), "--block", str(args.block), "--no-plots"]
    if args.pair_rounds is not None:
        command += ["--pair-rounds", str(args.pair_rounds)]
    for item in args.set or ():
        command += ["--set", item]
    for item in args.fail_on or ():
        command += ["--fail-on", item]
    if head is not None:
        command += ["--head-python", str(head)]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    answers: Counter[str] = Counter()
    cases: list[dict[str, object]] = []
    try:
        data = json.loads(done.stdout)
        answers.update(case["answer"] for case in data["cases"])
        keep = ("key", "answer", "ratio", "ci_low", "ci_high", "base_s", "head_s", "ratios", "pair_ratios")
        cases = [{k: case.get(k) for k in keep} for case in data["cases"]]
    except (json.JSONDecodeError, KeyError, TypeError):
        print(done.stderr[-2000:], file=sys.stderr)
    return Session(done.returncode, answers, time.monotonic() - started, tuple(cases))


def load() -> str:
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return "unknown"
    return f"{one:.1f} / {five:.1f} / {fifteen:.1f}"


def render(args: argparse.Namespace, series: dict[str, list[Session]], loads: list[str], log: list[str]) -> str:
    shown = args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config
    lines = [
        f"# attnbench ab: A/A and {args.slowdown:.0%} slowdown sessions",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node() or 'this machine'} "
        f"({os.cpu_count()} CPUs), {args.conditions} (load average 1/5/15 min at each session's start: "
        f"{', '.join(loads[:6])}{' …' if len(loads) > 6 else ''}).",
        "",
        f"Command per session: `attnbench ab {shown}"
        f" --rounds {args.rounds} --block {args.block}"
        + ("" if args.pair_rounds is None else f" --pair-rounds {args.pair_rounds}")
        + "".join(f" --set {shlex.quote(s)}" for s in args.set or ())
        + "".join(f" --fail-on {f}" for f in args.fail_on or ())
        + "`; slowed sessions add `--head-python` a wrapper that sets "
        f"`ATTNBENCH_INJECT_SLOWDOWN={args.slowdown}`. Both sides run this interpreter; A/A and slowed sessions "
        "alternate. Script: `scripts/ab_power.py`.",
        "",
        "| series | sessions | exit 0 | exit 1 (regression) | exit 6 (unclear) | other exits | unclear rate | "
        "cases slower / unclear / faster / same | median session |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |",
    ]
    for name, runs in series.items():
        exits = Counter(r.exit for r in runs)
        answers: Counter[str] = Counter()
        for r in runs:
            answers.update(r.answers)
        seconds = sorted(r.seconds for r in runs)
        n = len(runs)
        other = n - exits[0] - exits[1] - exits[6]
        lines.append(
            f"| {name} | {n} | {exits[0]} | {exits[1]} | {exits[6]} | {other} | "
            f"{exits[6] / n:.0%} | {' / '.join(str(answers[a]) for a in ANSWERS)} | "
            f"{seconds[n // 2] if n else 0:.0f} s |"
            if n
            else f"| {name} | 0 | | | | | | | |"
        )
    lines += ["", "Targets (issue 50): 0 of 20 A/A sessions exit 1; at least 9 of 10 slowed sessions exit 1.", ""]
    lines += ["Each session, in the order run (exit code, then the cases' answers, then its wall time):", ""]
    lines += ["```text", *log, "```", ""]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aa", type=int, default=20, help="A/A sessions")
    parser.add_argument("--slowed", type=int, default=10, help="sessions with the head slowed")
    parser.add_argument("--slowdown", type=float, default=0.25)
    parser.add_argument("--config", type=Path, default=ROOT / "configs" / "aa-cpu.yaml")
    parser.add_argument("--set", action="append", help="a config override, as ab's --set (repeatable)")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--block", type=float, default=0.1)
    parser.add_argument("--pair-rounds", type=int, default=None, help="ab's --pair-rounds (default: ab's own)")
    parser.add_argument("--fail-on", action="append")
    parser.add_argument("--report", type=Path, default=ROOT / "results" / "ab-power-cpu.md")
    parser.add_argument(
        "--conditions",
        default="**with other jobs running on the machine**",
        help="what the machine was doing, as the report says it (e.g. 'on a quiet machine')",
    )
    args = parser.parse_args()
    args.config = args.config.resolve()
    series: dict[str, list[Session]] = {"A/A": [], f"head slowed {args.slowdown:.0%}": []}
    aa, slowed = series.values()
    loads: list[str] = []
    log: list[str] = []
    args.report.with_suffix(".jsonl").write_text("")  # this series only
    with tempfile.TemporaryDirectory(prefix="ab-power-") as tmp:
        folder = Path(tmp)
        head = wrapper(folder, args.slowdown)
        # A/A and slowed sessions alternate until each series has its count (the longer one finishes alone).
        order = []
        for i in range(max(args.aa, args.slowed)):
            order += [kind for kind, count in (("aa", args.aa), ("slowed", args.slowed)) if i < count]
        for index, kind in enumerate(order):
            loads.append(load())
            result = session(args, folder / f"s{index}", head if kind == "slowed" else None)
            (aa if kind == "aa" else slowed).append(result)
            log.append(
                f"{index + 1}/{len(order)} {kind}: exit {result.exit} {dict(result.answers)} {result.seconds:.0f} s"
            )
            print(log[-1], flush=True)
            args.report.write_text(render(args, series, loads, log))
            with args.report.with_suffix(".jsonl").open("a") as jsonl:  # every session's cases, for a closer look
                jsonl.write(json.dumps({"series": kind, "exit": result.exit, "cases": list(result.cases)}) + "\n")
    print(render(args, series, loads, log))
    return 0


if __name__ == "__main__":
    sys.exit(main())
