"""Telling the device without torch (``guess_device``, for --dry-run) agrees with what torch would say."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnbench.core.errors import DeviceError
from attnbench.host import devices
from attnbench.host.devices import cuda_build_in, guess_device, resolve_device
from tests.support import mentions, numbers


def _driver(tmp_path: Path, count: int) -> Path:
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for i in range(count):
        (gpus / f"0000:{i:02x}:00.0").mkdir()
    return gpus


def test_the_build_is_read_from_torchs_version_file(tmp_path: Path) -> None:
    version = tmp_path / "version.py"
    version.write_text("from typing import Optional\n__version__ = '2.14.1'\ncuda: Optional[str] = '12.8'\n")
    assert cuda_build_in(version) == "CUDA 12.8"
    version.write_text("__version__ = '2.13.0+cpu'\ncuda = None\n")
    assert cuda_build_in(version) is None
    assert cuda_build_in(tmp_path / "missing.py") is None
    version.write_text("cuda = (")
    assert cuda_build_in(version) is None


def test_auto_is_cuda_only_with_a_cuda_build_and_a_visible_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "_torch_cuda_build", lambda: "CUDA 12.8")
    two = _driver(tmp_path, 2)
    guess = guess_device("auto", gpus=two)
    assert guess.device == "cuda:0" and mentions(guess.basis, "CUDA", values=(12.8, 2))  # its version, 2 GPUs
    assert guess_device("auto", gpus=tmp_path / "no-driver").device == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert guess_device("auto", gpus=two).device == "cpu"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,7,0")  # CUDA stops at 7, which names no device
    assert "1 NVIDIA GPU visible" in guess_device("auto", gpus=two).basis
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5d1c0b2e")
    assert guess_device("auto", gpus=two).device == "cuda:0"
    monkeypatch.setattr(devices, "_torch_cuda_build", lambda: None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    guess = guess_device("auto", gpus=two)
    assert guess.device == "cpu" and numbers(guess.basis) == [2]  # GPUs visible, but no CUDA build


def test_an_explicit_cuda_request_is_kept_and_a_likely_refusal_said(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "_torch_cuda_build", lambda: "CUDA 12.8")
    one = _driver(tmp_path, 1)
    assert guess_device("cuda", gpus=one) == devices.DeviceGuess("cuda:0")
    far = guess_device("cuda:3", gpus=one)
    assert far.device == "cuda:3" and "does not look present" in far.problem
    assert "CUDA" in guess_device("cuda", gpus=tmp_path / "none").problem

    assert guess_device("cpu") == devices.DeviceGuess("cpu")
    with pytest.raises(DeviceError, match="not a device"):
        guess_device("tpu")


def test_the_guess_agrees_with_torch_here() -> None:
    assert guess_device("auto").device == resolve_device("auto")


# ------------------------------------------------------------------------- the thread count a sweep runs with
@pytest.fixture
def torch_threads() -> object:
    import torch

    found = torch.get_num_threads()
    yield torch
    torch.set_num_threads(found)


@pytest.mark.parametrize(
    ("cpus", "torch_default", "expected"),
    [(2, 2, 1), (8, 8, 7), (64, 64, 63), (128, 64, None), (1, 1, None), (4, 2, None)],
)
def test_a_cpu_leaves_one_cpu_free_only_where_torch_would_take_them_all(
    cpus: int, torch_default: int, expected: int | None, torch_threads: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in devices.THREAD_COUNT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    torch_threads.set_num_threads(torch_default)  # type: ignore[attr-defined]
    assert devices.resolve_threads(None, "cpu", cpus=cpus) == expected


def test_a_given_count_a_gpu_and_the_environments_choice_are_kept(
    torch_threads: object, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch_threads.set_num_threads(4)  # type: ignore[attr-defined]
    assert devices.resolve_threads(3, "cpu", cpus=4) == 3
    assert devices.resolve_threads(4, "cpu", cpus=4) == 4
    assert devices.resolve_threads(None, "cuda:0", cpus=4) is None
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert devices.resolve_threads(None, "cpu", cpus=4) is None
