"""What one case sets for the whole process ends with it (issue 38): torch's process-wide settings are put back
after every case and the row that changed them says so; and a user model that calls ``sys.exit`` is its row's
``error``, not the sweep's end."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import torch

from attnbench.core.cases import Case
from attnbench.families.user.spec import UserModel
from attnbench.timing.executor import ExecutorSettings
from attnbench.timing.torch_executor import TorchExecutor
from attnbench.timing.torch_state import KeptTorchState
from tests.measure.test_torch_executor import QUICK
from tests.support import tiny_case


def user_case(factory: str, mode: str = "forward") -> Case:
    case = tiny_case("sdpa", mode=mode)  # type: ignore[arg-type]
    user = UserModel(f"tests.measure.hostile_models:{factory}", "attention")
    return replace(case, model=f"my-{factory}", definition=user.definition())


def executor(threads: int = 2) -> TorchExecutor:
    return TorchExecutor(ExecutorSettings("cpu", QUICK, telemetry="off", threads=threads))


def set_sdpa_flash(on: bool) -> None:
    torch.backends.cuda.enable_flash_sdp(on)


BACKENDS = torch.backends


def setting(name: str, read: Callable[[], Any], change: Callable[[], None], *marks: Any) -> Any:
    return pytest.param(name, read, change, marks=marks, id=name)


CHANGES = [
    setting("num_threads", torch.get_num_threads, lambda: torch.set_num_threads(torch.get_num_threads() + 1)),
    setting("default_dtype", torch.get_default_dtype, lambda: torch.set_default_dtype(torch.float64)),
    setting("grad_enabled", torch.is_grad_enabled, lambda: torch.set_grad_enabled(False)),
    setting("mkldnn.enabled", lambda: BACKENDS.mkldnn.enabled, lambda: setattr(BACKENDS.mkldnn, "enabled", False)),
    setting("cudnn.benchmark", lambda: BACKENDS.cudnn.benchmark, lambda: setattr(BACKENDS.cudnn, "benchmark", True)),
    setting("sdpa.flash", torch.backends.cuda.flash_sdp_enabled, lambda: set_sdpa_flash(False)),
    setting(  # the first switch to deterministic algorithms imports what they need: over a second
        "deterministic_algorithms",
        torch.are_deterministic_algorithms_enabled,
        lambda: torch.use_deterministic_algorithms(True, warn_only=True),
        pytest.mark.slow,
    ),
    setting("default_device", torch.get_default_device, lambda: torch.set_default_device("meta")),
    setting(
        "float32_matmul_precision",
        torch.get_float32_matmul_precision,
        lambda: torch.set_float32_matmul_precision("medium"),
    ),
]


@pytest.mark.parametrize(("name", "read", "change"), CHANGES)
def test_a_setting_a_block_changes_is_put_back_and_named(
    name: str, read: Callable[[], Any], change: Callable[[], None]
) -> None:
    before = read()
    kept = KeptTorchState()
    with kept:
        change()
        assert read() != before
    assert read() == before
    assert len(kept.changed) >= 1 and any(c.startswith(name) for c in kept.changed), kept.changed


def test_a_block_that_changes_nothing_writes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    written: list[str] = []
    monkeypatch.setattr(torch, "set_num_threads", lambda n: written.append(f"threads {n}"))
    monkeypatch.setattr(torch, "set_default_dtype", lambda d: written.append(f"dtype {d}"))
    kept = KeptTorchState()
    with kept:
        torch.zeros(2).sum()
    assert kept.changed == () and written == []


def test_settings_are_put_back_when_the_block_raises() -> None:
    threads = torch.get_num_threads()
    kept = KeptTorchState()
    with pytest.raises(KeyboardInterrupt), kept:
        torch.set_num_threads(threads + 1)
        raise KeyboardInterrupt
    assert torch.get_num_threads() == threads and len(kept.changed) == 1


# ----------------------------------------------------------------------------------------- around each case
@pytest.mark.slow
def test_what_a_user_model_sets_for_the_process_does_not_reach_later_rows() -> None:
    clean = executor().run(tiny_case("lstm"))
    run = executor()
    rows = [run.run(case) for case in (user_case("one_thread"), user_case("no_onednn"), user_case("float64_default"))]
    lstm, after = run.run(tiny_case("lstm")), run.run(user_case("fine"))
    assert all(r.ok for r in (clean, *rows, lstm, after)), [r.reason for r in (*rows, lstm, after)]
    assert [r.extra["torch_state_changed"] for r in rows] == [
        "num_threads 2 → 1",
        "mkldnn.enabled True → False",
        "default_dtype float32 → float64",
    ]
    # The lstm after them runs on the executor's threads and oneDNN path, as it does in a fresh executor.
    assert lstm.extra["torch_threads"] == clean.extra["torch_threads"] == 2
    assert lstm.extra["rnn_path"] == clean.extra["rnn_path"]
    assert "torch_state_changed" not in lstm.extra and "torch_state_changed" not in after.extra
    assert torch.get_num_threads() == 2 and torch.get_default_dtype() == torch.float32
    assert torch.backends.mkldnn.enabled


@pytest.mark.parametrize(("factory", "code"), [("exits", "3"), ("exits_in_forward", "0")])
def test_a_user_model_calling_sys_exit_is_an_error_row_and_the_next_case_runs(factory: str, code: str) -> None:
    run = executor(threads=1)
    row = run.run(user_case(factory))
    assert row.status == "error" and f"my-{factory}" in row.reason and f"sys.exit({code})" in row.reason
    assert run.run(user_case("fine")).ok


def test_ctrl_c_in_a_user_model_still_ends_the_sweep() -> None:
    with pytest.raises(KeyboardInterrupt):
        executor(threads=1).run(user_case("interrupts"))


@pytest.mark.parametrize(("factory", "held"), [("float64_output", "torch.float64"), ("meta_output", "meta")])
def test_a_user_models_output_in_another_dtype_or_on_another_device_is_an_error(factory: str, held: str) -> None:
    row = executor(threads=1).run(user_case(factory))
    assert row.status == "error" and held in row.reason, row.reason
