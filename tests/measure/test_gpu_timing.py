"""GPU timing aids: the arithmetic here everywhere, the CUDA paths (flush, graph replay, profile) on a GPU."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from attnbench.cli import app
from attnbench.core.cases import Case, TimingPolicy
from attnbench.measure.gpu_timing import busy_time, launch_bound
from attnbench.results.store import load_run

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_busy_time_is_the_union_of_intervals() -> None:
    assert busy_time([]) == 0.0
    assert busy_time([(0.0, 1.0), (2.0, 3.0)]) == pytest.approx(2.0)
    assert busy_time([(0.0, 2.0), (1.0, 3.0)]) == pytest.approx(3.0)  # overlap counts once
    assert busy_time([(0.0, 5.0), (1.0, 2.0)]) == pytest.approx(5.0)  # nested
    assert busy_time([(2.0, 3.0), (0.0, 1.0), (0.5, 2.5)]) == pytest.approx(3.0)  # unsorted


def test_launch_bound_cut_is_115_percent_of_busy_time() -> None:
    assert launch_bound(1.16e-3, 1e-3) is True
    assert launch_bound(1.14e-3, 1e-3) is False
    assert launch_bound(1e-3, 0.0) is None  # the profile saw no device work: unknown, not "no"


@pytest.mark.parametrize(
    ("setting", "message"),
    [("timing.cache=cold", "timing.cache apply to CUDA"), ("timing.cuda_graph=true", "timing.cuda_graph apply")],
)
def test_gpu_only_timing_options_are_refused_on_cpu(tmp_path: Path, setting: str, message: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("name: c\ndevice: cpu\nmodels: [lstm]\ngrid: {batch: [1], seq_len: [8]}\nd_model: 16\n")
    result = CliRunner().invoke(app, ["sweep", str(config), "--set", setting, "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert message in result.output and "hint:" in result.output


@pytest.mark.gpu
@CUDA
class TestOnCuda:
    CASE = Case("vanilla", "forward", "bfloat16", "cuda", 2, 256, 256, 4, 1, False)

    def _run(self, case: Case, **policy: object):  # type: ignore[no-untyped-def]
        from attnbench.measure.executor import ExecutorSettings
        from attnbench.measure.torch_executor import TorchExecutor

        timing = replace(TimingPolicy(max_case_s=1.0, min_time_s=0.05), **policy)  # type: ignore[arg-type]
        return TorchExecutor(ExecutorSettings("cuda", timing, telemetry="off")).run(case)

    def test_profile_counts_kernels_and_classifies_launch_bound(self) -> None:
        result = self._run(self.CASE)
        assert result.ok, result.reason
        assert isinstance(result.extra.get("kernels_per_call"), int) and result.extra["kernels_per_call"] > 0
        assert 0 < float(result.extra["kernel_busy_s"]) < 1  # type: ignore[arg-type]
        assert isinstance(result.extra["launch_bound"], bool)
        # A tiny call at batch 1 is all launch overhead on any modern GPU.
        tiny = self._run(replace(self.CASE, batch=1, seq_len=8, d_model=64, heads=2))
        assert tiny.ok and tiny.extra["launch_bound"] is True

    def test_cold_cache_is_not_faster_than_warm(self) -> None:
        warm = self._run(self.CASE)
        cold = self._run(self.CASE, cache="cold")
        assert warm.ok and cold.ok and warm.measurement and cold.measurement
        assert cold.measurement.calls_per_sample == 1
        assert cold.measurement.median_s > 0.9 * warm.measurement.median_s

    def test_cuda_graph_replays_forward_and_refuses_train(self) -> None:
        graph = self._run(self.CASE, cuda_graph=True)
        assert graph.ok and graph.extra["cuda_graph"] is True
        train = self._run(replace(self.CASE, mode="train"), cuda_graph=True)
        assert train.status == "unsupported" and "forward passes only" in train.reason

    def test_sweep_rows_keep_the_profile(self, tmp_path: Path) -> None:
        config = tmp_path / "g.yaml"
        config.write_text(
            "name: g\ndevice: cuda\nmodels: [lstm, sdpa]\nmodes: [forward]\ndtype: [bfloat16]\n"
            "grid: {batch: [1], seq_len: [64]}\nd_model: 128\nheads: 2\ntiming: {max_case_s: 1}\n"
        )
        result = CliRunner().invoke(app, ["sweep", str(config), "--out", str(tmp_path / "o"), "-q"])
        assert result.exit_code == 0, result.output
        (folder,) = (tmp_path / "o").iterdir()
        for row in load_run(folder).results:
            assert row.ok and "kernels_per_call" in row.extra, row.extra
