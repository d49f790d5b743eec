"""Worker entry points for ``IsolatedExecutor(worker_main=...)``: the real ``_worker`` behind a true seam.

A spawned worker imports this module by name before anything else, so it must not import torch at the top: the
point of ``recording_import_env`` is to see the environment at the moment torch is first imported.
"""

from __future__ import annotations

import multiprocessing.connection
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from attnbench.sweeps import isolated_executor as isolation
from attnbench.timing.executor import ExecutorSettings

STICKY = "CUDA error: an illegal memory access was encountered"
ENV_RECORD = "ATTNBENCH_TEST_ENV_RECORD"  # a file the first `import torch` writes TEARDOWN_CUPTI into


def recording_import_env(
    conn: multiprocessing.connection.Connection, settings: ExecutorSettings, env: Mapping[str, str] | None
) -> None:
    """The real worker, with an audit hook writing TEARDOWN_CUPTI to a file when torch is first imported."""
    path = os.environ[ENV_RECORD]

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if event == "import" and args[0] == "torch" and not os.path.exists(path):
            with open(path, "w") as f:
                f.write(os.environ.get("TEARDOWN_CUPTI", "<unset>"))

    assert "torch" not in sys.modules
    sys.addaudithook(hook)
    isolation._worker(conn, settings, env)


def sticky_cuda(
    conn: multiprocessing.connection.Connection, settings: ExecutorSettings, env: Mapping[str, str] | None
) -> None:
    """The real worker on a "GPU" whose context died: torch.cuda says a device exists, and every CUDA call raises
    the same illegal-memory-access error, as after a real one (the seam: torch.cuda's functions)."""
    import torch

    def sticky() -> Callable[..., Any]:
        # One function per name: dynamo's trace rules map each torch function object to one rule, and refuse an
        # object met under two names with different ones (synchronize and empty_cache have different rules).
        def raises(*args: object, **kwargs: object) -> Any:
            raise RuntimeError(STICKY)

        return raises

    torch.cuda.is_available = lambda: True  # type: ignore[assignment]
    torch.cuda.is_initialized = lambda: True  # type: ignore[assignment]
    for name in ("synchronize", "empty_cache", "get_rng_state"):
        setattr(torch.cuda, name, sticky())
    # The worker touches its device before saying it is ready: a fresh context works, so that touch succeeds.
    zeros = torch.zeros
    torch.zeros = lambda *a, device=None, **k: zeros(*a, **k)  # type: ignore[assignment]
    isolation._worker(conn, settings, env)


def hung_profile(
    conn: multiprocessing.connection.Connection, settings: ExecutorSettings, env: Mapping[str, str] | None
) -> None:
    """The real executor on a CPU, speaking the worker's protocol, whose profile never ends after the timed row."""
    from attnbench.core.cases import Case
    from attnbench.timing.torch_executor import TorchExecutor

    executor = TorchExecutor(settings)
    conn.send(("ready", 1))
    while (message := conn.recv()) is not None:

        def timed(result: Any) -> None:
            conn.send(("timed", result.to_dict(include_raw=True)))

        executor.run(Case.from_dict(message), on_timed=timed)
        time.sleep(3600)  # the "profile": never ends
