"""compare's gates on any metric: the threshold language for patterns and metrics, and the verdicts on peak memory,
tokens/s and GB/s, with the median's rule and exit codes."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from attnbench.analysis.compare import Policy, compare_paths
from attnbench.analysis.gates import judge
from attnbench.analysis.thresholds import Thresholds, parse_gate, thresholds_from, with_fail_on
from attnbench.cli import app
from attnbench.core.errors import AttnbenchError
from tests.support import mentions, numbers, synthetic_runs, tiny_case

runner = CliRunner()
LSTM = "model=lstm|mode=forward|dtype=float32|device=cpu|batch=2|seq_len=64"


# ------------------------------------------------------------------------------------------------ the language


@pytest.mark.parametrize(
    ("text", "metric", "value"),
    [("5%", "median", 0.05), ("peak_mem:10%", "peak_mem", 0.10), ("tokens_per_s: 2.5 %", "tokens_per_s", 0.025)],
)
def test_gate_language(text: str, metric: str, value: float) -> None:
    assert parse_gate(text) == (metric, pytest.approx(value))


def test_a_statistic_that_is_no_gate_names_the_allowed_ones() -> None:
    with pytest.raises(AttnbenchError) as info:
        parse_gate("mean:5%")
    assert "--fail-on" in info.value.message and "peak_mem" in info.value.hint and "gbps" in info.value.hint


def test_patterns_models_and_metrics_in_a_file(tmp_path: Path) -> None:
    data = {
        "default": "4%",
        "lstm": "8%",
        "*/decode": "12%",
        "lstm/train": "10%",
        "peak_mem": "10%",
        "tokens_per_s": {"default": "5%", "sdpa-*": "7%"},
    }
    limits = thresholds_from(data, tmp_path / "t.yaml")
    assert limits.for_case(tiny_case("lstm")) == pytest.approx(0.08)
    assert limits.for_case(tiny_case("lstm", mode="train")) == pytest.approx(0.10)  # the pattern beats the model
    assert limits.for_case(tiny_case("lstm", mode="decode")) == pytest.approx(0.12)  # the first pattern that matches
    assert limits.for_case(tiny_case("vanilla")) == pytest.approx(0.04)
    assert limits.gated == ("tokens_per_s", "peak_mem")
    assert limits.limit("peak_mem", tiny_case("gru")) == pytest.approx(0.10)
    assert limits.limit("tokens_per_s", tiny_case("sdpa-flash")) == pytest.approx(0.07)
    assert limits.limit("gbps", tiny_case("gru")) is None
    assert (
        limits.describe()
        == "4 %; lstm 8 %; */decode 12 %; lstm/train 10 %; tokens_per_s 5 %; sdpa-* 7 %; peak_mem 10 %"
    )


def test_the_command_line_sets_each_metrics_default() -> None:
    limits = with_fail_on(Thresholds(0.05, {"lstm": 0.08}), ["median:3%", "peak_mem:20%"])
    assert limits.default == pytest.approx(0.03) and limits.per_model == {"lstm": 0.08}
    assert limits.limit("peak_mem", tiny_case("lstm")) == pytest.approx(0.20)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({"lsttm/train": "5%"}, "'lsttm' matches no model"),
        ({"lstm/infer": "5%"}, "'infer' matches no mode"),
        ({"peak_mem": {"lstm": "tokens_per_s:5%"}}, "names tokens_per_s, under a key of peak_mem"),
        ({"peak_mem": {"lstmm": "5%"}}, "key 'peak_mem.lstmm': unknown model"),
    ],
)
def test_file_errors_name_the_key(tmp_path: Path, data: dict[str, object], says: str) -> None:
    with pytest.raises(AttnbenchError) as info:
        thresholds_from(data, tmp_path / "t.yaml")
    assert says in info.value.message and "t.yaml" in info.value.message


@pytest.mark.parametrize(
    ("lo", "hi", "worse_up", "verdict"),
    [
        (1.12, 1.2, True, "regressed"),
        (0.8, 0.88, False, "regressed"),  # a rate that fell by more than 10 %
        (1.12, 1.2, False, "improved"),
        (0.95, 1.05, True, "same"),
        (0.95, 1.15, False, "noisy"),
    ],
)
def test_the_rule_turns_round_where_lower_is_worse(lo: float, hi: float, worse_up: bool, verdict: str) -> None:
    assert judge(lo, hi, 0.10, higher_is_worse=worse_up) == verdict


# ------------------------------------------------------------------------------------------------- the verdicts


def _scale_peaks(folder: Path, factor: float, only: str = LSTM, bytes_moved: int | None = None) -> None:
    for run in folder.iterdir():
        rows = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line]
        for row in rows:
            if row["key"].startswith(only) and row.get("memory"):
                row["memory"]["peak_bytes"] = round(row["memory"]["peak_bytes"] * factor)
            if bytes_moved is not None and row["status"] == "ok":
                row.setdefault("extra", {})["bytes_moved"] = bytes_moved
        (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.fixture
def sides(tmp_path: Path) -> tuple[Path, Path]:
    base, current = tmp_path / "base", tmp_path / "current"
    synthetic_runs(base, [1.0] * 3, seed=1, sigma=0.005, case_sigma=0.002)
    synthetic_runs(current, [1.0] * 3, seed=2, sigma=0.005, case_sigma=0.002)
    for folder in (current / name for name in ("run-000", "run-001", "run-002")):
        run = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**run, "run_id": "current-" + folder.name}))
    return base, current


def test_more_memory_regresses_only_where_memory_is_gated(sides: tuple[Path, Path]) -> None:
    base, current = sides
    _scale_peaks(current, 1.25)
    plain = compare_paths(base, current, Policy(noise_floor=0.0))
    assert not plain.gates and not plain.regressed
    policy = Policy(with_fail_on(Thresholds(), ["peak_mem:10%"]), noise_floor=0.0)
    gated = compare_paths(base, current, policy)
    (grew,) = [g for g in gated.gates if g.verdict == "regressed"]
    assert grew.metric == "peak_mem" and grew.key.startswith(LSTM)
    assert grew.ratio == pytest.approx(1.25, abs=1e-4) and grew.ci_low == pytest.approx(1.25, abs=1e-4)
    assert {g.verdict for g in gated.gates if g is not grew} == {"same"}
    assert gated.regressed and gated.exit_code == 1
    assert gated.to_dict()["gates"][0]["metric"] == "peak_mem"


def test_a_rate_is_the_time_turned_round(sides: tuple[Path, Path], tmp_path: Path) -> None:
    base, _ = sides
    slow = tmp_path / "slow"
    synthetic_runs(slow, [1.25] * 3, seed=3, sigma=0.005, case_sigma=0.002, only=LSTM)
    for folder in slow.iterdir():
        run = json.loads((folder / "run.json").read_text())
        (folder / "run.json").write_text(json.dumps({**run, "run_id": "slow-" + folder.name}))
    _scale_peaks(base, 1.0, bytes_moved=10**6)
    _scale_peaks(slow, 1.0, bytes_moved=10**6)
    limits = with_fail_on(Thresholds(0.5), ["tokens_per_s:10%", "gbps:10%"])  # the median gate alone would pass
    comparison = compare_paths(base, slow, Policy(limits, noise_floor=0.0))
    assert not any(c.verdict == "regressed" for c in comparison.cases)
    fell = [g for g in comparison.gates if g.verdict == "regressed"]
    assert sorted(g.metric for g in fell) == ["gbps", "tokens_per_s"]
    case = next(c for c in comparison.cases if c.key == fell[0].key)
    assert case.ratio is not None and case.ci_low is not None and case.ci_high is not None
    assert fell[0].ratio == pytest.approx(1 / case.ratio) and fell[0].ci_high == pytest.approx(1 / case.ci_low)
    assert fell[0].ratio == pytest.approx(0.8, abs=0.02)
    assert fell[0].base is not None and fell[0].current is not None
    assert math.isclose(fell[0].current / fell[0].base, 1 / (case.current_s or 1) * (case.base_s or 1), rel_tol=1e-9)
    assert comparison.regressed


def test_the_python_api_gates_as_the_cli_does(sides: tuple[Path, Path]) -> None:
    """attnbench.api.compare applies the gates a --fail-on names itself: a script or notebook gets the CLI's
    verdict (the gates were once applied by the CLI alone, and the API's compare ignored them)."""
    import attnbench

    base, current = sides
    _scale_peaks(current, 1.25)
    assert attnbench.compare(base, current, noise_floor=0).exit_code == 0
    gated = attnbench.compare(base, current, noise_floor="0%", fail_on="peak_mem:10%")
    assert gated.regressed and gated.exit_code == 1
    assert [g.metric for g in gated.gates if g.verdict == "regressed"] == ["peak_mem"]
    cli = runner.invoke(app, ["compare", str(base), str(current), "--noise-floor", "0", "--fail-on", "peak_mem:10%"])
    assert cli.exit_code == gated.exit_code
    by_file = attnbench.compare(base, current, noise_floor=0, thresholds={"default": "5%", "peak_mem": "10%"})
    assert by_file.exit_code == 1


def test_cli_gates_memory_with_compares_exit_codes(sides: tuple[Path, Path], tmp_path: Path) -> None:
    base, current = sides
    _scale_peaks(current, 1.25)
    same = runner.invoke(app, ["compare", str(base), str(current), "--noise-floor", "0"])
    assert same.exit_code == 0, same.output
    gated = runner.invoke(app, ["compare", str(base), str(current), "--noise-floor", "0", "--fail-on", "peak_mem:10%"])
    assert gated.exit_code == 1, gated.output
    md = runner.invoke(
        app, ["compare", str(base), str(current), "--fail-on", "5%", "--fail-on", "peak_mem:10%", "-f", "md"]
    )
    heading = md.stdout.splitlines()[0]
    assert heading.startswith("## ") and "peak_mem" in heading and numbers(heading) == [1]  # 1 case regressed in it
    assert "### Other metrics" in md.stdout and "| peak_mem | lstm forward float32 b=2 n=64" in md.stdout
    assert "+25.0 %" in md.stdout
    file = tmp_path / "t.yaml"
    file.write_text("default: 5%\nlstm/forward: 30%\npeak_mem: {'lstm/*': 30%}\n")
    loose = runner.invoke(app, ["compare", str(base), str(current), "--noise-floor", "0", "--thresholds", str(file)])
    assert loose.exit_code == 0, loose.output
    bad = runner.invoke(app, ["compare", str(base), str(current), "--fail-on", "p99:5%"])
    (error,) = [line for line in bad.output.splitlines() if line.startswith("error:")]
    assert bad.exit_code == 2 and mentions(error, "--fail-on", "'p99:5%'")
