"""scripts/: the GPU check fits its budget and runs end to end on CPU shapes, its wheels are only what the GPU
machine lacks, and the telemetry-overhead script survives a device it cannot run on."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.support import ROOT, mentions

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
# The shared folder beside the checkout (../shared), or beside the worktrees' parent (../../shared).
_SHARED = [ROOT.parent / "shared" / "wheels-py312", ROOT.parent.parent / "shared" / "wheels-py312"]
WHEELS = next((p for p in _SHARED if p.is_dir()), _SHARED[0])
# What comes back from the device tool's $OUT: at most 8 files of at most 16 MiB, no more than 2 folders down,
# named in letters, digits, '.', '_' and '-'.
MAX_FILES, MAX_BYTES, MAX_DEPTH = 8, 16 * 2**20, 2
NAME = re.compile(r"[A-Za-z0-9._-]+")


def test_the_plan_runs_every_step_under_a_timeout_within_six_minutes() -> None:
    plan = subprocess.run(["bash", str(SCRIPT), "--plan"], capture_output=True, text=True, check=True).stdout
    steps = re.findall(r"^\| ([a-z-]+) \| (\d+) \|$", plan, re.MULTILINE)
    total = int(re.search(r"\| total, with (\d+) s kill grace per step \| (\d+) \(limit 360\) \|", plan).group(2))  # type: ignore[union-attr]
    grace = int(re.search(r"with (\d+) s kill grace", plan).group(1))  # type: ignore[union-attr]
    assert total == sum(int(b) + grace for _, b in steps) <= 360
    names = [name for name, _ in steps]
    # The article's claims (presets included) run first after setting up and calibrating (so the claims sweep's rows
    # are held to this device's ceilings), and each sweep is packed right after it.
    assert names[:6] == ["setup", "env", "calibrate", "claims-sweep", "claims-pack", "claims-report"]
    assert names[names.index("flash-sweep") + 1] == "flash-pack"
    budgets = dict((name, int(b)) for name, b in steps)
    assert budgets["setup"] >= 30  # an offline wheel install, and pydantic's import: nothing more
    text = SCRIPT.read_text()
    setup = text[text.index("setup() {") : text.index("environment() {")]
    assert "import torch" not in setup and "import pydantic" in setup  # torch's cold import is env's
    assert "--set 'order=[decode,presets]'" in text  # claim 1's decode rows and claim 3 first
    assert "models=[mamba2," in text  # Mamba-2 runs in a sweep of the check, bf16 forward at n = 2048 on the GPU
    assert '--junitxml="$OUT/gpu-tests.xml"' in text and "ATTNBENCH_TEST_TIMEOUT_S=" in text
    assert 'timeout -k "$KILL_GRACE_S" "$budget" "$@"' in text  # the one place a step runs
    for name in names:
        assert re.search(rf"run_step {name} ", text), name  # every step goes through run_step


@pytest.mark.slow
def test_cpu_mode_runs_every_step_from_a_fresh_checkout(tmp_path: Path) -> None:
    """What CI can check of the GPU check: every step on tiny CPU shapes, from the files a clone has (no .whl, no
    build, no installed attnbench), with the Python of this venv; what comes back fits the device tool's limits."""
    checkout = tmp_path / "checkout"
    files = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=ROOT, capture_output=True, text=True
    ).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (checkout / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, checkout / name)
    out = tmp_path / "out"
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "LANG": "C.UTF-8",
        "PYTHON": sys.executable,
        "OUT": str(out),
        "TMPDIR": str(tmp_path),
        "ATTNBENCH_PLOTS": "0",  # as everywhere in the suite (conftest.py): the plots' own tests draw them
    }
    run = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--cpu"], cwd=checkout, env=env, capture_output=True, text=True, timeout=1200
    )
    log = (out / "gpu-check.log").read_text() if (out / "gpu-check.log").exists() else run.stdout + run.stderr
    assert run.returncode == 0, log[-6000:]

    found = [p for p in out.rglob("*") if p.is_file()]
    assert len(found) <= MAX_FILES, found
    for path in found:
        assert path.stat().st_size <= MAX_BYTES, path
        assert len(path.relative_to(out).parts) - 1 <= MAX_DEPTH, path
        assert NAME.fullmatch(path.name), path
    names = {p.name for p in found}
    assert {"gpu-check.log", "summary.md", "claims-run.tgz", "claims.md", "flash-run.tgz", "selfcheck.md"} <= names
    assert "gpu-tests.xml" in names  # one result per GPU test, even when the step is cut short
    assert re.search(r"^reached (\d+) of \1 cases", log, re.MULTILINE), "the claims sweep says how far it got"
    assert "telemetry-overhead.md" in names

    summary = (out / "summary.md").read_text()
    steps = re.findall(r"^\| ([a-z-]+) \| (.+?) \| \d+ \| \d+ \|$", summary, re.MULTILINE)
    assert len(steps) == 12 and all(verdict == "ok" for _, verdict in steps), summary  # 11 steps and "all"
    assert "- claims: " in summary and "- gpu tests: " in summary
    for tarball, config in (("claims-run.tgz", "claims-cpu"), ("flash-run.tgz", "gpu-seq-sweep")):
        with tarfile.open(out / tarball) as archive:
            members = archive.getnames()
        (folder,) = {m.split("/")[0] for m in members}
        assert folder.endswith(f"-{config}-cpu"), folder
        assert {f"{folder}/run.json", f"{folder}/results.jsonl", f"{folder}/summary.csv"} <= set(members)
        if tarball == "flash-run.tgz":
            with tarfile.open(out / tarball) as archive:
                rows = archive.extractfile(f"{folder}/results.jsonl")
                assert rows is not None
                stored = [json.loads(line) for line in rows.read().decode().splitlines() if line.strip()]
            # Mamba-2 ran (on a loaded CPU a tiny budget may call it too slow, as any model: ran, not failed)
            assert {r["status"] for r in stored if r["case"]["model"] == "mamba2"} <= {"ok", "too_slow_for_budget"}
            assert any(r["case"]["model"] == "mamba2" for r in stored)
    assert "bert-base" in (out / "claims.md").read_text()  # the presets ran with the claims
    assert not list(Path(tmp_path).glob("gpu-check.*")), "the work folder is removed"


def test_prepare_gpu_wheels_carries_pydantic_and_its_needs_only(tmp_path: Path) -> None:
    if not list(WHEELS.glob("pydantic-*.whl")):
        pytest.skip(f"no pydantic wheels in {WHEELS}")
    source = tmp_path / "wheels"
    shutil.copytree(WHEELS, source)
    for name, version in (("tabulate", "0.10.0"), ("hypothesis", "6.170.17")):  # the image has these already
        with zipfile.ZipFile(source / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
            wheel.writestr(f"{name}-{version}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\n")
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    shutil.copy2(ROOT / "scripts" / "prepare_gpu_wheels.sh", checkout / "scripts")
    (checkout / ".whl").mkdir()
    (checkout / ".whl" / "sortedcontainers-2.4.0-py3-none-any.whl").write_text("stale")  # a leftover is removed
    env = {**os.environ, "PYTHON": sys.executable, "PIP_NO_INDEX": "1"}
    run = subprocess.run(
        ["bash", "scripts/prepare_gpu_wheels.sh", str(source)], cwd=checkout, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    carried = sorted(p.name.split("-")[0] for p in (checkout / ".whl").glob("*.whl"))
    assert carried == ["annotated_types", "pydantic", "pydantic_core", "typing_extensions", "typing_inspection"]
    assert mentions(run.stdout.splitlines(), "hypothesis, tabulate")  # what was left behind, named


@pytest.mark.slow
def test_telemetry_overhead_on_a_device_that_cannot_run_its_cases_reports_them_skipped() -> None:
    """Its GPU cases are half precision (FlashAttention has no float32 CUDA kernel); a row that is not ok is
    reported and left out, where an assert used to end the GPU check. Here no CUDA: every case is skipped."""
    spec = importlib.util.spec_from_file_location("telemetry_overhead", ROOT / "scripts" / "telemetry_overhead.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert {case.dtype for case in module.CUDA_CASES} == {"bfloat16"}
    run = subprocess.run(
        [sys.executable, "scripts/telemetry_overhead.py", "--device", "cuda", "--rounds", "1", "--quick"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("skipped:") == len(module.CUDA_CASES) and "CUDA" in run.stdout  # each case, and why


@pytest.mark.slow
def test_a_test_past_its_time_fails_alone_and_compile_heavy_tests_run_last_under_their_own_limit(
    tmp_path: Path,
) -> None:
    """What the gpu-tests step relies on (tests/conftest.py): ATTNBENCH_TEST_TIMEOUT_S fails one slow test rather
    than the step's whole budget, and the compile-heavy tests (FlexAttention's, and those marked ``compiles``, such as
    reduce-overhead's decode on a cold inductor cache) come after every other one, under their own limit."""
    suite = tmp_path / "tests"
    suite.mkdir()
    shutil.copy(ROOT / "tests" / "conftest.py", suite / "conftest.py")
    (suite / "test_sample.py").write_text(
        "import time\n\nimport pytest\n\n"
        "@pytest.mark.compiles(limit_s=30)\n"
        "def test_compiles_first_in_the_file():\n    time.sleep(2)\n\n"
        "def test_flex_first_in_the_file():\n    pass\n\n"
        "def test_sleeps():\n    time.sleep(5)\n\n"
        "def test_quick():\n    pass\n"
    )
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(suite)],
        env={**os.environ, "ATTNBENCH_TEST_TIMEOUT_S": "1"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    order = re.findall(r"::(\w+) (PASSED|FAILED)", run.stdout)  # -v: one line per test, as they run
    assert order == [
        ("test_sleeps", "FAILED"),
        ("test_quick", "PASSED"),
        ("test_compiles_first_in_the_file", "PASSED"),  # 2 s: past the suite's 1 s, inside its own 30 s
        ("test_flex_first_in_the_file", "PASSED"),
    ]
    assert "ATTNBENCH_TEST_TIMEOUT_S" in run.stdout  # the limit it ran past, named
