"""The commands end to end through typer's CliRunner, on real torch models at tiny sizes."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.report.rows import COLUMNS
from tests.support import BAD_CONFIGS, FIXTURE, QUICK_TIMING, mentions, numbers, tiny_config

runner = CliRunner()

TINY = tiny_config(
    models=["lstm", "gru", "vanilla", "sdpa-flash", "sdpa-efficient"],
    modes=["forward", "train"],
    grid={"batch": [2], "seq_len": [16, 32]},
    d_model=32,
    heads=4,
    # One thread, and a budget that a call slowed by the next test worker still fits min_samples into (converged
    # cases stop long before it). The sweep runs in this process: it must hand torch's thread count back.
    threads=1,
    timing={**QUICK_TIMING, "max_case_s": 1.0},
)


THREADS_AROUND_THE_SWEEP: list[int] = []  # torch's thread count before and after tiny_run's in-process sweep


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    import torch

    tmp = tmp_path_factory.mktemp("sweep")
    config = tmp / "tiny.yaml"
    config.write_text(TINY)
    THREADS_AROUND_THE_SWEEP.append(torch.get_num_threads())
    result = runner.invoke(app, ["sweep", str(config), "--out", str(tmp / "out")])
    THREADS_AROUND_THE_SWEEP.append(torch.get_num_threads())
    assert result.exit_code == 0, result.output
    (folder,) = (tmp / "out").iterdir()
    return folder, result.output


@pytest.mark.slow
def test_a_sweep_in_the_callers_process_hands_the_thread_count_back(tiny_run: tuple[Path, str]) -> None:
    folder, _ = tiny_run
    before, after = THREADS_AROUND_THE_SWEEP
    if before == 1:
        pytest.skip("torch already ran one thread here: the sweep's setting changes nothing to hand back")
    assert json.loads((folder / "run.json").read_text())["environment"]["torch_threads"] == 1  # it ran with 1
    assert after == before


def test_sweep_writes_the_four_files(tiny_run: tuple[Path, str]) -> None:
    folder, output = tiny_run
    assert {p.name for p in folder.iterdir()} >= {"run.json", "results.jsonl", "summary.csv", "summary.md"}
    assert folder.name.endswith("-tiny-cpu")
    run = json.loads((folder / "run.json").read_text())
    assert run["state"] == "complete"
    assert len(run["config_sha256"]) == 64
    assert run["environment"]["device"] == "cpu"
    assert f"wrote {folder / 'summary.csv'}" in output


def test_rows_and_statuses(tiny_run: tuple[Path, str]) -> None:
    folder, _ = tiny_run
    rows = list(csv.DictReader((folder / "summary.csv").open()))
    assert list(rows[0]) == list(COLUMNS)
    assert len(rows) == 5 * 2 * 2
    by_model: dict[str, set[str]] = {}
    for row in rows:
        by_model.setdefault(row["model"], set()).add(row["status"])
    assert by_model["sdpa-efficient"] == {"unsupported"}
    for model in ("lstm", "gru", "vanilla", "sdpa-flash"):
        # ok; on a machine busy enough that min_samples calls no longer fit the budget, too_slow_for_budget says so
        assert "ok" in by_model[model] and by_model[model] <= {"ok", "too_slow_for_budget"}, by_model
    ok = [r for r in rows if r["status"] == "ok"]
    assert all(float(r["median_ms"]) > 0 and float(r["tokens_per_s"]) > 0 for r in ok)
    for r in ok:
        # Fewer than 6 samples admit no distribution-free 95 % interval: the CSV leaves it empty, never inf.
        if int(r["samples"]) >= 6:
            assert float(r["ci95_low_ms"]) <= float(r["median_ms"]) <= float(r["ci95_high_ms"])
        else:
            assert r["ci95_low_ms"] == r["ci95_high_ms"] == ""
    unsupported = next(r for r in rows if r["status"] == "unsupported")
    assert "CUDA" in unsupported["reason"]


def test_lines_per_case_and_final_table(tiny_run: tuple[Path, str]) -> None:
    _, output = tiny_run
    assert mentions(output.splitlines(), "[1/20]", "lstm forward float32 b=2 n=16 d=32")  # the count, and the case
    assert "[20/20]" in output
    assert "| vanilla" in output  # non-TTY output ends with the markdown comparison tables


def test_report_formats_read_the_stored_run(tiny_run: tuple[Path, str], tmp_path: Path) -> None:
    folder, _ = tiny_run
    md = runner.invoke(app, ["report", str(folder), "--format", "md", "-o", "-"])
    assert md.exit_code == 0
    assert md.output == (folder / "summary.md").read_text()
    csv_out = runner.invoke(app, ["report", str(folder), "--format", "csv"])
    assert csv_out.output == (folder / "summary.csv").read_text()
    js = runner.invoke(app, ["report", str(folder), "--format", "json", "-o", str(tmp_path / "r.json")])
    assert js.exit_code == 0
    assert len(json.loads((tmp_path / "r.json").read_text())["rows"]) == 20
    table = runner.invoke(app, ["report", str(folder)])
    assert table.exit_code == 0 and "sdpa-flash" in table.output


def test_report_baseline_changes_speedups(tiny_run: tuple[Path, str]) -> None:
    folder, _ = tiny_run
    out = runner.invoke(app, ["report", str(folder), "--format", "md", "--baseline", "vanilla"])
    assert out.exit_code == 0 and "against `vanilla`" in out.output


def test_dry_run_lists_cases_without_measuring(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    out = runner.invoke(app, ["sweep", str(config), "--dry-run", "--set", "grid.seq_len=[8]"])
    assert out.exit_code == 0
    assert "10 cases on cpu (dry run" in out.output
    # A budget, not a promise: 10 cases of TINY's 1.0 s.
    assert mentions(out.output.splitlines(), "timing.max_case_s", "10 s", values=(10, 1))  # 10 cases × 1 s
    assert not (tmp_path / "results").exists()


def test_validate(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    out = runner.invoke(app, ["validate", str(config)])
    assert out.exit_code == 0 and "20 cases" in out.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["validate", "does-not-exist.yaml"], "does-not-exist.yaml"),
        (["report", "no/such/run"], "no such run folder"),
        (["report", str(FIXTURE), "--baseline", "lsmt"], "no model 'lsmt' in this run"),
        (["sweep", "--device", "tpu", "--dry-run"], "not a device"),
        (["models", "--dtype", "float8"], "unknown dtype"),
    ],
)
def test_bad_input_is_one_error_line_and_exit_2(args: list[str], message: str) -> None:
    out = runner.invoke(app, args)
    assert out.exit_code == 2, out.output
    assert "Traceback" not in out.output
    assert "error:" in out.output
    assert message in out.output


def test_unknown_model_in_config_lists_valid_names(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text(TINY.replace("sdpa-efficient", "sdpa-flsh"))
    out = runner.invoke(app, ["sweep", str(config)])
    assert out.exit_code == 2
    assert "sdpa-flsh" in out.output and "sdpa-flash" in out.output and "hint:" in out.output
    assert "Traceback" not in out.output


def test_models_lists_every_model_with_availability() -> None:
    out = runner.invoke(app, ["models", "--device", "cpu"], env={"COLUMNS": "140"})
    assert out.exit_code == 0
    for name in ("lstm", "gru", "vanilla", "sdpa-flash", "sdpa-efficient", "flash-attn", "flex", "linear-attn"):
        assert name in out.output
    assert "unavailable" in out.output and "available" in out.output


def test_models_is_one_line_a_model_and_models_name_shows_its_options() -> None:
    """264 lines at 140 columns (issue 51): one line a model, each model's options on `models NAME`."""
    from attnbench.families.catalogue import MODELS, PUBLISHED

    out = runner.invoke(app, ["models", "--device", "cpu"], env={"COLUMNS": "140"})
    assert out.exit_code == 0
    lines = out.output.splitlines()
    # two tables (models, published presets), each a title, rules and a header; the notes under them
    assert len(lines) <= len(MODELS) + len(PUBLISHED) + 14
    assert all(sum(line.startswith(f"│ {name} ") for line in lines) == 1 for name in [*MODELS, *PUBLISHED])
    preset = runner.invoke(app, ["models", "llama3.1-8b", "--device", "cpu"], env={"COLUMNS": "140"})
    assert preset.exit_code == 0 and "41,943,040" in preset.output  # q, k, v, o of one layer, cited in full
    one = runner.invoke(app, ["models", "sdpa-flash", "--device", "cpu"], env={"COLUMNS": "140"})
    assert one.exit_code == 0, one.output
    for option in ("heads_kv", "window", "compile", "scope"):  # every option, with its default and values
        assert option in one.output
    assert "flash" in one.output and "lstm" not in one.output
    data = json.loads(runner.invoke(app, ["models", "mamba2", "-f", "json", "--device", "cpu"]).stdout)
    assert [m["name"] for m in data["models"]] == ["mamba2"] and {"form", "chunk"} <= set(data["models"][0]["options"])
    wrong = runner.invoke(app, ["models", "lsmt", "--device", "cpu"])
    assert wrong.exit_code == 2 and "lstm" in wrong.output and "Traceback" not in wrong.output


def test_env_prints_the_environment() -> None:
    out = runner.invoke(app, ["env", "--device", "cpu"])
    assert out.exit_code == 0
    assert "torch_threads" in out.output and "fingerprint" in out.output


@pytest.mark.slow
def test_an_error_case_makes_sweep_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attnbench.timing.torch_executor as executor

    def broken(*args: object, **kwargs: object) -> object:
        raise ValueError("a bug in a model")

    monkeypatch.setattr(executor, "build_model", broken)
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    out = runner.invoke(
        app,
        [
            "sweep",
            str(config),
            "--out",
            str(tmp_path),
            "--set",
            "models=[lstm]",
            "--set",
            "modes=[forward]",
            "--set",
            "grid.seq_len=[8]",
        ],
    )
    assert out.exit_code == 1
    (folder,) = (p for p in tmp_path.iterdir() if p.is_dir())
    rows = list(csv.DictReader((folder / "summary.csv").open()))
    assert rows[0]["status"] == "error" and "ValueError: a bug in a model" in rows[0]["reason"]


@pytest.mark.slow
def test_ctrl_c_keeps_finished_rows_and_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnbench.timing.torch_executor import TorchExecutor

    real_run = TorchExecutor.run
    calls = {"n": 0}

    def interrupted_on_third(self: TorchExecutor, case):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real_run(self, case)

    monkeypatch.setattr(TorchExecutor, "run", interrupted_on_third)
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    out = runner.invoke(
        app, ["sweep", str(config), "--out", str(tmp_path), "--set", "models=[lstm]", "--set", "grid.seq_len=[8, 16]"]
    )
    assert out.exit_code == 130
    (folder,) = (p for p in tmp_path.iterdir() if p.is_dir())
    assert json.loads((folder / "run.json").read_text())["state"] == "interrupted"
    assert len((folder / "results.jsonl").read_text().splitlines()) == 2
    assert "2 of 4 cases finished" in out.output


BAD_CONFIG_FILES = sorted(BAD_CONFIGS.iterdir())


@pytest.mark.parametrize("path", BAD_CONFIG_FILES, ids=[p.name for p in BAD_CONFIG_FILES])
def test_every_bad_config_is_an_error_a_hint_and_exit_2(path: Path) -> None:
    out = runner.invoke(app, ["validate", str(path)])
    assert out.exit_code == 2
    lines = out.output.strip().splitlines()
    assert lines[0].startswith(f"error: {path}")  # names the file (and line/key where there is one)
    assert any(line.startswith("hint: ") for line in lines[1:])
    assert "Traceback" not in out.output


def test_cpu_sweep_records_cpu_telemetry_and_says_why_gpu_columns_are_empty(tiny_run: tuple[Path, str]) -> None:
    folder, _ = tiny_run
    # Every timed row (ok, or too slow for its budget on a busy machine) has its telemetry.
    rows = [r for r in csv.DictReader((folder / "summary.csv").open()) if r["status"] in ("ok", "too_slow_for_budget")]
    for row in rows:
        assert 0 < float(row["cpu_util_pct"]) <= 110  # CPU time is counted in ticks: a little over 100 happens
        assert int(row["rss_max_bytes"]) > 0 and int(row["threads_max"]) >= 1
        assert row["gpu_util_pct"] == row["power_w"] == row["energy_j"] == ""
        assert "all GPU metrics" in row["telemetry_note"] and "CPU run" in row["telemetry_note"]
        assert row["telemetry_source"] == "psutil"
    sidecar = [json.loads(line) for line in (folder / "telemetry.jsonl").read_text().splitlines()]
    assert sorted(s["key"] for s in sidecar) == sorted(r["key"] for r in rows)
    assert all(len(s["samples"]) >= 1 and "rss_bytes" in s["samples"][0] for s in sidecar)
    rows_text = (folder / "results.jsonl").read_text()
    assert "rss_bytes" not in rows_text  # raw samples live in the sidecar only


def test_report_shows_the_telemetry_table(tiny_run: tuple[Path, str]) -> None:
    folder, _ = tiny_run
    out = runner.invoke(app, ["report", str(folder), "--telemetry"])
    assert out.exit_code == 0
    # A rich table by default, with only the columns a CPU run has values in.
    assert out.stdout.startswith("Telemetry per case") and "┃ case" in out.stdout
    assert "cpu %" in out.stdout and "gpu util" not in out.stdout and "power W" not in out.stdout
    md = runner.invoke(app, ["report", str(folder), "--telemetry", "-f", "md"])
    assert md.exit_code == 0
    assert md.stdout.startswith("# ") and "| lstm forward float32 b=2 n=16 d=32" in md.stdout
    # The unsupported rows have no telemetry, so the note differs between rows and stays in its column.
    table = [
        [cell.strip() for cell in line.strip("|").split("|")] for line in md.stdout.splitlines() if line[:2] == "| "
    ]
    assert "gpu util" not in md.stdout and "note" in table[0][-1] and len({row[-1] for row in table[2:]}) > 1
    refused = runner.invoke(app, ["report", str(folder), "--telemetry", "-f", "csv"])
    assert refused.exit_code == 2 and "-f md" in refused.output


@pytest.mark.slow
def test_telemetry_off_records_nothing(tmp_path: Path) -> None:
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY)
    args = ["sweep", str(config), "--out", str(tmp_path), "--telemetry", "off", "--set", "models=[lstm]"]
    out = runner.invoke(app, [*args, "--set", "modes=[forward]", "--set", "grid.seq_len=[8]"])
    assert out.exit_code == 0, out.output
    (folder,) = (p for p in tmp_path.iterdir() if p.is_dir())
    (row,) = csv.DictReader((folder / "summary.csv").open())
    assert row["cpu_util_pct"] == "" and row["telemetry_source"] == "off"
    assert not (folder / "telemetry.jsonl").exists()
    assert json.loads((folder / "run.json").read_text())["config"]["telemetry"] == "off"


@pytest.mark.slow
def test_env_says_whether_nvml_is_available() -> None:
    out = runner.invoke(app, ["env", "--device", "cpu"])
    assert out.exit_code == 0 and "telemetry.nvml" in out.stdout


def test_rows_carry_analytic_flops_with_their_formula(tiny_run: tuple[Path, str]) -> None:
    from attnbench.core.cases import Case
    from attnbench.families.flops import count_flops
    from attnbench.results.store import load_run

    folder, _ = tiny_run
    rows = {r["key"]: r for r in csv.DictReader((folder / "summary.csv").open())}
    for result in load_run(folder).results:
        row = rows[result.case.key]
        if not result.ok:
            # No rate from a row that is not ok (a too-slow row's few warm-up calls are evidence, not a timing).
            assert row["tflops"] == row["pct_of_peak"] == row["executed_tflops"] == ""
            continue
        expected = count_flops(Case.from_dict(result.case.to_dict()))
        assert int(row["flops"]) == expected.flops and row["flops_formula"] == expected.formula
        assert float(row["tflops"]) == pytest.approx(expected.flops / (float(row["median_ms"]) / 1e3) / 1e12, rel=1e-4)


def _command_names() -> list[str]:
    import typer

    group = typer.main.get_command(app)
    return list(group.commands)  # type: ignore[attr-defined]


@pytest.mark.parametrize("command", [[], *([name] for name in _command_names())])
def test_help_shows_no_metavar_after_a_flag(command: list[str]) -> None:
    """A flag takes no value: `--dry-run <bool>` would read as if it took one."""
    out = runner.invoke(app, [*command, "--help"])
    assert out.exit_code == 0, out.output
    assert "<bool>" not in out.output
    assert "--help" in out.output


def test_env_prints_sizes_in_gib() -> None:
    out = runner.invoke(app, ["env", "--device", "cpu"])
    assert out.exit_code == 0
    (line,) = [line for line in out.output.splitlines() if line.split()[:1] == ["memory"]]
    assert line.rstrip().endswith("GiB"), line
    assert "memory_bytes" not in out.output


def test_validate_takes_several_files_and_says_which_failed(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(TINY)
    other = tmp_path / "other.yaml"
    other.write_text(tiny_config("other"))
    bad = BAD_CONFIGS / "unknown-model.yaml"
    out = runner.invoke(app, ["validate", str(good), str(bad), str(other)])
    assert out.exit_code == 2, out.output
    lines = out.output.strip().splitlines()
    assert lines[0].startswith(f"ok: {good} → 20 cases")
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {bad}:2, key 'models[0]'")
    assert lines[lines.index(errors[0]) + 1].startswith("hint: ")
    assert any(line.startswith(f"ok: {other} → 4 cases") for line in lines)
    assert numbers(lines[-1]) == [3, 2, 1]  # configs, ok, failed
    assert "Traceback" not in out.output


def test_validate_every_shipped_config_and_a_folder(tmp_path: Path) -> None:
    from tests.support import ROOT

    shipped = sorted((ROOT / "configs").glob("*.yaml"))
    out = runner.invoke(app, ["validate", *map(str, shipped)])
    assert out.exit_code == 0, out.output
    assert out.output.count("ok: ") == len(shipped)
    (tmp_path / "a.yaml").write_text(TINY)
    (tmp_path / "b.yml").write_text(tiny_config("b"))
    (tmp_path / "notes.txt").write_text("not a config")
    out = runner.invoke(app, ["validate", str(tmp_path)])
    assert out.exit_code == 0, out.output
    assert out.output.count("ok: ") == 2 and numbers(out.output.splitlines()[-1]) == [2, 2, 0]

    empty = tmp_path / "empty"
    empty.mkdir()
    out = runner.invoke(app, ["validate", str(empty)])
    assert out.exit_code == 2 and "no *.yaml files" in out.output and "hint:" in out.output


@pytest.mark.slow
def test_no_plots_writes_the_summaries_and_no_plots(tmp_path: Path) -> None:
    """For a CI gate that reads only the rows: no matplotlib import, no drawing; report --plots draws them later."""
    config = tmp_path / "one.yaml"
    config.write_text(tiny_config(models=["lstm"], grid={"batch": [1], "seq_len": [8]}, threads=1))
    done = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / "out"), "-q", "--no-plots"])
    assert done.exit_code == 0, done.output
    (folder,) = (tmp_path / "out").iterdir()
    assert {p.name for p in folder.iterdir()} >= {"summary.csv", "summary.md"} and not (folder / "plots").exists()
    assert "/plots" not in done.output and ".png" not in done.output
    drawn = runner.invoke(app, ["report", str(folder), "--plots"])
    assert drawn.exit_code == 0, drawn.output
    assert any((folder / "plots").glob("*.png"))


@pytest.mark.slow
def test_a_cpu_sweep_without_threads_runs_on_every_cpu_but_one_in_its_workers_too(tmp_path: Path) -> None:
    import torch

    from attnbench.host.devices import THREAD_COUNT_VARIABLES, resolve_threads

    expected = resolve_threads(None, "cpu")
    if expected is None or any(os.environ.get(name) for name in THREAD_COUNT_VARIABLES):
        pytest.skip(f"torch runs {torch.get_num_threads()} threads on {os.cpu_count()} CPUs here: nothing is left free")
    config = tmp_path / "c.yaml"
    config.write_text(tiny_config(models=["lstm"], threads=None, isolate=True, grid={"batch": [1], "seq_len": [8]}))
    result = runner.invoke(app, ["sweep", str(config), "--out", str(tmp_path / "out"), "-q"])
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "out").iterdir()
    assert json.loads((folder / "run.json").read_text())["environment"]["torch_threads"] == expected
    rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
    assert [row["extra"]["torch_threads"] for row in rows] == [expected]  # the isolated worker ran with it
    before = torch.get_num_threads()
    shown = runner.invoke(app, ["env", "--device", "cpu", "-f", "json"])
    assert json.loads(shown.output)["environment"]["torch_threads"] == expected
    assert torch.get_num_threads() == before  # env (like calibrate and selfcheck) hands the caller's count back
