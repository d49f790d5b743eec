"""What many test modules share: where things are, the golden-file check, and the tiny configs that real sweeps
in tests run (small enough for seconds on a 2-core machine)."""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml

from attnbench.core.cases import Case, Mode, TimingPolicy
from attnbench.families.catalogue import MODELS, has_heads

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
GOLDEN = DATA / "golden"
BAD_CONFIGS = DATA / "bad_configs"
BAD_RUNS = DATA / "bad_runs"
FIXTURE = DATA / "runs" / "tiny-cpu"  # a real CPU run, committed: every renderer's golden input
# A real CPU decode run, committed: lstm, mingru, vanilla, sdpa-flash at n = 64…4096, d_model 64, batch 2.
DECODE_FIXTURE = DATA / "runs" / "tiny-decode-cpu"

# A timing policy for real sweeps in tests: converges loosely, stops fast. Not for numbers anyone reads.
QUICK_TIMING: dict[str, float | int] = {
    "target_ci": 0.05,
    "min_samples": 5,
    "min_time_s": 0.01,
    # A ceiling, not the usual cost (tiny cases converge in a few ms): beside another test worker a first train
    # call can take most of 0.3 s, and the sweep then rightly ends the row too_slow_for_budget, not ok.
    "max_case_s": 1.0,
    "warmup_max_s": 0.05,
    "process_warmup_s": 0.05,  # the process warm-up, short: tests check what rows say, not how fast
}


def tiny_config(name: str = "tiny", **changes: Any) -> str:
    """A CPU config of tiny models as YAML text; ``changes`` replace top-level keys (``grid`` whole, ``timing``
    but for a short ``process_warmup_s`` it does not name)."""
    config: dict[str, Any] = {
        "name": name,
        "device": "cpu",
        "models": ["lstm", "sdpa-flash"],
        "modes": ["forward"],
        "dtype": ["float32"],
        "grid": {"batch": [1], "seq_len": [8, 16]},
        "d_model": 16,
        "heads": 2,
        "layers": 1,
        # One torch thread: tiny shapes gain nothing from more, and beside another test worker on a 2-core machine
        # OpenMP's spinning threads made each call 10-60x slower (a tiny LSTM: 0.3 ms a call, 2.8 ms with two).
        "threads": 1,
        "timing": dict(QUICK_TIMING),
    }
    if "timing" in changes:
        # A test's own timing keeps the short process warm-up unless it names one: it checks rows, not speed.
        changes["timing"] = {"process_warmup_s": QUICK_TIMING["process_warmup_s"], **changes["timing"]}
    config.update(changes)
    return yaml.safe_dump(config, sort_keys=False)


def quick_policy(**fields: Any) -> TimingPolicy:
    """A ``TimingPolicy`` for a test that reads rows, not speed: the short process warm-up unless ``fields`` name
    one (the rule ``tiny_config`` applies to a config's own timing)."""
    return TimingPolicy(**{"process_warmup_s": QUICK_TIMING["process_warmup_s"], **fields})


def tiny_case(
    model: str = "lstm",
    *,
    mode: Mode = "forward",
    dtype: str = "float32",
    device: str = "cpu",
    batch: int = 2,
    seq_len: int = 16,
    d_model: int = 16,
    heads: int = 2,
    layers: int = 1,
    causal: bool | None = None,
    **options: Any,
) -> Case:
    """A small ``Case`` for tests: recurrent models get no heads and are causal (as configs make them);
    ``options`` become the case's model options."""
    recurrent = MODELS[model].kind == "recurrent"
    headless = not has_heads(model)
    return Case(
        model,
        mode,
        dtype,
        device,
        batch,
        seq_len,
        d_model,
        None if headless else heads,
        layers,
        recurrent if causal is None else causal,
        tuple(sorted(options.items())),
    )


def check_golden(name: str, text: str) -> None:
    """``text`` must equal the committed golden file; ``UPDATE_GOLDEN=1`` rewrites it instead."""
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rerun with UPDATE_GOLDEN=1 if that is intended"


def synthetic_runs(
    folder: Path,
    levels: list[float],
    *,
    seed: int = 0,
    sigma: float = 0.03,
    case_sigma: float = 0.01,
    only: str | None = None,
    environment: dict[int, dict[str, Any]] | None = None,
) -> list[Path]:
    """Copies of the FIXTURE run, one per entry of ``levels``, whose samples are scaled by that level times
    realistic noise: a per-run factor shared by every case (log-normal, ``sigma``: the machine's state moves a
    whole run) and a per-case one (``case_sigma``). ``only``: a case-key substring; the levels apply to it alone,
    the other cases keep level 1. ``environment``: run index → environment fields to change (a new driver, …).
    Runs start an hour apart, in list order."""
    import json
    import math
    import random

    rng = random.Random(seed)
    template = json.loads((FIXTURE / "run.json").read_text())
    rows = [json.loads(line) for line in (FIXTURE / "results.jsonl").read_text().splitlines() if line.strip()]
    paths = []
    for index, level in enumerate(levels):
        run_factor = math.exp(rng.gauss(0, sigma))
        run = dict(template, run_id=f"synthetic-{index:03d}", created_utc=f"2026-12-01T{index % 24:02d}:00:00.000000Z")
        run["environment"] = {**template["environment"], **(environment or {}).get(index, {})}
        out = folder / f"run-{index:03d}"
        out.mkdir(parents=True)
        (out / "run.json").write_text(json.dumps(run, indent=2))
        lines = []
        for row in rows:
            row = json.loads(json.dumps(row))
            m = row.get("measurement")
            if m is not None:
                stepped = only is None or only in row["key"]
                factor = (level if stepped else 1.0) * run_factor * math.exp(rng.gauss(0, case_sigma))
                m["samples_s"] = [s * factor for s in m["samples_s"]]
            lines.append(json.dumps(row))
        (out / "results.jsonl").write_text("\n".join(lines) + "\n")
        paths.append(out)
    return paths


# ------------------------------------------------------------------------------------------ a disk that fills up
@contextmanager
def small_disk(path: Path, size: str = "4m") -> Iterator[Path]:
    """A real tmpfs of ``size`` mounted at ``path``, so that a full disk is the kernel's own ENOSPC, not a fake.
    Needs the right to mount (root here); elsewhere the test is skipped."""
    path.mkdir(parents=True, exist_ok=True)
    mount = shutil.which("mount")
    if mount is None:
        pytest.skip("no mount command here")
    done = subprocess.run(
        [mount, "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip() or done.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


def fill_disk(disk: Path) -> Path:
    """Write a file on ``disk`` until the disk is full; returns it (delete it to free the space again)."""
    filler = disk / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
        for chunk in (1 << 20, 4096, 1):  # down to the last byte of the last block
            try:
                while True:
                    os.write(fd, b"\0" * chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(fd)
    return filler


def heads_kv_of(case: Case) -> int | None:
    """A case's key/value heads as summary.csv's column says them (None without heads)."""
    from attnbench.families.catalogue import case_column_values

    value = case_column_values(case).get("heads_kv")
    return value if isinstance(value, int) else None


_NUMBER = re.compile(r"(?<![\w.])[-+−]?\d+(?:\.\d+)?")


def numbers(text: str) -> list[float]:
    """The numbers a rendered text states, in order, as written: 'n^2.00 (95 % CI 1.9–2.1, n=64–1024)' → [2.0, 95.0,
    1.9, 2.1, 64.0, 1024.0]. A test of a message or a line holds these (and the names it gives), not its wording."""
    return [float(found.replace("−", "-")) for found in _NUMBER.findall(text)]


def mentions(texts: str | Iterable[str], *names: str, values: Iterable[float] = ()) -> bool:
    """Whether one of ``texts`` (a note, a warning, an error) names each of ``names`` (a key, a metric, a flag, a
    model) and states each of ``values``: what a test of a message holds instead of its sentence."""
    wanted = set(values)
    return any(
        all(name in text for name in names) and wanted <= set(numbers(text))
        for text in ([texts] if isinstance(texts, str) else texts)
    )
