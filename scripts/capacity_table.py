"""A run folder's capacity rows as a markdown table (issue 52): each row's batch and the bytes each sequence holds,
beside the same model's at its plain layout (no kv_dtype, contiguous, separate pools) at the same n.

    .venv/bin/python scripts/capacity_table.py results/runs/<run folder>   # prints the table

The figures are memory, not time: a machine's load does not change them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(folder: Path) -> list[dict[str, object]]:
    found = []
    for line in (folder / "results.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        case, extra = row["case"], row.get("extra", {})
        if case["mode"] != "capacity" or "capacity_batch" not in extra:
            continue
        kept = case.get("kept", {})
        found.append(
            {
                "model": case["model"],
                "n": case["seq_len"],
                "kept": ", ".join(f"{k}={v}" for k, v in sorted(kept.items())) or "-",
                "plain": sorted(kept.items()),
                "batch": extra["capacity_batch"],
                "state": extra.get("state_bytes", 0) // max(1, extra["capacity_batch"]),
            }
        )
    return found


def table(found: list[dict[str, object]]) -> str:
    base = {(r["model"], r["n"]): r for r in found if r["kept"] == "-"}
    kv_only = {(r["model"], r["n"], r["kept"]): r for r in found}
    lines = [
        "| model | n | kept as | capacity (sequences) | state bytes / sequence | × plain | against the same dtype "
        "contiguous: sequences, bytes / sequence, the batch its bytes alone predict |",
        "|---|---:|---|---:|---:|---:|---|",
    ]
    for r in sorted(found, key=lambda r: (str(r["model"]), int(str(r["n"])), str(r["kept"]))):
        plain = base.get((r["model"], r["n"]))
        ratio = f"{int(str(r['batch'])) / int(str(plain['batch'])):.2f}" if plain else ""
        layout = [f"{k}={v}" for k, v in r["plain"] if k not in ("page_tokens", "hybrid_pages")]  # type: ignore[attr-defined]
        same = kv_only.get((r["model"], r["n"], ", ".join(layout) or "-"))
        delta = ""
        if same is not None and same is not r:
            gap = int(str(r["batch"])) - int(str(same["batch"]))
            extra = int(str(r["state"])) - int(str(same["state"]))
            predicted = int(str(same["batch"])) * int(str(same["state"])) // int(str(r["state"]))
            delta = f"{gap:+d}, {extra:+,d} B, {predicted}"
        lines.append(
            f"| {r['model']} | {r['n']} | {r['kept']} | {r['batch']} | {int(str(r['state'])):,} | {ratio} | {delta} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(rows(Path(sys.argv[1]))))
