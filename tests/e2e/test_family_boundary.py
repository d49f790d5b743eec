"""A family is one folder: no module outside ``attnbench/families`` (and ``claims``, which judges the article's
models by name) names a built-in model, an option only some families have, or branches on a model's kind as a
stand-in for what its family does; and a family's torch-free half imports no torch, at import time or later.

Docstrings and ``__all__`` lists are prose and exports, not code, and are not read; the few string literals that
happen to equal a name and mean something else are listed in ``ALLOWED`` with the reason.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnbench.families import shared
from attnbench.families.catalogue import MODEL_NAMES, MODELS
from tests.e2e.test_layers import FAMILY_TORCH
from tests.support import QUICK_TIMING, ROOT

PACKAGE = ROOT / "attnbench"
# The options every network family shares (families/shared.py): the words of a network, not of one family.
NETWORK_OPTIONS = {o.name for o in (shared.SCOPE, shared.FFN_MULT, shared.VOCAB, shared.MAX_LEN, shared.MATCH)} | {
    shared.COMPILE.name,
    "positional",
    "preset",
}
FAMILY_OPTIONS = {o.name for spec in MODELS.values() for o in spec.options} - NETWORK_OPTIONS
# (module, literal): why a string equal to a model or option name means something else there.
ALLOWED = {
    ("attnbench/timing/gpu_timing.py", "kernel"): "Kineto's activity type for a GPU kernel",
    ("attnbench/results/environment.py", "flash-attn"): "the distribution an older run.json's flash_attn field named",
}
OUTSIDE = ("families", "claims")


def _prose(tree: ast.Module) -> set[int]:
    """The ids of docstring constants and of the strings in ``__all__``."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.add(id(first.value))
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            skip.update(id(n) for n in ast.walk(node.value))
    return skip


def _kind_test(node: ast.Compare) -> bool:
    """``x.kind == "recurrent"``, ``kind_of(case) != "attention"`` and the like."""
    sides = [node.left, *node.comparators]
    words = any(isinstance(s, ast.Constant) and s.value in ("recurrent", "attention") for s in sides)
    kind = any(
        (isinstance(s, ast.Attribute) and s.attr == "kind")
        or (isinstance(s, ast.Call) and isinstance(s.func, ast.Name) and s.func.id == "kind_of")
        or (isinstance(s, ast.Name) and s.id == "kind")
        for s in sides
    )
    return words and kind


def naming_outside_the_families(root: Path) -> list[str]:
    """``path:line`` and what it names, for every module outside the families and claims."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.split("/")[1] in OUTSIDE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        prose = _prose(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in prose:
                what = "model" if node.value in MODEL_NAMES else "option" if node.value in FAMILY_OPTIONS else None
                if what is not None and (rel, node.value) not in ALLOWED:
                    found.append(f"{rel}:{node.lineno} names the {what} {node.value!r}")
            elif isinstance(node, ast.Compare) and _kind_test(node):
                found.append(f"{rel}:{node.lineno} branches on a kind: {ast.unparse(node)}")
    return found


def test_no_module_outside_the_families_names_a_model_an_option_or_a_kind() -> None:
    assert naming_outside_the_families(PACKAGE) == []


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    copy = tmp_path / "attnbench"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_each_kind_of_naming_is_caught(planted: Path) -> None:
    cells = planted / "report" / "cells.py"
    cells.write_text(
        cells.read_text() + "\n\ndef _planted(case, kind):\n"
        "    if case.kind == 'recurrent' or kind != 'attention':\n"
        "        return case.model == 'mamba2' or 'bidirectional' in case.options\n"
        "    return 'scope'  # a network's option: allowed\n"
    )
    found = naming_outside_the_families(planted)
    assert len(found) == 4 and all(f.startswith("attnbench/report/cells.py:") for f in found)
    assert sum("branches on a kind" in f for f in found) == 2
    assert any("the model 'mamba2'" in f for f in found) and any("the option 'bidirectional'" in f for f in found)


def test_the_families_torch_free_half_imports_no_torch() -> None:
    """Every spec and every loop over the families imports, and runs, in a Python where torch cannot be imported:
    validate, report and compare rest on them."""
    torch_free = sorted(
        ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (PACKAGE / "families").rglob("*.py")
        if p.stem not in FAMILY_TORCH
    )
    assert "attnbench.families.rnn.spec" in torch_free and "attnbench.families.catalogue" in torch_free
    script = (
        "import sys\nsys.modules['torch'] = None\n"
        + "".join(f"import {m}\n" for m in torch_free)
        + "from attnbench.families.catalogue import MODELS, family_of\n"
        "from attnbench.families.flops import count_flops\n"
        "from tests.support import tiny_case\n"
        "for name, spec in MODELS.items():\n"
        "    case = tiny_case(name, d_model=64, heads=4)\n"
        "    family_of(case).parameters(case); family_of(case).state_bytes(case)\n"
        "print('torch' in sys.modules and sys.modules['torch'] is not None)\n"
    )
    run = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


@pytest.mark.slow
def test_a_family_copied_and_renamed_is_found_listed_and_measured_with_nothing_else_changed(tmp_path: Path) -> None:
    """ARCHITECTURE §7's promise, tried as a newcomer would: copy one family's folder, rename it, and the catalogue,
    ``attnbench models``, validation and a sweep know the new model, with not one file outside the folder edited."""
    tree = tmp_path / "tree"
    shutil.copytree(PACKAGE, tree / "attnbench", ignore=shutil.ignore_patterns("__pycache__"))
    source, folder = tree / "attnbench" / "families" / "rwkv7", tree / "attnbench" / "families" / "scratch7"
    shutil.copytree(source, folder)
    for path in folder.glob("*.py"):
        text = path.read_text()
        text = text.replace('"rwkv7"', '"scratch7"').replace("families.rwkv7.", "families.scratch7.")
        path.write_text(text.replace('f"rwkv7-{form}"', 'f"scratch7-{form}"'))
    config = tmp_path / "scratch.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "scratch",
                "device": "cpu",
                "threads": 1,
                "models": ["scratch7", "rwkv7"],
                "modes": ["forward", "decode"],
                "grid": {"batch": [1], "seq_len": [16]},
                "d_model": 32,
                "heads": 2,
                "causal": True,
                "timing": dict(QUICK_TIMING),
            }
        )
    )
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}

    def attnbench(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "attnbench", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )

    listed = attnbench("models", "-f", "json")
    assert listed.returncode == 0, listed.stderr
    assert "scratch7" in listed.stdout
    assert attnbench("validate", str(config)).returncode == 0
    swept = attnbench("sweep", str(config), "--out", str(tmp_path / "out"), "-q", "--no-plots")
    assert swept.returncode == 0, swept.stderr
    rows = [json.loads(line) for line in next((tmp_path / "out").iterdir()).joinpath("results.jsonl").open()]
    status = {(r["case"]["model"], r["case"]["mode"]): r["status"] for r in rows}
    assert status == {(m, mode): "ok" for m in ("scratch7", "rwkv7") for mode in ("forward", "decode")}
    flops = {r["case"]["model"]: r["extra"]["flops"] for r in rows if r["case"]["mode"] == "forward"}
    assert flops["scratch7"] == flops["rwkv7"] > 0  # the same layer, counted by the copied formulas
