"""``attnbench.measure``: one case timed from Python by the sweep's own parts (the config's checks, the sweep's plan,
``TorchExecutor`` and ``adaptive.measure``), returning the row a sweep stores; the example in docs/how-to/python.md
runs as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import attnbench as ab
from attnbench.core.errors import ConfigError
from attnbench.families.user.spec import user_of
from attnbench.results.store import load_run
from attnbench.sweeps.events import QuietListener
from attnbench.sweeps.runner import SweepRequest, open_sweep
from attnbench.timing import torch_executor
from tests.support import QUICK_TIMING, tiny_config

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "how-to" / "python.md"
SHAPE: dict[str, Any] = {"seq_len": 16, "batch": 1, "d_model": 16, "heads": 2, "layers": 1, "threads": 1}


def documented_example() -> str:
    """The page's code block that calls ``ab.measure``."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)
    (block,) = [b for b in blocks if "ab.measure(" in b]
    return block


@pytest.mark.slow
def test_the_documented_example_runs_and_returns_the_rows(tmp_path: Path) -> None:
    # Run as a script, as a notebook runs it: its factory lives in __main__.
    script = tmp_path / "example.py"
    script.write_text(
        documented_example() + "\nimport json\nprint(json.dumps({'row': row.to_dict(), 'mine': mine.to_dict()}))\n",
        encoding="utf-8",
    )
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    row, mine = ab.Result.from_dict(rows["row"]), ab.Result.from_dict(rows["mine"])
    for result in (row, mine):
        assert result.status == "ok", result.reason
        case = result.case
        assert (case.seq_len, case.batch, case.d_model, case.mode, case.dtype, case.device) == (
            256,
            2,
            64,
            "forward",
            "float32",
            "cpu",
        )
        assert result.median_s > 0 and len(result.timing.samples_s) >= 3
    assert row.case.model == "sdpa-flash" and row.case.given("positional") == "rope"
    assert user_of(mine.case).factory == "__main__:build" and user_of(mine.case).kind == "attention"


@pytest.mark.slow
def test_the_row_is_a_sweeps_row_timed_by_the_sweeps_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    adaptive_measure = torch_executor.measure

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append("adaptive.measure")
        return adaptive_measure(*args, **kwargs)

    monkeypatch.setattr(torch_executor, "measure", spy)
    timing = dict(QUICK_TIMING)
    row = ab.measure("lstm", device="cpu", timing=timing, **SHAPE)
    assert calls == ["adaptive.measure"]  # the sweep's stopping rule timed it, once
    assert row.status == "ok", row.reason

    config = tmp_path / "one.yaml"
    config.write_text(
        tiny_config("one", models=["lstm"], grid={"batch": [1], "seq_len": [16]}, timing=timing), encoding="utf-8"
    )
    with open_sweep(SweepRequest(config, "cpu", tmp_path / "runs", isolate=False)) as run:
        run.run(QuietListener())
        folder = run.folder
    (swept,) = load_run(folder).results
    assert row.case == swept.case  # the same case, key and all
    assert set(row.to_dict()) == set(swept.to_dict())  # and the same row's fields
    # Under the same stopping rule: its target, and samples up to the sweep's minimum at least.
    assert row.timing.target_ci == swept.timing.target_ci == QUICK_TIMING["target_ci"]
    assert len(row.timing.samples_s) >= QUICK_TIMING["min_samples"]


@pytest.mark.parametrize(
    ("model", "arguments", "key"),
    [
        ("lstm", {"seq_len": 0}, "seq_len"),
        ("lstm", {"seq_len": 8, "batch": -1}, "batch"),
        ("lstm", {"seq_len": 8, "mode": "fwd"}, "mode"),
        ("lstm", {"seq_len": 8, "dtype": "float99"}, "dtype"),
        ("no-such-model", {"seq_len": 8}, "model"),
        ("sdpa-flash", {"seq_len": 8, "options": {"nope": 1}}, "options.nope"),
        ("sdpa-flash", {"seq_len": 8, "options": {"window": [0, 4]}}, "options"),
        ("lstm", {"seq_len": 8, "timing": {"target_ci": 5}}, "timing.target_ci"),
        ("lstm", {"seq_len": 8, "timing": {"processes": 3}}, "timing.processes"),
        ("lstm", {"seq_len": 8, "timing": {"rounds": 2}}, "timing.rounds"),
        ("lstm", {"seq_len": 8, "kind": "recurrent"}, "kind"),
        ("lstm", {"seq_len": 8, "device": "tpu"}, "device"),
        (lambda request: None, {"seq_len": 8, "kind": "attention"}, "model"),
        (42, {"seq_len": 8}, "model"),
    ],
)
def test_a_bad_argument_is_a_config_error_naming_it(model: Any, arguments: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError) as raised:
        ab.measure(model, **arguments)
    assert raised.value.key == key and raised.value.hint


def test_importing_attnbench_and_finding_measure_needs_no_torch() -> None:
    code = "import sys, attnbench; attnbench.measure; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"
    assert "measure" in ab.__all__
