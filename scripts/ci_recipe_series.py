"""README's CI recipe, tried again and again on unchanged code: it must exit 0 (issue 51: at least 9 of 10 tries).

    python scripts/ci_recipe_series.py [--tries 10] [--beside light|none] [--report results/ci-recipe-aa-cpu.md]
        [--conditions "what else the machine was doing"]

Each try runs the commands of README's "Compare two runs in CI" block, as written there (read from README.md, so the
series follows the recipe when it changes), in a fresh folder: ``calibrate`` on the first try only (the recipe says
once per machine: its figure is cached per machine and the later tries read it), the base and head sweeps of the
same code, ``compare`` (the gate: its exit code is the try's) and ``report``. ``--beside light`` runs a light job
throughout, as a laptop with a browser open or a shared CI runner would: a Python loop busy for 20 ms then asleep
for 80 ms, about a fifth of one core. The report is rewritten after every try (a stopped script keeps what it had):
the exit codes, how many tries exited 0, each try's wall time and the load average as it started, and what compare
found (regressed, improved, noisy) per try.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEADING = "## Compare two runs in CI"
LIGHT = (
    "import time\n"
    "while True:\n"
    "    end = time.perf_counter() + 0.02\n"
    "    while time.perf_counter() < end: pass\n"
    "    time.sleep(0.08)\n"
)
LIGHT_TEXT = "a light job (a Python loop busy 20 ms then asleep 80 ms: about a fifth of one core)"


def recipe(readme: Path) -> list[list[str]]:
    """The commands of README's CI block, comments dropped, each split as a shell would."""
    text = readme.read_text(encoding="utf-8")
    block = text.split(HEADING, 1)[1].split("```", 2)[1]
    lines = [line.split("#", 1)[0].strip() for line in block.splitlines()[1:]]
    return [shlex.split(line) for line in lines if line]


@dataclass(frozen=True)
class Try:
    exit: int  # compare's
    seconds: float
    load: float
    verdicts: dict[str, int]
    steps: tuple[tuple[str, int], ...]  # every command and its exit code


def one_try(commands: list[list[str]], first: bool) -> Try:
    started, load = time.perf_counter(), os.getloadavg()[0]
    steps: list[tuple[str, int]] = []
    gate, verdicts = -1, {}
    with tempfile.TemporaryDirectory(prefix="ci-recipe-") as folder:
        for words in commands:
            if words[:2] == ["attnbench", "calibrate"] and not first:
                continue
            argv = [sys.executable, "-m", "attnbench", *words[1:]]
            if words[:2] == ["attnbench", "compare"]:
                done = subprocess.run([*argv, "--format", "json"], cwd=folder, capture_output=True, text=True)
                gate = done.returncode
                verdicts = _verdicts(done.stdout)
            else:
                done = subprocess.run(argv, cwd=folder, capture_output=True, text=True)
            steps.append((" ".join(words), done.returncode))
    return Try(gate, time.perf_counter() - started, load, verdicts, tuple(steps))


def _verdicts(stdout: str) -> dict[str, int]:
    """compare's counts of verdicts (its JSON's ``counts``), those above 0."""
    try:
        counts = json.loads(stdout).get("counts", {})
    except (json.JSONDecodeError, AttributeError):
        return {}
    return {str(k): int(v) for k, v in counts.items() if v}


def report(path: Path, tries: list[Try], args: argparse.Namespace, commands: list[list[str]]) -> None:
    zero = sum(t.exit == 0 for t in tries)
    beside = (
        "a light job (a Python loop busy 20 ms then asleep 80 ms: about a fifth of one core)"
        if args.beside == "light"
        else "nothing of ours"
    )
    lines = [
        "# README's CI recipe on unchanged code",
        "",
        f"Measured {datetime.now(UTC):%Y-%m-%d %H:%M} UTC on {platform.node()} ({os.cpu_count()} CPUs), "
        f"{len(tries)} tries of {args.tries}; beside it: {beside}"
        + (f"; {args.conditions}" if args.conditions else "")
        + ". Script: `scripts/ci_recipe_series.py`.",
        "",
        "The recipe, as README.md gives it (calibrate on the first try only, as it says: once per machine):",
        "",
        "```sh",
        *(" ".join(c) for c in commands),
        "```",
        "",
        f"**compare exited 0 in {zero} of {len(tries)} tries** (target, issue 51: at least 9 of 10).",
        "",
        "| try | compare exit | verdicts | load (1 min) at start | wall time | every step's exit |",
        "| ---: | ---: | --- | ---: | ---: | --- |",
    ]
    for i, t in enumerate(tries, start=1):
        verdicts = ", ".join(f"{k} {v}" for k, v in sorted(t.verdicts.items())) or "—"
        steps = ", ".join(f"`{re.sub(r'^attnbench ', '', s)}` {code}" for s, code in t.steps)
        lines.append(f"| {i} | {t.exit} | {verdicts} | {t.load:.1f} | {t.seconds:.0f} s | {steps} |")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tries", type=int, default=10)
    parser.add_argument("--beside", choices=("light", "none"), default="light")
    parser.add_argument("--report", type=Path, default=ROOT / "results" / "ci-recipe-aa-cpu.md")
    parser.add_argument("--conditions", default="")
    args = parser.parse_args()
    commands = recipe(ROOT / "README.md")
    job = subprocess.Popen([sys.executable, "-c", LIGHT]) if args.beside == "light" else None
    tries: list[Try] = []
    try:
        for i in range(args.tries):
            tries.append(one_try(commands, first=i == 0))
            report(args.report, tries, args, commands)
            print(f"try {i + 1}/{args.tries}: compare exit {tries[-1].exit} ({tries[-1].seconds:.0f} s)", flush=True)
    finally:
        if job is not None:
            job.terminate()
    return 0 if sum(t.exit == 0 for t in tries) >= 0.9 * len(tries) else 1


if __name__ == "__main__":
    sys.exit(main())
