"""The architecture holds: every module imports only its own room and the rooms below it (``if TYPE_CHECKING:``
aside), no two modules import each other in a circle (lazy imports inside functions and ``TYPE_CHECKING`` ones
included), and no room holds more than a quarter of the package's lines.

ARCHITECTURE.md draws the same table; a change to one is a change to the other.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "attnbench"

# Each room and the rooms it may import (itself included). Lower rooms never import higher ones.
_BELOW_MEASURING = frozenset({"core", "families", "config", "results"})
_MEASURING = frozenset({"host", "timing", "sweeps", "cluster", "instrument"})
ALLOWED: dict[str, frozenset[str]] = {
    "core": frozenset({"core"}),
    "families": frozenset({"core", "families"}),
    "config": frozenset({"core", "families", "config"}),
    "results": frozenset({"core", "families", "results"}),
    "host": frozenset({"core", "families", "results", "host"}),
    "timing": frozenset({"core", "families", "results", "host", "timing"}),
    "sweeps": _BELOW_MEASURING | {"host", "timing", "sweeps"},
    "cluster": _BELOW_MEASURING | {"sweeps", "cluster"},
    "instrument": _BELOW_MEASURING | {"host", "timing", "sweeps", "instrument"},
    "analysis": frozenset({"core", "families", "results", "analysis"}),
    "claims": frozenset({"core", "families", "results", "analysis", "claims"}),
    "report": frozenset({"core", "families", "results", "analysis", "claims", "report"}),
    # The commands' work as library calls: everything the CLI may use but the CLI.
    "workflows": _BELOW_MEASURING | _MEASURING | {"analysis", "claims", "report", "workflows"},
    "cli": _BELOW_MEASURING | _MEASURING | {"analysis", "claims", "report", "workflows", "cli"},
    # attnbench/__init__.py and __main__.py
    "": frozenset({"core", "families", "config", "results", "analysis", "claims", "report", "workflows", "cli"}),
}
# The modules of ``families`` that are torch's (``families/__init__.py`` lists them): only the measuring rooms, the
# families' own torch modules and the CLI may import them; the rest of ``families`` is torch-free.
FAMILY_TORCH = ("torch_family", "states", "blocks", "positional", "registry", "serving", "layers")
TORCH_ROOMS = _MEASURING | {"families"}
# Heavy or room-specific third-party packages, and the only rooms that may import them.
THIRD_PARTY: dict[str, frozenset[str]] = {
    "torch": TORCH_ROOMS,
    "triton": TORCH_ROOMS,
    "flash_attn": frozenset({"families"}),
    "fla": frozenset({"families"}),
    "mamba_ssm": frozenset({"families"}),
    "pynvml": frozenset({"host"}),
    "psutil": frozenset({"host", "instrument"}),
    "pydantic": frozenset({"config"}),
    "typer": frozenset({"cli"}),
    "rich": frozenset({"cli", "report"}),
    "matplotlib": frozenset({"report"}),
    "pandas": frozenset({"report"}),
    "numpy": frozenset({"analysis", "report"}),
    "ruptures": frozenset({"analysis"}),
    "scipy": frozenset({"analysis"}),
    "submitit": frozenset({"cluster"}),
}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # an attnbench module, or a third-party top-level name
    line: int


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def imports_of(root: Path, *, type_checking: bool = False) -> tuple[set[str], list[Import]]:
    """Every module under ``root`` and every import statement in it, lazy ones included, TYPE_CHECKING ones only
    with ``type_checking``. ``from pkg import sub`` where ``pkg.sub`` is a module counts as importing ``pkg.sub``
    alone."""
    paths = sorted(root.rglob("*.py"))
    modules = {module_name(p, root) for p in paths}
    found: list[Import] = []
    for path in paths:
        source = module_name(path, root)
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = set() if type_checking else _type_checking_lines(tree)
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom) or node.lineno in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    package = source.split(".") if path.name == "__init__.py" else source.split(".")[:-1]
                    base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
                subs = [f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            for target in targets:
                if target.split(".")[0] == root.name:
                    while target not in modules and "." in target:  # `import a.b.c` names module a.b.c
                        target = target.rsplit(".", 1)[0]
                    if target != source:
                        found.append(Import(source, target, node.lineno))
                else:
                    found.append(Import(source, target.split(".")[0], node.lineno))
    return modules, found


def room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in ALLOWED) else ""


def torch_module(module: str) -> bool:
    """Whether ``module`` is one of the families' torch modules (``FAMILY_TORCH``)."""
    parts = module.split(".")
    return len(parts) > 2 and parts[1] == "families" and parts[-1] in FAMILY_TORCH


def upward_imports(root: Path) -> list[str]:
    """``source:line imports target`` for every import that leaves the rooms ``source`` may use, and every import
    of a family's torch module (or of torch) from a torch-free one."""
    _, found = imports_of(root)
    problems = []
    for imp in found:
        where = f"{imp.source}:{imp.line}"
        if imp.target.split(".")[0] == root.name:
            if room(imp.target) not in ALLOWED[room(imp.source)]:
                problems.append(f"{where} imports {imp.target} ({room(imp.source) or 'top'} → {room(imp.target)})")
            elif torch_module(imp.target) and not (
                room(imp.source) in TORCH_ROOMS | {"cli"}
                and (room(imp.source) != "families" or torch_module(imp.source))
            ):
                problems.append(f"{where} imports {imp.target}, a torch module, from a torch-free one")
        elif imp.target in THIRD_PARTY and room(imp.source) not in THIRD_PARTY[imp.target]:
            problems.append(
                f"{where} imports {imp.target}, which belongs in {', '.join(sorted(THIRD_PARTY[imp.target]))}"
            )
        elif imp.target in THIRD_PARTY and room(imp.source) == "families" and not torch_module(imp.source):
            problems.append(f"{where} imports {imp.target} into a torch-free module of the families")
    return problems


def circles(root: Path) -> list[list[str]]:
    """Strongly connected groups of modules (Tarjan): each a set of modules that import each other in a ring, the
    imports a type checker alone follows included."""
    modules, found = imports_of(root, type_checking=True)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for imp in found:
        if imp.target in graph:
            graph[imp.source].add(imp.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return groups


@pytest.mark.slow
def test_no_module_imports_a_room_above_its_own() -> None:
    assert upward_imports(PACKAGE) == []


@pytest.mark.slow
def test_no_two_modules_import_each_other_in_a_circle() -> None:
    assert circles(PACKAGE) == []


def test_the_top_level_shows_the_rooms() -> None:
    loose = sorted(p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert len(loose) <= 6, loose
    rooms = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert rooms == sorted(r for r in ALLOWED if r)


@pytest.fixture
def planted(tmp_path: Path) -> Path:
    copy = tmp_path / "attnbench"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.mark.slow
def test_a_planted_upward_import_is_caught(planted: Path) -> None:
    stats = planted / "core" / "stats.py"
    stats.write_text(
        stats.read_text() + "\n\ndef _later() -> None:\n    from attnbench.results.store import load_run\n"
    )
    assert upward_imports(planted) == [
        "attnbench.core.stats:" + str(len(stats.read_text().splitlines())) + " imports attnbench.results.store "
        "(core → results)"
    ]


@pytest.mark.slow
def test_a_planted_circle_is_caught(planted: Path) -> None:
    units = planted / "core" / "units.py"
    units.write_text(units.read_text() + "\n\ndef _later() -> None:\n    from attnbench.core import stats\n")
    stats = planted / "core" / "stats.py"
    stats.write_text(stats.read_text() + "\n\ndef _later() -> None:\n    from attnbench.core.units import KIB\n")
    assert circles(planted) == [["attnbench.core.stats", "attnbench.core.units"]]


@pytest.mark.slow
def test_a_planted_torch_import_outside_the_measuring_rooms_is_caught(planted: Path) -> None:
    cells = planted / "report" / "cells.py"
    cells.write_text(cells.read_text() + "\n\ndef _later() -> None:\n    import torch.nn\n")
    problems = upward_imports(planted)
    assert len(problems) == 1 and problems[0].startswith("attnbench.report.cells:") and " torch, " in problems[0]


@pytest.mark.slow
def test_a_planted_torch_import_in_a_spec_is_caught(planted: Path) -> None:
    spec = planted / "families" / "rnn" / "spec.py"
    spec.write_text(
        spec.read_text() + "\n\ndef _later() -> None:\n    import torch\n    from attnbench.families import registry\n"
    )
    problems = upward_imports(planted)
    assert len(problems) == 2 and all(p.startswith("attnbench.families.rnn.spec:") for p in problems)


def test_every_command_is_thin() -> None:
    """ARCHITECTURE §2: a command parses its options, calls the library and renders; its body (from the docstring
    on, past the typer signature) fits in 60 lines, and the work it does is a library call (``workflows``, …)."""
    long: dict[str, int] = {}
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Name) and d.id == "handles_errors" for d in node.decorator_list
            ):
                body = (node.end_lineno or node.lineno) - node.body[0].lineno + 1
                if body > 60:
                    long[f"{path.name}:{node.name}"] = body
    assert long == {}


def test_no_function_is_long() -> None:
    """A function outside ``cli`` fits in 80 lines (its ``def`` to its last line); one in ``cli`` in 60 past its
    signature (a typer signature spells every option): a longer one is split into pieces that say what they do."""
    long: dict[str, int] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        in_cli = path.parent.name == "cli"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = node.body[0].lineno if in_cli else node.lineno
                lines = (node.end_lineno or node.lineno) - first + 1
                if lines > (60 if in_cli else 80):
                    long[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    assert long == {}


def test_no_room_holds_more_than_a_quarter_of_the_package() -> None:
    lines: dict[str, int] = {}
    for path in PACKAGE.rglob("*.py"):
        name = room(module_name(path, PACKAGE))
        lines[name] = lines.get(name, 0) + len(path.read_text(encoding="utf-8").splitlines())
    total = sum(lines.values())
    assert max(lines.values()) <= 0.25 * total, {k: f"{v / total:.0%}" for k, v in sorted(lines.items())}


def test_no_two_modules_of_the_measuring_rooms_share_a_name() -> None:
    """ARCHITECTURE §2: what measure/ was before the rooms had decode, decoding and decode_state, and selfcheck four
    times over; a name in the measuring rooms now says which module it is."""
    found: dict[str, list[str]] = {}
    for room_name in sorted(_MEASURING):
        for path in (PACKAGE / room_name).rglob("*.py"):
            if path.stem != "__init__":
                found.setdefault(path.stem, []).append(module_name(path, PACKAGE))
    assert {name: where for name, where in found.items() if len(where) > 1} == {}


@pytest.mark.slow
def test_a_circle_through_a_type_checking_import_is_caught(planted: Path) -> None:
    stats = planted / "core" / "stats.py"
    stats.write_text(
        stats.read_text() + "\n\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
        "    from attnbench.core.units import KIB\n"
    )
    units = planted / "core" / "units.py"
    units.write_text(units.read_text() + "\n\ndef _later() -> None:\n    from attnbench.core import stats\n")
    assert upward_imports(planted) == []  # a type checker's import may point up: only circles are refused
    assert circles(planted) == [["attnbench.core.stats", "attnbench.core.units"]]
