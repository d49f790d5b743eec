"""A plain, non-editable install: it carries the built-in configs, so `attnbench sweep` works from any directory,
and it depends on everything the first sweep writes, plots included."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.support import ROOT, tiny_config

pytestmark = pytest.mark.slow  # real sweeps and worker processes throughout: not in the fast tier


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The wheel built from this checkout, and the folder it is installed into (dependencies from this venv)."""
    tmp = tmp_path_factory.mktemp("wheel")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp / "dist"), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if build.returncode != 0 and "No matching distribution" in build.stderr:
        pytest.skip("the build backend cannot be fetched here")
    assert build.returncode == 0, build.stderr
    (wheel,) = (tmp / "dist").glob("attnbench-*.whl")
    site = tmp / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        timeout=120,
    )
    return wheel, site


def _attnbench(site: Path, cwd: Path, *args: str, as_a_user: bool = False) -> subprocess.CompletedProcess[str]:
    """``as_a_user``: without the suite's own settings (tests/conftest.py's ATTNBENCH_PLOTS=0), as a shell has it."""
    env = {**os.environ, "PYTHONPATH": str(site)}
    if as_a_user:
        env.pop("ATTNBENCH_PLOTS", None)
    code = (
        "import attnbench, sys; print(attnbench.__file__); "
        f"sys.argv=['attnbench', *{list(args)!r}]; from attnbench.cli import run; run()"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_wheel_install_runs_the_builtin_default_from_anywhere(installed: tuple[Path, Path], tmp_path: Path) -> None:
    _, site = installed
    out = _attnbench(site, tmp_path, "sweep", "--dry-run", "--device", "cpu")
    assert out.returncode == 0, out.stderr
    first = out.stdout.splitlines()[0]
    assert first.startswith(str(site))  # the installed copy, not the checkout
    assert "36 cases on cpu (dry run" in out.stdout
    assert not (tmp_path / "results").exists()


@pytest.mark.slow
def test_a_plain_install_draws_the_plots(installed: tuple[Path, Path], tmp_path: Path) -> None:
    """Issue 18: `pip install .` brings matplotlib (a base requirement, not an extra), and the sweep of the
    installed package writes plots/*.png beside its rows."""
    wheel, site = installed
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(archive.read(name).decode())
    requires = metadata.get_all("Requires-Dist") or []
    base = [r for r in requires if "extra ==" not in r]
    assert any(r.startswith("matplotlib") for r in base), requires
    config = tmp_path / "tiny.yaml"
    config.write_text(tiny_config())
    out = _attnbench(site, tmp_path, "sweep", str(config), "-q", as_a_user=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[0].startswith(str(site))
    assert "plots skipped" not in out.stdout + out.stderr
    (folder,) = (tmp_path / "results" / "runs").iterdir()
    plots = sorted(p.name for p in (folder / "plots").glob("*.png"))
    assert plots and all(p.endswith(".png") for p in plots)
    # The speed-up plot draws only speed-ups from good evidence: on a busy machine every cell may be contended
    # (issue 17), and then it has nothing to draw.
    assert {"latency", "memory", "throughput"} <= {p.split("-", 1)[0] for p in plots}, plots
