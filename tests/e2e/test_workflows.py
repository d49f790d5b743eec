"""The GitHub workflows: they parse, they run README's commands, every attnbench flag they pass exists, and their
shell steps do what their comments say (run here with a stand-in for the GPU sweep)."""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.core
import typer.main
import yaml

from attnbench.cli import app
from tests.support import ROOT, numbers

WORKFLOWS = ROOT / ".github" / "workflows"
COMPARE_DATA = ROOT / "tests" / "data" / "compare"
WORKFLOW_FILES = ("tests.yml", "gpu-benchmark.yml", "gpu-history.yml")


def workflow(name: str) -> dict[str, Any]:
    data = yaml.safe_load((WORKFLOWS / name).read_text())
    # YAML 1.1 reads the bare key `on` as the boolean true.
    data["on"] = data.pop(True)
    return data


def steps(name: str) -> list[dict[str, Any]]:
    return [step for job in workflow(name)["jobs"].values() for step in job["steps"]]


def step(name: str, title: str) -> dict[str, Any]:
    (found,) = [s for s in steps(name) if s.get("name") == title]
    return found


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]


def test_workflows_parse_and_every_step_runs_or_uses() -> None:
    for name in WORKFLOW_FILES:
        data = workflow(name)
        assert data["jobs"] and data["on"]
        for s in steps(name):
            assert ("run" in s) != ("uses" in s), s
    assert set(workflow("tests.yml")["on"]) >= {"push", "pull_request"}
    assert set(workflow("gpu-benchmark.yml")["on"]) == {"pull_request", "workflow_dispatch"}
    assert set(workflow("gpu-history.yml")["on"]) == {"push", "workflow_dispatch"}


def test_cpu_workflow_runs_the_readme_test_command() -> None:
    (command,) = [line for line in readme_commands() if "pytest" in line]
    assert any(s.get("run", "").strip() == command for s in steps("tests.yml")), command


def test_gpu_workflow_installs_as_the_readme_says() -> None:
    (install,) = [line for line in readme_commands() if re.search(r"pip install \.( |$)", line)]
    assert "python3 -m venv" in install
    script = step("gpu-benchmark.yml", "Install both, as README says (pip install .)")["run"]
    for side in ("head", "base"):
        assert re.search(rf'python3 -m venv "\$WORK/venv-{side}" && "\$WORK/venv-{side}/bin/pip" install', script)


def test_runner_labels_are_configurable_with_a_self_hosted_gpu_default() -> None:
    (job,) = workflow("gpu-benchmark.yml")["jobs"].values()
    runs_on = job["runs-on"]
    assert "inputs.runner_labels" in runs_on and "vars.ATTNBENCH_RUNNER_LABELS" in runs_on
    assert """'["self-hosted", "gpu"]'""" in runs_on
    assert "runner_labels" in workflow("gpu-benchmark.yml")["on"]["workflow_dispatch"]["inputs"]
    # Self-hosted runners run the PR's code: never for a fork's pull request.
    assert "github.event.pull_request.head.repo.full_name == github.repository" in job["if"]


def invocations(script: str) -> list[tuple[str, set[str]]]:
    """(command, its --flags) for every `attnbench COMMAND` in a shell script, flags from bash arrays included."""
    script = script.replace("\\\n", " ")
    arrays: dict[str, set[str]] = {}
    for name, body in re.findall(r"(\w+)\+?=\(([^)]*)\)", script):
        arrays.setdefault(name, set()).update(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", body))
    found = []
    for line in script.splitlines():
        for match in re.finditer(r"attnbench\"?\s+([a-z][\w-]*)(.*)", line):
            command, rest = match.groups()
            flags = set(re.findall(r"(?<![\w$-])(--?[a-z][\w-]*)", rest))
            for name in re.findall(r"\$\{(\w+)\[@\]\}", rest):
                flags |= arrays[name]
            found.append((command, flags))
    return found


def test_every_attnbench_flag_the_workflows_pass_exists() -> None:
    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    seen: set[str] = set()
    for name in WORKFLOW_FILES:
        for s in steps(name):
            for command, flags in invocations(s.get("run", "")):
                assert command in group.commands, f"{name}: attnbench {command} does not exist"
                known = {opt for p in group.commands[command].params for opt in (*p.opts, *p.secondary_opts)}
                assert flags <= known, f"{name}: attnbench {command} has no {sorted(flags - known)}"
                seen.add(command)
    assert seen == {"env", "sweep", "compare", "history", "publish"}


def shell(script: str, values: dict[str, str]) -> str:
    """A run step's script with its ${{ }} expressions replaced; an expression not in ``values`` fails the test."""

    def sub(match: re.Match[str]) -> str:
        expression = match.group(1).strip()
        assert expression in values, f"no test value for ${{{{ {expression} }}}}"
        return values[expression]

    return re.sub(r"\$\{\{(.*?)\}\}", sub, script)


EXPRESSIONS = {
    "steps.add.outputs.history": "unused: the test sets HISTORY",
    "steps.base.outputs.sha": "0123abcd",
    "github.event.pull_request.head.sha || github.sha": "4567ef01",
    "runner.temp": "/tmp",
}


def test_run_steps_are_valid_bash() -> None:
    for name in WORKFLOW_FILES:
        for s in steps(name):
            if "run" in s:
                out = subprocess.run(["bash", "-n", "-c", shell(s["run"], EXPRESSIONS)], capture_output=True, text=True)
                assert out.returncode == 0, f"{name}, step {s.get('name')}: {out.stderr}"


@pytest.mark.parametrize(
    ("rc", "refusal_fails", "exit_code"),
    [("0", "false", 0), ("1", "false", 1), ("2", "false", 2), ("3", "false", 0), ("4", "false", 0), ("3", "true", 3)],
)
def test_gate_fails_on_regression_not_on_a_refusal(rc: str, refusal_fails: str, exit_code: int) -> None:
    script = step("gpu-benchmark.yml", "Gate")["run"]
    env = {**os.environ, "RC": rc, "FAIL_ON_REFUSAL": refusal_fails}
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env)
    assert out.returncode == exit_code, out.stdout + out.stderr


def stand_in(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def run_step(
    title: str, env: dict[str, str], cwd: Path, name: str = "gpu-benchmark.yml"
) -> subprocess.CompletedProcess[str]:
    script = shell(step(name, title)["run"], EXPRESSIONS)
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**os.environ, **env}, cwd=cwd)


@pytest.mark.parametrize(
    ("kind", "order"),
    [("commit", ["base", "head", "head", "base", "base", "head"]), ("stored", ["head", "head", "head"])],
)
def test_sweeps_alternate_base_and_head(tmp_path: Path, kind: str, order: list[str]) -> None:
    log = tmp_path / "order.log"
    for side in ("base", "head"):
        stand_in(tmp_path / f"venv-{side}" / "bin" / "attnbench", f'echo {side} "$@" >> {log}\nexit 1\n')
    env = {"WORK": str(tmp_path), "ROUNDS": "3", "BASE_KIND": kind, "CONFIG": "c.yaml", "DEVICE": "cuda"}
    out = run_step("Sweep base and head in alternation", env, tmp_path)
    assert out.returncode == 0, out.stderr  # exit 1 (a case failed) is judged by compare, not fatal here
    lines = log.read_text().splitlines()
    assert [line.split()[0] for line in lines] == order
    assert lines[0].endswith(f"sweep head/c.yaml --device cuda --out {tmp_path}/{order[0]}-runs -q")


def test_a_sweep_that_cannot_run_stops_the_job(tmp_path: Path) -> None:
    for side in ("base", "head"):
        stand_in(tmp_path / f"venv-{side}" / "bin" / "attnbench", "exit 2\n")
    env = {"WORK": str(tmp_path), "ROUNDS": "2", "BASE_KIND": "commit", "CONFIG": "c.yaml", "DEVICE": "cuda"}
    out = run_step("Sweep base and head in alternation", env, tmp_path)
    (annotation,) = [line for line in out.stdout.splitlines() if line.startswith("::error::")]
    assert out.returncode == 2 and "base" in annotation and numbers(annotation) == [2]  # which side, and its exit


def compare_env(tmp_path: Path, kind: str = "commit") -> dict[str, str]:
    stand_in(
        tmp_path / "venv-head" / "bin" / "attnbench",
        f'PYTHONPATH="{ROOT}" exec "{sys.executable}" -m attnbench "$@"\n',
    )
    (tmp_path / "summary.md").write_text("")
    (tmp_path / "output").write_text("")
    return {
        "WORK": str(tmp_path),
        "BASE_KIND": kind,
        "FAIL_ON": "median:5%",
        "THRESHOLDS": "",
        "NOISE_FLOOR": "",
        "BASELINE": "gpu",
        "ROUNDS": "1",
        "CONFIG": "configs/default-cuda.yaml",
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "GITHUB_OUTPUT": str(tmp_path / "output"),
    }


@pytest.mark.slow
def test_compare_step_writes_summary_comment_and_exit_code(tmp_path: Path) -> None:
    shutil.copytree(COMPARE_DATA / "base", tmp_path / "base-runs" / "run-1")
    shutil.copytree(COMPARE_DATA / "current", tmp_path / "head-runs" / "run-1")
    out = run_step("Compare", compare_env(tmp_path), tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "output").read_text() == "rc=1\n"
    summary = (tmp_path / "summary.md").read_text()
    heading = summary.splitlines()[0]
    assert heading.startswith("## ") and numbers(heading) == [1]  # 1 case regressed: the ok → oom
    assert "Base: commit" in summary and "1 run(s) per side" in summary
    assert (tmp_path / "comment.md").read_text() == summary
    assert json.loads((tmp_path / "compare.json").read_text())["schema"] == "attnbench.compare/1"


@pytest.mark.slow
def test_compare_step_without_a_baseline_says_so(tmp_path: Path) -> None:
    (tmp_path / "head-runs").mkdir()
    shutil.copytree(COMPARE_DATA / "current", tmp_path / "head-runs" / "run-1")
    (tmp_path / "head").mkdir()
    out = run_step("Compare", compare_env(tmp_path, kind="stored"), tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "output").read_text() == "rc=4\n"
    summary = (tmp_path / "summary.md").read_text()
    assert summary.startswith("## ") and "results/baselines/gpu" in summary and "Base: stored" in summary


def test_a_compare_that_crashes_is_not_called_a_regression(tmp_path: Path) -> None:
    env = compare_env(tmp_path)
    stand_in(tmp_path / "venv-head" / "bin" / "attnbench", 'echo "Traceback (most recent call last):" >&2\nexit 1\n')
    out = run_step("Compare", env, tmp_path)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "output").read_text() == "rc=70\n"
    heading = (tmp_path / "summary.md").read_text().splitlines()[0]
    assert heading.startswith("## ") and numbers(heading) == [70]  # failed, with its exit code: no verdict


@pytest.mark.slow
def test_history_keeps_the_newest_runs_and_reads_them(tmp_path: Path) -> None:
    from tests.support import synthetic_runs

    new = tmp_path / "new"
    (run,) = synthetic_runs(new, [1.0])
    home = tmp_path / "home"
    for i in range(5):  # older runs already in the history
        (home / "attnbench-history" / "default-cuda" / f"2026010{i}-000000-x-cuda").mkdir(parents=True)
    (tmp_path / "output").write_text("")
    env = {
        "WORK": str(tmp_path),
        "CONFIG": "configs/default-cuda.yaml",
        "HISTORY_DIR": "",
        "KEEP": "4",
        "HOME": str(home),
        "GITHUB_OUTPUT": str(tmp_path / "output"),
    }
    out = run_step("Add the run to the history", env, tmp_path, "gpu-history.yml")
    assert out.returncode == 0, out.stderr
    history = home / "attnbench-history" / "default-cuda"
    assert sorted(p.name for p in history.iterdir()) == [
        "20260102-000000-x-cuda",
        "20260103-000000-x-cuda",
        "20260104-000000-x-cuda",
        run.name,
    ]
    assert (tmp_path / "output").read_text() == f"history={history}\n"
    for empty in history.iterdir():
        if empty.name != run.name:
            empty.rmdir()
    synthetic_runs(history / "more", [1.0] * 5)
    for folder in (history / "more").iterdir():
        folder.rename(history / f"older-{folder.name}")
    (history / "more").rmdir()
    stand_in(
        tmp_path / "venv" / "bin" / "attnbench", f'PYTHONPATH="{ROOT}" exec "{sys.executable}" -m attnbench "$@"\n'
    )
    (tmp_path / "summary.md").write_text("")
    env = {"WORK": str(tmp_path), "HISTORY": str(history), "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md")}
    (tmp_path / "repo").mkdir()
    out = run_step("History", env, tmp_path, "gpu-history.yml")
    assert out.returncode == 0, out.stderr
    heading = (tmp_path / "summary.md").read_text().splitlines()[0]
    assert heading.startswith("# ") and "median" in heading  # the history report, of the median


@pytest.mark.slow
def test_compare_step_passes_every_gate_of_fail_on(tmp_path: Path) -> None:
    shutil.copytree(COMPARE_DATA / "base", tmp_path / "base-runs" / "run-1")
    shutil.copytree(COMPARE_DATA / "current", tmp_path / "head-runs" / "run-1")
    env = {**compare_env(tmp_path), "FAIL_ON": "median:5% peak_mem:10%"}
    out = run_step("Compare", env, tmp_path)
    assert out.returncode == 0, out.stderr
    policy = json.loads((tmp_path / "compare.json").read_text())["policy"]
    assert policy["thresholds_described"] == "5 %; peak_mem 10 %"


def _history_env(tmp_path: Path, history: Path) -> dict[str, str]:
    stand_in(
        tmp_path / "venv" / "bin" / "attnbench", f'PYTHONPATH="{ROOT}" exec "{sys.executable}" -m attnbench "$@"\n'
    )
    for name in ("summary.md", "output"):
        (tmp_path / name).write_text("")
    (tmp_path / "repo").mkdir(exist_ok=True)
    return {
        "WORK": str(tmp_path),
        "HISTORY": str(history),
        "HISTORY_DIR": str(tmp_path / "histories"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
        "GITHUB_OUTPUT": str(tmp_path / "output"),
        "GITHUB_REPOSITORY": "owner/attnbench",
        "GITHUB_SERVER_URL": "https://github.com",
    }


@pytest.mark.slow
def test_history_step_writes_the_alert_when_the_newest_run_confirms_a_step(tmp_path: Path) -> None:
    from attnbench.report.alerts_md import ALERT_MARKER
    from tests.support import synthetic_runs

    history = tmp_path / "histories" / "tiny"
    stepped = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"
    synthetic_runs(history, [1.0] * 6 + [1.3] * 2, only=stepped, sigma=0.01, case_sigma=0.005)
    env = _history_env(tmp_path, history)
    out = run_step("History", env, tmp_path, "gpu-history.yml")
    assert out.returncode == 0, out.stderr  # the job fails at its end, after the site is published
    alert = tmp_path / "alert.md"
    assert (tmp_path / "output").read_text() == f"alert={alert}\n"
    summary = (tmp_path / "summary.md").read_text()
    marker, heading, *rest = summary.splitlines()
    assert marker == ALERT_MARKER and heading.startswith("## ") and numbers(heading) == [1]  # a step in 1 case
    assert any(line.startswith("# ") and "median" in line for line in rest)  # then the history report
    script = step("gpu-history.yml", "Post the alert as an issue")["with"]["script"]
    assert f"const marker = '{ALERT_MARKER}';" in script and "attnbench-alert" in script
    gate = step("gpu-history.yml", "Fail on a new step")
    assert "steps.history.outputs.alert != ''" in gate["if"]


@pytest.mark.slow
def test_publish_step_keeps_one_site_beside_the_histories_and_adds_to_it(tmp_path: Path) -> None:
    from tests.support import synthetic_runs

    history = tmp_path / "histories" / "tiny"
    synthetic_runs(history, [1.0] * 4)
    env = _history_env(tmp_path, history)
    out = run_step("Publish the site", env, tmp_path, "gpu-history.yml")
    assert out.returncode == 0, out.stderr
    site = tmp_path / "histories" / "_site"
    assert (tmp_path / "output").read_text() == f"site={site}\n"
    assert "4 runs (4 new)" in out.stdout and (site / "index.html").exists()
    assert "https://github.com/owner/attnbench/commit/" not in (site / "runs.html").read_text()  # no commits here
    assert re.search(r"<title>[^<]* owner/attnbench</title>", (site / "index.html").read_text())  # the repository's

    again = run_step("Publish the site", env, tmp_path, "gpu-history.yml")
    assert again.returncode == 0 and "4 runs (0 new)" in again.stdout and "wrote 0 files" in again.stdout
    pages = workflow("gpu-history.yml")["jobs"]["pages"]
    assert pages["needs"] == "history" and "needs.history.outputs.site != ''" in pages["if"]
    assert "default_branch" in pages["if"] and pages["environment"]["name"] == "github-pages"
    assert [s["uses"] for s in pages["steps"]] == ["actions/deploy-pages@v4"]
