"""report, validate and --help must work where torch and pynvml cannot be imported (DESIGN §2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURE_RUN = ROOT / "tests" / "data" / "runs" / "tiny-cpu"


@pytest.fixture(scope="module")
def blocked_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    blocker = tmp_path_factory.mktemp("blocker")
    for name in ("torch", "pynvml"):
        package = blocker / name
        package.mkdir()
        (package / "__init__.py").write_text(f"raise ImportError('{name} is blocked for this test')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(blocker), str(ROOT)])
    return env


def attnbench(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "attnbench", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
        check=False,
    )


def test_blocker_really_blocks(blocked_env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import torch"], capture_output=True, text=True, env=blocked_env, check=False
    )
    assert out.returncode != 0 and "blocked" in out.stderr


@pytest.mark.parametrize("fmt", ["md", "csv", "json", "table"])
def test_report_without_torch(blocked_env: dict[str, str], fmt: str) -> None:
    out = attnbench(blocked_env, "report", str(FIXTURE_RUN), "--format", fmt)
    assert out.returncode == 0, out.stderr
    assert "sdpa-flash" in out.stdout


def test_validate_and_help_without_torch(blocked_env: dict[str, str]) -> None:
    out = attnbench(blocked_env, "validate", "configs/default.yaml")
    assert out.returncode == 0, out.stderr
    assert attnbench(blocked_env, "--help").returncode == 0
    assert attnbench(blocked_env, "report", "--help").returncode == 0


def test_bad_report_input_without_torch_is_a_clean_error(blocked_env: dict[str, str]) -> None:
    out = attnbench(blocked_env, "report", "tests")
    assert out.returncode == 2
    assert "error:" in out.stderr and "Traceback" not in out.stderr


def test_report_telemetry_without_torch_or_pynvml(blocked_env: dict[str, str]) -> None:
    out = attnbench(blocked_env, "report", str(FIXTURE_RUN), "--telemetry")
    assert out.returncode == 0, out.stderr
    assert "# Telemetry per case" in out.stdout
