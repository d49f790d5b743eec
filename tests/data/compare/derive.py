"""Builds the ``compare`` fixture runs from a real stored run, and the helpers tests use to derive more.

    python tests/data/compare/derive.py [--source tests/data/runs/tiny-cpu]

writes ``base/`` (a subset of the source run's rows, unchanged) and ``current/`` (the same rows with known
changes: one case 25 % slower, one 25 % faster, one 4 % slower, one now out of memory, one gone, one new), so each
verdict has a case whose answer is known. Rows are edited as JSON, so whatever fields the source rows carry are
kept. Deterministic: running it twice writes the same bytes.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]

Row = dict[str, Any]

# (model, mode, seq_len) of the source rows kept in base/: every family, ok and failed rows, short and long samples.
KEEP = [
    ("lstm", "forward", 16),
    ("lstm", "forward", 64),
    ("lstm", "train", 16),  # a single sample: no interval can be had
    ("gru", "forward", 16),
    ("gru", "forward", 64),
    ("vanilla", "forward", 16),
    ("vanilla", "forward", 64),
    ("sdpa-flash", "forward", 16),
    ("sdpa-flash", "train", 16),
    ("sdpa-flash", "train", 64),
    ("sdpa-efficient", "forward", 16),  # unsupported on a CPU, on both sides
    ("vanilla", "forward", 1048576),  # out of memory on both sides
]
BASE_COMMIT = "1" * 40
CURRENT_COMMIT = "2" * 40


def read_run(folder: Path) -> tuple[dict[str, Any], list[Row]]:
    run = json.loads((folder / "run.json").read_text(encoding="utf-8"))
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text(encoding="utf-8").splitlines() if line]
    return run, rows


def write_run(folder: Path, run: dict[str, Any], rows: Iterable[Row]) -> Path:
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(run, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    lines = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    (folder / "results.jsonl").write_text(lines, encoding="utf-8")
    return folder


def ident(row: Row) -> tuple[str, str, int]:
    case = row["case"]
    return case["model"], case["mode"], case["seq_len"]


def scaled(row: Row, factor: float) -> Row:
    """The row with every timing (samples, replicate medians) multiplied by ``factor``."""
    out = json.loads(json.dumps(row))
    m = out.get("measurement")
    if m is not None:
        m["samples_s"] = [x * factor for x in m["samples_s"]]
        if "replicate_medians_s" in m:
            m["replicate_medians_s"] = [x * factor for x in m["replicate_medians_s"]]
    return out


def key_of(case: dict[str, Any]) -> str:
    """``Case.key`` for a case dict (rows store their key; a derived case needs a new one)."""
    heads = "-" if case["heads"] is None else case["heads"]
    parts = [
        f"model={case['model']}",
        f"mode={case['mode']}",
        f"dtype={case['dtype']}",
        f"device={case['device'].split(':', 1)[0]}",
        f"batch={case['batch']}",
        f"seq_len={case['seq_len']}",
        f"d_model={case['d_model']}",
        f"heads={heads}",
        f"layers={case['layers']}",
        f"causal={str(case['causal']).lower()}",
    ]
    parts += [f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in sorted(case["options"].items())]
    return "|".join(parts)


def with_run(run: dict[str, Any], run_id: str, commit: str, **environment: Any) -> dict[str, Any]:
    out = json.loads(json.dumps(run))
    out["run_id"] = run_id
    out["environment"]["git_commit"] = commit
    out["environment"].update(environment)
    return out


def derive_current(rows: list[Row]) -> list[Row]:
    """base's rows with the known changes the fixture tests expect."""
    changes: dict[tuple[str, str, int], Callable[[Row], Row | None]] = {
        ("lstm", "forward", 64): lambda r: scaled(r, 1.25),  # regressed
        ("gru", "forward", 16): lambda r: scaled(r, 0.75),  # improved
        ("vanilla", "forward", 16): lambda r: scaled(r, 1.04),  # noisy: within the floor of the threshold
        ("sdpa-flash", "train", 16): lambda r: {
            **r,
            "status": "oom",
            "reason": "out of memory: CPU allocator refused 1.5 GiB",
            "measurement": None,
            "memory": None,
        },  # regressed by failure
        ("sdpa-flash", "train", 64): lambda r: None,  # missing
    }
    out: list[Row] = []
    for row in rows:
        change = changes.get(ident(row))
        new = row if change is None else change(row)
        if new is not None:
            out.append(new)
        if ident(row) == ("lstm", "forward", 16):  # a case the base never ran: new
            extra = json.loads(json.dumps(row))
            extra["case"]["seq_len"] = 32
            extra["key"] = key_of(extra["case"])
            out.append(extra)
    return out


def build(source: Path) -> None:
    run, rows = read_run(source)
    kept = [row for wanted in KEEP for row in rows if ident(row) == wanted]
    if len(kept) != len(KEEP):
        raise SystemExit(f"{source}: expected rows for {KEEP}, found {len(kept)} of them")
    base_run = with_run(run, "20261202-135140-tiny-fixture-cpu", BASE_COMMIT)
    current_run = with_run(run, "20261202-141500-tiny-fixture-cpu", CURRENT_COMMIT)
    print(write_run(HERE / "base", base_run, kept))
    print(write_run(HERE / "current", current_run, derive_current(kept)))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source", type=Path, default=ROOT / "tests" / "data" / "runs" / "tiny-cpu")
    build(parser.parse_args().source)
