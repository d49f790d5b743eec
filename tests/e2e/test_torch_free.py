"""report, validate and --help must work where torch and pynvml cannot be imported (ARCHITECTURE.md §2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import FIXTURE, ROOT

FIXTURE_RUN = FIXTURE


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
@pytest.mark.slow
def test_report_without_torch(blocked_env: dict[str, str], fmt: str) -> None:
    out = attnbench(blocked_env, "report", str(FIXTURE_RUN), "--format", fmt)
    assert out.returncode == 0, out.stderr
    assert "sdpa-flash" in out.stdout


@pytest.mark.slow
def test_validate_and_help_without_torch(blocked_env: dict[str, str]) -> None:
    out = attnbench(blocked_env, "validate", "configs/default.yaml")
    assert out.returncode == 0, out.stderr
    assert attnbench(blocked_env, "--help").returncode == 0
    assert attnbench(blocked_env, "report", "--help").returncode == 0


@pytest.mark.slow
def test_sweep_dry_run_without_torch(blocked_env: dict[str, str]) -> None:
    """Issue 18: a dry run lists the cases and budgets the time without importing torch (seconds saved), telling
    "auto" from the files torch and the driver leave."""
    out = attnbench(blocked_env, "sweep", "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert "36 cases on cpu (dry run: nothing measured)" in lines
    assert any(line.startswith("device: auto → cpu (") and "told without importing torch" in line for line in lines)
    assert any(line.startswith("estimate: up to 1 min 30 s of warm-up and sampling (36 cases") for line in lines)
    gpu = attnbench(blocked_env, "sweep", "configs/default-cuda.yaml", "--device", "cuda", "--dry-run")
    assert gpu.returncode == 0, gpu.stderr
    assert "96 cases on cuda:0 (dry run" in gpu.stdout
    assert "the sweep itself would refuse 'cuda'" in gpu.stderr and "Traceback" not in gpu.stderr
    assert attnbench(blocked_env, "sweep", "--help").returncode == 0


@pytest.mark.slow
def test_schema_without_torch(blocked_env: dict[str, str], tmp_path: Path) -> None:
    out = attnbench(blocked_env, "schema")
    assert out.returncode == 0, out.stderr
    assert (ROOT / "configs" / "attnbench.schema.json").read_text(encoding="utf-8") == out.stdout
    target = tmp_path / "schema.json"
    assert attnbench(blocked_env, "schema", "-o", str(target)).returncode == 0
    assert target.read_text(encoding="utf-8") == out.stdout


def test_bad_report_input_without_torch_is_a_clean_error(blocked_env: dict[str, str]) -> None:
    out = attnbench(blocked_env, "report", "tests")
    assert out.returncode == 2
    assert "error:" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.slow
def test_report_telemetry_without_torch_or_pynvml(blocked_env: dict[str, str]) -> None:
    out = attnbench(blocked_env, "report", str(FIXTURE_RUN), "--telemetry")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Telemetry per case")
    md = attnbench(blocked_env, "report", str(FIXTURE_RUN), "--telemetry", "-f", "md")
    assert md.returncode == 0, md.stderr
    assert "# Telemetry per case" in md.stdout


@pytest.mark.parametrize("fmt", ["table", "md", "json"])
@pytest.mark.slow
def test_claims_without_torch_or_pynvml(blocked_env: dict[str, str], fmt: str) -> None:
    out = attnbench(blocked_env, "claims", str(FIXTURE_RUN), "--format", fmt)
    assert out.returncode == 0, out.stderr
    # The terminal table wraps prose cells; its verdict column does not.
    assert ("not measurable here" if fmt == "table" else "CPU run; cpu_util_pct shown instead") in out.stdout
    assert attnbench(blocked_env, "claims", "--help").returncode == 0


# Issue 5: the new report formats and plots are torch-free too (layer 4).


@pytest.mark.parametrize(
    ("fmt", "expect"),
    [("html", "<!DOCTYPE html>"), ("gab", '"unit": "ms"'), ("bmf", '"latency"'), ("samples", '"seconds"')],
)
@pytest.mark.slow
def test_new_report_formats_without_torch(blocked_env: dict[str, str], fmt: str, expect: str) -> None:
    out = attnbench(blocked_env, "report", str(FIXTURE_RUN), "--format", fmt, "-o", "-")
    assert out.returncode == 0, out.stderr
    assert "sdpa-flash" in out.stdout and expect in out.stdout


@pytest.mark.slow
def test_report_plots_without_torch(blocked_env: dict[str, str], tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = attnbench(blocked_env, "report", str(FIXTURE_RUN), "--plots-dir", str(tmp_path), "-f", "csv", "-o", "-")
    assert out.returncode == 0, out.stderr
    assert len(list(tmp_path.glob("*.png"))) == 8


def test_report_html_without_torch_or_matplotlib(blocked_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is blocked for this test')\n")
    env = {**blocked_env, "PYTHONPATH": os.pathsep.join([str(tmp_path), blocked_env["PYTHONPATH"]])}
    out = attnbench(env, "report", str(FIXTURE_RUN), "--format", "html", "--plots", "-o", "-")
    assert out.returncode == 0, out.stderr
    assert out.stderr.strip().splitlines() == [
        "note: plots skipped: matplotlib is not installed (pip install matplotlib)"
    ]
    assert "<img" not in out.stdout and "matplotlib is not installed" in out.stdout


COMPARE = ROOT / "tests" / "data" / "compare"


@pytest.mark.parametrize("fmt", ["md", "json", "table"])
@pytest.mark.slow
def test_compare_without_torch(blocked_env: dict[str, str], fmt: str) -> None:
    out = attnbench(blocked_env, "compare", str(COMPARE / "base"), str(COMPARE / "current"), "--format", fmt)
    assert out.returncode == 1, out.stderr  # the fixture holds two regressions
    assert "regress" in out.stdout and "Traceback" not in out.stderr


@pytest.mark.slow
def test_compare_exit_codes_without_torch(blocked_env: dict[str, str], tmp_path: Path) -> None:
    import json

    base = str(COMPARE / "base")
    assert attnbench(blocked_env, "compare", base, base).returncode == 0
    assert attnbench(blocked_env, "compare", str(tmp_path / "none"), base).returncode == 4
    assert attnbench(blocked_env, "compare", base, base, "--fail-on", "mean:5%").returncode == 2
    assert attnbench(blocked_env, "compare", "--help").returncode == 0
    other = tmp_path / "other"
    shutil.copytree(COMPARE / "base", other)
    run = json.loads((other / "run.json").read_text())
    run["environment"]["torch"] = "2.14.0"
    (other / "run.json").write_text(json.dumps(run))
    refused = attnbench(blocked_env, "compare", base, str(other))
    assert refused.returncode == 3 and "torch: '2.13.0+cpu' (base) vs '2.14.0' (current)" in refused.stderr


@pytest.mark.slow
def test_history_and_the_python_api_without_torch(blocked_env: dict[str, str], tmp_path: Path) -> None:
    out = attnbench(blocked_env, "history", str(FIXTURE_RUN), str(FIXTURE_RUN), "-f", "md")
    assert out.returncode == 0, out.stderr
    assert "# attnbench history" in out.stdout
    code = (
        "import attnbench as ab, sys\n"
        f"df = ab.frame({str(FIXTURE_RUN)!r})\n"
        f"h = ab.history([{str(FIXTURE_RUN)!r}])\n"
        "assert 'torch' not in sys.modules or sys.modules['torch'] is None\n"
        "print(len(df), len(h.cases))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=blocked_env, cwd=tmp_path, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["21", "21"]


@pytest.mark.slow
def test_merge_without_torch(blocked_env: dict[str, str], tmp_path: Path) -> None:
    out = attnbench(blocked_env, "merge", str(FIXTURE_RUN), "-o", str(tmp_path / "merged"))
    assert out.returncode == 0, out.stderr
    assert "merged 1 run(s)" in out.stdout and (tmp_path / "merged" / "summary.md").exists()


@pytest.mark.slow
def test_publish_without_torch(blocked_env: dict[str, str], tmp_path: Path) -> None:
    out = attnbench(blocked_env, "publish", str(ROOT / "results" / "history-example-cpu" / "runs"), "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "12 runs (12 new)" in out.stdout and (tmp_path / "index.html").exists()
    assert (tmp_path / "assets" / "plotly.min.js").stat().st_size > 1_000_000
