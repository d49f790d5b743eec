"""Where to look for the commit behind a step: the commits between the last good and the first bad run, and a
``git bisect run`` command line that sweeps one case at each commit and compares it with the last good run.

Torch-free and config-free: the case is pinned by ``--set`` overrides written from its fields (``one_case_sets``:
models, modes, dtype, the whole grid, the model's options; presets and the decode section off), so the sweep at each
commit measures exactly the case of the step, with that commit's code and config file. The bisect step's exit code
follows ``git bisect run``'s contract: 0 good (compare found no regression), 1 bad (it did), 125 skip (the sweep
could not run at that commit, or compare gave no verdict: exit 2, 3 or 4).
"""

from __future__ import annotations

import math
import re
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from attnbench.analysis.history import History
from attnbench.analysis.steps import Step
from attnbench.core.cases import KEPT_DTYPES, Case
from attnbench.core.stats import student_t_975
from attnbench.families.catalogue import causal_from_grid, config_entry, option_axes

# Where each bisect step writes its sweep (one folder per commit, so a step left behind never mixes with the next).
BISECT_OUT = "/tmp/attnbench-bisect"


@dataclass(frozen=True)
class BisectHint:
    """What to bisect: ``good`` (the last good run's commit) to ``bad`` (the first bad run's), the commits between
    them when git can list them here (``commits``, newest first; None when it cannot), and the two lines to run."""

    good: str
    bad: str
    commits: tuple[str, ...] | None
    case: Case
    start: str  # git bisect start BAD GOOD
    run: str  # git bisect run sh -c '…'

    @property
    def range(self) -> str:
        return f"{self.good[:12]}..{self.bad[:12]}"


def _flow(value: object) -> str:
    """A YAML flow value for ``--set`` (lists, mappings, booleans, numbers, plain words)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_flow(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_flow(v)}" for k, v in value.items()) + "}"
    return str(value)


def _word(text: str) -> str:
    """One shell word for the inner script: bare when it can be, else in double quotes (so the script itself sits
    in single quotes without escapes), else shell-quoted."""
    if re.fullmatch(r"[\w@%+=:,./-]+", text):
        return text
    return f'"{text}"' if not re.search(r'["$`\\!]', text) else shlex.quote(text)


def _words(words: Sequence[str]) -> str:
    return " ".join(_word(w) for w in words)


# The config's top-level keys of the serving questions (``config.serving``).
SERVING_KEYS = (
    *("memory_budget", "prefill_chunk", "draft", "accept", "packing"),
    *("prefix_tokens", "requests", "checkpoint_every"),
)


def one_case_sets(case: Case) -> list[str]:
    """``--set`` overrides that narrow a config to ``case`` alone (its key, whatever else the config crosses)."""
    grid: dict[str, object] = {"batch": [case.batch], "seq_len": [case.seq_len], "d_model": [case.d_model]}
    if case.heads is not None:
        grid["heads"] = [case.heads]
    grid["layers"] = [case.layers]
    if causal_from_grid(case):
        grid["causal"] = [case.causal]
    model: object = case.model
    options = {case.model: dict(case.options)} if case.options else {}
    entry = config_entry(case)
    if entry is not None:  # a factory entry or a stack is its mapping in the config (a factory's options inside it)
        model, options = entry, {} if "options" in entry else options
    sets = [f"models={_flow([model])}", f"modes=[{case.mode}]", f"dtype=[{case.dtype}]"]
    axes = ("d_model", "heads", *option_axes(), "layers", "causal")  # wherever the config wrote them: from grid alone
    sets += [f"{key}=null" for key in ("presets", "decode", *axes)]
    # The serving question the case asks (issue 41), and none other: a key its mode does not use is refused.
    asked: dict[str, object] = {name: value for name, value in case.serving if value or name != "memory_budget"}
    if case.packing:
        asked["packing"] = list(case.packing)
    sets += [f"{key}={_flow(asked[key]) if key in asked else 'null'}" for key in SERVING_KEYS]
    # What the case keeps its states in (issue 52), and no other: a key left at its default crosses nothing.
    kept = {key: int(value) if key == "page_tokens" else value for key, value in case.kept}
    sets += [f"{key}={_flow([kept[key]]) if key in kept else 'null'}" for key in KEPT_DTYPES]
    sets.append(f"grid={_flow(grid)}")
    sets.append(f"model_options={_flow(options)}")
    return sets


def commits_between(good: str, bad: str, repo: Path | None = None) -> tuple[str, ...] | None:
    """The commits after ``good`` up to ``bad`` (newest first), or None when git cannot list them here."""
    try:
        out = subprocess.run(
            ["git", "-C", str(repo or Path.cwd()), "rev-list", f"{good}..{bad}"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return tuple(out.stdout.split()) if out.returncode == 0 else None


def bisect_hint(
    case: Case,
    good: str,
    bad: str,
    *,
    config: str | None,
    baseline: Path,
    gates: Sequence[str],
    noise_floor: float | None = None,
    python: str = "python3",
    repo: Path | None = None,
) -> BisectHint:
    """The hint for a step of ``case`` between commits ``good`` and ``bad``: sweep ``config`` (None: the built-in
    default) narrowed to the case with the checked-out code (``python -m attnbench`` from the checkout's root), then
    compare it with ``baseline`` (the last good run's folder) under ``gates`` (``--fail-on`` values) using the
    attnbench installed for ``python`` (``-P``: not the checkout's). The config's hash differs from the baseline's,
    so compare is told to allow that key. Each side of that compare is one process: ``noise_floor``
    (``noise_floor_for``: the spread between runs the history measured) is what it widens their interval by, since
    the runs may record no floor of their own, and compare's default then calls only changes beyond ×2. A commit
    compare calls noisy is skipped, not called good."""
    out = f"{BISECT_OUT}/$(git rev-parse --short=12 HEAD)"
    sweep = [python, "-m", "attnbench", "sweep", *([] if config is None else [config])]
    sweep += ["--device", case.device.split(":")[0]]
    sets = " ".join(f"--set {_word(s)}" for s in one_case_sets(case))
    compare = [python, "-P", "-m", "attnbench", "compare", str(baseline)]
    flags = " ".join(
        [
            "--allow-mismatch config_sha256",
            *(f"--fail-on {_word(g)}" for g in gates),
            *([] if noise_floor is None else [f"--noise-floor {noise_floor * 100:.3g}%"]),
            # A commit compare cannot judge (noisy) is no "good" one: git bisect would blame a later commit. So it
            # is a skip, 125, like a sweep that could not run.
            "--exit-noisy 125",
        ]
    )
    script = (
        f'rm -rf "{out}"; {_words(sweep)} {sets} --out "{out}" -q --no-plots > /dev/null; '
        f'[ $? -le 1 ] || exit 125; {_words(compare)} "{out}" {flags} -f md > /dev/null; '
        "rc=$?; [ $rc -le 1 ] || exit 125; exit $rc"
    )
    return BisectHint(
        good=good,
        bad=bad,
        commits=commits_between(good, bad, repo),
        case=case,
        start=f"git bisect start {bad} {good}",
        run=f"git bisect run sh -c {shlex.quote(script)}",
    )


def noise_floor_for(history: History, segment: int, case: Case, step: Step) -> float | None:
    """The floor a one-process-a-side compare of ``case`` needs at each bisected commit, measured by the history
    itself: the pooled standard deviation of the case's log readings on each side of the step (the runs before
    ``first_possible`` and from ``index`` on, as measured: the whole-run drift between processes included, which is
    what two single runs differ by), turned into the half-width of a 95 % interval of the ratio of two single runs
    as ``attnbench calibrate`` states its floor (Student's t on the pooled degrees of freedom). None when a side has
    fewer than two readings, or for a memory step (one reading per run repeats; compare's rule for it needs none)."""
    if history.metric == "peak_mem":
        return None
    found = next((c for c in history.cases if c.segment == segment and c.case.key == case.key), None)
    if found is None:
        return None
    sides = [
        [math.log(p.value) for p in points if p.value]
        for points in (found.points[: step.first_possible], found.points[step.index :])
    ]
    if any(len(side) < 2 for side in sides):
        return None
    df = sum(len(side) - 1 for side in sides)
    ss = math.fsum((x - math.fsum(side) / len(side)) ** 2 for side in sides for x in side)
    sigma = math.sqrt(ss / df)
    return min(9.99, math.expm1(student_t_975(df) * math.sqrt(2) * sigma))


def bisectable(change: float, floor: float | None) -> bool:
    """Whether one run a side can tell a commit after a step of ``change`` from one before it, at the gate of half
    the step (``gates_for``): the floor must leave room between the half and the whole step."""
    if floor is None:
        return True
    whole, half = math.log1p(abs(change)), math.log1p(abs(change) / 2)
    return math.log1p(floor) < whole - half


def gates_for(metric: str, change: float) -> list[str]:
    """``--fail-on`` values that call a commit bad when it shows about half of a step of relative size ``change``
    on ``metric``: a step that is there reads well beyond it, a commit before it well within."""
    half = max(0.01, min(0.9, abs(change) / 2))
    text = f"{half * 100:.3g}%"
    if metric in ("median", "tokens_per_s", "gbps"):  # a rate's step is the time's, turned round
        return [f"median:{text}"]
    return ["median:90%", f"{metric}:{text}"]  # memory: the time may move as it likes
