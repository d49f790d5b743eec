"""What many test modules share: where things are, the golden-file check, and the tiny configs that real sweeps
in tests run (small enough for seconds on a 2-core machine)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from attnbench.core.cases import Case, Mode
from attnbench.core.catalogue import is_recurrent

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
    "max_case_s": 0.3,
    "warmup_max_s": 0.05,
}


def tiny_config(name: str = "tiny", **changes: Any) -> str:
    """A CPU config of tiny models as YAML text; ``changes`` replace top-level keys (``grid`` whole)."""
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
        "timing": dict(QUICK_TIMING),
    }
    config.update(changes)
    return yaml.safe_dump(config, sort_keys=False)


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
    recurrent = is_recurrent(model)
    return Case(
        model,
        mode,
        dtype,
        device,
        batch,
        seq_len,
        d_model,
        None if recurrent else heads,
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
