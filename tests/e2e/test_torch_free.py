"""report, validate and --help must work where torch and pynvml cannot be imported (ARCHITECTURE.md §2)."""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import FIXTURE, ROOT, mentions

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


# One Python where torch and pynvml cannot be imported, which has loaded the command line and what the report
# commands load (typer, rich, pandas, matplotlib's Agg figures) and forks a child per command line: the child runs
# the console entry point as `python -m attnbench` would, its stdout and stderr into files, and exits with the code
# the shell would see. Each command is its own process still, with torch as unimportable as in the server, without
# paying Python's start and those imports ~30 times over (~12 s of a test worker).
_SERVER = """
import importlib, json, os, sys, traceback
for name in ("attnbench.cli", "attnbench.report.plots", "attnbench.report.html", "matplotlib.figure",
             "matplotlib.backends.backend_agg", "typer._adapters"):
    importlib.import_module(name)
from attnbench.__main__ import main

for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
        sys.argv = ["attnbench", *request["args"]]
        code = 0
        try:
            main()
        except SystemExit as exc:
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
            code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), pid, flush=True)
"""


class Commands:
    """``python -m attnbench ARGS`` in the blocked environment, through the fork server above."""

    def __init__(self, env: dict[str, str], scratch: Path) -> None:
        self.scratch, self.count, self.pids = scratch, 0, list[int]()
        self.server = subprocess.Popen(
            [sys.executable, "-c", _SERVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env, cwd=ROOT
        )

    def __call__(self, *args: str) -> subprocess.CompletedProcess[str]:
        assert self.server.stdin is not None and self.server.stdout is not None
        self.count += 1
        out, err = self.scratch / f"{self.count}.out", self.scratch / f"{self.count}.err"
        request = {"args": list(args), "stdout": str(out), "stderr": str(err)}
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        # A command that hangs fails its test after a minute, as subprocess.run's timeout did.
        ready, _, _ = select.select([self.server.stdout], [], [], 60)
        assert ready, f"attnbench {' '.join(args)} did not finish within 60 s"
        reply = self.server.stdout.readline().split()
        assert reply, f"the fork server died (exit {self.server.wait(10)})"
        self.pids.append(int(reply[1]))
        return subprocess.CompletedProcess(
            ["attnbench", *args], int(reply[0]), out.read_text(encoding="utf-8"), err.read_text(encoding="utf-8")
        )

    def close(self) -> None:
        assert self.server.stdin is not None
        self.server.stdin.close()
        self.server.wait(30)


@pytest.fixture(scope="module")
def attnbench(blocked_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Commands]:
    commands = Commands(blocked_env, tmp_path_factory.mktemp("commands"))
    yield commands
    commands.close()


def run_alone(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """A command line in a Python of its own, for an environment other than the server's."""
    return subprocess.run(
        [sys.executable, "-m", "attnbench", *args], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60
    )


def test_the_server_runs_each_command_in_a_process_of_its_own(attnbench: Commands) -> None:
    """What the fork server stands in for: a new process per command line, its stdout, stderr and exit code."""
    first, second = attnbench("--version"), attnbench("--version")
    assert first.returncode == 0 and first.stdout == second.stdout and first.stdout.startswith("attnbench ")
    bad = attnbench("report", "tests")
    assert bad.returncode == 2 and bad.stderr.startswith("error:") and not bad.stdout
    assert len(set(attnbench.pids[-3:])) == 3 and attnbench.server.pid not in attnbench.pids


def test_blocker_really_blocks(blocked_env: dict[str, str]) -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import torch"], capture_output=True, text=True, env=blocked_env, check=False
    )
    assert out.returncode != 0 and "blocked" in out.stderr


@pytest.mark.parametrize("fmt", ["md", "csv", "json", "table"])
def test_report_without_torch(attnbench: Commands, fmt: str) -> None:
    out = attnbench("report", str(FIXTURE_RUN), "--format", fmt)
    assert out.returncode == 0, out.stderr
    assert "sdpa-flash" in out.stdout


def test_validate_and_help_without_torch(attnbench: Commands) -> None:
    out = attnbench("validate", "configs/default.yaml")
    assert out.returncode == 0, out.stderr
    assert attnbench("--help").returncode == 0
    assert attnbench("report", "--help").returncode == 0


def test_sweep_dry_run_without_torch(attnbench: Commands) -> None:
    """Issue 18: a dry run lists the cases and budgets the time without importing torch (seconds saved), telling
    "auto" from the files torch and the driver leave."""
    out = attnbench("sweep", "--dry-run")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    # One line per case (its key), the count and the device "auto" resolved to (here, where torch cannot import),
    # and the budget: 36 cases × timing.max_case_s 2.5 s = 1 min 30 s.
    assert len([line for line in lines if line.startswith("model=")]) == 36 and mentions(lines, "cpu", values=(36,))
    assert any(line.startswith("device:") and mentions(line, "auto", "cpu") for line in lines)
    assert mentions(lines, "timing.max_case_s", "1 min 30 s", values=(36, 2.5))
    gpu = attnbench("sweep", "configs/default-cuda.yaml", "--device", "cuda", "--dry-run")
    assert gpu.returncode == 0, gpu.stderr
    assert mentions(gpu.stdout.splitlines(), "cuda:0", values=(96,))
    assert gpu.stderr.startswith("warning:") and "'cuda'" in gpu.stderr and "Traceback" not in gpu.stderr
    assert attnbench("sweep", "--help").returncode == 0


def test_schema_without_torch(attnbench: Commands, tmp_path: Path) -> None:
    out = attnbench("schema")
    assert out.returncode == 0, out.stderr
    assert (ROOT / "configs" / "attnbench.schema.json").read_text(encoding="utf-8") == out.stdout
    target = tmp_path / "schema.json"
    assert attnbench("schema", "-o", str(target)).returncode == 0
    assert target.read_text(encoding="utf-8") == out.stdout


def test_bad_report_input_without_torch_is_a_clean_error(attnbench: Commands) -> None:
    out = attnbench("report", "tests")
    assert out.returncode == 2
    assert "error:" in out.stderr and "Traceback" not in out.stderr


def test_report_telemetry_without_torch_or_pynvml(attnbench: Commands) -> None:
    out = attnbench("report", str(FIXTURE_RUN), "--telemetry")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Telemetry per case")
    md = attnbench("report", str(FIXTURE_RUN), "--telemetry", "-f", "md")
    assert md.returncode == 0, md.stderr
    assert "# Telemetry per case" in md.stdout


@pytest.mark.parametrize("fmt", ["table", "md", "json"])
def test_claims_without_torch_or_pynvml(attnbench: Commands, fmt: str) -> None:
    out = attnbench("claims", str(FIXTURE_RUN), "--format", fmt)
    assert out.returncode == 0, out.stderr
    # The terminal table wraps prose cells; its verdict column does not.
    assert ("not measurable here" if fmt == "table" else "CPU run; cpu_util_pct shown instead") in out.stdout
    assert attnbench("claims", "--help").returncode == 0


# Issue 5: the new report formats and plots are torch-free too (layer 4).


@pytest.mark.parametrize(
    ("fmt", "expect"),
    [("html", "<!DOCTYPE html>"), ("gab", '"unit": "ms"'), ("bmf", '"latency"'), ("samples", '"seconds"')],
)
@pytest.mark.slow
def test_new_report_formats_without_torch(attnbench: Commands, fmt: str, expect: str) -> None:
    out = attnbench("report", str(FIXTURE_RUN), "--format", fmt, "-o", "-")
    assert out.returncode == 0, out.stderr
    assert "sdpa-flash" in out.stdout and expect in out.stdout


@pytest.mark.slow
def test_report_plots_without_torch(attnbench: Commands, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = attnbench("report", str(FIXTURE_RUN), "--plots-dir", str(tmp_path), "-f", "csv", "-o", "-")
    assert out.returncode == 0, out.stderr
    assert len(list(tmp_path.glob("*.png"))) == 8


def test_report_html_without_torch_or_matplotlib(blocked_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "matplotlib").mkdir()
    (tmp_path / "matplotlib" / "__init__.py").write_text("raise ImportError('matplotlib is blocked for this test')\n")
    env = {**blocked_env, "PYTHONPATH": os.pathsep.join([str(tmp_path), blocked_env["PYTHONPATH"]])}
    out = run_alone(env, "report", str(FIXTURE_RUN), "--format", "html", "--plots", "-o", "-")
    assert out.returncode == 0, out.stderr
    (note,) = out.stderr.strip().splitlines()  # one note, with the command that installs what is missing
    assert note.startswith("note:") and "pip install matplotlib" in note
    assert "<img" not in out.stdout and "matplotlib" in out.stdout  # the page says why it has no plots


COMPARE = ROOT / "tests" / "data" / "compare"


@pytest.mark.parametrize("fmt", ["md", "json", "table"])
def test_compare_without_torch(attnbench: Commands, fmt: str) -> None:
    out = attnbench("compare", str(COMPARE / "base"), str(COMPARE / "current"), "--format", fmt)
    assert out.returncode == 1, out.stderr  # the fixture holds two regressions
    assert "regress" in out.stdout and "Traceback" not in out.stderr


def test_compare_exit_codes_without_torch(attnbench: Commands, tmp_path: Path) -> None:
    base = str(COMPARE / "base")
    assert attnbench("compare", base, base).returncode == 0
    assert attnbench("compare", str(tmp_path / "none"), base).returncode == 4
    assert attnbench("compare", base, base, "--fail-on", "mean:5%").returncode == 2
    assert attnbench("compare", "--help").returncode == 0
    other = tmp_path / "other"
    shutil.copytree(COMPARE / "base", other)
    run = json.loads((other / "run.json").read_text())
    run["environment"]["torch"] = "2.14.0"
    (other / "run.json").write_text(json.dumps(run))
    refused = attnbench("compare", base, str(other))
    assert refused.returncode == 3 and mentions(refused.stderr, "torch", "'2.13.0+cpu'", "'2.14.0'")


def test_history_and_the_python_api_without_torch(
    attnbench: Commands, blocked_env: dict[str, str], tmp_path: Path
) -> None:
    out = attnbench("history", str(FIXTURE_RUN), str(FIXTURE_RUN), "-f", "md")
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


def test_merge_without_torch(attnbench: Commands, tmp_path: Path) -> None:
    out = attnbench("merge", str(FIXTURE_RUN), "-o", str(tmp_path / "merged"))
    assert out.returncode == 0, out.stderr
    assert "merged 1 run(s)" in out.stdout and (tmp_path / "merged" / "summary.md").exists()


@pytest.mark.slow
def test_publish_without_torch(attnbench: Commands, tmp_path: Path) -> None:
    out = attnbench("publish", str(ROOT / "results" / "history-example-cpu" / "runs"), "-o", str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert "12 runs (12 new)" in out.stdout and (tmp_path / "index.html").exists()
    assert (tmp_path / "assets" / "plotly.min.js").stat().st_size > 1_000_000
