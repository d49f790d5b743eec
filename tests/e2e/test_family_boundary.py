"""A family is one folder: no module outside ``attnbench/families`` (and ``claims``, which judges the article's
models by name) names a built-in model, an option only some families have, or branches on a model's kind as a
stand-in for what its family does; none imports a family's folder (``attnbench.families.<family>``: the catalogue and
the registry are the way in), reads a row extra a family declares by its name (the family reads its own, through a
hook), and no value of ``core`` or ``results`` holds a family's type (by its name, or by any name imported from the
families, ``TYPE_CHECKING`` imports included: a model a case defines travels as an opaque ``Definition``), nor does
``core`` import the families at all; and a family's torch-free half imports no torch, at import time or later.

Docstrings and ``__all__`` lists are prose and exports, not code, and are not read; the few string literals that
happen to equal a name and mean something else are listed in ``ALLOWED`` with the reason.
"""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from attnbench.families import shared
from attnbench.families.catalogue import FAMILIES, HYBRID, MODEL_NAMES, MODELS, USER
from tests.e2e.test_layers import FAMILY_TORCH, imports_of
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
# The families' folders, and the row extras they declare (``Family.extras``): only a family reads its own.
FAMILY_FOLDERS = tuple(sorted(p.parent.name for p in (PACKAGE / "families").glob("*/spec.py")))
EXTRA_KEYS = {spec.name for family in (*FAMILIES, HYBRID, USER) for spec in family.extras}
# The rooms whose values every other room passes on and stores (ARCHITECTURE §3).
VALUE_ROOMS = ("core", "results")


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


def _outside(module: str) -> bool:
    parts = module.split(".")
    return len(parts) < 2 or parts[1] not in OUTSIDE


def family_folder_imports(root: Path) -> list[str]:
    """``module:line`` and the family folder it imports, for every module outside the families and claims (lazy and
    ``TYPE_CHECKING`` imports included)."""
    _, found = imports_of(root, type_checking=True)
    folders = tuple(f"{root.name}.families.{name}" for name in FAMILY_FOLDERS)
    return sorted(
        f"{i.source}:{i.line} imports {i.target}"
        for i in found
        if _outside(i.source) and any(i.target == f or i.target.startswith(f + ".") for f in folders)
    )


def extra_keys_read_outside(root: Path) -> list[str]:
    """``path:line`` and the key, for every string outside the families and claims that spells a row extra a family
    declares (``row.extra.get("sdpa_kernel")``): the family's hook reads it, handed the row's extras."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).as_posix()
        if rel.split("/")[1] in OUTSIDE:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        prose = _prose(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in EXTRA_KEYS and id(node) not in prose:
                found.append(f"{rel}:{node.lineno} reads the extra {node.value!r}")
    return found


def _family_types(root: Path) -> set[str]:
    """The classes a family's folder defines, and the names that begin with a family's (``HybridModel``)."""
    defined = {
        node.name
        for path in (root / "families").glob("*/*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
    }
    return defined | {name.capitalize() for name in FAMILY_FOLDERS}


def _imported_from_families(tree: ast.Module) -> set[str]:
    """The names a module binds to something of the families (``from attnbench.families.x import T as U``: U;
    ``import attnbench.families.x as m``: m), ``TYPE_CHECKING`` imports included."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(f"{PACKAGE.name}.families"):
            names.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Import):
            families = [a for a in node.names if a.name.startswith(f"{PACKAGE.name}.families")]
            names.update(a.asname or a.name.split(".")[0] for a in families)
    return names


def family_types_in_core_values(root: Path) -> dict[tuple[str, str], str]:
    """(module, class.field) → the family's type, for every field of a class in ``core`` or ``results`` whose
    annotation names a family's type, or a name the module imports from the families (under any alias, in a
    string annotation too); classes that are themselves a family's type are that family's, not core's."""
    types = _family_types(root)

    def family_type(name: str) -> bool:
        return name in types or any(name.startswith(t) and name[len(t) : len(t) + 1].isupper() for t in types)

    found: dict[tuple[str, str], str] = {}
    for room in VALUE_ROOMS:
        for path in sorted((root / room).rglob("*.py")):
            rel = path.relative_to(root.parent).as_posix()
            tree = ast.parse(path.read_text(encoding="utf-8"))
            imported = _imported_from_families(tree)
            for cls in ast.walk(tree):
                if not isinstance(cls, ast.ClassDef) or family_type(cls.name):
                    continue
                for item in cls.body:
                    if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                        names = [n.id for n in ast.walk(item.annotation) if isinstance(n, ast.Name)]
                        names += [
                            word
                            for n in ast.walk(item.annotation)
                            if isinstance(n, ast.Constant)
                            for word in re.findall(r"[A-Za-z_]\w*", str(n.value))
                        ]
                        held = [n for n in names if family_type(n) or n in imported]
                        if held:
                            found[(rel, f"{cls.name}.{item.target.id}")] = held[0]
    return found


def core_imports_of_the_families(root: Path) -> list[str]:
    """``module:line`` and what it imports, for every import of the families in ``core`` (``TYPE_CHECKING`` ones
    included, which the layer test lets point anywhere): core knows no model, so it may not even name one's type."""
    _, found = imports_of(root, type_checking=True)
    core, families = f"{root.name}.core", f"{root.name}.families"
    return sorted(
        f"{i.source}:{i.line} imports {i.target}"
        for i in found
        if (i.source == core or i.source.startswith(core + "."))
        and (i.target == families or i.target.startswith(families + "."))
    )


def test_no_module_outside_the_families_imports_a_family_folder() -> None:
    assert FAMILY_FOLDERS and "attention" in FAMILY_FOLDERS
    assert family_folder_imports(PACKAGE) == []


def test_no_module_outside_the_families_reads_a_family_extra_by_name() -> None:
    assert "sdpa_kernel" in EXTRA_KEYS and "rnn_path" in EXTRA_KEYS
    assert extra_keys_read_outside(PACKAGE) == []


def test_no_core_value_holds_a_family_type() -> None:
    """A user's model and a hybrid stack travel in their cases as an opaque ``Definition``, which their family reads."""
    assert family_types_in_core_values(PACKAGE) == {}
    assert core_imports_of_the_families(PACKAGE) == []


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


def test_each_kind_of_leak_is_caught(planted: Path) -> None:
    """One of each kind of leak planted in a copy of the package, and each one found."""
    pivot = planted / "report" / "cells.py"  # any module outside the families
    pivot.write_text(
        pivot.read_text() + "\n\nfrom typing import TYPE_CHECKING\n"
        "from attnbench.families.attention.spec import FAMILY as _PLANTED\n"
        "from attnbench.families import rnn as _planted_rnn\n"
        "if TYPE_CHECKING:\n"
        "    import attnbench.families.mamba2.layers\n\n\n"
        "def _planted_leak(row):\n"
        "    from attnbench.families.user.layers import check_output\n"
        "    return row.extra.get('sdpa_kernel'), row.extra['rnn_path'], check_output\n"
    )
    cases = planted / "core" / "cases.py"
    cases.write_text(
        cases.read_text() + "\n\n@dataclass(frozen=True)\nclass _Planted:\n"
        "    family: 'AttentionFamily | None' = None\n"
        "    models: tuple[RnnFamily, ...] = ()\n"
        "    spec: Mamba2Spec | None = None\n"
        "    fine: Case | None = None\n"
    )
    imports = family_folder_imports(planted)
    assert len(imports) == 4 and all(i.startswith("attnbench.report.cells:") for i in imports)
    assert {i.rsplit(" ", 1)[1].split(".")[2] for i in imports} == {"attention", "rnn", "mamba2", "user"}
    extras = extra_keys_read_outside(planted)
    assert len(extras) == 2 and {e.rsplit(" ", 1)[1] for e in extras} == {"'sdpa_kernel'", "'rnn_path'"}
    held = set(family_types_in_core_values(planted))
    assert held == {("attnbench/core/cases.py", f"_Planted.{f}") for f in ("family", "models", "spec")}


def test_a_family_type_held_in_a_core_value_is_caught_under_any_name(planted: Path) -> None:
    """The leak this boundary closed (issue 47: ``Case.hybrid: HybridModel``), planted back under other names: a
    family's class imported for type checking only, under an alias, and a family's module named in a string
    annotation. Each field is found, and so is each import of the families in core."""
    cases = planted / "core" / "cases.py"
    cases.write_text(
        cases.read_text() + "\n\nfrom typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    import attnbench.families.user.spec as _users\n"
        "    from attnbench.families.hybrid.spec import HybridModel as _Stack\n\n\n"
        "@dataclass(frozen=True)\nclass _PlantedCase:\n"
        "    stack: _Stack | None = None\n"
        "    user: '_users.UserModel | None' = None\n"
        "    hybrid: HybridModel | None = None\n"
        "    fine: Definition | None = None\n"
    )
    held = family_types_in_core_values(planted)
    assert set(held) == {("attnbench/core/cases.py", f"_PlantedCase.{f}") for f in ("stack", "user", "hybrid")}
    imports = core_imports_of_the_families(planted)
    assert {i.rsplit(" ", 1)[1] for i in imports} == {"attnbench.families.user.spec", "attnbench.families.hybrid.spec"}
    assert all(i.startswith("attnbench.core.cases:") for i in imports)


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
                # warm: a cold decode sample flushes twice this machine's LLC (960 MB on a host with a 480 MiB L3),
                # which under load took the row past its budget; the boundary, not the timing, is under test here
                "cache": "warm",
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
